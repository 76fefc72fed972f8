"""Merge a LoRA adapter into its base with the pinned toolchain, then validate the result.

The merge itself is roles/python_toolchain/files/merge_adapter.py, run with the
toolchain venv's python (torch, transformers and PEFT live there, not in
llmfleet's venv); playbooks/merge_adapter.yml runs the same file on hosts.
Here it is run locally and its output directory checked with model_validation,
the same check the model_staging and vllm roles run.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.errors import LlmfleetError, RefusedError
from llmfleet.module_utils import model_validation
from llmfleet.paths import REPO_ROOT

MERGE_SCRIPT = REPO_ROOT / "roles" / "python_toolchain" / "files" / "merge_adapter.py"
# The script's exit code for refused input (see its docstring).
REFUSED = 2
# Adapter problems that stop vLLM serving an adapter but not a merge: merging
# is the fix model_validation suggests for each of them.
MERGEABLE = frozenset({"rank-too-big", "lora-bias", "dora", "modules-to-save", "unsupported-target-module"})


@dataclass(frozen=True)
class MergeResult:
    """What the merge wrote (the script's JSON line) and the model check of it."""

    out: Path
    written: dict[str, Any]
    report: dict[str, Any]


def merge_adapter(
    base: Path,
    adapter: Path,
    out: Path,
    python: Path,
    engine_version: str = model_validation.LAB_ENGINE_VERSION,
    chat: bool = True,
) -> MergeResult:
    """Merge adapter into base as the new directory out, then check out is servable.

    RefusedError when the script refuses its input or the merged model fails
    the check; LlmfleetError when the toolchain fails.
    """
    if not python.exists():
        raise LlmfleetError(
            f"no toolchain python at {python}: give the python of a venv with the pinned torch, transformers"
            " and peft (the python_toolchain role's <python_toolchain_dir>/bin/python)"
        )
    # The adapter must fit this base (names, shapes, layers) before anything is written.
    before = model_validation.check_model(str(base), adapters=[str(adapter)], engine_version=engine_version, chat=chat)
    blocking = [problem for problem in before["problems"] if problem["code"] not in MERGEABLE]
    if blocking:
        raise RefusedError(
            f"not merging {adapter} into {base}:\n"
            + "\n".join(f"{problem['file']}: {problem['message']}; fix: {problem['fix']}" for problem in blocking)
        )
    result = subprocess.run(
        [str(python), str(MERGE_SCRIPT), "--base", str(base), "--adapter", str(adapter), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode == REFUSED:
        raise RefusedError(result.stderr.strip().removeprefix("merge_adapter: refused: "))
    if result.returncode != 0:
        raise LlmfleetError(f"the merge failed (exit {result.returncode}):\n{result.stderr.strip()[-3000:]}")
    written: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    report = model_validation.check_model(str(out), engine_version=engine_version, chat=chat)
    if report["problems"]:
        raise RefusedError(
            f"the merged model in {out} is not servable by vLLM {report['engine_version']}:\n"
            + "\n".join(report["problem_lines"])
        )
    return MergeResult(out=out, written=written, report=report)
