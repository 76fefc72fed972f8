#!/usr/bin/python
# Copyright: llmfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: refuse a model directory (and LoRA adapters) the pinned vLLM cannot serve."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_check
short_description: Refuse model directories and LoRA adapters the pinned vLLM cannot serve
description:
  - Checks a model directory on the host with the rules in C(plugins/module_utils/model_validation/),
    the same rules C(llmfleet model check) applies, before any engine is touched.
  - Checks that C(config.json) parses, that its architecture is one the pinned vLLM release serves, and
    that the keys its family needs are present (C(rope_theta) for Qwen2/Llama-family configs).
  - Checks that the weights are complete (C(model.safetensors), or every shard a
    C(model.safetensors.index.json) lists, with readable, untruncated headers holding every indexed
    tensor, in one dtype), that tokenizer files are present, and that a chat template is present when
    O(chat) is true. Weights are never loaded; only safetensors headers are read.
  - Checks each adapter in O(adapters) is a PEFT LoRA adapter for this base model, whose target modules
    are ones the engine applies LoRA to (any subset, such as q_proj and v_proj, is fine) and whose rank
    is within the engine's maximum.
  - Fails with one line per problem naming the file and the fix; returns the facts the capacity planner
    needs (layers, heads, KV heads, head_dim, dtype, max positions, weight bytes read from the headers).
  - Findings that do not stop serving are reported as warnings.
  - Changes nothing, unless O(config_fixes) asks for explicit C(config.json) keys; the change is then
    shown as a diff, logged, and the original kept as C(config.json.orig-<timestamp>) when O(backup) is true.
version_added: "0.1.0"
author:
  - llmfleet contributors
options:
  path:
    description:
      - The model directory on the host.
    type: path
    required: true
  adapters:
    description:
      - LoRA adapter directories to serve with the model (C(--lora-modules)).
    type: list
    elements: path
    default: []
  engine_version:
    description:
      - The vLLM release that will serve the model, normally C({{ gpu_stacks[gpu_stack].vllm.version }}).
      - Releases llmfleet has serving data for are C(0.4.2) (the mission stack), C(0.9.2) (the current-cu128
        stack) and C(0.32.0) (the lab engine).
    type: str
    required: true
  chat:
    description:
      - Whether C(/v1/chat/completions) is served, so a chat template is required.
    type: bool
    default: true
  config_fixes:
    description:
      - "C(config.json) keys to set before checking, for example C({rope_theta: 1000000.0}) for a Qwen2
        export that lost it. Only the keys given change; values are written as given."
      - Applied only when given, reported as a diff (C(--diff)) and logged; in check mode nothing is written.
    type: dict
  backup:
    description:
      - Keep the original C(config.json) as C(config.json.orig-<timestamp>) before applying O(config_fixes).
    type: bool
    default: true
  base_model_names:
    description:
      - Other names of the model (for example the hub name it was staged from) that an adapter's
        C(base_model_name_or_path) may record; staging renames directories.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: The checks run unchanged; O(config_fixes) are reported, with their diff, but not written.
  diff_mode:
    support: full
    description: Shows the C(config.json) change that O(config_fixes) makes.
notes:
  - Adapters are matched to the base by name (path, directory name, C(_name_or_path), O(base_model_names))
    and by tensor shapes; see the module_utils docstring for the rule.
seealso:
  - name: vLLM supported models
    description: The architectures each release serves.
    link: https://docs.vllm.ai/en/latest/models/supported_models.html
"""

EXAMPLES = r"""
- name: Refuse a model directory vLLM cannot serve
  model_check:
    path: /srv/models/qwen2-1.5b-sft/current
    engine_version: "{{ gpu_stacks[gpu_stack].vllm.version }}"
  register: __vllm_model_check

- name: Check a model with the LoRA adapters it will serve
  model_check:
    path: /srv/models/qwen2-1.5b/current
    adapters:
      - /srv/adapters/support-bot/current
    base_model_names:
      - Qwen/Qwen2-1.5B
    engine_version: "0.4.2"

- name: Restore the rope_theta a LLaMA-Factory export dropped (explicit, logged, backed up)
  model_check:
    path: /srv/models/qwen2-1.5b-sft/current
    engine_version: "0.4.2"
    config_fixes:
      rope_theta: 1000000.0
