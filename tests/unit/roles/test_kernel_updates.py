"""nvidia_driver_kernel_updates: security (the default) lets kernel updates in and reboots onto them safely; hold holds.

`security` releases a hold of the kernel and headers metapackages, and before
any reboot tasks/pending_kernel.yml makes sure a newer installed kernel has
the NVIDIA module (building it with DKMS, refusing the host when it cannot).
`hold` holds the installed metapackages of the running flavour, and warns.
The Molecule scenario runs in a container, which has no kernel packages or
kernels; here the tasks run as written, through ansible-playbook on
localhost, with the host's facts given, a FAKE dpkg-query, dpkg and dkms on
PATH, and FAKE /boot and /lib/modules trees under tmp_path. The fakes answer
from a table and record what they were asked: this machine's packages and
kernels are neither read nor changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "nvidia_driver"
CONFIGURE = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
PENDING_KERNEL = yaml.safe_load((ROLE / "tasks" / "pending_kernel.yml").read_text())
TASKS = [
    "configure | Read which kernel metapackages are installed, and held",
    "configure | Hold the kernel with the driver",
    "configure | Warn that a held kernel gets no security updates",
    "configure | Let kernel updates in",
]

DEBIAN_12 = {
    "distribution": "Debian",
    "distribution_version": "12.8",
    "distribution_major_version": "12",
    "os_family": "Debian",
    "kernel": "6.1.0-26-amd64",
}
UBUNTU_2204 = {
    "distribution": "Ubuntu",
    "distribution_version": "22.04",
    "distribution_major_version": "22",
    "os_family": "Debian",
    "kernel": "5.15.0-119-generic",
}
UBUNTU_2204_HWE = {**UBUNTU_2204, "kernel": "6.8.0-45-generic"}
UBUNTU_2404 = {
    "distribution": "Ubuntu",
    "distribution_version": "24.04",
    "distribution_major_version": "24",
    "os_family": "Debian",
    "kernel": "6.8.0-45-generic",
}


def _fake_dpkg(tmp_path: Path, states: dict[str, str]) -> Path:
    """FAKE dpkg-query and dpkg: package states from `states`; queries and new selections logged under tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A state is "<status> <want>", e.g. "installed hold"; a bare status wants install.
    lines = [f"{name} {state if ' ' in state else state + ' install'}\n" for name, state in states.items()]
    (tmp_path / "status").write_text("".join(lines))
    query = bin_dir / "dpkg-query"
    # The role's --showformat, which the fake emulates; any other call is an error.
    query.write_text(f"""#!/bin/sh
# FAKE dpkg-query for tests.
format='${{Package}} ${{db:Status-Status}} ${{db:Status-Want}}\\n'
if [ "$1" != --show ] || [ "$2" != --showformat ] || [ "$3" != "$format" ]; then
  echo "FAKE dpkg-query: unexpected call: $*" >&2; exit 2
fi
shift 3
echo "$*" >> {tmp_path}/queried
rc=0
for name in "$@"; do
  state=$(awk -v name="$name" '$1 == name {{print $2 " " $3}}' {tmp_path}/status)
  if [ -n "$state" ]; then echo "$name $state"; else echo "dpkg-query: no packages found matching $name" >&2; rc=1; fi
done
exit $rc
""")
    dpkg = bin_dir / "dpkg"
    dpkg.write_text(f"""#!/bin/sh
# FAKE dpkg for tests: what ansible.builtin.dpkg_selections calls.
case "$1" in
  --get-selections) awk -v name="$2" '$1 == name {{print $1 "\\t" $3}}' {tmp_path}/status ;;
  --set-selections) cat >> {tmp_path}/selections ;;
  *) echo "FAKE dpkg: unexpected call: $*" >&2; exit 2 ;;
esac
""")
    for tool in (query, dpkg):
        tool.chmod(0o755)
    return bin_dir


