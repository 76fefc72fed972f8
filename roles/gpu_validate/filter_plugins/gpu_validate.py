"""Filters that judge the gpu_validate script's figures: the report and the local facts.

``measurements | gpu_validate_report(table=..., gpu_facts=..., fail_fraction=0.8)``
returns {ok, gpus, host_checks, failures, lines}; ``report |
gpu_validate_facts(measurements, results_path)`` the dict kept as
ansible_local.gpu_validate. The logic lives in
plugins/module_utils/gpu_validation.py (pure functions, unit-tested on the real
H200 readings); filter plugins run on the controller, where
``ansible.module_utils`` holds only Ansible's own module_utils, so the file is
loaded from its path in this repository.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ansible.errors import AnsibleFilterError

_PATH = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / "gpu_validation.py"
_NAME = "_llmfleet_gpu_validation"


def _validation() -> ModuleType:
    module = sys.modules.get(_NAME)
    if module is None:
        spec = importlib.util.spec_from_file_location(_NAME, _PATH)
        if spec is None or spec.loader is None:  # pragma: no cover (the file is in the repository)
            raise AnsibleFilterError(f"gpu_validate: cannot load {_PATH}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        spec.loader.exec_module(module)
    return module


def gpu_validate_report(measurements: Mapping[str, Any], table: list[Mapping[str, Any]], **options: Any) -> Any:
    if not isinstance(measurements, Mapping):
        what = type(measurements).__name__
        raise AnsibleFilterError(f"gpu_validate_report expects the script's JSON object, got {what}")
    try:
        return _validation().judge(measurements, table, **options)
    except (TypeError, ValueError, KeyError) as error:
        raise AnsibleFilterError(f"gpu_validate_report: {error}") from error


def gpu_validate_facts(report: Mapping[str, Any], measurements: Mapping[str, Any], results_path: str) -> Any:
    return _validation().local_facts(report, measurements, results_path)


class FilterModule:
    """llmfleet GPU validation filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_validate_report": gpu_validate_report, "gpu_validate_facts": gpu_validate_facts}
