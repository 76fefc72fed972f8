"""Filters of the nvidia_driver role: which kernel modules (open or proprietary) drive a host's GPUs.

``pci.gpus | nvidia_kernel_modules(nvidia_driver_kernel_modules, nvidia_driver_branch)``
takes the GPUs that the nvidia_pci module lists and returns {modules, reason, problem}:
``modules`` is ``open`` or ``proprietary``; ``problem`` is empty, or what makes the choice
impossible (a GPU older than Turing asked to run the open modules, a Blackwell GPU asked to
run the proprietary ones, both on one host) and what to do, for the role's assert to print.

The generation table and the rule live in plugins/module_utils/nvidia_pci.py, beside
the PCI reading they follow from; this file only adapts them to Jinja.

``nvrm_line | nvidia_loaded_module_flavour`` reads which flavour the kernel loaded from
the first line of /proc/driver/nvidia/version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

# Controller-side plugins import the shared code from the installed llmfleet package
# (llmfleet/module_utils is a link to plugins/module_utils): one import path, one module.
try:
    from llmfleet.module_utils import nvidia_pci
except ImportError as error:  # pragma: no cover (every venv that runs Ansible here installs llmfleet)
    raise AnsibleFilterError(
        f"nvidia_driver: {error}; run ansible-playbook from the README's venv, or pip install -e '.[ops]' in yours"
    ) from error


def nvidia_kernel_modules(gpus: Sequence[Mapping[str, str]], requested: str, branch: Any) -> dict[str, str]:
    """The kernel modules for these GPUs: {modules, reason, problem}."""
    try:
        return nvidia_pci.choose_kernel_modules([dict(gpu) for gpu in gpus], str(requested), int(str(branch)))
    except (KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError(f"nvidia_kernel_modules: {error}") from error


def nvidia_loaded_module_flavour(nvrm_line: str) -> str:
    """open or proprietary, from the first line of /proc/driver/nvidia/version ("NVRM version: ...")."""
    try:
        return nvidia_pci.loaded_module_flavour(str(nvrm_line))
    except ValueError as error:
        raise AnsibleFilterError(f"nvidia_loaded_module_flavour: {error}") from error


class FilterModule:
    """llmfleet filters of the nvidia_driver role."""

    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_kernel_modules": nvidia_kernel_modules,
            "nvidia_loaded_module_flavour": nvidia_loaded_module_flavour,
        }
