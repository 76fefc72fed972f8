"""`llmfleet model make-tiny|make-tiny-adapter`: the lab's generated models.

These commands share the `llmfleet model` group with the operator's checks
(llmfleet.ops.model); llmfleet.cli gathers both into it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeAlias

from llmfleet.lab.tiny import make_tiny_model
from llmfleet.lab.tiny_adapter import DEFAULT_RANK, DEFAULT_TARGETS, make_tiny_adapter, parse_targets

# argparse's sub-parser action has no public name; this alias is only for typing.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _make_tiny(args: argparse.Namespace) -> int:
    model = make_tiny_model(Path(args.dir), seed=args.seed)
    print(f"wrote a tiny Qwen2 model (seed {model.seed}, {model.size_bytes} bytes) to {model.path}")
    return 0


def register_make_tiny(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "make-tiny",
        help="write a tiny random-weight Qwen2 model that vLLM can serve",
        description=(
            "Write a tiny Qwen2ForCausalLM (2 layers, hidden 128, bf16 random weights) with a"
            " locally trained byte-level BPE tokenizer and a ChatML chat template into DIR."
            " Nothing is downloaded. The same seed gives byte-identical files. DIR must be"
            " missing, empty, or an earlier tiny model."
        ),
    )
    parser.add_argument("dir", metavar="DIR", help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights (default 0)")
    parser.set_defaults(handler=_make_tiny)


def _make_tiny_adapter(args: argparse.Namespace) -> int:
    adapter = make_tiny_adapter(
        Path(args.dir),
        Path(args.base),
        seed=args.seed,
        targets=parse_targets(args.targets),
        rank=args.rank,
        alpha=args.alpha,
    )
    print(
        f"wrote a tiny LoRA adapter (r={adapter.rank}, targets {','.join(adapter.targets)}, seed {adapter.seed},"
        f" {adapter.size_bytes} bytes) for {adapter.base} to {adapter.path}"
    )
    return 0


def register_make_tiny_adapter(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "make-tiny-adapter",
        help="write a tiny random-weight PEFT LoRA adapter for a base model directory",
        description=(
            "Write a PEFT-format LoRA adapter (adapter_config.json with peft_type LORA, and"
            " adapter_model.safetensors with lora_A [r, in] and lora_B [out, r] for every layer and target"
            " module, in bf16) whose shapes fit the base model's config.json. Nothing is downloaded. The same"
            " seed and base give byte-identical files. DIR must be missing, empty, or an earlier tiny adapter."
        ),
    )
    parser.add_argument("dir", metavar="DIR", help="directory to write the adapter into")
    parser.add_argument("--base", required=True, metavar="MODEL_DIR", help="the base model (bf16), e.g. a tiny model")
    parser.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        metavar="M1,M2",
        help=f"comma-separated target modules (default {','.join(DEFAULT_TARGETS)})",
    )
    parser.add_argument("--rank", type=int, default=DEFAULT_RANK, help=f"LoRA rank r (default {DEFAULT_RANK})")
    parser.add_argument("--alpha", type=int, default=None, help="lora_alpha (default 2 x rank)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights (default 0)")
    parser.set_defaults(handler=_make_tiny_adapter)


def register(subparsers: Subparsers) -> None:
    """Add make-tiny and make-tiny-adapter to the `llmfleet model` group's sub-parsers."""
    register_make_tiny(subparsers)
    register_make_tiny_adapter(subparsers)
