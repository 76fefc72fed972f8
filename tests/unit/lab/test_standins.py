"""The llmfleet STAND-IN packages: real names and versions, labelled, and what the roles pin.

The stand-ins (files/standins/, built by llmfleet/lab/standins.py) are NOT NVIDIA's
packages. These tests keep them honest: every package and command says
STAND-IN, the versions the roles and scenarios pin exist, newer versions exist
too (so the scenarios' pin tests prove something), and the CUDA ones follow the
version table.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.errors import LlmfleetError
from llmfleet.lab import standins
from llmfleet.paths import REPO_ROOT
from llmfleet.stacks import load_stacks

ROLES = REPO_ROOT / "roles"
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def packages() -> dict[str, list[str]]:
    """name -> versions of every stand-in."""
    result: dict[str, list[str]] = {}
    for standin in standins.load_standins():
        result.setdefault(standin.name, []).append(standin.version)
    return result


def _by_name(name: str, version: str) -> standins.StandIn:
    return next(s for s in standins.load_standins() if s.name == name and s.version == version)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _render(tmp_path: Path, name: str, version: str, source: str) -> Path:
    """A stand-in's command, rendered as the package installs it."""
    standin = _by_name(name, version)
    script = tmp_path / source
    script.write_text(standins.render_file(standin, (standins.STANDINS_DIR / source).read_text()))
    script.chmod(0o755)
    return script


# --- The package list ---------------------------------------------------------


def test_driver_stand_ins_are_debian_12s_versions(packages: dict[str, list[str]]) -> None:
    for name in ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi"):
        # bookworm non-free, and the newer bookworm-security update the pin must refuse.
        assert packages[name] == ["535.261.03-1", "535.309.01-0+deb12u1"], name
    assert packages["nvidia-persistenced"] == ["535.171.04-1~deb12u1"]


def test_container_toolkit_stand_ins_cover_the_roles_default_and_a_newer_release(
    packages: dict[str, list[str]],
) -> None:
    defaults = yaml.safe_load((ROLES / "nvidia_container_toolkit" / "defaults" / "main.yml").read_text())
    pinned = f"{defaults['nvidia_container_toolkit_version']}-1"
    for name in defaults["nvidia_container_toolkit_packages"]:
        assert pinned in packages[name], name
        assert any(_numbers(version) > _numbers(pinned) for version in packages[name]), f"{name}: nothing newer"


def test_cuda_stand_ins_follow_the_version_table(packages: dict[str, list[str]]) -> None:
    for stack in load_stacks().values():
        version = f"{stack['cuda']['version']}-1"
        for names in stack["cuda"]["packages"].values():
            for name in names:
                assert version in packages[name], name
                major, minor = name.rsplit("-", 2)[-2:]
                assert version in packages[f"cuda-nvcc-{major}-{minor}"]


def test_a_stack_added_to_the_table_gets_its_stand_ins(tmp_path: Path) -> None:
    table = yaml.safe_load(standins.STACKS_FILE.read_text())
    table["gpu_stacks"]["future"] = {"cuda": {"version": "12.9.1", "packages": {"debian12": ["cuda-toolkit-12-9"]}}}
    stacks = tmp_path / "stacks.yml"
    stacks.write_text(yaml.safe_dump(table))
    made = {(s.name, s.version) for s in standins.load_standins(stacks_file=stacks)}
    assert {("cuda-toolkit-12-9", "12.9.1-1"), ("cuda-nvcc-12-9", "12.9.1-1")} <= made


def test_fabric_manager_stand_ins_match_the_driver_pin_and_not_the_security_update(
    packages: dict[str, list[str]],
) -> None:
    # Fabric Manager exists at the pinned driver's version, at another release the running driver must
    # refuse, and not at bookworm-security's driver, which the Molecule scenario's side effect pins.
    for name in ("nvidia-fabricmanager-535", "libnvidia-nscq-535"):
        assert packages[name] == ["535.261.03-1", "535.274.02-1"], name
    assert "535.309.01-0+deb12u1" in packages["nvidia-driver"]


