"""PEFT LoRA adapters: for this base model, target modules and rank the engine accepts, tensors that fit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .config import _positive_int
from .engines import LORA_BIAS_FLAG, LORA_MODULES_TO_SAVE, LORA_RANKS, LORA_TARGET_MODULES
from .findings import ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_WEIGHTS_BIN, _Findings, _is_file, _join, _read_json
from .safetensors import SafetensorsError, TensorInfo, read_safetensors_header


def smallest_max_lora_rank(rank: int, engine_version: str) -> int | None:
    """The smallest --max-lora-rank value that admits rank, or None if none does."""
    return next((value for value in LORA_RANKS[engine_version] if value >= rank), None)


def lora_module_shapes(model: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each LoRA-able linear module, from the base facts."""
    hidden, heads, kv_heads = model.get("hidden_size"), model.get("attention_heads"), model.get("kv_heads")
    head_dim, intermediate = model.get("head_dim"), model.get("intermediate_size")
    shapes: dict[str, tuple[int, int]] = {}
    if hidden and heads and head_dim:
        shapes["q_proj"] = (hidden, heads * head_dim)
        shapes["o_proj"] = (heads * head_dim, hidden)
    if hidden and kv_heads and head_dim:
        shapes["k_proj"] = shapes["v_proj"] = (hidden, kv_heads * head_dim)
    if hidden and intermediate:
        shapes["gate_proj"] = shapes["up_proj"] = (hidden, intermediate)
        shapes["down_proj"] = (intermediate, hidden)
    return shapes


_LORA_TENSOR_RE = re.compile(
    r"^(?P<module>.+)\.lora_(?P<part>A|B|embedding_A|embedding_B)(?:\.[A-Za-z_]+)?(?:\.weight)?$"
)
_LAYER_RE = re.compile(r"\.layers\.(\d+)\.")


def _basename(name: str) -> str:
    return name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()


def base_model_matches(recorded: str, model_dir: str, model_config: dict[str, Any], base_names: list[str]) -> bool:
    """Whether an adapter's base_model_name_or_path names this model (see the module docstring)."""
    recorded_path = Path(recorded)
    if recorded_path.is_absolute() and recorded_path.exists():
        try:
            if recorded_path.samefile(model_dir):
                return True
        except OSError:
            pass
    candidates = [model_dir, str(Path(model_dir).resolve()), *base_names]
    if isinstance(model_config.get("_name_or_path"), str) and model_config["_name_or_path"]:
        candidates.append(model_config["_name_or_path"])
    return _basename(recorded) in {_basename(candidate) for candidate in candidates if candidate}


