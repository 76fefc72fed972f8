"""plugins/modules/gpu_facts.py, run as Ansible runs it, with nvidia-smi programs on PATH.

Where the test machine has no NVML (no GPU), the module falls back to
`nvidia-smi -q -x`. The programs here: a FAKE nvidia-smi that prints the real
H200 report recorded on the lent machine (tests/unit/fixtures/real-h200/), the
lab's STAND-IN nvidia-smi (files/standins/), a FAKE one failing as nvidia-smi
does without a driver, and none at all.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from llmfleet.lab import standins
from llmfleet.paths import REPO_ROOT
from tests.ansible_adhoc import run_module

REAL = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200"
RECORDED = json.loads((REAL / "gpu_facts.json").read_text())


def _bin(tmp_path: Path, text: str) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    program = directory / "nvidia-smi"
    program.write_text(text)
    program.chmod(0o755)
    return directory


def _path(monkeypatch: pytest.MonkeyPatch, directory: Path | None) -> None:
    # Keep the directories of the venv's tools; leave out any real nvidia-smi.
    keep = [str(Path(sys.executable).parent), "/usr/bin", "/bin"]
    monkeypatch.setenv("PATH", os.pathsep.join(([str(directory)] if directory else []) + keep))


def _real_h200(tmp_path: Path) -> Path:
    return _bin(tmp_path, f"""#!/bin/sh
# FAKE nvidia-smi: replays the report the real one printed on the lent H200.
case "$1" in
  -q) cat {REAL / "nvidia-smi-q-x.xml"} ;;
  --query-gpu=pci.bus_id,compute_cap) echo "00000000:00:06.0, 9.0" ;;
  *) exit 2 ;;
esac
""")


def test_the_real_h200_report_gives_what_the_module_gave_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _path(monkeypatch, _real_h200(tmp_path))
    run = run_module(tmp_path, "gpu_facts", {"source": "nvidia-smi"})
    assert run.returncode == 0, run.result
    result = run.result
    assert (result["state"], result["source"], result["changed"]) == ("ok", "nvidia-smi", False)
    # The same report, read again: what moves between two reads is the power draw.
    moving = {"power_draw_w"}
    assert [{k: v for k, v in gpu.items() if k not in moving} for gpu in result["gpus"]] == [
        {k: v for k, v in gpu.items() if k not in moving} for gpu in RECORDED["nvidia-smi"]["gpus"]
    ]
    assert result["gpus"][0]["compute_capability"] == "9.0"  # from the query interface
    assert result["ansible_facts"]["llmfleet_gpus"]["driver_version"] == "580.159.04"


def test_auto_falls_back_to_nvidia_smi_without_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _path(monkeypatch, _real_h200(tmp_path))
    result = run_module(tmp_path, "gpu_facts", {"source": "auto"}, check_mode=True).result
    assert result["source"] == "nvidia-smi"
    assert "NVML" in result["fallback_reason"] or "pynvml" in result["fallback_reason"]
    assert result["gpus"][0]["name"] == "NVIDIA H200"


def test_the_lab_stand_in_goes_through_the_same_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    standin = next(s for s in standins.load_standins() if s.name == "nvidia-smi" and s.version == "535.261.03-1")
    directory = _bin(tmp_path, standins.render_file(standin, (standins.STANDINS_DIR / "nvidia-smi").read_text()))
    _path(monkeypatch, directory)
    result = run_module(tmp_path, "gpu_facts", {"source": "nvidia-smi"}).result
    assert result["driver_version"] == "535.261.03"
    assert [(g["index"], g["memory_free_mib"], g["compute_capability"]) for g in result["gpus"]] == [
        (0, 22462, "8.9"), (1, 24207, "8.9")
    ]


FAILING = """#!/bin/sh
# FAKE nvidia-smi: fails as the real one does when the driver is not loaded.
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""


@pytest.mark.parametrize(
    ("program", "state", "words"),
    [
        (None, "absent", "nvidia-smi is not installed"),
        (FAILING, "failing", "couldn't communicate with the NVIDIA driver"),
    ],
    ids=["no-driver", "driver-not-answering"],
)
def test_no_driver_is_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str | None, state: str, words: str
) -> None:
    _path(monkeypatch, _bin(tmp_path, program) if program else None)
    failed = run_module(tmp_path, "gpu_facts", {"required": True}).result
    assert failed["failed"] is True
    assert failed["state"] == state
    assert "no NVIDIA driver answers on this host" in failed["msg"] and words in failed["msg"]
    assert "the nvidia_driver role" in failed["msg"]
    judged: dict[str, Any] = run_module(tmp_path, "gpu_facts", {"required": False}).result
    assert judged["failed"] is False
    assert (judged["state"], judged["gpus"]) == (state, [])