def _configure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, facts: dict[str, Any], states: dict[str, str], mode: str = "hold"
) -> tuple[list[str], list[str], list[str]]:
    """Run the kernel tasks of configure.yml for a host with `facts`: what dpkg-query was asked, held, released."""
    monkeypatch.setenv("PATH", f"{_fake_dpkg(tmp_path, states)}:{os.environ['PATH']}")
    tasks = [task for task in CONFIGURE if task["name"] in TASKS]
    assert [task["name"] for task in tasks] == TASKS, "configure.yml's kernel tasks changed: update this test"
    play = [
        {
            "name": "Kernel updates",
            "hosts": "all",
            "gather_facts": False,
            # As preflight loads them: vars/main.yml, then the distribution's file.
            "vars_files": [str(ROLE / "vars" / "main.yml"), str(ROLE / "vars" / f"{facts['distribution']}.yml")],
            "vars": {"nvidia_driver_kernel_updates": mode},
            "tasks": tasks,
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, playbook, json.dumps({"ansible_facts": facts}))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    queried = (tmp_path / "queried").read_text().split() if (tmp_path / "queried").exists() else []
    selections = (tmp_path / "selections").read_text().splitlines() if (tmp_path / "selections").exists() else []
    held = [line.split()[0] for line in selections if line.split()[1:] == ["hold"]]
    released = [line.split()[0] for line in selections if line.split()[1:] == ["install"]]
    assert len(held) + len(released) == len(selections), f"selections other than hold and install: {selections}"
    assert ("WARNING: nvidia_driver_kernel_updates is hold" in output) is (mode == "hold"), output[-3000:]
    return queried, held, released


@pytest.mark.parametrize(
    ("facts", "image", "headers"),
    [
        (DEBIAN_12, "linux-image-amd64", "linux-headers-amd64"),
        (UBUNTU_2204, "linux-image-generic", "linux-headers-generic"),
        # A hardware-enablement kernel (not 22.04's 5.15) follows the HWE metapackages.
        (UBUNTU_2204_HWE, "linux-image-generic-hwe-22.04", "linux-headers-generic-hwe-22.04"),
        (UBUNTU_2404, "linux-image-generic", "linux-headers-generic"),
    ],
    ids=["debian12", "ubuntu2204", "ubuntu2204-hwe", "ubuntu2404"],
)
def test_hold_holds_the_running_flavours_kernel_and_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, facts: dict[str, Any], image: str, headers: str
) -> None:
    states = {image: "installed", headers: "installed", "linux-image-6.1.0-26-amd64": "installed"}
    queried, held, _ = _configure(tmp_path, monkeypatch, facts, states, mode="hold")
    assert queried == [image, headers]
    # The metapackages only: the running kernel's own package keeps its security fixes.
    assert sorted(held) == sorted([image, headers])


def test_hold_leaves_metapackages_that_are_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Headers removed but not purged (config-files): holding them would bring nothing back.
    states = {"linux-image-amd64": "installed", "linux-headers-amd64": "config-files"}
    _, held, _ = _configure(tmp_path, monkeypatch, DEBIAN_12, states, mode="hold")
    assert held == ["linux-image-amd64"]


def test_hold_on_a_host_without_kernel_packages_holds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A container: dpkg-query knows neither package and exits 1, which is not a failure.
    queried, held, _ = _configure(tmp_path, monkeypatch, DEBIAN_12, {}, mode="hold")
    assert queried == ["linux-image-amd64", "linux-headers-amd64"]
    assert held == []


@pytest.mark.parametrize("mode", ["blacklist", "none"])
def test_the_other_modes_neither_hold_nor_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    states = {"linux-image-amd64": "installed hold", "linux-headers-amd64": "installed"}
    assert _configure(tmp_path, monkeypatch, DEBIAN_12, states, mode=mode) == ([], [], [])


def test_security_releases_an_earlier_hold_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    states = {"linux-image-generic": "installed hold", "linux-headers-generic": "installed"}
    queried, held, released = _configure(tmp_path, monkeypatch, UBUNTU_2204, states, mode="security")
    assert queried == ["linux-image-generic", "linux-headers-generic"]
    assert (held, released) == ([], ["linux-image-generic"])


def test_security_is_the_default() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["nvidia_driver_kernel_updates"] == "security"
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["nvidia_driver_kernel_updates"]
    assert option["default"] == "security" and option["choices"][0] == "security"


RUNNING = "6.1.0-26-amd64"


def _fake_kernels(tmp_path: Path, kernels: dict[str, bool], dkms_builds: bool) -> tuple[Path, Path, Path]:
    """FAKE /boot and /lib/modules (each kernel with or without an nvidia.ko) and a FAKE dkms on a PATH dir."""
    boot, modules, bin_dir = tmp_path / "boot", tmp_path / "modules", tmp_path / "bin"
    for directory in (boot, modules, bin_dir):
        directory.mkdir()
    for version, built in kernels.items():
        (boot / f"vmlinuz-{version}").write_text("FAKE kernel image\n")
        module_dir = modules / version / "updates" / "dkms"
        module_dir.mkdir(parents=True)
        if built:
            (module_dir / "nvidia.ko.zst").write_text("FAKE module\n")
    dkms = bin_dir / "dkms"
    # What DKMS does for `autoinstall -k`: builds the module, or fails as it does without headers.
    build = (
        f'mkdir -p {modules}/"$3"/updates/dkms && echo FAKE > {modules}/"$3"/updates/dkms/nvidia.ko'
        if dkms_builds
        else 'echo "Error! Your kernel headers for kernel $3 cannot be found." >&2; exit 1'
    )
    dkms.write_text(f'#!/bin/sh\n# FAKE dkms for tests.\necho "$*" >> {tmp_path}/dkms-calls\n{build}\n')
    dkms.chmod(0o755)
    return boot, modules, bin_dir


