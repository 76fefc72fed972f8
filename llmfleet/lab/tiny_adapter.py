"""A tiny, real PEFT LoRA adapter for a base model directory, made without torch or PEFT.

The model checks and LoRA serving tests need an adapter whose shapes fit a
base model exactly, and nothing can be downloaded. So llmfleet writes one in
PEFT's on-disk format, the format vLLM's `--lora-modules name=path` loads:

- adapter_config.json: peft_type LORA, task_type CAUSAL_LM, r, lora_alpha,
  target_modules and base_model_name_or_path (the base directory, resolved);
- adapter_model.safetensors: for every layer and target module,
  `base_model.model.model.layers.N.<self_attn|mlp>.<module>.lora_A.weight`
  [r, in_features] and `...lora_B.weight` [out_features, r], in bf16 through the
  same writer as the tiny model (llmfleet.lab.tiny.safetensors_bytes).

Unlike PEFT's initialisation, lora_B is not zero: an adapter that changes the
model's output lets a serving test tell adapter from base. Same seed and base,
same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmfleet.errors import LlmfleetError
from llmfleet.lab.tiny import FloatArray, safetensors_bytes, write_generated_dir
from llmfleet.module_utils import model_validation

ADAPTER_CONFIG = model_validation.ADAPTER_CONFIG
ADAPTER_WEIGHTS = model_validation.ADAPTER_WEIGHTS
MARKER = "llmfleet-tiny-adapter.json"
FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, MARKER)

DEFAULT_TARGETS = ("q_proj", "v_proj")
DEFAULT_RANK = 8
INIT_STD = 0.02
# The linear modules of a Qwen2/Llama decoder layer, and the block each sits in.
MODULE_BLOCK = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


@dataclass(frozen=True)
class TinyAdapter:
    """What make_tiny_adapter wrote."""

    path: Path
    base: Path
    seed: int
    rank: int
    targets: tuple[str, ...]
    files: tuple[Path, ...]

    @property
    def size_bytes(self) -> int:
        return sum(file.stat().st_size for file in self.files)


def parse_targets(text: str) -> tuple[str, ...]:
    """ "q_proj,v_proj" -> ("q_proj", "v_proj"), refusing modules the generator cannot shape."""
    targets = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [target for target in targets if target not in MODULE_BLOCK]
    if not targets or unknown:
        raise LlmfleetError(
            f"--targets must name modules from {', '.join(MODULE_BLOCK)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    return targets


def _base_facts(base: Path) -> dict[str, Any]:
    try:
        report = model_validation.check_model(str(base), chat=False)
    except ValueError as error:
        raise LlmfleetError(str(error)) from error
    facts: dict[str, Any] = report["facts"]
    if facts.get("weights_dtype") != "bfloat16":
        raise LlmfleetError(
            f"{base}: the tiny adapter writer makes bf16 adapters for bf16 bases;"
            f" this base's weights are {facts.get('weights_dtype')}"
        )
    return facts


def adapter_tensor_shapes(facts: dict[str, Any], targets: Sequence[str], rank: int) -> dict[str, tuple[int, int]]:
    """Every LoRA tensor of the adapter with its shape, from the base model's facts."""
    module_shapes = model_validation.lora_module_shapes(facts)
    layers = facts.get("layers")
    missing = [target for target in targets if target not in module_shapes]
    if not layers or missing:
        raise LlmfleetError(f"the base model's config.json does not size {', '.join(missing) or 'its layers'}")
    shapes: dict[str, tuple[int, int]] = {}
    for layer in range(int(layers)):
        for target in targets:
            in_features, out_features = module_shapes[target]
            prefix = f"base_model.model.model.layers.{layer}.{MODULE_BLOCK[target]}.{target}"
            shapes[f"{prefix}.lora_A.weight"] = (rank, in_features)
            shapes[f"{prefix}.lora_B.weight"] = (out_features, rank)
    return shapes


def adapter_config(base: Path, targets: Sequence[str], rank: int, alpha: int) -> dict[str, Any]:
    """adapter_config.json as PEFT writes it for a plain LoRA adapter."""
    return {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": str(base.resolve()),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "rank_pattern": {},
        "revision": None,
        "target_modules": list(targets),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }


def _json_bytes(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def tiny_adapter_files(
    base: Path, seed: int, targets: Sequence[str] = DEFAULT_TARGETS, rank: int = DEFAULT_RANK, alpha: int | None = None
) -> dict[str, bytes]:
    """The name and content of every file of the adapter."""
    if rank < 1:
        raise LlmfleetError(f"--rank must be a positive integer, got {rank}")
    facts = _base_facts(base)
    shapes = adapter_tensor_shapes(facts, targets, rank)
    rng = np.random.default_rng(seed)
    tensors: dict[str, FloatArray] = {
        name: rng.normal(0.0, INIT_STD, size=shapes[name]).astype(np.float32) for name in sorted(shapes)
    }
    marker = {"generator": "llmfleet model make-tiny-adapter", "seed": seed, "format": 1}
    return {
        ADAPTER_CONFIG: _json_bytes(adapter_config(base, targets, rank, alpha if alpha is not None else 2 * rank)),
        ADAPTER_WEIGHTS: safetensors_bytes(tensors),
        MARKER: _json_bytes(marker),
    }


def make_tiny_adapter(
    path: Path,
    base: Path,
    seed: int = 0,
    targets: Sequence[str] = DEFAULT_TARGETS,
    rank: int = DEFAULT_RANK,
    alpha: int | None = None,
) -> TinyAdapter:
    """Write a LoRA adapter for base into path (created if missing) and return what was written."""
    files = tiny_adapter_files(base, seed, targets, rank, alpha)
    written = write_generated_dir(path, files, MARKER, "tiny adapter", "llmfleet model make-tiny-adapter")
    return TinyAdapter(path=path, base=base, seed=seed, rank=rank, targets=tuple(targets), files=written)