"""

RETURN = r"""
ok:
  description: Whether the directory (and every adapter) is servable.
  returned: always
  type: bool
  sample: true
problems:
  description: Why it is not servable; empty when O(ok) is true.
  returned: always
  type: list
  elements: dict
  contains:
    code:
      description: Stable problem id.
      type: str
      sample: missing-rope-theta
    file:
      description: The file the problem is in.
      type: str
      sample: /srv/models/qwen2/config.json
    message:
      description: What is wrong.
      type: str
    fix:
      description: What to do.
      type: str
facts:
  description: What the capacity planner needs, read from config.json and the safetensors headers.
  returned: always
  type: dict
  sample: {"architecture": "Qwen2ForCausalLM", "layers": 2, "attention_heads": 2, "kv_heads": 1,
           "head_dim": 64, "dtype": "bfloat16", "dtype_bytes": 2, "max_positions": 2048,
           "max_model_len": 2048, "parameters": 361600, "weights_bytes": 723200}
adapters:
  description: Per adapter, its rank, the --max-lora-rank it needs and its target modules.
  returned: always
  type: list
  elements: dict
engine_version:
  description: The vLLM release checked against.
  returned: always
  type: str
  sample: "0.32.0"
config_fix:
  description: The O(config_fixes) change (keys, unified diff, whether written, backup file); null without fixes.
  returned: always
  type: dict
backup_file:
  description: The copy of the original config.json.
  returned: when config_fixes changed config.json outside check mode and backup is true
  type: str
  sample: /srv/models/qwen2/config.json.orig-20261130T101500Z
"""

# Ansible's module layout puts DOCUMENTATION, EXAMPLES and RETURN before the imports
# (ansible-doc reads them without importing); hence the E402 exemptions.
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.model_validation import check_model  # noqa: E402

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "path": {"type": "path", "required": True},
    "adapters": {"type": "list", "elements": "path", "default": []},
    "engine_version": {"type": "str", "required": True},
    "chat": {"type": "bool", "default": True},
    "config_fixes": {"type": "dict"},
    "backup": {"type": "bool", "default": True},
    "base_model_names": {"type": "list", "elements": "str", "default": []},
}


def run(params: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """Check the directory as the module's parameters say; ValueError for unusable input."""
    report = check_model(
        params["path"],
        adapters=params["adapters"],
        engine_version=params["engine_version"],
        chat=params["chat"],
        config_fixes=params["config_fixes"],
        write_fixes=not check_mode,
        backup=params["backup"],
        base_names=params["base_model_names"],
    )
    report.pop("problem_lines")
    # Findings that do not stop serving go out through AnsibleModule.warn, i.e. the
    # standard `warnings` return value (passing `warnings` to exit_json is deprecated).
    report["model_warnings"] = report.pop("warnings")
    fix = report["config_fix"]
    result: dict[str, Any] = {"changed": bool(fix and fix["changed"]), **report}
    if fix is not None:
        # The texts travel in `diff` only; config_fix keeps the summary and the unified diff.
        before, after = fix.pop("before"), fix.pop("after")
        if fix["changed"]:
            result["diff"] = {
                "before": before,
                "after": after,
                "before_header": f"{fix['path']} (before)",
                "after_header": f"{fix['path']} (after)",
            }
        if fix["backup_file"]:
            result["backup_file"] = fix["backup_file"]
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module.params, module.check_mode)
    except (ValueError, OSError) as error:
        module.fail_json(msg=f"model_check: {error}", changed=False)
    for warning in result.pop("model_warnings"):
        module.warn(warning)
    fix = result["config_fix"]
    if fix and fix["changed"]:
        verb = "would set" if module.check_mode else "set"
        backup = f"; original saved as {fix['backup_file']}" if fix["backup_file"] else ""
        message = f"model_check: {verb} {', '.join(fix['keys'])} in {fix['path']} as asked{backup}"
        module.log(message)
        module.warn(message)
    if not result["ok"]:
        lines = [f"{problem['file']}: {problem['message']}; fix: {problem['fix']}" for problem in result["problems"]]
        module.fail_json(
            msg=f"{module.params['path']} is not servable by vLLM {result['engine_version']}: " + " | ".join(lines),
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
