"""Is a model directory servable by the pinned vLLM? One answer for the module and the CLI.

This is the check behind DESIGN.md failure modes #2 (LoRA adapters trained on a
subset of modules, merged/unmerged confusion, missing shards or tokenizer files)
and #3 (a Qwen2 config.json that lost ``rope_theta`` in export). It reads only
small files and safetensors *headers* (struct + json): weights are never loaded,
so it runs in seconds on a 100 GB model and needs nothing but the standard
library.

Stdlib only, on purpose: Ansible ships this package to managed hosts as
``ansible.module_utils.model_validation`` (the ``model_check`` module) and the
llmfleet CLI imports the same files as ``llmfleet.module_utils.model_validation``
(``llmfleet model check``, ``llmfleet plan``). The package's modules import each
other relatively, which both import paths resolve.

One concern a file: ``engines`` (what each vLLM release serves), ``config``
(config.json), ``safetensors`` (header reading), ``weights`` (files and shards),
``tokenizer`` (tokenizer and chat template), ``adapters`` (LoRA), ``config_fix``
(explicit config.json fixes), ``findings`` (what a check reports); this file
runs them all (``check_model``).

What "servable" means here
--------------------------
* config.json parses; its architecture is one the pinned vLLM release serves
  for text generation; the keys that architecture family needs are present.
* Weights are complete: ``model.safetensors``, or ``model.safetensors.index.json``
  whose every shard exists, has a readable header, is not truncated, and holds
  every tensor the index assigns to it. All tensors share one dtype (quantized
  checkpoints, which mix dtypes by design, only get a warning).
* Tokenizer files are present; a chat template too when chat is served.
* Each LoRA adapter is a PEFT LoRA adapter for *this* base model, its target
  modules are ones the engine applies LoRA to for this architecture, and its
  rank is within the engine's maximum. A subset such as q_proj,v_proj is fine:
  vLLM only rejects modules it does not know (the deployment write-up's claim
  that all of q/k/v/o are required is wrong; see LORA_TARGET_MODULES).

Base-model matching rule for adapters
-------------------------------------
``base_model_name_or_path`` in adapter_config.json is what the training run
loaded: a hub name (``Qwen/Qwen2-1.5B``) or a path on the training machine. The
adapter matches when that value (1) is a path to this very directory, or (2) its
last path component equals, case-insensitively, the last component of one of:
the model directory (as given and with links resolved), config.json's
``_name_or_path``, or a name the operator records (``--base-name`` /
``base_model_names``: the name the model was staged under, since staging renames
directories). Independently of names, every LoRA tensor's shape must fit the base
config (lora_A is [r, in_features], lora_B is [out_features, r]); a shape that
does not fit is proof of a wrong base whatever the names say.
"""


from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .adapters import base_model_matches, check_adapter, lora_module_shapes, smallest_max_lora_rank
from .config import (
    ARCHITECTURE_FAMILY,
    CONFIG_ALIASES,
    FAMILY_REQUIRED_KEYS,
    ROPE_THETA_HINTS,
    _check_config,
    rope_theta,
)
from .config_fix import ConfigFix, backup_name, parse_fix, plan_config_fixes, write_config_fix
from .engines import (
    ARCHITECTURES_0_4_2,
    ARCHITECTURES_0_9_2,
    ARCHITECTURES_0_32_0,
    CURRENT_ENGINE_VERSION,
    ENGINE_VERSIONS,
    LAB_ENGINE_VERSION,
    LORA_BIAS_FLAG,
    LORA_MODULES_TO_SAVE,
    LORA_RANKS,
    LORA_TARGET_MODULES,
    MISSION_ENGINE_VERSION,
    SUPPORTED_ARCHITECTURES,
    check_engine_version,
)
from .findings import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    ADAPTER_WEIGHTS_BIN,
    CHAT_TEMPLATE_FILES,
    CONFIG,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    TOKENIZER_MODEL,
    WEIGHTS,
    WEIGHTS_INDEX,
    Problem,
    _Findings,
    _is_file,
    _join,
    _read_json,
)
from .safetensors import (
    DTYPE_BYTES,
    DTYPE_NAMES,
    MAX_HEADER_BYTES,
    TORCH_DTYPE_BYTES,
    SafetensorsError,
    TensorInfo,
    read_safetensors_header,
)
from .tokenizer import _check_tokenizer
from .weights import _check_weights


