"""plugins/modules/gpu_facts.py on the report the real H200 gave while a process held GPU memory.

tests/unit/fixtures/real-h200-faults/ was recorded on the lent H200 while holder.py (a real
process holding 4 GiB through PyTorch: the stand-in for a crashed engine that still holds its
memory) ran. Here a FAKE nvidia-smi replays that report, and the module, run as Ansible runs
it, must list the process as the module listed it on the H200.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from llmfleet.paths import REPO_ROOT
from tests.ansible_adhoc import run_module

FAULTS = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-faults"
RECORDED = json.loads((FAULTS / "gpu_facts-holder.json").read_text())
HOLDER = RECORDED["nvidia-smi"]["processes"][0]
# Read on the H200 from /proc, which the replay cannot have: the holder's command line.
FROM_PROC = {"cmdline"}


def _replayable_report(pid: int) -> tuple[str, int]:
    """The recorded report, and its holder's PID. The module reads /proc/PID here, so where this
    machine runs a process with the recorded PID, the holder gets one that is free."""
    xml = (FAULTS / "nvidia-smi-q-x-holder.xml").read_text()
    if not Path(f"/proc/{pid}").exists():
        return xml, pid
    free = next(candidate for candidate in range(4_194_303, 1, -1) if not Path(f"/proc/{candidate}").exists())
    return xml.replace(f"<pid>{pid}</pid>", f"<pid>{free}</pid>"), free


def _fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xml: str) -> None:
    (tmp_path / "report.xml").write_text(xml)
    caps = "\n".join(f"{gpu['pci_bus_id']}, {gpu['compute_capability']}" for gpu in RECORDED["nvidia-smi"]["gpus"])
    directory = tmp_path / "bin"
    directory.mkdir()
    program = directory / "nvidia-smi"
    program.write_text(f"""#!/bin/sh
# FAKE nvidia-smi: replays the report the real one printed on the lent H200 while holder.py ran.
case "$1" in
  -q) cat {tmp_path / "report.xml"} ;;
  --query-gpu=pci.bus_id,compute_cap) printf '%s\\n' '{caps}' ;;
  *) exit 2 ;;
esac
""")
    program.chmod(0o755)
    keep = [str(Path(sys.executable).parent), "/usr/bin", "/bin"]  # the venv's tools; no real nvidia-smi
    monkeypatch.setenv("PATH", os.pathsep.join([str(directory), *keep]))


def _without(entry: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key not in keys}


def test_the_holder_is_listed_as_the_module_listed_it_on_the_h200(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xml, pid = _replayable_report(HOLDER["pid"])
    _fake_nvidia_smi(tmp_path, monkeypatch, xml)
    run = run_module(tmp_path, "gpu_facts", {"source": "nvidia-smi"})
    assert run.returncode == 0, run.result
    result = run.result
    assert [_without(process, FROM_PROC) for process in result["processes"]] == [
        _without(HOLDER, FROM_PROC) | {"pid": pid}
    ]
    # On the host, not in a container: the preflight role counts it as stray.
    assert result["processes"][0]["container_id"] is None
    # The report and the module's reading on the H200 were two reads, seconds apart:
    # the power draw and the temperature moved.
    moving = {"power_draw_w", "temperature_c"}
    assert [_without(gpu, moving) for gpu in result["gpus"]] == [
        _without(gpu, moving) for gpu in RECORDED["nvidia-smi"]["gpus"]
    ]
    assert result["gpus"][0]["memory_used_mib"] >= HOLDER["used_memory_mib"]


def test_nvml_and_nvidia_smi_listed_the_holder_alike_on_the_h200() -> None:
    # The preflight role read NVML there; the replays read nvidia-smi's report. Both named the
    # same process with the same memory, so the role's message is the same either way.
    assert RECORDED["nvml"]["processes"] == RECORDED["nvidia-smi"]["processes"]
    assert HOLDER["used_memory_mib"] > 4096  # the 4 GiB PyTorch allocated, plus its CUDA context
