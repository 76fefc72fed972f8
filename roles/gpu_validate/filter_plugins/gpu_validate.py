"""Filters that judge the gpu_validate script's figures: the report and the local facts.

``measurements | gpu_validate_report(table=..., gpu_facts=..., fail_fraction=0.8)``
returns {ok, gpus, host_checks, failures, lines}; ``report |
gpu_validate_facts(measurements, results_path)`` the dict kept as
ansible_local.gpu_validate. The logic lives in
plugins/module_utils/gpu_validation.py (pure functions, unit-tested on the real
H200 readings); filter plugins run on the controller, where
``ansible.module_utils`` holds only Ansible's own module_utils, so they import
it from the installed llmfleet package (``llmfleet.module_utils``, a link to
plugins/module_utils; docs/layout.md).

This plugin stays in the role (roles/gpu_validate/filter_plugins) rather than
plugins/filter: only the gpu_validate role calls these filters (tasks/validate.yml
and vars/main.yml), and they judge that role's own script's output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

# Controller-side plugins import the shared code from the installed llmfleet package
# (llmfleet/module_utils is a link to plugins/module_utils): one import path, one module.
# Without llmfleet in the Python that runs ansible-playbook, say how to get it.
try:
    from llmfleet.module_utils import gpu_validation
except ImportError as error:  # pragma: no cover (every venv that runs Ansible here installs llmfleet)
    raise AnsibleFilterError(
        f"gpu_validate: {error}; run ansible-playbook from the README's venv, or pip install -e '.[ops]' in yours"
    ) from error


def gpu_validate_report(measurements: Mapping[str, Any], table: list[Mapping[str, Any]], **options: Any) -> Any:
    if not isinstance(measurements, Mapping):
        what = type(measurements).__name__
        raise AnsibleFilterError(f"gpu_validate_report expects the script's JSON object, got {what}")
    try:
        return gpu_validation.judge(measurements, table, **options)
    except (TypeError, ValueError, KeyError) as error:
        raise AnsibleFilterError(f"gpu_validate_report: {error}") from error


def gpu_validate_facts(report: Mapping[str, Any], measurements: Mapping[str, Any], results_path: str) -> Any:
    return gpu_validation.local_facts(report, measurements, results_path)


class FilterModule:
    """llmfleet GPU validation filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_validate_report": gpu_validate_report, "gpu_validate_facts": gpu_validate_facts}