def test_the_driver_scenario_pins_a_version_that_exists(packages: dict[str, list[str]]) -> None:
    converge = yaml.safe_load((ROLES / "nvidia_driver" / "molecule" / "default" / "converge.yml").read_text())
    pinned = converge[0]["vars"]["nvidia_driver_version"]
    assert f"{pinned}-1" in packages["nvidia-driver"]


# --- Labels -------------------------------------------------------------------


@pytest.mark.parametrize("standin", standins.load_standins(), ids=lambda s: f"{s.name}={s.version}")
def test_every_control_file_says_stand_in(standin: standins.StandIn) -> None:
    sources = {item.dest: f"/tmp/{Path(item.dest).name}" for item in standin.files}
    control = standins.control_file(standin, sources)
    assert f"Description: {standins.STANDIN_LABEL} (" in control
    assert f"Package: {standin.name}\nVersion: {standin.version}\n" in control
    assert "{version}" not in control and "{upstream}" not in control
    if sources:
        # equivs reads the first pair on the field's own line.
        assert "\nFiles: /tmp/" in control


def test_every_shipped_file_says_stand_in() -> None:
    shipped = {item.src for standin in standins.load_standins() for item in standin.files}
    assert shipped
    for name in shipped:
        assert "STAND-IN" in (standins.STANDINS_DIR / name).read_text(), name


def test_render_fills_placeholders_and_refuses_unknown_ones() -> None:
    standin = _by_name("nvidia-smi", "535.261.03-1")
    assert standins.render_file(standin, "@PACKAGE@ @VERSION@ @UPSTREAM@ @CUDA_DRIVER_API@") == (
        "nvidia-smi 535.261.03-1 535.261.03 12.2"
    )
    with pytest.raises(LlmfleetError, match="@NOT_A_VALUE@"):
        standins.render_file(standin, "@NOT_A_VALUE@")


def test_content_key_follows_the_files(tmp_path: Path) -> None:
    copy = tmp_path / "standins"
    shutil.copytree(standins.STANDINS_DIR, copy)
    listed = standins.load_standins()
    before = standins.content_key(listed, copy)
    assert standins.content_key(listed, copy) == before
    (copy / "nvcc").write_text((copy / "nvcc").read_text() + "# changed\n")
    assert standins.content_key(listed, copy) != before


# --- The commands they ship ---------------------------------------------------


