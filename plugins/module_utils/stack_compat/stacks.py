"""The stack table (playbooks/vars/stacks.yml): reading one stack, its own consistency rules, and
the rules on its versions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .report import Problem
from .rules import check
from .versions import (
    cuda_tag,
    parse_cuda_version,
    parse_driver_version,
    parse_peft_version,
    parse_torch_version,
    parse_vllm_version,
)


def _get(stack: Mapping[str, object], path: str, name: str) -> object:
    node: object = stack
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            raise ValueError(f"stack {name!r}: missing {path}")
        node = node[key]
    return node


def _get_str(stack: Mapping[str, object], path: str, name: str) -> str:
    value = _get(stack, path, name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"stack {name!r}: {path} must be a non-empty string (quote versions), got {value!r}")
    return value


def stack_packages(stack: Mapping[str, object], name: str = "stack") -> dict[str, list[str]]:
    """cuda.packages: NVIDIA repository name (debian12, ubuntu2204, ...) -> package names."""
    packages = _get(stack, "cuda.packages", name)
    if not isinstance(packages, Mapping) or not packages:
        raise ValueError(f"stack {name!r}: cuda.packages must map at least one distribution to its packages")
    result: dict[str, list[str]] = {}
    for distro, names in packages.items():
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"stack {name!r}: cuda.packages.{distro} must be a non-empty list of package names")
        result[str(distro)] = list(names)
    return result


def stack_versions(stack: Mapping[str, object], name: str = "stack") -> dict[str, str]:
    """The versions of a stack (driver = the stack's minimum); all but peft are check()'s arguments."""
    return {
        "driver": _get_str(stack, "driver.min_version", name),
        "cuda": _get_str(stack, "cuda.version", name),
        "torch": f"{_get_str(stack, 'torch.version', name)}+{_get_str(stack, 'torch.cuda_tag', name)}",
        "vllm": _get_str(stack, "vllm.version", name),
        "transformers": _get_str(stack, "transformers.version", name),
        "peft": _get_str(stack, "peft.version", name),
    }


def check_stack(
    stack: Mapping[str, object],
    name: str = "stack",
    driver: str | None = None,
    compute_capability: str | None = None,
) -> list[Problem]:
    """The table's own consistency rules, then check() on its versions.

    ``driver`` is the driver actually installed; it defaults to the stack's
    minimum, which is what "every shipped stack passes its own check" tests.
    """
    versions = stack_versions(stack, name)
    branch = _get_str(stack, "driver.branch", name)
    image = _get_str(stack, "vllm.image", name)
    packages = stack_packages(stack, name)
    min_driver = parse_driver_version(versions["driver"])
    cuda = parse_cuda_version(versions["cuda"])
    torch = parse_torch_version(versions["torch"])
    vllm = parse_vllm_version(versions["vllm"])
    parse_peft_version(versions["peft"])  # only its form: the table holds no PEFT rule

    problems: list[Problem] = []
    if not branch.isdigit() or int(branch) != min_driver.major:
        problems.append(
            Problem(
                "stack-driver-branch-mismatch",
                found=f"branch {branch}, min_version {min_driver}",
                required=f"min_version {branch}.x",
                message=(
                    f"stack {name!r}: driver.min_version {min_driver} is not on driver branch {branch}; "
                    "make both name the same branch"
                ),
            )
        )
    expected_suffix = f"-{cuda.major}-{cuda.minor}"
    for distro, names in sorted(packages.items()):
        for package in _versioned_cuda_packages(names):
            if not package.endswith(expected_suffix):
                problems.append(
                    Problem(
                        "stack-cuda-package-mismatch",
                        found=f"{distro}: {package}",
                        required=f"*{expected_suffix}",
                        message=(
                            f"stack {name!r}: package {package} for {distro} is not CUDA {cuda.major}.{cuda.minor}; "
                            f"use the {expected_suffix.lstrip('-')} packages for cuda.version {cuda}"
                        ),
                    )
                )
    if torch.local != cuda_tag(cuda):
        problems.append(
            Problem(
                "stack-torch-cuda-tag-mismatch",
                found=f"torch.cuda_tag {torch.local}",
                required=cuda_tag(cuda),
                message=(
                    f"stack {name!r}: torch.cuda_tag {torch.local} does not match cuda.version {cuda}; "
                    f"one stack runs one CUDA: use {cuda_tag(cuda)}"
                ),
            )
        )
    if not image.endswith(f":v{vllm}"):
        problems.append(
            Problem(
                "stack-image-tag-mismatch",
                found=f"image {image}",
                required=f"tag v{vllm}",
                message=(
                    f"stack {name!r}: engine image {image} is not tagged v{vllm} (vllm.version); "
                    "the image and the host-side vLLM must be the same release"
                ),
            )
        )
    problems += check(
        driver=driver if driver is not None else versions["driver"],
        cuda=versions["cuda"],
        torch=versions["torch"],
        vllm=versions["vllm"],
        compute_capability=compute_capability,
        transformers=versions["transformers"],
    )
    return problems


def _versioned_cuda_packages(names: Iterable[str]) -> list[str]:
    """Packages whose name carries a CUDA major-minor, such as cuda-toolkit-12-1."""
    return [name for name in names if re.match(r"^cuda-[a-z-]+-\d+-\d+$", name)]
