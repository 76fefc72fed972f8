"""The preflight role on the faults provoked on the real H200, replayed on localhost.

tests/unit/fixtures/real-h200-faults/ holds what the role said there (collect.sh ran its
preflight.yml three times): with holder.py holding GPU memory (a real process, the stand-in
for a crashed engine that still holds its memory), after holder.py was killed, and with
/dev/shm remounted at 64 MiB. Here the same playbook runs the role on localhost with a
FAKE nvidia-smi that replays the report recorded there and, for /dev/shm, a FAKE df that
replays `df -P -k /dev/shm` as recorded there: the role's probes, judging and verdict run
for real, and each provoked check must come out as it came out on the H200, word for word.

This machine is not the H200: it has no GPU on its PCI bus (preflight_allow_no_gpu) and its
own OS, disks and kernel, so only the provoked checks are compared, not the whole verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import venv_tool

FAULTS = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-faults"
PLAYBOOK = FAULTS / "preflight.yml"
# The report of the real H200 with no process holding memory (recorded on 2026-12-01).
IDLE_REPORT = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200" / "nvidia-smi-q-x.xml"
HOLDER_REPORT = FAULTS / "nvidia-smi-q-x-holder.xml"
HOLDER_FACTS = json.loads((FAULTS / "gpu_facts-holder.json").read_text())["nvidia-smi"]
HOLDER, HOLDER_GPU = HOLDER_FACTS["processes"][0], HOLDER_FACTS["gpus"][0]
SHM_MIN_MIB = yaml.safe_load((REPO_ROOT / "roles" / "preflight" / "defaults" / "main.yml").read_text())[
    "preflight_shm_min_mib"
]


def _recorded(name: str) -> dict[str, Any]:
    outcome: dict[str, Any] = json.loads((FAULTS / f"preflight-{name}.json").read_text())
    return outcome


def _check(outcome: dict[str, Any], check: str) -> dict[str, Any]:
    found = [result for result in outcome["results"] if result["check"] == check]
    assert len(found) == 1, outcome["results"]
    return found[0]


def _replayable(xml: str) -> tuple[str, int]:
    """The report, and its holder's PID. gpu_facts reads /proc/PID on this machine, so where it
    runs a process with the recorded PID, the holder gets one that is free."""
    pid: int = HOLDER["pid"]
    if not Path(f"/proc/{pid}").exists():
        return xml, pid
    free = next(candidate for candidate in range(4_194_303, 1, -1) if not Path(f"/proc/{candidate}").exists())
    return xml.replace(f"<pid>{pid}</pid>", f"<pid>{free}</pid>"), free


def _play(
    tmp_path: Path, report: str, df_dev_shm: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run the recorded playbook with the FAKE programs; its result and the outcome it kept."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "report.xml").write_text(report)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
# FAKE nvidia-smi: replays a report the real one printed on the lent H200.
case "$1" in
  -q) cat {tmp_path / "report.xml"} ;;
  --query-gpu=pci.bus_id,compute_cap) echo "{HOLDER_GPU['pci_bus_id']}, {HOLDER_GPU['compute_capability']}" ;;
  *) exit 2 ;;
esac
""")
    smi.chmod(0o755)
    if df_dev_shm is not None:
        df = bin_dir / "df"
        df.write_text(f"""#!/bin/sh
# FAKE df: for /dev/shm, replays what the real one printed on the lent H200; otherwise the real df.
for last; do :; done
if [ "$last" = /dev/shm ]; then cat {df_dev_shm}; else exec /bin/df "$@"; fi
""")
        df.chmod(0o755)
    out = tmp_path / "outcome.json"
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
           "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])}
    command = [
        venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(PLAYBOOK),
        "-e", f"ansible_python_interpreter={sys.executable}",
        "-e", json.dumps({"preflight_faults_out": str(out), "preflight_allow_no_gpu": True,
                          "preflight_disk_requirements": [],
                          "preflight_report_path": str(tmp_path / "report" / "preflight.txt"),
                          "__preflight_facts_dir": str(tmp_path / "facts.d"),
                          "__preflight_facts_file": str(tmp_path / "facts.d" / "gpus.fact")}),
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert out.is_file(), result.stdout[-3000:] + result.stderr[-2000:]
    outcome: dict[str, Any] = json.loads(out.read_text())
    return result, outcome


def test_a_process_holding_gpu_memory_fails_gpu_processes_as_on_the_h200(tmp_path: Path) -> None:
    report, pid = _replayable(HOLDER_REPORT.read_text())
    result, outcome = _play(tmp_path, report)
    recorded = _check(_recorded("holder"), "gpu-processes")
    assert recorded["status"] == "FAIL"
    expected = recorded["detail"].replace(f"pid {HOLDER['pid']} ", f"pid {pid} ")
    assert _check(outcome, "gpu-processes") == {"check": "gpu-processes", "status": "FAIL", "detail": expected}
    # The message names the GPU, the process, where it runs and what it holds, and what to do.
    held = HOLDER["used_memory_mib"]
    assert expected.startswith(f"GPU 0: pid {pid} ({HOLDER['name']}, on the host) holds {held} MiB.")
    assert "Stop it (kill the pid, or docker rm -f the container), then rerun" in expected
    # The play fails, and the role's failure message carries the check as it did on the H200.
    assert result.returncode != 0
    assert outcome["failed"] is True and outcome["task"] == "verdict | Fail on what would break serving"
    assert f"[gpu-processes] {expected}" in outcome["msg"]
    assert f"[gpu-processes] {recorded['detail']}" in _recorded("holder")["msg"]


def test_with_the_process_killed_gpu_processes_passes_as_on_the_h200(tmp_path: Path) -> None:
    _result, outcome = _play(tmp_path, IDLE_REPORT.read_text())
    recorded = _check(_recorded("after-kill"), "gpu-processes")
    assert recorded["status"] == "PASS" and _recorded("after-kill")["failed"] is False
    assert _check(outcome, "gpu-processes") == recorded
    assert "[gpu-processes]" not in (outcome["msg"] or "")


def test_a_64_mib_dev_shm_fails_dev_shm_as_on_the_h200(tmp_path: Path) -> None:
    result, outcome = _play(tmp_path, IDLE_REPORT.read_text(), df_dev_shm=FAULTS / "df-dev-shm.txt")
    recorded = _check(_recorded("shm"), "dev-shm")
    assert recorded["status"] == "FAIL"
    assert _check(outcome, "dev-shm") == recorded
    # The size comes from the replayed df (65536 KiB there), the advice from the role.
    size_kib = int((FAULTS / "df-dev-shm.txt").read_text().splitlines()[1].split()[1])
    assert recorded["detail"].startswith(f"/dev/shm is {size_kib // 1024} MiB, {SHM_MIN_MIB} MiB needed.")
    assert "--shm-size or --ipc=host" in recorded["detail"]
    assert result.returncode != 0
    assert outcome["failed"] is True and f"[dev-shm] {recorded['detail']}" in outcome["msg"]
    assert f"[dev-shm] {recorded['detail']}" in _recorded("shm")["msg"]