def _pending_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernels: dict[str, bool], dkms_builds: bool = False
) -> tuple[int, str, list[str], list[str]]:
    """Run tasks/pending_kernel.yml as verify.yml imports it: rc, output, the reboot reasons, the dkms calls."""
    boot, modules, bin_dir = _fake_kernels(tmp_path, kernels, dkms_builds)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    verify = yaml.safe_load((ROLE / "tasks" / "verify.yml").read_text())
    imported = next(task for task in verify if task.get("ansible.builtin.import_tasks") == "pending_kernel.yml")
    report = {
        "name": "Write down the reasons for a reboot",
        "ansible.builtin.copy": {
            "content": "{{ __nvidia_driver_reboot_reasons | to_json }}",
            "dest": str(tmp_path / "reasons.json"),
        },
    }
    play = [
        {
            "name": "Pending kernel",
            "hosts": "all",
            "gather_facts": False,
            "vars": {
                **imported["vars"],
                "__nvidia_driver_boot_dir": str(boot),
                "__nvidia_driver_modules_dir": str(modules),
                "__nvidia_driver_reboot_reasons": ["an earlier reason"],
            },
            "tasks": [{**task, "when": [imported["when"], *_when(task)]} for task in PENDING_KERNEL] + [report],
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    facts = {"ansible_facts": {**DEBIAN_12, "kernel": RUNNING}}
    result = run_local_playbook(tmp_path, playbook, json.dumps(facts), "nvidia_driver_kernel_updates=security")
    output = result.stdout + result.stderr
    reasons = json.loads((tmp_path / "reasons.json").read_text()) if (tmp_path / "reasons.json").exists() else []
    calls = (tmp_path / "dkms-calls").read_text().splitlines() if (tmp_path / "dkms-calls").exists() else []
    return result.returncode, output, reasons, calls


def _when(task: dict[str, Any]) -> list[Any]:
    when = task.get("when", [])
    return when if isinstance(when, list) else [when]


def test_no_newer_kernel_adds_no_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The running kernel and an older fallback, neither with a module it needs now.
    rc, output, reasons, calls = _pending_kernel(tmp_path, monkeypatch, {RUNNING: True, "6.1.0-9-amd64": False})
    assert rc == 0, output[-3000:]
    assert (reasons, calls) == (["an earlier reason"], [])


def test_a_newer_kernel_with_its_module_is_a_reason_to_reboot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 6.1.0-101 sorts above 6.1.0-26 as a version, below it as a string.
    rc, output, reasons, calls = _pending_kernel(tmp_path, monkeypatch, {RUNNING: True, "6.1.0-101-amd64": True})
    assert rc == 0, output[-3000:]
    assert calls == []
    assert reasons[0] == "an earlier reason"
    assert reasons[1].startswith(f"kernel 6.1.0-101-amd64 is installed and boots next (running {RUNNING})"), reasons


def test_a_missing_module_is_built_before_the_reboot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rc, output, reasons, calls = _pending_kernel(
        tmp_path, monkeypatch, {RUNNING: True, "6.1.0-27-amd64": False}, dkms_builds=True
    )
    assert rc == 0, output[-3000:]
    assert calls == ["autoinstall -k 6.1.0-27-amd64"]
    assert any(reason.startswith("kernel 6.1.0-27-amd64") for reason in reasons), reasons


def test_a_kernel_without_a_module_is_refused_and_not_rebooted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rc, output, _, calls = _pending_kernel(tmp_path, monkeypatch, {RUNNING: True, "6.1.0-27-amd64": False})
    assert rc != 0
    assert calls == ["autoinstall -k 6.1.0-27-amd64"]
    assert "boots kernel 6.1.0-27-amd64 at its next reboot" in output and "The host was not rebooted" in output
    assert "kernel headers for kernel 6.1.0-27-amd64 cannot be found" in output
    assert "Install linux-headers-6.1.0-27-amd64" in output
