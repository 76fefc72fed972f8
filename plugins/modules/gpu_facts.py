#!/usr/bin/python
# Copyright: llmfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: the host's NVIDIA driver, GPUs and the processes holding GPU memory."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Read the NVIDIA driver, the GPUs and the processes holding GPU memory
description:
  - Reads NVML through C(nvidia-ml-py) (C(import pynvml)) where the host's Python has it, and otherwise
    parses C(nvidia-smi -q -x), the driver's full XML report. Both give the same result.
  - Reports the driver version and the CUDA version the driver supports; per GPU its index, UUID, name,
    PCI bus id, compute capability, total, used and free memory (MiB), MIG mode, persistence mode,
    whether a display is active, clocks (current and maximum), power limit and draw, temperature and
    ECC state; and the processes holding GPU memory, each with the container it runs in (read from
    C(/proc/PID/cgroup)).
  - Also sets the fact C(llmfleet_gpus) to the same result.
  - Never changes the host.
version_added: "0.1.0"
author:
  - llmfleet contributors
options:
  source:
    description:
      - Where to read. C(auto) tries NVML, then C(nvidia-smi).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  required:
    description:
      - Fail when no working driver answers (no NVML and no C(nvidia-smi), or both failing), with a
        message that says what to do.
      - With C(false) the module succeeds and says why in RV(state) and RV(msg); preflight uses this to
        judge a host before its driver is installed.
    type: bool
    default: true
  nvidia_smi:
    description:
      - The C(nvidia-smi) program, a name on PATH or a path.
    type: str
    default: nvidia-smi
attributes:
  check_mode:
    support: full
    description: The module only reads, so check mode runs it unchanged.
  diff_mode:
    support: none
