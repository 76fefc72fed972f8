"""Filters that size the vLLM engine from a model's facts: the capacity planner for playbooks.

``model_facts | capacity_plan(gpus=2, gpu_memory_gib=80)`` returns the plan that
``llmfleet plan`` prints (kv_bytes_per_token, kv_cache_tokens, weights_bytes,
tensor_parallel_size, suggested_flags, ...); model_facts is the ``facts`` that
the model_check module returns. An impossible request (weights that do not fit,
a GPU count that does not divide the heads, a length past the model's positions)
raises AnsibleFilterError with the numbers, so the play stops before any engine
is touched.

Keyword options (see plan() in capacity_planner.py): gpu_memory_gib (one GPU's
memory; required unless kv_cache_gib is given), gpu_memory_utilization (0.9),
max_model_len (the model's max positions), kv_cache_gib (an explicit KV budget
per GPU: VLLM_CPU_KVCACHE_SPACE on the CPU engine), block_size (16 on CUDA, 128
on vLLM 0.32.0's CPU backend), reserve_gib (measured activation and runtime
memory, replacing the estimate) and kv_cache_dtype (auto = the model dtype)::

    - name: Size the engine for two 80 GiB GPUs
      ansible.builtin.set_fact:
        __vllm_plan: "{{ __vllm_model_check.facts | capacity_plan(gpus=2, gpu_memory_gib=80) }}"

The arithmetic lives in plugins/module_utils/capacity_planner.py, shared with the
CLI. Filter plugins run on the controller, where ``ansible.module_utils`` holds
only Ansible's own module_utils, so the file is loaded from its path beside this
plugin.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ansible.errors import AnsibleFilterError

_PLANNER_PATH = Path(__file__).resolve().parent.parent / "module_utils" / "capacity_planner.py"
_MODULE_NAME = "_llmfleet_capacity_planner"


def _planner() -> ModuleType:
    """plugins/module_utils/capacity_planner.py, loaded once by path."""
    module = sys.modules.get(_MODULE_NAME)
    if module is None:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, _PLANNER_PATH)
        if spec is None or spec.loader is None:  # pragma: no cover (the file ships with the plugin)
            raise AnsibleFilterError(f"capacity_plan: cannot load {_PLANNER_PATH}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE_NAME] = module
        spec.loader.exec_module(module)
    return module


def capacity_plan(facts: Mapping[str, Any], gpus: int, **options: Any) -> dict[str, Any]:
    """The capacity plan for facts on gpus GPUs; AnsibleFilterError when it cannot work."""
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError(
            f"capacity_plan expects the facts dict that model_check returns, got {type(facts).__name__}"
        )
    planner = _planner()
    try:
        result: dict[str, Any] = planner.plan(dict(facts), gpus, **options)
    except planner.PlanRefused as error:
        raise AnsibleFilterError("capacity_plan refused: " + " | ".join(error.reasons)) from error
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"capacity_plan: {error}") from error
    return result


class FilterModule:
    """llmfleet capacity filters."""

    def filters(self) -> dict[str, Any]:
        return {"capacity_plan": capacity_plan}
