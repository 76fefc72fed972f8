"""Unit tests for the lab's inventory reading and base-image keying."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmfleet.build.base_image import content_key, debian_mirror
from llmfleet.errors import LlmfleetError
from llmfleet.lab.topology import DEFAULT_INVENTORY, load_lab


def test_shipped_lab_inventory_describes_six_hosts() -> None:
    lab = load_lab(DEFAULT_INVENTORY)
    assert lab.network == "llmfleet-lab-net"
    by_name = {host.name: host for host in lab.hosts}
    assert set(by_name) == {"gw1", "redis1", "mon1", "gpu1", "gpu2", "gpu3"}
    assert by_name["gpu1"].groups == ("gpu_nodes",)
    assert by_name["gpu1"].container == "llmfleet-lab-gpu1"
    assert len({host.address for host in lab.hosts}) == 6, "addresses must be unique"
    assert lab.ssh_user == "ops", "the lab logs in as production.example does"


@pytest.mark.parametrize(
    ("hosts_yml", "message"),
    [
        ("all: {children: {g: {hosts: {h1: {lab_address: 10.1.0.5}}}}}", "needs lab_name and a valid lab_subnet"),
        ("all: {vars: {lab_name: x, lab_subnet: 10.1.0.0/24, ansible_user: ops}, children: {g: {hosts: {h1: {}}}}}",
         "host h1 needs lab_address inside 10.1.0.0/24"),
        ("all: {vars: {lab_name: x, lab_subnet: 10.1.0.0/24, ansible_user: ops},"
         " children: {g: {hosts: {h1: {lab_address: 10.2.0.5}}}}}",
         "host h1 needs lab_address inside"),
        ("all: {vars: {lab_name: x, lab_subnet: 10.1.0.0/24}, children: {g: {hosts: {h1: {lab_address: 10.1.0.5}}}}}",
         "all.vars needs ansible_user, an unprivileged user"),
        ("all: {vars: {lab_name: x, lab_subnet: 10.1.0.0/24, ansible_user: root},"
         " children: {g: {hosts: {h1: {lab_address: 10.1.0.5}}}}}",
         "all.vars needs ansible_user, an unprivileged user"),
        ("all: {vars: {lab_name: x, lab_subnet: 10.1.0.0/24, ansible_user: ops},"
         " children: {g: {hosts: {h1: {lab_address: 10.1.0.5, ansible_host: x-h1}}}}}",
         "host h1 needs ansible_host: 10.1.0.5 (its lab_address)"),
        ("all: {vars: {lab_name: x, lab_subnet: 10.1.0.0/24, ansible_user: ops}}", "no hosts under all.children"),
        ("all: [unbalanced", "cannot read lab inventory"),
    ],
)
def test_bad_lab_inventory_is_refused_with_the_fix(tmp_path: Path, hosts_yml: str, message: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(hosts_yml)
    with pytest.raises(LlmfleetError, match=re.escape(message)):
        load_lab(inventory)


def test_mirror_comes_from_deb822_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.invalid/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian_mirror(tmp_path) == "http://mirror.invalid/debian"


def test_mirror_comes_from_one_line_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://mirror.invalid/debian bookworm main\n")
    assert debian_mirror(tmp_path) == "http://mirror.invalid/debian"


def test_no_mirror_names_the_variable_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_DEBIAN_MIRROR", raising=False)
    with pytest.raises(LlmfleetError, match="set LLMFLEET_DEBIAN_MIRROR"):
        debian_mirror(tmp_path)


def test_content_key_follows_the_recipe_inputs() -> None:
    assert content_key("http://a.invalid/debian") == content_key("http://a.invalid/debian")
    assert content_key("http://a.invalid/debian") != content_key("http://b.invalid/debian")
