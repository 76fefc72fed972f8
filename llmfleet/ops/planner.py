"""`llmfleet plan`: size the vLLM KV cache and engine flags from a model directory and the GPUs.

The facts come from the model check (plugins/module_utils/model_validation/:
config.json and safetensors headers), the arithmetic from
plugins/module_utils/capacity_planner.py, shared with the `capacity_plan`
filter. Exit 0 with the plan; 2 when the request cannot work (weights that do
not fit, a GPU count that does not divide the heads, a length past the model's
positions), one line per reason with the numbers; 1 for bad input.

Before the weights arrive: a directory holding only config.json, or
``--config FILE``, is planned with the weight bytes estimated from the
architecture's parameter count (capacity_planner.estimate_parameters), and the
plan says so. ``--gpu-facts FILE`` takes the GPU memory (and, without
``--gpus``, the GPU count) from the gpu_facts module's JSON instead of a flag.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from llmfleet.errors import LlmfleetError, RefusedError
from llmfleet.module_utils import capacity_planner, model_validation


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="size the KV cache and vLLM flags from a model directory and the GPUs",
        description=(
            "Compute the weight bytes (from safetensors headers), KV bytes per token per GPU"
            " (2 x layers x KV heads per GPU x head_dim x dtype bytes), the KV cache tokens that fit (in whole"
            " blocks, as vLLM counts them), the sequences that fit at --max-model-len, and suggested"
            " --tensor-parallel-size, --max-model-len, --max-num-seqs and --gpu-memory-utilization. Exit 0: the"
            " plan; 2: refused, one line per reason with the numbers; 1: bad input."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model", metavar="DIR", help="the model directory (only config.json needed: weights are then estimated)"
    )
    source.add_argument(
        "--config", metavar="FILE", help="a model's config.json alone: plan before the weights arrive (estimated)"
    )
    parser.add_argument(
        "--gpus", type=int, metavar="N", help="GPUs the engine gets (= its TP size); default: all in --gpu-facts"
    )
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument(
        "--gpu-memory-gib", type=float, metavar="G", help="memory of one GPU in GiB (required unless --kv-cache-gib)"
    )
    memory.add_argument(
        "--gpu-facts",
        metavar="FILE",
        help="the gpu_facts module's JSON (or the preflight role's gpus.fact): GPU memory = the smallest GPU's total",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=capacity_planner.DEFAULT_GPU_MEMORY_UTILIZATION,
        metavar="U",
        help=f"fraction of GPU memory vLLM may use (default {capacity_planner.DEFAULT_GPU_MEMORY_UTILIZATION})",
    )
    parser.add_argument("--max-model-len", type=int, metavar="L", help="context length (default: the model's)")
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        metavar="K",
        help="an explicit KV cache budget per GPU in GiB, e.g. the CPU engine's VLLM_CPU_KVCACHE_SPACE",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=capacity_planner.DEFAULT_BLOCK_SIZE,
        metavar="B",
        help=(
            f"KV cache block size (default {capacity_planner.DEFAULT_BLOCK_SIZE}, vLLM's CUDA default;"
            f" vLLM 0.32.0's CPU backend uses {capacity_planner.CPU_BLOCK_SIZE})"
        ),
    )
    parser.add_argument(
        "--reserve-gib", type=float, metavar="R", help="measured activation/runtime memory per GPU (default: estimated)"
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=sorted(capacity_planner.KV_CACHE_DTYPE_BYTES),
        help="KV cache element type (default auto: the model dtype)",
    )
    parser.add_argument(
        "--engine-version",
        default=model_validation.LAB_ENGINE_VERSION,
        metavar="V",
        help=f"the vLLM release (default {model_validation.LAB_ENGINE_VERSION}); only used to read the model",
    )
    parser.add_argument("--json", action="store_true", help="print the plan (or the refusal) as JSON")
    parser.set_defaults(handler=_plan)


def model_facts(model_dir: str, engine_version: str) -> tuple[dict[str, Any], list[str]]:
    """The planner's facts for model_dir, and the model check's problem lines (which may not matter here).

    Without weights (config.json only), weights_bytes is estimated from the
    architecture's parameter count and the facts say so (weights_estimated).
    """
    try:
        report = model_validation.check_model(model_dir, engine_version=engine_version, chat=False)
    except (ValueError, OSError) as error:
        raise LlmfleetError(str(error)) from error
    facts: dict[str, Any] = report["facts"]
    if not facts.get("weights_bytes") and not facts.get("weights_files"):
        try:
            facts = capacity_planner.with_estimated_weights(facts)
        except ValueError as error:
            raise RefusedError(f"cannot plan {model_dir} without its weights: {error}") from error
    missing = model_validation.missing_planner_facts(facts)
    if missing:
        raise RefusedError(
            f"cannot plan: {model_dir} does not give {', '.join(missing)}: "
            + " | ".join(report["problem_lines"] or ["see `llmfleet model check`"])
        )
    return facts, list(report["problem_lines"])


def config_facts(config_file: str, engine_version: str) -> tuple[dict[str, Any], list[str]]:
    """model_facts for a config.json alone, read from a temporary directory holding only it."""
    if not Path(config_file).is_file():
        raise LlmfleetError(f"--config {config_file}: no such file")
    with tempfile.TemporaryDirectory(prefix="llmfleet-plan-") as directory:
        shutil.copyfile(config_file, Path(directory) / "config.json")
        facts, problems = model_facts(directory, engine_version)
    return facts, [line.replace(directory + "/config.json", config_file) for line in problems]


def gpus_from_facts(path: str) -> tuple[int, float, str]:
    """(GPU count, memory of the smallest GPU in GiB, its name) from gpu_facts' JSON."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise LlmfleetError(f"--gpu-facts {path}: cannot read it as JSON: {error}") from error
    gpus = document.get("gpus") if isinstance(document, dict) else None
    if isinstance(document, dict) and isinstance(document.get("llmfleet_gpus"), dict):
        gpus = document["llmfleet_gpus"].get("gpus")
    sizes = [gpu for gpu in gpus or [] if isinstance(gpu, dict) and gpu.get("memory_total_mib")]
    if not sizes:
        raise LlmfleetError(
            f"--gpu-facts {path} lists no GPU with memory_total_mib (give the gpu_facts module's result)"
        )
    smallest = min(sizes, key=lambda gpu: int(gpu["memory_total_mib"]))
    return len(sizes), int(smallest["memory_total_mib"]) / 1024, str(smallest.get("name"))


