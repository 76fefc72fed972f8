"""The nvidia_driver role's flavours: which kernel modules drive a host's GPUs, and the packages each flavour installs.

The choice is plugins/module_utils/nvidia_pci.py's (the generation table and the rule), reached from the role
through the nvidia_kernel_modules filter. It is checked against two listings: the real H200's PCI bus, recorded on
the lent machine (tests/unit/fixtures/real-h200-pci/), whose kernel ran NVIDIA's open module; the role's own choice
recorded on a real H100 (tests/unit/fixtures/real-h100-flavour/); and the STAND-IN
listing (files/standins/pci-devices.yml, not a real machine's) with two RTX 4090s that the lab and the role's
Molecule scenario use. The package names are rendered from the role's own vars files by ansible-playbook, for
every combination of kernel modules, headless and server.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from llmfleet.module_utils.nvidia_pci import GENERATIONS, choose_kernel_modules, gpu_generation, loaded_module_flavour
from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "nvidia_driver"
REAL_H200 = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-pci"
REAL_H100 = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h100-flavour"
STANDIN_PCI = yaml.safe_load((REPO_ROOT / "files" / "standins" / "pci-devices.yml").read_text())
STANDIN_GPUS = [device for device in STANDIN_PCI["devices"]
                if device["vendor"] == "0x10de" and device["class"].startswith("0x03")]


def _gpus(*device_ids: str) -> list[dict[str, str]]:
    return [{"slot": f"0000:{n:02x}:00.0", "device": device} for n, device in enumerate(device_ids, start=1)]


def test_the_generation_table_covers_every_device_id_once() -> None:
    starts = [first for first, _, _ in GENERATIONS]
    assert starts[0] == 0 and GENERATIONS[-1][1] == 0xFFFF
    assert all(GENERATIONS[i][1] + 1 == GENERATIONS[i + 1][0] for i in range(len(GENERATIONS) - 1))


@pytest.mark.parametrize(("device", "generation"), [
    ("0x1db4", "pre-Turing"),  # V100
    ("0x1eb8", "Turing"),  # T4
    ("0x2184", "Turing"),  # GTX 1660
    ("0x20b0", "Ampere"),  # A100
    ("0x2236", "Ampere"),  # A10
    ("0x2330", "Hopper"),  # H100 SXM
    ("0x2342", "Hopper"),  # GH200
    ("0x26b9", "Ada Lovelace"),  # L40S
    ("0x2901", "Blackwell or newer"),  # B200
])
def test_device_ids_name_their_generation(device: str, generation: str) -> None:
    assert gpu_generation(device) == generation


def test_the_real_h200_gets_the_open_modules_it_ran() -> None:
    pci = json.loads((REAL_H200 / "nvidia_pci.json").read_text())
    choice = choose_kernel_modules(pci["gpus"], "auto", 535)
    assert choice == {
        "modules": "open",
        "reason": "Hopper GPUs, for which NVIDIA recommends the open modules (0000:00:06.0 Hopper)",
        "problem": "",
    }
    # What its kernel had loaded (driver 580.159.04, NVIDIA's open module).
    nvrm = next(line for line in (REAL_H200 / "environment.txt").read_text().splitlines()
                if line.startswith("NVRM version:"))
    assert loaded_module_flavour(nvrm) == "open"


def test_the_role_chose_on_a_real_h100_the_open_modules_its_kernel_runs() -> None:
    recorded = json.loads((REAL_H100 / "flavour.json").read_text())
    assert recorded["kernel_module_flavour"] == recorded["loaded_flavour"] == "open"
    assert recorded["nvidia_driver_packages"][:2] == ["nvidia-driver-580-open", "nvidia-dkms-580-open"]
    # The same rule, here, from the device id nvidia-smi read there (0x233010DE: device 0x2330, vendor 0x10de).
    name, pci_id, driver = (field.strip() for field in (REAL_H100 / "gpu.txt").read_text().split(","))
    assert name.startswith("NVIDIA H100") and driver == "580.159.04"
    gpus = [{"slot": "0000:00:06.0", "device": "0x" + pci_id[2:6].lower()}]
    assert choose_kernel_modules(gpus, "auto", 580) == recorded["kernel_module_choice"]
    assert loaded_module_flavour(recorded["loaded_line"]) == "open"


def test_the_proprietary_modules_line_reads_as_proprietary() -> None:
    # The proprietary module's first line has this form (no such host was at hand to record it).
    assert loaded_module_flavour("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Release Build") == (
        "proprietary")
    with pytest.raises(ValueError, match="not the first line"):
        loaded_module_flavour("nvidia-smi: command not found")


@pytest.mark.parametrize(("branch", "modules"), [(535, "proprietary"), (580, "open")])
def test_the_stand_in_rtx_4090s_follow_the_branchs_default(branch: int, modules: str) -> None:
    choice = choose_kernel_modules(STANDIN_GPUS, "auto", branch)
    assert choice["modules"] == modules and choice["problem"] == ""
    assert "0000:01:00.0 Ada Lovelace, 0000:02:00.0 Ada Lovelace" in choice["reason"]


@pytest.mark.parametrize(("gpus", "branch", "modules", "why"), [
    (_gpus("0x1db4", "0x2236"), 580, "proprietary", "a GPU older than Turing"),
    (_gpus("0x2901"), 550, "open", "only the open modules drive"),
    (_gpus("0x2330", "0x26b9"), 535, "proprietary", "default before branch 560"),
    ([], 535, "proprietary", "no NVIDIA GPU on the PCI bus"),
    ([], 570, "open", "no NVIDIA GPU on the PCI bus"),
])
def test_auto_chooses_by_generation_then_by_branch(gpus: list[dict[str, str]], branch: int, modules: str,
                                                  why: str) -> None:
    choice = choose_kernel_modules(gpus, "auto", branch)
    assert (choice["modules"], choice["problem"]) == (modules, "")
    assert why in choice["reason"]


@pytest.mark.parametrize(("gpus", "requested", "problem"), [
    (_gpus("0x2330", "0x1db4"), "open",
     "these are older: 0000:02:00.0. Set nvidia_driver_kernel_modules to proprietary"),
    (_gpus("0x2901"), "proprietary", "open kernel modules (Blackwell has no proprietary one): 0000:01:00.0. Set"),
    (_gpus("0x1db4", "0x2901"), "auto", "older than Turing (0000:01:00.0) need the proprietary kernel modules and "
                                        "Blackwell ones (0000:02:00.0) the open modules"),
])
def test_a_flavour_the_gpus_cannot_run_is_a_problem_naming_them(gpus: list[dict[str, str]], requested: str,
                                                                problem: str) -> None:
    assert problem in choose_kernel_modules(gpus, requested, 570)["problem"]


def test_an_unknown_request_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, open, proprietary"):
        choose_kernel_modules([], "closed", 535)


COMBINATIONS = list(itertools.product(["proprietary", "open"], [False, True], [False, True]))


def _rendered(tmp_path: Path, distribution: str, source: str) -> dict[tuple[str, bool, bool], dict[str, list[str]]]:
    """nvidia_driver_packages and the other flavours' packages, from the role's vars, for every combination."""
    tasks = []
    for modules, headless, server in COMBINATIONS:
        out = tmp_path / f"{modules}-{headless}-{server}.json"
        tasks.append({
            "name": f"Render {modules} headless={headless} server={server}",
            "ansible.builtin.copy": {
                "content": "{{ {'pinned': nvidia_driver_packages, 'other': __nvidia_driver_other_flavour_packages,"
                           " 'server_packages': __nvidia_driver_server_packages} | to_json }}",
                "dest": str(out), "mode": "0644"},
            "vars": {"__nvidia_driver_module_flavour": modules, "nvidia_driver_headless": headless,
                     "nvidia_driver_server": server},
        })
    play = [{"name": "Render the driver's package names", "hosts": "all", "gather_facts": False,
             "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml"),
                            str(ROLE / "vars" / f"{distribution}.yml")],
             "tasks": tasks}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    # The site's settings as extra vars: the defaults file, loaded as vars_files here, would win over play vars.
    result = run_local_playbook(tmp_path, playbook, json.dumps(
        {"nvidia_driver_branch": "535", "nvidia_driver_version": "535.261.03", "nvidia_driver_source": source}))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return {combo: json.loads((tmp_path / f"{combo[0]}-{combo[1]}-{combo[2]}.json").read_text())
            for combo in COMBINATIONS}


@pytest.mark.parametrize("source", ["distro", "nvidia"])
def test_ubuntu_names_each_flavour_and_removes_the_others(tmp_path: Path, source: str) -> None:
    rendered = _rendered(tmp_path, "Ubuntu", source)
    assert rendered["proprietary", False, False]["pinned"] == [
        "nvidia-driver-535", "nvidia-dkms-535", "nvidia-utils-535", "nvidia-compute-utils-535"]
    assert rendered["open", True, True]["pinned"] == [
        "nvidia-headless-535-server-open", "nvidia-dkms-535-server-open", "nvidia-utils-535-server",
        "nvidia-compute-utils-535-server"]
    assert rendered["open", False, False]["pinned"][:2] == ["nvidia-driver-535-open", "nvidia-dkms-535-open"]
    every = {name for combo in rendered.values() for name in combo["pinned"]}
    assert len(every) == 16
    for combo in rendered.values():
        # The other flavours' packages: every name of the branch but the chosen ones.
        assert set(combo["other"]) == every - set(combo["pinned"])
        assert combo["server_packages"] is True


@pytest.mark.parametrize(("source", "open_module"), [("distro", "nvidia-open-kernel-dkms"),
                                                     ("nvidia", "nvidia-kernel-open-dkms")])
def test_debian_names_each_flavour_and_removes_the_others(tmp_path: Path, source: str, open_module: str) -> None:
    rendered = _rendered(tmp_path, "Debian", source)
    persistenced = ["nvidia-persistenced"] if source == "nvidia" else []
    assert rendered["proprietary", False, False]["pinned"] == ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi",
                                                               *persistenced]
    assert rendered["proprietary", False, False]["other"] == [open_module]
    assert rendered["open", True, False]["pinned"] == ["libcuda1", open_module, "nvidia-smi", *persistenced]
    assert sorted(rendered["open", True, False]["other"]) == ["nvidia-driver", "nvidia-kernel-dkms"]
    assert all(combo["server_packages"] is False for combo in rendered.values())


def test_a_site_that_names_its_packages_has_nothing_removed(tmp_path: Path) -> None:
    play = [{"name": "Render", "hosts": "all", "gather_facts": False,
             "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml"),
                            str(ROLE / "vars" / "Ubuntu.yml")],
             "tasks": [{"name": "Render", "ansible.builtin.copy": {
                 "content": "{{ __nvidia_driver_other_flavour_packages | to_json }}",
                 "dest": str(tmp_path / "other.json"), "mode": "0644"},
                 "vars": {"__nvidia_driver_module_flavour": "open"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, tmp_path / "play.yml", json.dumps(
        {"nvidia_driver_branch": "535", "nvidia_driver_version": "535.261.03", "nvidia_driver_source": "distro",
         "nvidia_driver_packages": ["cuda-drivers-535"]}))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert json.loads((tmp_path / "other.json").read_text()) == []
