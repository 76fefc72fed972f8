"""nvidia_driver refuses to reboot onto a module Secure Boot would reject, with the enrolment steps.

No container or CI machine boots with Secure Boot, so neither the lab nor
Molecule reaches this. Here the role's own pieces run on localhost: its
probe script (files/secure-boot-mok.sh) against a FAKE mokutil that answers
as the real one does, and its refusal task, taken as written from
tasks/verify.yml, through ansible-playbook with the probe's answers. Nothing
on this machine is read or changed beyond the temporary directory.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "nvidia_driver"
PROBE = ROLE / "files" / "secure-boot-mok.sh"
VERIFY = yaml.safe_load((ROLE / "tasks" / "verify.yml").read_text())
REFUSE = "verify | Refuse to reboot onto a module Secure Boot would reject"
MOK_KEYS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__nvidia_driver_mok_keys"]


def _fake_mokutil(tmp_path: Path, answers: dict[str, str]) -> Path:
    """A FAKE mokutil: Secure Boot on, and for --test-key KEY the line the real one prints for that state."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = {
        "enrolled": "is already enrolled",
        "pending": "is already in the enrollment request",
        "not-enrolled": "is not enrolled",
    }
    cases = "".join(f'  "{key}") echo "$2 {lines[state]}" ;;\n' for key, state in answers.items())
    mokutil = bin_dir / "mokutil"
    mokutil.write_text(f"""#!/bin/sh
# FAKE mokutil for tests: answers as the real one does.
case "$1" in
  --sb-state) echo "SecureBoot enabled" ;;
  --test-key)
    case "$2" in
{cases}    esac ;;
esac
""")
    mokutil.chmod(0o755)
    return bin_dir


def test_the_probe_reports_each_keys_enrolment(tmp_path: Path) -> None:
    keys = {name: tmp_path / f"{name}.der" for name in ("enrolled", "pending", "not-enrolled")}
    for path in keys.values():
        path.write_bytes(b"key")
    absent = tmp_path / "absent.der"
    bin_dir = _fake_mokutil(tmp_path, {str(path): state for state, path in keys.items()})
    result = subprocess.run(
        ["/bin/sh", str(PROBE), *map(str, keys.values()), str(absent)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True, check=True, timeout=30,
    )
    report = json.loads(result.stdout)
    assert report["keys"] == {**{str(path): state for state, path in keys.items()}, str(absent): "absent"}
    # The firmware's state comes from /sys/firmware/efi, which a test cannot fake.
    assert report["state"] == ("enabled" if Path("/sys/firmware/efi").is_dir() else "no-efi")


def test_the_refusal_comes_before_the_reboot() -> None:
    names = [task["name"] for task in VERIFY]
    reboots = [index for index, task in enumerate(VERIFY) if "ansible.builtin.reboot" in task]
    assert reboots, "verify.yml no longer reboots: update this test"
    assert names.index(REFUSE) < min(reboots)


def _refuse(tmp_path: Path, state: str, keys: dict[str, str]) -> subprocess.CompletedProcess[str]:
    task = next(task for task in VERIFY if task["name"] == REFUSE)
    play = [{
        "name": "Secure Boot", "hosts": "all", "gather_facts": False,
        "vars": {"__nvidia_driver_mok_keys": MOK_KEYS,
                 "__nvidia_driver_secure_boot_probe": {"stdout": json.dumps({"state": state, "keys": keys})}},
        "tasks": [task],
    }]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    return run_local_playbook(tmp_path, playbook)


NOT_ENROLLED = {MOK_KEYS[0]: "not-enrolled", MOK_KEYS[1]: "absent"}


@pytest.mark.parametrize(
    ("state", "keys", "refused"),
    [
        ("enabled", NOT_ENROLLED, True),
        ("enabled", {MOK_KEYS[0]: "absent", MOK_KEYS[1]: "pending"}, True),
        ("enabled", {MOK_KEYS[0]: "absent", MOK_KEYS[1]: "enrolled"}, False),
        ("disabled", NOT_ENROLLED, False),
        ("no-efi", NOT_ENROLLED, False),
    ],
)
def test_only_secure_boot_without_an_enrolled_key_refuses(
    tmp_path: Path, state: str, keys: dict[str, str], refused: bool
) -> None:
    result = _refuse(tmp_path, state, keys)
    output = result.stdout + result.stderr
    assert (result.returncode != 0) == refused, output[-3000:]
    # Passed, not skipped: the check ran.
    assert refused or "ok: [localhost]" in output, output[-3000:]


def _message(tmp_path: Path, keys: dict[str, Any]) -> str:
    result = _refuse(tmp_path, "enabled", keys)
    assert result.returncode != 0
    return re.sub(r"\s+", " ", result.stdout + result.stderr)


def test_the_refusal_names_the_key_and_the_steps(tmp_path: Path) -> None:
    message = _message(tmp_path, NOT_ENROLLED)
    assert "The host was not rebooted" in message, message
    assert f"sudo mokutil --import {MOK_KEYS[0]}" in message, message
    assert "Enroll MOK" in message and f"mokutil --test-key {MOK_KEYS[0]}" in message, message
    assert "only step 2 is left" not in message, message


def test_a_pending_enrolment_says_only_the_reboot_is_left(tmp_path: Path) -> None:
    message = _message(tmp_path, {MOK_KEYS[0]: "absent", MOK_KEYS[1]: "pending"})
    assert f"sudo mokutil --import {MOK_KEYS[1]}" in message, message
    assert "only step 2 is left" in message, message
