"""The lab's STAND-IN PCI listing (llmfleet/lab/standin_pci.py): NVSwitches on one lab host.

files/standins/pci-devices.yml is NOT a real machine's bus. These tests check that the tree
`llmfleet lab up` mounts over a host's /sys/bus/pci/devices is what the roles' detection reads
as four NVSwitches and two GPUs, that it is labelled a stand-in, that exactly one lab GPU host
gets it, and that the container is created with it mounted read-only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.errors import LlmfleetError
from llmfleet.lab import hosts, standin_pci
from llmfleet.lab.topology import DEFAULT_INVENTORY, load_lab
from llmfleet.module_utils.nvidia_pci import read_nvidia_pci


def test_the_listing_is_labelled_a_stand_in() -> None:
    assert "llmfleet STAND-IN PCI listing: NOT a real machine's devices" in standin_pci.SPEC_FILE.read_text()


def test_the_tree_reads_as_four_nvswitches_and_two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFLEET_CACHE", str(tmp_path / "cache"))
    tree = standin_pci.ensure_tree()
    assert standin_pci.ensure_tree() == tree, "written once, then reused"
    found = read_nvidia_pci(str(tree))
    assert len(found["nvswitches"]) == 4
    assert {switch["driver"] for switch in found["nvswitches"]} == {"nvidia-nvswitch"}
    assert [gpu["slot"] for gpu in found["gpus"]] == ["0000:01:00.0", "0000:02:00.0"]


def test_a_malformed_listing_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "pci.yml"
    spec.write_text("devices:\n  - {slot: '0000:05:00.0', vendor: '0x10de'}\n")
    with pytest.raises(LlmfleetError, match="devices must be a list of"):
        standin_pci.load_devices(spec)


def test_one_lab_gpu_host_gets_the_listing() -> None:
    lab = load_lab(DEFAULT_INVENTORY)
    assert [host.name for host in lab.hosts if host.standin_pci] == ["gpu1"]


def test_that_host_is_created_with_the_listing_mounted_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMFLEET_CACHE", str(tmp_path / "cache"))
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(hosts, "docker", lambda *args, **kwargs: calls.append(args))
    lab = load_lab(DEFAULT_INVENTORY)
    by_name = {host.name: host for host in lab.hosts}
    mount = f"{standin_pci.ensure_tree()}:/sys/bus/pci/devices:ro"
    for name in ("gpu1", "gpu2"):
        calls.clear()
        hosts._create(lab, by_name[name], "image")
        [run] = [call for call in calls if call[0] == "run"]
        assert (mount in run) == (name == "gpu1"), run
