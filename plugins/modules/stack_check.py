#!/usr/bin/python
# Copyright: llmfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: refuse NVIDIA driver/CUDA/PyTorch/vLLM/GPU combinations that cannot work."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stack_check
short_description: Refuse GPU software stacks that cannot work together
description:
  - Checks an NVIDIA driver, CUDA toolkit, PyTorch build, vLLM release and GPU against the
    compatibility rules in C(plugins/module_utils/stack_compat/), the same rules the
    C(llmfleet stack check) command applies.
  - Fails with one actionable message per broken rule, naming the rule and the minimum or
    required version, for example driver 470.199.02 under CUDA 12.1 (needs >= 530.30.02).
  - Give the versions one by one, or O(stack) with an entry of the C(gpu_stacks) table from
    C(playbooks/vars/stacks.yml); O(driver) is then the driver installed on the host and
    defaults to the stack's C(driver.min_version).
  - Reads nothing from the host and never changes it.
version_added: "0.1.0"
author:
  - llmfleet contributors
options:
  driver:
    description:
      - NVIDIA driver version as C(nvidia-smi) prints it, for example C(535.104.05).
      - Required unless O(stack) is given.
    type: str
  cuda:
    description:
      - CUDA toolkit version, C(12.1) or with its update number C(12.1.1).
      - Required unless O(stack) is given; mutually exclusive with it.
    type: str
  torch:
    description:
      - PyTorch version, preferably with its wheel label, for example C(2.3.0+cu121).
    type: str
  vllm:
    description:
      - vLLM version, for example C(0.4.2).
    type: str
  transformers:
    description:
      - Hugging Face transformers version, for example C(4.40.2); checked against the range O(vllm) requires.
      - Mutually exclusive with O(stack), which names it.
    type: str
  gpu:
    description:
      - GPU name as C(nvidia-smi) or the vendor prints it, for example C(NVIDIA GeForce RTX 4090) or C(H100).
      - Mutually exclusive with O(compute_capability).
    type: str
  compute_capability:
    description:
      - GPU compute capability, for example C(8.9) or C(sm_89).
    type: str
  stack:
    description:
      - One stack of the C(gpu_stacks) table, typically C({{ gpu_stacks[gpu_stack] }}).
      - Its consistency (driver branch, CUDA package names, wheel label, image tag) is checked too.
    type: dict
  stack_name:
    description:
      - Name of O(stack), used in messages.
    type: str
    default: stack
attributes:
  check_mode:
    support: full
    description: The module only evaluates rules, so check mode runs it unchanged.
  diff_mode:
    support: none
notes:
  - Quote versions in YAML; an unquoted C(12.10) becomes the number C(12.1) and is refused.
  - The driver floor is the CUDA release notes' Table 3 (the toolkit driver), not the weaker
    minor-version-compatibility floor; see the module_utils docstring for why.
"""

EXAMPLES = r"""
- name: Refuse the write-up's pin before anything installs
  stack_check:
    driver: "470.199.02"
    cuda: "12.1"
    gpu: "NVIDIA GeForce RTX 4090"

- name: Check the inventory's stack against the installed driver and GPU
  stack_check:
    stack: "{{ gpu_stacks[gpu_stack] }}"
    stack_name: "{{ gpu_stack }}"
    driver: "{{ __nvidia_smi_driver_version }}"
    gpu: "{{ __nvidia_smi_gpu_name }}"

- name: Check explicit versions
  stack_check:
    driver: "535.104.05"
    cuda: "12.1.1"
    torch: "2.3.0+cu121"
    vllm: "0.4.2"
    compute_capability: "8.9"
"""

RETURN = r"""
ok:
  description: Whether every rule passed.
  returned: always
  type: bool
  sample: true
problems:
  description: The broken rules; empty when O(ok) is true.
  returned: always
  type: list
  elements: dict
  contains:
    rule:
      description: Stable rule id.
      type: str
      sample: driver-too-old-for-cuda
    message:
      description: What is wrong and what to do.
      type: str
    found:
      description: The version found.
      type: str
      sample: driver 470.199.02
    required:
      description: The minimum or required version.
      type: str
      sample: ">= 530.30.02"
    source:
      description: Vendor documentation the rule comes from.
      type: str
checked:
  description: The versions the rules were applied to.
  returned: always
  type: dict
  sample: {"driver": "535.104.05", "cuda": "12.1.1", "torch": "2.3.0+cu121", "vllm": "0.4.2",
           "compute_capability": "8.9"}
"""

# Ansible's module layout puts DOCUMENTATION, EXAMPLES and RETURN before the imports
# (ansible-doc reads them without importing); hence the E402 exemptions.
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.stack_compat import (  # noqa: E402
    check,
    check_stack,
    format_compute_capability,
    gpu_compute_capability,
    stack_versions,
)

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "driver": {"type": "str"},
    "cuda": {"type": "str"},
    "torch": {"type": "str"},
    "vllm": {"type": "str"},
    "transformers": {"type": "str"},
    "gpu": {"type": "str"},
    "compute_capability": {"type": "str"},
    "stack": {"type": "dict"},
    "stack_name": {"type": "str", "default": "stack"},
}


def run(params: dict[str, Any]) -> dict[str, Any]:
    """Apply the rules to the module's parameters; ValueError for unusable input."""
    compute_capability = params["compute_capability"]
    if params["gpu"] is not None:
        compute_capability = format_compute_capability(gpu_compute_capability(params["gpu"]))
    stack = params["stack"]
    if stack is not None:
        name = params["stack_name"]
        checked: dict[str, Any] = {"stack": name}
        checked.update(stack_versions(stack, name))
        if params["driver"] is not None:
            checked["driver"] = params["driver"]
        problems = check_stack(stack, name, driver=params["driver"], compute_capability=compute_capability)
    else:
        missing = [key for key in ("driver", "cuda") if params[key] is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)} required unless stack is given")
        checked = {key: params[key] for key in ("driver", "cuda", "torch", "vllm", "transformers")}
        problems = check(
            params["driver"],
            params["cuda"],
            torch=params["torch"],
            vllm=params["vllm"],
            compute_capability=compute_capability,
            transformers=params["transformers"],
        )
    checked["compute_capability"] = compute_capability
    return {"ok": not problems, "problems": [problem.as_dict() for problem in problems], "checked": checked}


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[
            ("gpu", "compute_capability"),
            ("stack", "cuda"),
            ("stack", "torch"),
            ("stack", "vllm"),
            ("stack", "transformers"),
        ],
        required_one_of=[("stack", "cuda")],
        supports_check_mode=True,
    )
    try:
        result = run(module.params)
    except ValueError as error:
        module.fail_json(msg=f"stack_check: {error}", changed=False)
    if not result["ok"]:
        lines = [
            f"[{problem['rule']}] {problem['message']} (found {problem['found']}; required {problem['required']})"
            for problem in result["problems"]
        ]
        module.fail_json(msg="Incompatible GPU software stack: " + " | ".join(lines), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