notes:
  - The lab's STAND-IN C(nvidia-smi) (files/standins/, not NVIDIA's) prints the same XML, so GPU-less test
    hosts go through the same parser.
  - Memory figures are MiB, as C(nvidia-smi) prints them (NVML's bytes divided by 1048576, rounded down).
"""

EXAMPLES = r"""
- name: Read the GPUs
  gpu_facts:
  register: gpus

- name: Judge a host that may have no driver yet
  gpu_facts:
    required: false
  register: __preflight_gpu_facts

- name: Read through nvidia-smi even where NVML works
  gpu_facts:
    source: nvidia-smi
"""

RETURN = r"""
state:
  description: C(ok); C(absent) (no driver answers and no C(nvidia-smi) is installed); C(failing) (installed, but
    the driver does not answer). Only C(ok) when O(required=true).
  returned: always
  type: str
  sample: ok
msg:
  description: Why the GPUs could not be read, when RV(state) is not C(ok).
  returned: when state is not ok
  type: str
source:
  description: C(nvml) or C(nvidia-smi).
  returned: when state is ok
  type: str
  sample: nvml
fallback_reason:
  description: Why NVML was not used, when O(source=auto) fell back to C(nvidia-smi).
  returned: when NVML was tried and not used
  type: str
driver_version:
  description: The NVIDIA driver's version.
  returned: when state is ok
  type: str
  sample: "580.159.04"
cuda_driver_version:
  description: The newest CUDA version the driver supports (its CUDA driver API).
  returned: when state is ok
  type: str
  sample: "13.0"
gpus:
  description: One entry per GPU, in the driver's (PCI bus) order.
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA H200
      uuid: GPU-3b8f3a7e-0000-0000-0000-000000000000
      pci_bus_id: "00000000:00:07.0"
      compute_capability: "9.0"
      memory_total_mib: 143771
      memory_used_mib: 0
      memory_free_mib: 143182
      mig_mode: Disabled
      persistence_mode: Enabled
      display_active: Disabled
      clocks: {graphics_mhz: 345, sm_mhz: 345, memory_mhz: 3201, sm_max_mhz: 1980, memory_max_mhz: 3201}
      power_limit_w: 700.0
      power_draw_w: 75.3
      temperature_c: 29
      ecc: {current: Enabled, pending: Enabled, uncorrected_volatile: 0}
processes:
  description: The processes holding GPU memory.
  returned: always
  type: list
  elements: dict
  sample:
    - {gpu_index: 0, gpu_uuid: GPU-..., pid: 4242, name: python3, type: C, used_memory_mib: 70210,
       container_id: null, cmdline: python3 -m vllm.entrypoints.openai.api_server ...}
"""

# Ansible's module layout puts DOCUMENTATION, EXAMPLES and RETURN before the imports
# (ansible-doc reads them without importing); hence the E402 exemptions.
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpu_nvml import NvmlUnavailable, read_nvml  # noqa: E402
from ansible.module_utils.gpu_procs import describe_processes  # noqa: E402
from ansible.module_utils.gpu_smi import (  # noqa: E402
    SMI_COMPUTE_CAP_ARGV,
    SmiParseError,
    add_compute_caps,
    parse_compute_caps,
    parse_smi_xml,
)

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "source": {"type": "str", "choices": ["auto", "nvml", "nvidia-smi"], "default": "auto"},
    "required": {"type": "bool", "default": True},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
}
NO_DRIVER_FIX = (
    "Install the NVIDIA driver (the nvidia_driver role) and reboot if it asks; on a host whose driver is"
    " installed, check `dkms status`, `lsmod | grep nvidia` and `dmesg | grep -i -e nvrm -e xid`"
)


class NotRead(Exception):
    """No GPU facts: state is 'absent' or 'failing'."""

    def __init__(self, state: str, msg: str) -> None:
        super().__init__(msg)
        self.state = state
        self.msg = msg


def read_smi(module: AnsibleModule, program: str) -> dict[str, Any]:
    path = module.get_bin_path(program)
    if path is None:
        raise NotRead("absent", f"{program} is not installed (not found on PATH)")
    rc, out, err = module.run_command([path, "-q", "-x"])
    if rc != 0:
        said = " ".join(f"{out} {err}".split())[:400]
        raise NotRead("failing", f"{path} -q -x exited {rc}: {said}")
    try:
        facts = parse_smi_xml(out)
    except SmiParseError as error:
        raise NotRead("failing", str(error)) from error
    if any(gpu["compute_capability"] is None for gpu in facts["gpus"]):
        # Older reports lack it; the query interface has it since the 510 drivers.
        rc, out, _err = module.run_command([path, *SMI_COMPUTE_CAP_ARGV[1:]])
        if rc == 0:
            add_compute_caps(facts, parse_compute_caps(out))
    return facts


def read(module: AnsibleModule) -> dict[str, Any]:
    source = module.params["source"]
    fallback = None
    if source in ("auto", "nvml"):
        try:
            return read_nvml()
        except NvmlUnavailable as error:
            if source == "nvml":
                raise NotRead("failing", str(error)) from error
            fallback = str(error)
    try:
        facts = read_smi(module, module.params["nvidia_smi"])
    except NotRead as error:
        if fallback is not None:
            raise NotRead(error.state, f"NVML: {fallback}; nvidia-smi: {error.msg}") from error
        raise
    if fallback is not None:
        facts["fallback_reason"] = fallback
    return facts


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        facts = read(module)
    except NotRead as error:
        msg = f"gpu_facts: no NVIDIA driver answers on this host ({error.msg}). {NO_DRIVER_FIX}"
        if module.params["required"]:
            module.fail_json(msg=msg, state=error.state, gpus=[], processes=[], changed=False)
        result = {"state": error.state, "msg": msg, "gpus": [], "processes": []}
        module.exit_json(changed=False, ansible_facts={"llmfleet_gpus": result}, **result)
    facts["processes"] = describe_processes(facts["processes"])
    result = {"state": "ok", **facts}
    module.exit_json(changed=False, ansible_facts={"llmfleet_gpus": result}, **result)


if __name__ == "__main__":
    main()
