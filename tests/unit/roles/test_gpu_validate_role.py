"""The gpu_validate role end to end on localhost, replaying the real H200's readings.

ansible-playbook runs the role against localhost with a FAKE nvidia-smi that
prints the report recorded on the lent H200 and a FAKE toolchain Python that
prints the figures measured there (or an altered copy): the role's plumbing
(gpu_facts, probe, judging filter, JSON file, local facts, verdict) runs for
real; only the GPU is replayed. A slow GPU must fail the play, naming the GPU
and the figure; a host without a GPU is refused unless allowed.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmfleet.paths import REPO_ROOT
from tests.tools import venv_tool

REAL = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200"
MEASURED = json.loads((REAL / "gpu_validate.json").read_text())["measurements"]


def _fakes(tmp_path: Path, measurements: dict[str, Any] | None) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if measurements is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"""#!/bin/sh
# FAKE nvidia-smi: replays the report the real one printed on the lent H200.
case "$1" in
  -q) cat {REAL / "nvidia-smi-q-x.xml"} ;;
  *) echo "00000000:00:06.0, 9.0" ;;
esac
""")
        smi.chmod(0o755)
    (tmp_path / "measured.json").write_text(json.dumps(measurements or {}))
    python = bin_dir / "toolchain-python"
    python.write_text(f"""#!/bin/sh
# FAKE toolchain Python: answers the probe and prints the figures measured on the lent H200.
case "$*" in
  *--probe*) echo '{{"device_count": 1}}' ;;
  *) cat {tmp_path / "measured.json"} ;;
esac
""")
    python.chmod(0o755)
    playbook = tmp_path / "play.yml"
    playbook.write_text("- name: Validate\n  hosts: all\n  gather_facts: false\n  roles: [{role: gpu_validate}]\n")
    return {"bin": str(bin_dir), "python": str(python), "playbook": str(playbook)}


def _play(tmp_path: Path, measurements: dict[str, Any] | None, *extra: str) -> subprocess.CompletedProcess[str]:
    fakes = _fakes(tmp_path, measurements)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
           "PATH": os.pathsep.join([fakes["bin"], str(Path(sys.executable).parent), "/usr/bin", "/bin"])}
    command = [
        venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", fakes["playbook"],
        "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"gpu_validate_python={fakes['python']}",
        "-e", json.dumps({"gpu_validate_results_path": str(tmp_path / "out" / "gpu_validate.json"),
                          "gpu_validate_script_dir": str(tmp_path / "libexec"),
                          "__gpu_validate_facts_dir": str(tmp_path / "facts.d"),
                          "__gpu_validate_facts_file": str(tmp_path / "facts.d" / "gpu_validate.fact")}),
        *extra,
    ]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)


def test_the_real_h200_passes_and_its_figures_are_kept(tmp_path: Path) -> None:
    result = _play(tmp_path, MEASURED)
    assert result.returncode == 0, result.stdout[-3000:]
    facts = json.loads((tmp_path / "facts.d" / "gpu_validate.fact").read_text())
    assert facts["ok"] is True
    assert facts["gpus"][0]["matmul_bf16_tflops"] == 769.8
    kept = json.loads((tmp_path / "out" / "gpu_validate.json").read_text())
    assert kept["report"]["ok"] is True and kept["measurements"] == MEASURED


def test_a_slow_gpu_fails_the_play_naming_it_and_the_figure(tmp_path: Path) -> None:
    slow = copy.deepcopy(MEASURED)
    slow["gpus"][0]["copy"]["gbs"] = 2100.0
    result = _play(tmp_path, slow)
    assert result.returncode != 0
    assert "GPU validation failed on localhost (1 problem(s)" in result.stdout
    assert "GPU 0 (NVIDIA H200, GPU-217ee39e-ed23-4138-ecce-08c8168c2179): device-to-device copy 2100.0 GB/s is BELOW" \
        in " ".join(result.stdout.split())
    facts = json.loads((tmp_path / "facts.d" / "gpu_validate.fact").read_text())
    assert facts["ok"] is False and facts["gpus"][0]["status"]["copy"] == "FAIL"


@pytest.mark.parametrize("allowed", [False, True], ids=["refused", "allowed"])
def test_a_host_without_a_gpu(tmp_path: Path, allowed: bool) -> None:
    result = _play(tmp_path, None, "-e", json.dumps({"gpu_validate_allow_no_gpu": allowed}))
    text = " ".join(result.stdout.split())
    if allowed:
        assert result.returncode == 0, text[-2000:]
        assert "HAS NO WORKING NVIDIA GPU: NOTHING WAS VALIDATED" in text
    else:
        assert result.returncode != 0
        assert "gpu_validate: localhost has no working NVIDIA GPU to validate" in text
    assert not (tmp_path / "facts.d" / "gpu_validate.fact").exists()
