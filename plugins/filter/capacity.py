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
only Ansible's own module_utils, so they import it from the installed llmfleet
package (``llmfleet.module_utils``, a link to plugins/module_utils), as every
controller-side plugin does (docs/layout.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

# Controller-side plugins import the shared code from the installed llmfleet package
# (llmfleet/module_utils is a link to plugins/module_utils): one import path, one module.
# Without llmfleet in the Python that runs ansible-playbook, say how to get it.
try:
    from llmfleet.module_utils import capacity_planner
except ImportError as error:  # pragma: no cover (every venv that runs Ansible here installs llmfleet)
    raise AnsibleFilterError(
        f"capacity: {error}; run ansible-playbook from the README's venv, or pip install -e '.[ops]' in yours"
    ) from error


def capacity_plan(facts: Mapping[str, Any], gpus: int, **options: Any) -> dict[str, Any]:
    """The capacity plan for facts on gpus GPUs; AnsibleFilterError when it cannot work."""
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError(
            f"capacity_plan expects the facts dict that model_check returns, got {type(facts).__name__}"
        )
    try:
        result: dict[str, Any] = capacity_planner.plan(dict(facts), gpus, **options)
    except capacity_planner.PlanRefused as error:
        raise AnsibleFilterError("capacity_plan refused: " + " | ".join(error.reasons)) from error
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"capacity_plan: {error}") from error
    return result


class FilterModule:
    """llmfleet capacity filters."""

    def filters(self) -> dict[str, Any]:
        return {"capacity_plan": capacity_plan}
