"""config.json: the architecture, the keys its family needs, and the facts the planner sizes from."""

from __future__ import annotations

from typing import Any

from .engines import SUPPORTED_ARCHITECTURES
from .findings import CONFIG, _Findings, _join

# Qwen2/Llama-family configs whose transformers class silently falls back to
# rope_theta=10000.0 when the key is missing, while the released checkpoints
# were trained with another base (Qwen2/2.5: 1000000.0; Llama 3: 500000.0).
# A LLaMA-Factory export that drops the key serves without error and answers
# garbage past a few hundred tokens (DESIGN.md failure mode #3).
ROPE_THETA_HINTS = {
    "qwen2": "Qwen2/Qwen2.5 checkpoints use 1000000.0",
    "llama": "Llama 2 uses 10000.0, Llama 3 500000.0, Mistral 7B v0.2+ 1000000.0",
}
ARCHITECTURE_FAMILY = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen2",
    "Qwen3MoeForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "LLaMAForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "AquilaForCausalLM": "llama",
    "AquilaModel": "llama",
    "InternLMForCausalLM": "llama",
    "InternLM3ForCausalLM": "llama",
}
_LLAMA_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
    "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
)  # fmt: skip
# transformers' Qwen2Config defaults num_key_value_heads to 32, not to
# num_attention_heads: a config that lost the key describes another model.
FAMILY_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "llama": _LLAMA_KEYS,
    "qwen2": (*_LLAMA_KEYS, "num_key_value_heads"),
}

# Other families name the same sizes differently (GPT-2: n_embd, n_head, ...).
CONFIG_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "max_position_embeddings": (
        "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len",
    ),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner"),
}  # fmt: skip
_SIZING_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")

# rope_scaling types whose factor vLLM multiplies into the derived max length
# (vllm/config _get_and_verify_max_len); others (llama3, longrope) keep it.
_SCALED_ROPE_TYPES = frozenset({"linear", "dynamic", "yarn"})


def _first(config: dict[str, Any], key: str) -> Any:
    for alias in CONFIG_ALIASES.get(key, (key,)):
        if config.get(alias) is not None:
            return config[alias]
    return None


def rope_theta(config: dict[str, Any]) -> Any:
    """rope_theta, at the top level or in transformers' newer rope_parameters."""
    if config.get("rope_theta") is not None:
        return config["rope_theta"]
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and parameters.get("rope_theta") is not None:
        return parameters["rope_theta"]
    return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _check_config(model_dir: str, config: dict[str, Any], engine_version: str, findings: _Findings) -> dict[str, Any]:
    """Check the architecture and keys; return the sizes the planner needs (possibly partial)."""
    path = _join(model_dir, CONFIG)
    facts: dict[str, Any] = {}
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures or not all(isinstance(a, str) for a in architectures):
        findings.problem(
            "no-architecture", path, "has no 'architectures' list",
            "add the architecture the model was trained as, e.g. \"architectures\": [\"Qwen2ForCausalLM\"]"
            " (copy it from the base model's config.json)",
        )  # fmt: skip
        architecture = None
    else:
        architecture = architectures[0]
        supported = SUPPORTED_ARCHITECTURES[engine_version]
        if architecture not in supported:
            close = sorted(a for a in supported if a.lower()[:5] == architecture.lower()[:5])[:5]
            hint = f" (similar names it serves: {', '.join(close)})" if close else ""
            findings.problem(
                "unsupported-architecture", path,
                f"architecture {architecture} is not one vLLM {engine_version} serves for text generation{hint}",
                f"serve it with a vLLM release that supports {architecture}, or fix 'architectures' if the"
                " export wrote the wrong class",
            )  # fmt: skip
    facts["architecture"] = architecture
    facts["model_type"] = config.get("model_type")

    family = ARCHITECTURE_FAMILY.get(architecture or "")
    if family is not None:
        for key in FAMILY_REQUIRED_KEYS[family]:
            present = rope_theta(config) is not None if key == "rope_theta" else config.get(key) is not None
            if present:
                continue
            if key == "rope_theta":
                findings.problem(
                    "missing-rope-theta", path,
                    f"rope_theta is missing: {architecture} then silently uses transformers' default 10000.0,"
                    " not the base the model was trained with, and answers garbage on long inputs",
                    f"copy rope_theta from the base model's config.json ({ROPE_THETA_HINTS[family]}) and apply it"
                    " explicitly: llmfleet model check DIR --fix-config rope_theta=VALUE"
                    " (module: config_fixes: {rope_theta: VALUE})",
                )  # fmt: skip
            else:
                findings.problem(
                    f"missing-{key.replace('_', '-')}", path, f"{key} is missing ({architecture} needs it)",
                    f"copy {key} from the base model's config.json and apply it with --fix-config {key}=VALUE",
                )  # fmt: skip
    else:
        for key in _SIZING_KEYS:
            if _first(config, key) is None:
                findings.problem(
                    f"missing-{key.replace('_', '-')}", path,
                    f"has no {key} (nor {', '.join(CONFIG_ALIASES[key][1:])}): the model cannot be sized",
                    f"copy {key} from the base model's config.json",
                )  # fmt: skip

    hidden = _positive_int(_first(config, "hidden_size"))
    heads = _positive_int(_first(config, "num_attention_heads"))
    layers = _positive_int(_first(config, "num_hidden_layers"))
    kv_heads = _positive_int(_first(config, "num_key_value_heads")) or heads
    head_dim = _positive_int(config.get("head_dim"))
    if head_dim is None and hidden is not None and heads is not None:
        if hidden % heads:
            findings.problem(
                "bad-head-dim", path,
                f"hidden_size {hidden} is not divisible by num_attention_heads {heads} and head_dim is not given",
                "set head_dim explicitly (copy it from the base model's config.json)",
            )  # fmt: skip
        else:
            head_dim = hidden // heads
    if heads is not None and kv_heads is not None and heads % kv_heads:
        findings.problem(
            "bad-kv-heads", path,
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
            "copy num_key_value_heads from the base model's config.json",
        )  # fmt: skip
    max_positions = _positive_int(_first(config, "max_position_embeddings"))
    max_model_len = max_positions
    scaling = config.get("rope_scaling")
    if max_positions is not None and isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        if kind in _SCALED_ROPE_TYPES and isinstance(factor, (int, float)) and factor > 1:
            max_model_len = int(max_positions * factor)
    facts.update(
        {
            "hidden_size": hidden,
            "intermediate_size": _positive_int(_first(config, "intermediate_size")),
            "attention_heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "layers": layers,
            "vocab_size": _positive_int(_first(config, "vocab_size")),
            "max_positions": max_positions,
            "max_model_len": max_model_len,
            "rope_theta": rope_theta(config),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
            "quantized": isinstance(config.get("quantization_config"), dict),
        }
    )
    return facts