def check_adapter(
    adapter_dir: str,
    model_dir: str,
    model_config: dict[str, Any],
    model: dict[str, Any],
    engine_version: str,
    base_names: list[str],
    findings: _Findings,
) -> dict[str, Any]:
    """Check one adapter against the base model; return its facts."""
    facts: dict[str, Any] = {"path": adapter_dir}
    config_path = _join(adapter_dir, ADAPTER_CONFIG)
    if not Path(adapter_dir).is_dir():
        findings.problem(
            "missing-adapter", adapter_dir, "is not a directory",
            "give the directory holding adapter_config.json and adapter_model.safetensors",
        )  # fmt: skip
        return facts
    config = _read_json(
        config_path, findings, "missing-adapter-config",
        "copy adapter_config.json from the training output (PEFT writes it beside the adapter weights);"
        " a directory without it is probably a merged model: serve it as the model, not as an adapter",
    )  # fmt: skip
    if not isinstance(config, dict):
        if config is not None:
            findings.problem("bad-adapter-config", config_path, "is not a JSON object", "copy it again")
        return facts
    peft_type = config.get("peft_type")
    facts["peft_type"] = peft_type
    if peft_type != "LORA":
        findings.problem(
            "wrong-peft-type", config_path,
            f"peft_type is {peft_type!r}, and vLLM serves only LoRA adapters (peft_type LORA)",
            "merge the adapter into the base model with PEFT (merge_and_unload) and serve the merged"
            " directory, or retrain it as LoRA",
        )  # fmt: skip
    architecture = model.get("architecture")

    # Rank: r, and any per-module override in rank_pattern.
    rank = config.get("r")
    pattern = config.get("rank_pattern")
    ranks = [rank, *pattern.values()] if isinstance(pattern, dict) else [rank]
    valid_ranks = {value for value in (_positive_int(value) for value in ranks) if value is not None}
    if any(_positive_int(value) is None for value in ranks):
        findings.problem(
            "bad-rank", config_path, f"r (and rank_pattern) must be positive integers, got {ranks!r}",
            "copy adapter_config.json again from the training output",
        )  # fmt: skip
    else:
        top = max(valid_ranks)
        facts["rank"] = top
        allowed = LORA_RANKS[engine_version]
        flag = smallest_max_lora_rank(top, engine_version)
        facts["max_lora_rank"] = flag
        if flag is None:
            findings.problem(
                "rank-too-big", config_path,
                f"rank {top} exceeds vLLM {engine_version}'s maximum LoRA rank {allowed[-1]}"
                f" (--max-lora-rank accepts {', '.join(str(v) for v in allowed)})",
                f"retrain with r <= {allowed[-1]}, or merge the adapter into the base model and serve the merged"
                " directory",
            )  # fmt: skip
    if config.get("bias", "none") not in ("none", None):
        bias_flag = LORA_BIAS_FLAG[engine_version]
        findings.problem(
            "lora-bias", config_path,
            f"bias is {config.get('bias')!r}; vLLM {engine_version} serves LoRA without bias terms"
            + (f" unless started with {bias_flag}" if bias_flag else ""),
            (f"serve with {bias_flag}, " if bias_flag else "")
            + "retrain with bias='none', or merge the adapter into the base model",
        )  # fmt: skip
    if config.get("use_dora"):
        findings.problem(
            "dora", config_path, "use_dora is true; vLLM does not implement DoRA",
            "merge the adapter into the base model and serve the merged directory",
        )  # fmt: skip
    allowed_saved = LORA_MODULES_TO_SAVE[engine_version]
    saved = config.get("modules_to_save") or []
    if allowed_saved is not None and isinstance(saved, list) and set(saved) - allowed_saved:
        findings.problem(
            "modules-to-save", config_path,
            f"modules_to_save lists {', '.join(sorted(set(saved) - allowed_saved))}: vLLM {engine_version} cannot"
            " load fully trained modules from an adapter",
            "merge the adapter into the base model and serve the merged directory",
        )  # fmt: skip

    # Target modules, as declared and as the tensors show.
    supported = LORA_TARGET_MODULES[engine_version].get(architecture or "")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        findings.warnings.append(
            f"{config_path}: target_modules is the pattern {targets!r}; checking the tensor names instead"
        )
        declared: list[str] = []
    elif isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
        declared = [t.rsplit(".", 1)[-1] for t in targets]
    else:
        findings.problem(
            "bad-target-modules", config_path, f"target_modules is {targets!r}, not a list of module names",
            "copy adapter_config.json again from the training output",
        )  # fmt: skip
        declared = []
    facts["target_modules"] = sorted(set(declared))
    if supported is None and architecture:
        findings.warnings.append(
            f"{config_path}: llmfleet has no LoRA target table for {architecture} on vLLM {engine_version};"
            " target modules were not checked"
        )
    elif supported is not None:
        unsupported = sorted(set(declared) - supported)
        if unsupported:
            findings.problem(
                "unsupported-target-module", config_path,
                f"target_modules {', '.join(unsupported)} are not modules vLLM {engine_version} applies LoRA to"
                f" for {architecture} (it does: {', '.join(sorted(supported))}; any subset is fine)",
                "retrain without them, or merge the adapter into the base model and serve the merged directory",
            )  # fmt: skip

    # Weights: names, ranks and shapes against the base model.
    weights_path = _join(adapter_dir, ADAPTER_WEIGHTS)
    if not _is_file(weights_path):
        bin_present = _is_file(_join(adapter_dir, ADAPTER_WEIGHTS_BIN))
        findings.problem(
            "missing-adapter-weights", weights_path,
            "is missing" + (f" ({ADAPTER_WEIGHTS_BIN} is there; its tensors cannot be checked)" if bin_present else ""),
            "save the adapter with safetensors (PEFT save_pretrained(safe_serialization=True)) or copy it again",
        )  # fmt: skip
    else:
        try:
            tensors = read_safetensors_header(weights_path)
        except SafetensorsError as error:
            findings.problem("bad-adapter-weights", weights_path, str(error), "copy the adapter again")
            tensors = {}
        facts["tensor_modules"] = _check_adapter_tensors(weights_path, tensors, supported, valid_ranks, model, findings)

    recorded = config.get("base_model_name_or_path")
    facts["base_model_name_or_path"] = recorded
    if not isinstance(recorded, str) or not recorded:
        findings.warnings.append(
            f"{config_path}: base_model_name_or_path is not set; the base could not be matched by name"
        )
    elif not base_model_matches(recorded, model_dir, model_config, base_names):
        findings.problem(
            "base-model-mismatch", config_path,
            f"base_model_name_or_path is {recorded!r}, which does not name {model_dir}",
            "serve the adapter with the model it was trained on; if this directory is that model under another"
            f" name, record the name: --base-name {recorded} (module: base_model_names)",
        )  # fmt: skip
    return facts


