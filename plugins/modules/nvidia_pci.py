#!/usr/bin/python
# Copyright: llmfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: the NVIDIA GPUs and NVSwitches on the host's PCI bus."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_pci
short_description: List the NVIDIA GPUs and NVSwitches on the PCI bus
description:
  - Reads sysfs (C(/sys/bus/pci/devices)); needs no driver, no C(lspci) and no C(nvidia-smi), so it answers before
    the driver is installed and while it is broken.
  - A device of vendor C(0x10de) is a GPU when its class is C(0x03xxxx) (display controller) and an NVSwitch when
    its class is C(0x0680xx) (bridge, other), as NCCL tells them apart. No list of device ids is involved, so new
    generations are recognised.
  - On an NVSwitch system (HGX/DGX A100, H100, H200 SXM), CUDA does not initialise until NVIDIA Fabric Manager has
    set up the fabric. The preflight role reports the NVSwitches and the nvidia_driver role installs Fabric Manager
    where this module finds them.
  - Never changes the host.
version_added: "0.1.0"
author:
  - llmfleet contributors
options: {}
attributes:
  check_mode:
    support: full
    description: The module only reads, so check mode runs it unchanged.
  diff_mode:
    support: none
notes:
  - The Molecule scenario of the nvidia_driver role mounts a STAND-IN listing (files/standins/pci-devices.yml, not a
    real machine's) over C(/sys/bus/pci/devices) in its test container, so the same code finds NVSwitches there.
"""

EXAMPLES = r"""
- name: List the NVIDIA devices on the PCI bus
  nvidia_pci:
  register: __preflight_pci_probe

- name: Note whether the host needs Fabric Manager
  ansible.builtin.set_fact:
    needs_fabric_manager: "{{ __preflight_pci_probe.nvswitches | length > 0 }}"
"""

RETURN = r"""
gpus:
  description: The NVIDIA display controllers, in slot order.
  returned: always
  type: list
  elements: dict
  sample:
    - {slot: "0000:18:00.0", device: "0x2335", class: "0x030200", driver: nvidia}
nvswitches:
  description: The NVIDIA NVSwitches, in slot order. Empty on hosts without an NVLink switch fabric (PCIe cards, a
    single SXM GPU in a virtual machine).
  returned: always
  type: list
  elements: dict
  sample:
    - {slot: "0000:05:00.0", device: "0x22a3", class: "0x068000", driver: nvidia-nvswitch}
"""

# Ansible's module layout puts DOCUMENTATION, EXAMPLES and RETURN before the imports
# (ansible-doc reads them without importing); hence the E402 exemptions.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.nvidia_pci import read_nvidia_pci  # noqa: E402


def main() -> None:
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(changed=False, **read_nvidia_pci())


if __name__ == "__main__":
    main()