def test_stand_in_nvidia_smi_answers_the_roles_queries(tmp_path: Path) -> None:
    smi = _render(tmp_path, "nvidia-smi", "535.261.03-1", "nvidia-smi")
    fields = "index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,display_active,driver_version,compute_cap"
    result = subprocess.run(
        [sys.executable, smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert "STAND-IN" in result.stderr
    rows = [line.split(", ") for line in result.stdout.splitlines()]
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(len(row) == 10 and row[8] == "535.261.03" and "STAND-IN" in row[1] for row in rows)
    assert len({row[3] for row in rows}) == 2, "every GPU has its own bus id"
    version = subprocess.run([sys.executable, smi, "--version"], capture_output=True, text=True, check=False)
    assert "DRIVER version      : 535.261.03" in version.stdout
    bad = subprocess.run(
        [sys.executable, smi, "--query-gpu=bogus", "--format=csv"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert 'Field "bogus" is not a valid field to query.' in bad.stdout


def _shape(field: str) -> str:
    """A field with each run of (hex) digits generalised: the layout a parser relies on."""
    return re.sub(r"[0-9a-f]+", "h", field)


@pytest.mark.parametrize("output_format", ["csv,noheader,nounits", "csv"])
def test_stand_in_nvidia_smi_answers_in_the_real_nvidia_smi_shape(tmp_path: Path, output_format: str) -> None:
    real = [line for line in (FIXTURES / "nvidia-smi-h200.txt").read_text().splitlines() if not line.startswith("#")]
    real = real[:1] if output_format.endswith("nounits") else real[1:]
    smi = _render(tmp_path, "nvidia-smi", "535.261.03-1", "nvidia-smi")
    fields = "index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,display_active,driver_version,compute_cap"
    answer = subprocess.run(
        [sys.executable, smi, f"--query-gpu={fields}", f"--format={output_format}"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    if output_format == "csv":
        assert answer[0] == real[0], "the header names and units differ from the real nvidia-smi's"
        answer, real = answer[1:], real[1:]
    real_row = real[0].split(", ")
    for row in (line.split(", ") for line in answer):
        assert len(row) == len(real_row)
        # The name and display_active (Enabled/Disabled) are words; every other field is numbers.
        assert row[1].startswith("NVIDIA ")
        assert row[7] in {"Enabled", "Disabled"}
        numeric = [index for index in range(len(row)) if index not in (1, 7)]
        assert [_shape(row[i]) for i in numeric] == [_shape(real_row[i]) for i in numeric], row


def _driver(tmp_path: Path, answer: str) -> dict[str, str]:
    """PATH with a FAKE nvidia-smi that prints `answer` as the running driver ('' fails, as with no driver)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n# FAKE nvidia-smi\n[ -n '{answer}' ] || exit 9\necho '{answer}'\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.mark.parametrize(
    ("running", "said"),
    [
        (
            "535.261.03",
            "Fabric Manager version 535.274.02 does not match the running NVIDIA driver version 535.261.03;"
            " it starts only with a driver of exactly its own version.",
        ),
        ("", "no NVIDIA driver answers (nvidia-smi failed): cannot start"),
    ],
)
def test_stand_in_fabric_manager_refuses_another_driver(tmp_path: Path, running: str, said: str) -> None:
    # The matching start (it forks a daemon under /run) runs in the nvidia_driver role's Molecule scenario.
    fm = _render(tmp_path, "nvidia-fabricmanager-535", "535.274.02-1", "nv-fabricmanager")
    result = subprocess.run(["sh", fm], capture_output=True, text=True, check=False, env=_driver(tmp_path, running))
    assert result.returncode == 1
    assert "llmfleet STAND-IN nv-fabricmanager 535.274.02: not NVIDIA's Fabric Manager" in result.stdout
    assert said in result.stderr


def test_stand_in_nvidia_ctk_writes_a_labelled_cdi_spec(tmp_path: Path) -> None:
    ctk = _render(tmp_path, "nvidia-container-toolkit-base", "1.18.2-1", "nvidia-ctk")
    version = subprocess.run([sys.executable, ctk, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("NVIDIA Container Toolkit CLI version 1.18.2\n")
    spec = tmp_path / "cdi" / "nvidia.yaml"
    subprocess.run([sys.executable, ctk, "cdi", "generate", f"--output={spec}"], check=True, capture_output=True)
    text = spec.read_text()
    assert text.startswith("# llmfleet STAND-IN")
    assert yaml.safe_load(text)["kind"] == "nvidia.com/gpu"
    stdout = subprocess.run([sys.executable, ctk, "cdi", "generate"], capture_output=True, text=True, check=True)
    assert stdout.stdout == text, "stdout and --output give the same specification"


def test_stand_in_nvcc_prints_the_release(tmp_path: Path) -> None:
    nvcc = _render(tmp_path, "cuda-nvcc-12-1", "12.1.1-1", "nvcc")
    output = subprocess.run(["sh", nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    assert "Cuda compilation tools, release 12.1, V12.1.1" in output
    assert "STAND-IN" in output


# --- A real build (equivs) ----------------------------------------------------


@pytest.mark.skipif(shutil.which("equivs-build") is None, reason="equivs is not installed")
def test_one_stand_in_builds_into_an_indexed_repository(tmp_path: Path) -> None:
    standin = _by_name("nvidia-smi", "535.261.03-1")
    repo = tmp_path / "repo"
    repo.mkdir()
    deb = standins._build_one(standin, standins.STANDINS_DIR, repo, standins._templates(tmp_path))
    standins._index(repo)
    [stanza] = standins.packages_index(repo)
    assert (stanza["Package"], stanza["Version"]) == ("nvidia-smi", "535.261.03-1")
    assert stanza["Description"].startswith(standins.STANDIN_LABEL)
    assert "./usr/bin/nvidia-smi" in subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True).stdout
    release = (repo / "Release").read_text()
    assert "Label: llmfleet STAND-IN packages (not NVIDIA's)" in release
    for name in ("Packages", "Packages.gz"):
        assert hashlib.sha256((repo / name).read_bytes()).hexdigest() in release, name