def check_model(
    model_dir: str,
    adapters: list[str] | tuple[str, ...] = (),
    engine_version: str = LAB_ENGINE_VERSION,
    chat: bool = True,
    config_fixes: dict[str, Any] | None = None,
    write_fixes: bool = False,
    backup: bool = True,
    base_names: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """Validate a model directory (and adapters) for one vLLM release.

    config_fixes are applied to config.json only when write_fixes is true (the
    module outside check mode, the CLI); otherwise the report describes the
    directory as it would be after them. Returns {ok, problems, warnings,
    facts, adapters, engine_version, config_fix}. Raises ValueError for
    unusable input (unknown engine release, no such directory, a fix for an
    unreadable config).
    """
    engine_version = check_engine_version(engine_version)
    if not Path(model_dir).is_dir():
        raise ValueError(f"model directory {model_dir} does not exist or is not a directory")
    findings = _Findings()
    if _is_file(_join(model_dir, ADAPTER_CONFIG)) and not _is_file(_join(model_dir, CONFIG)):
        # A LoRA adapter given as the model: say so once, not as a missing config, weights and tokenizer.
        _adapter_as_model(model_dir, findings)
        return _report(engine_version, findings, {}, [], None)
    fix: ConfigFix | None = None
    if config_fixes:
        fix = plan_config_fixes(model_dir, dict(config_fixes))
        if write_fixes:
            write_config_fix(fix, backup=backup)

    config_path = _join(model_dir, CONFIG)
    if fix is not None:
        config: Any = json.loads(fix.after)
    else:
        config = _read_json(
            config_path, findings, "missing-config",
            "copy config.json from the training output or the base model",
        )  # fmt: skip
    facts: dict[str, Any] = {}
    if isinstance(config, dict):
        facts.update(_check_config(model_dir, config, engine_version, findings))
    elif config is not None:
        findings.problem("bad-config", config_path, "is not a JSON object", "copy config.json again")
    weights = _check_weights(model_dir, bool(facts.get("quantized")), findings)
    weights.pop("_tensors", None)
    facts.update(weights)
    config_dtype = (config.get("torch_dtype") or config.get("dtype")) if isinstance(config, dict) else None
    if isinstance(config_dtype, str) and config_dtype in TORCH_DTYPE_BYTES:
        facts["dtype"] = config_dtype
        if facts.get("weights_dtype") in DTYPE_NAMES.values() and facts["weights_dtype"] != config_dtype:
            findings.warnings.append(
                f"{config_path}: torch_dtype is {config_dtype} but the weights are {facts['weights_dtype']};"
                " vLLM serves in torch_dtype unless --dtype says otherwise"
            )
    else:
        facts["dtype"] = facts.get("weights_dtype")
    facts["dtype_bytes"] = TORCH_DTYPE_BYTES.get(str(facts.get("dtype")))
    facts.update(_check_tokenizer(model_dir, chat, findings))

    adapter_facts = [
        check_adapter(
            adapter, model_dir, config if isinstance(config, dict) else {}, facts, engine_version,
            list(base_names), findings,
        )
        for adapter in adapters
    ]  # fmt: skip
    if adapter_facts:
        ranks = [a["max_lora_rank"] for a in adapter_facts if a.get("max_lora_rank")]
        facts["max_lora_rank"] = max(ranks) if ranks else None
        facts["max_loras"] = len(adapter_facts)
    return _report(engine_version, findings, facts, adapter_facts, fix)


def _report(
    engine_version: str,
    findings: _Findings,
    facts: dict[str, Any],
    adapter_facts: list[dict[str, Any]],
    fix: ConfigFix | None,
) -> dict[str, Any]:
    return {
        "ok": not findings.problems,
        "engine_version": engine_version,
        "problems": [problem.as_dict() for problem in findings.problems],
        "problem_lines": [problem.line() for problem in findings.problems],
        "warnings": findings.warnings,
        "facts": facts,
        "adapters": adapter_facts,
        "config_fix": fix.as_dict() if fix is not None else None,
    }


def _adapter_as_model(model_dir: str, findings: _Findings) -> None:
    adapter_config = _join(model_dir, ADAPTER_CONFIG)
    parsed = _read_json(adapter_config, findings, "bad-adapter-config", "copy adapter_config.json again")
    base = parsed.get("base_model_name_or_path") if isinstance(parsed, dict) else None
    trained_on = f" trained on {base}" if isinstance(base, str) and base else ""
    findings.problem(
        "adapter-as-model",
        adapter_config,
        f"the model directory holds a LoRA adapter{trained_on}, not a model (adapter_config.json, no config.json)",
        "give the base model's directory as the model, and list this directory under the engine's adapters"
        " ({name, path}) to serve it",
    )


PLANNER_FACTS = ("layers", "attention_heads", "kv_heads", "head_dim", "dtype_bytes", "weights_bytes", "max_model_len")


def missing_planner_facts(facts: dict[str, Any]) -> list[str]:
    """The facts the capacity planner needs that the check could not establish."""
    return [key for key in PLANNER_FACTS if not facts.get(key)]


# What the module, the CLI and the tests use, from whichever file holds it.
__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "ADAPTER_WEIGHTS_BIN",
    "ARCHITECTURES_0_4_2",
    "ARCHITECTURES_0_9_2",
    "ARCHITECTURES_0_32_0",
    "ARCHITECTURE_FAMILY",
    "CHAT_TEMPLATE_FILES",
    "CONFIG",
    "CONFIG_ALIASES",
    "CURRENT_ENGINE_VERSION",
    "DTYPE_BYTES",
    "DTYPE_NAMES",
    "ENGINE_VERSIONS",
    "FAMILY_REQUIRED_KEYS",
    "LAB_ENGINE_VERSION",
    "LORA_BIAS_FLAG",
    "LORA_MODULES_TO_SAVE",
    "LORA_RANKS",
    "LORA_TARGET_MODULES",
    "MAX_HEADER_BYTES",
    "MISSION_ENGINE_VERSION",
    "PLANNER_FACTS",
    "ROPE_THETA_HINTS",
    "SUPPORTED_ARCHITECTURES",
    "TOKENIZER_CONFIG",
    "TOKENIZER_JSON",
    "TOKENIZER_MODEL",
    "TORCH_DTYPE_BYTES",
    "WEIGHTS",
    "WEIGHTS_INDEX",
    "ConfigFix",
    "Problem",
    "SafetensorsError",
    "TensorInfo",
    "backup_name",
    "base_model_matches",
    "check_adapter",
    "check_engine_version",
    "check_model",
    "lora_module_shapes",
    "missing_planner_facts",
    "parse_fix",
    "plan_config_fixes",
    "read_safetensors_header",
    "rope_theta",
    "smallest_max_lora_rank",
    "write_config_fix",
]