def _check_adapter_tensors(
    path: str,
    tensors: dict[str, TensorInfo],
    supported: frozenset[str] | None,
    ranks: set[int],
    model: dict[str, Any],
    findings: _Findings,
) -> list[str]:
    """Check LoRA tensor names and shapes (lora_A [r, in], lora_B [out, r]); return the modules found."""
    shapes = lora_module_shapes(model)
    layers = model.get("layers")
    modules: set[str] = set()
    bad_shapes: list[str] = []
    for name, info in sorted(tensors.items()):
        match = _LORA_TENSOR_RE.match(name)
        if match is None:
            continue
        module = match.group("module").rsplit(".", 1)[-1]
        modules.add(module)
        layer = _LAYER_RE.search(name)
        if layer is not None and layers and int(layer.group(1)) >= layers:
            bad_shapes.append(f"{name} is for layer {layer.group(1)} but the base has {layers} layers")
            continue
        if module not in shapes or len(info.shape) != 2:
            continue
        in_features, out_features = shapes[module]
        part = match.group("part")
        if part == "A" and (info.shape[1] != in_features or (ranks and info.shape[0] not in ranks)):
            bad_shapes.append(f"{name} is {list(info.shape)}, expected [r, {in_features}]")
        elif part == "B" and (info.shape[0] != out_features or (ranks and info.shape[1] not in ranks)):
            bad_shapes.append(f"{name} is {list(info.shape)}, expected [{out_features}, r]")
    if not modules and tensors:
        findings.problem(
            "no-lora-tensors", path, "holds no lora_A/lora_B tensors",
            "this is not a LoRA adapter: copy the adapter again, or serve the directory as a model",
        )  # fmt: skip
    if supported is not None:
        unsupported = sorted(modules - supported)
        if unsupported:
            findings.problem(
                "unsupported-target-module", path,
                f"holds LoRA weights for {', '.join(unsupported)}, which vLLM does not apply LoRA to for"
                f" {model.get('architecture')}",
                "retrain without them, or merge the adapter into the base model and serve the merged directory",
            )  # fmt: skip
    if bad_shapes:
        shown = "; ".join(bad_shapes[:2]) + (f"; and {len(bad_shapes) - 2} more" if len(bad_shapes) > 2 else "")
        findings.problem(
            "adapter-shape-mismatch", path,
            f"LoRA tensors do not fit the base model ({shown}): the adapter was trained on another base",
            "serve it with the model it was trained on, or retrain it on this one",
        )  # fmt: skip
    return sorted(modules)