def _plan(args: argparse.Namespace) -> int:
    if args.config:
        facts, problems = config_facts(args.config, args.engine_version)
    else:
        facts, problems = model_facts(args.model, args.engine_version)
    gpus, gpu_memory_gib = args.gpus, args.gpu_memory_gib
    if args.gpu_facts:
        count, gpu_memory_gib, name = gpus_from_facts(args.gpu_facts)
        gpus = gpus or count
        print(f"llmfleet: GPU memory from {args.gpu_facts}: {gpu_memory_gib:.2f} GiB ({name})", file=sys.stderr)
    if gpus is None:
        raise LlmfleetError("give --gpus N (or --gpu-facts FILE, whose GPUs it then counts)")
    try:
        plan = capacity_planner.plan(
            facts,
            gpus,
            gpu_memory_gib=gpu_memory_gib,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            kv_cache_gib=args.kv_cache_gib,
            block_size=args.block_size,
            reserve_gib=args.reserve_gib,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    except capacity_planner.PlanRefused as refused:
        if args.json:
            print(json.dumps({"ok": False, "reasons": refused.reasons}, indent=2))
        else:
            for reason in refused.reasons:
                print(f"llmfleet: refused {reason}", file=sys.stderr)
        return RefusedError.exit_code
    except ValueError as error:
        raise LlmfleetError(str(error)) from error
    if facts.get("weights_estimated"):
        print(
            f"llmfleet: note: no weights yet: {facts['weights_bytes']:,} weight bytes ESTIMATED from config.json"
            f" ({facts['parameters']:,} parameters x {facts['dtype_bytes']} bytes)",
            file=sys.stderr,
        )
    elif problems:
        print(
            f"llmfleet: warning: `llmfleet model check {args.model}` reports {len(problems)} problem(s) that do not"
            " change the plan; the model is not servable until they are fixed",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps({"ok": True, **plan, "model": _model_summary(facts)}, indent=2))
        return 0
    print(_text(args.model or args.config, facts, plan))
    return 0


def _model_summary(facts: dict[str, Any]) -> dict[str, Any]:
    keys = ("architecture", "layers", "attention_heads", "kv_heads", "head_dim", "dtype", "parameters", "max_positions",
            "weights_estimated")
    return {key: facts.get(key) for key in keys}


def _text(model: str, facts: dict[str, Any], plan: dict[str, Any]) -> str:
    gib = capacity_planner.gib
    if plan["kv_cache_source"] == "kv_cache_gib":
        budget = f"{gib(plan['kv_cache_bytes'])} per GPU (--kv-cache-gib)"
    else:
        estimate = ", estimated" if plan["reserve_is_estimate"] else ""
        budget = (
            f"{gib(plan['kv_cache_bytes'])} per GPU = {gib(plan['gpu_memory_bytes'])} x"
            f" {plan['gpu_memory_utilization']} - {gib(plan['weights_bytes_per_rank'])} weights"
            f" - {gib(plan['reserve_bytes'])} reserve{estimate}"
        )
    replicas = f", each replicated on {plan['kv_head_replicas']} GPUs" if plan["kv_head_replicas"] > 1 else ""
    estimate = (
        f" (ESTIMATED from config.json: {facts.get('parameters'):,} parameters x {facts.get('dtype_bytes')} bytes)"
        if plan.get("weights_estimated") else ""
    )
    lines = [
        f"model    {model}: {facts.get('architecture')}, {facts.get('layers')} layers, {facts.get('kv_heads')} KV"
        f" heads x head_dim {facts.get('head_dim')}, {facts.get('dtype')}, {plan['weights_bytes']:,} weight bytes"
        f"{estimate}",
        f"kv       {plan['kv_bytes_per_token']:,} bytes per token per GPU"
        f" (tensor-parallel {plan['tensor_parallel_size']}, {plan['kv_heads_per_rank']} KV head(s) per GPU{replicas})",
        f"budget   {budget}",
        f"cache    {plan['kv_cache_blocks']:,} blocks of {plan['block_size']} = {plan['kv_cache_tokens']:,} tokens",
        f"fits     {plan['sequences_at_max_model_len']:,} sequences of {plan['max_model_len']:,} tokens",
        f"flags    {' '.join(plan['suggested_args'])}",
    ]
    return "\n".join(lines)
