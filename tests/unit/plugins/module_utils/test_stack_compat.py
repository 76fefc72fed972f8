"""Unit tests for plugins/module_utils/stack_compat/: the GPU stack compatibility rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.module_utils import stack_compat
from llmfleet.module_utils.stack_compat import (
    COMPUTE_CAPABILITY_MIN_CUDA,
    CUDA_TOOLKIT_MIN_DRIVER,
    GPU_COMPUTE_CAPABILITY,
    RULES,
    TORCH_CUDA_TAGS,
    VLLM_TORCH,
    VLLM_TRANSFORMERS,
    Problem,
    check,
    check_stack,
)

STACKS_FILE = Path(__file__).parents[4] / "playbooks" / "vars" / "stacks.yml"


def load_stacks() -> dict[str, dict[str, Any]]:
    stacks: dict[str, dict[str, Any]] = yaml.safe_load(STACKS_FILE.read_text(encoding="utf-8"))["gpu_stacks"]
    return stacks


def rules(problems: list[Problem]) -> list[str]:
    return [problem.rule for problem in problems]


def by_rule(problems: list[Problem], rule: str) -> Problem:
    matches = [problem for problem in problems if problem.rule == rule]
    assert matches, f"expected rule {rule}, got {rules(problems)}"
    return matches[0]


# --- versions ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "text", "release", "local"),
    [
        (stack_compat.parse_driver_version, "535.104.05", (535, 104, 5), None),
        (stack_compat.parse_driver_version, "570.26", (570, 26), None),
        (stack_compat.parse_driver_version, " 470.199.02\n", (470, 199, 2), None),
        (stack_compat.parse_cuda_version, "12.1", (12, 1), None),
        (stack_compat.parse_cuda_version, "12.1.1", (12, 1, 1), None),
        (stack_compat.parse_torch_version, "2.3.0+cu121", (2, 3, 0), "cu121"),
        (stack_compat.parse_torch_version, "2.3.0", (2, 3, 0), None),
        (stack_compat.parse_torch_version, "2.3.0+rocm6.0", (2, 3, 0), "rocm6.0"),
        (stack_compat.parse_vllm_version, "0.4.2", (0, 4, 2), None),
        (stack_compat.parse_vllm_version, "v0.9.2", (0, 9, 2), None),
        (stack_compat.parse_vllm_version, "0.10.1.1", (0, 10, 1, 1), None),
        (stack_compat.parse_vllm_version, "0.5.0.post1", (0, 5, 0), None),
    ],
)
def test_versions_parse(parse: Any, text: str, release: tuple[int, ...], local: str | None) -> None:
    version = parse(text)
    assert version.release == release
    assert version.local == local


@pytest.mark.parametrize(
    ("parse", "value", "hint"),
    [
        (stack_compat.parse_driver_version, "latest", "not a version"),
        (stack_compat.parse_driver_version, "", "empty"),
        (stack_compat.parse_driver_version, "535", "2 to 3"),
        (stack_compat.parse_driver_version, "535.104.05.1", "2 to 3"),
        (stack_compat.parse_driver_version, "535.104.05+x", "'+' label"),
        (stack_compat.parse_cuda_version, "12", "2 to 3"),
        (stack_compat.parse_cuda_version, "cuda12.1", "not a version"),
        (stack_compat.parse_cuda_version, "12.1-rc1", "not a version"),
        (stack_compat.parse_cuda_version, 12.1, "quote versions in YAML"),
        (stack_compat.parse_cuda_version, None, "must be a string"),
        (stack_compat.parse_torch_version, "2.3.0+", "not a version"),
        (stack_compat.parse_torch_version, "2.3.0.post1", "post-release"),
        (stack_compat.parse_torch_version, "2.3.0rc1", "not a version"),
        (stack_compat.parse_vllm_version, "0.4.2; rm -rf /", "not a version"),
    ],
)
def test_garbage_versions_are_refused_with_a_clear_error(parse: Any, value: object, hint: str) -> None:
    with pytest.raises(ValueError, match=r"version|empty") as raised:
        parse(value)
    assert hint in str(raised.value)


def test_versions_compare_numerically_and_ignore_padding() -> None:
    parse = stack_compat.parse_driver_version
    assert parse("535.104.05") < parse("535.104.12")
    assert parse("535.104.12") < parse("535.129.03")
    assert parse("570.26") == parse("570.26.0")
    assert parse("470.199.02") < parse("530.30.02")
    assert str(parse("535.104.05")) == "535.104.05"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8.9", (8, 9)),
        ("sm_89", (8, 9)),
        ("SM89", (8, 9)),
        ("sm_100", (10, 0)),
        ("compute_90", (9, 0)),
        ("12.0", (12, 0)),
    ],
)
def test_compute_capability_parses(text: str, expected: tuple[int, int]) -> None:
    assert stack_compat.parse_compute_capability(text) == expected


@pytest.mark.parametrize("text", ["89", "8", "ada", "sm_8", ""])
def test_bad_compute_capability_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="compute capability"):
        stack_compat.parse_compute_capability(text)


# --- lookups ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cuda", "driver"),
    [
        ("12.1", "530.30.02"),
        ("12.1.1", "530.30.02"),
        ("12.2", "535.54.03"),  # no update given: the GA row
        ("12.2.2", "535.104.05"),
        ("12.8.1", "570.124.06"),
        ("12.8.2", "570.124.06"),  # newer update than the table knows: newest known row
        ("11.8", "520.61.05"),
        ("11.0", "450.51.05"),
        ("13.0", "580.65.06"),
    ],
)
def test_min_driver_for_cuda_follows_table_3(cuda: str, driver: str) -> None:
    floor = stack_compat.min_driver_for_cuda(stack_compat.parse_cuda_version(cuda))
    assert floor == stack_compat.parse_driver_version(driver)


@pytest.mark.parametrize("cuda", ["12.7", "14.0", "11.0.1"])
def test_unknown_cuda_releases_have_no_floor(cuda: str) -> None:
    assert stack_compat.min_driver_for_cuda(stack_compat.parse_cuda_version(cuda)) is None


@pytest.mark.parametrize(
    ("name", "capability"),
    [
        ("RTX 4090", (8, 9)),
        ("NVIDIA GeForce RTX 4090", (8, 9)),
        ("rtx 4090", (8, 9)),
        ("NVIDIA A100-SXM4-80GB", (8, 0)),
        ("A100", (8, 0)),
        ("NVIDIA A10", (8, 6)),
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA H100 PCIe", (9, 0)),
        ("H200", (9, 0)),
        ("NVIDIA L40S", (8, 9)),
        ("NVIDIA L40", (8, 9)),
        ("NVIDIA L4", (8, 9)),
        ("Tesla T4", (7, 5)),
        ("Tesla V100-SXM2-16GB", (7, 0)),
        ("NVIDIA RTX 6000 Ada Generation", (8, 9)),
        ("NVIDIA B200", (10, 0)),
        ("NVIDIA GeForce RTX 5090", (12, 0)),
    ],
)
def test_gpu_names_resolve_to_compute_capability(name: str, capability: tuple[int, int]) -> None:
    assert stack_compat.gpu_compute_capability(name) == capability


@pytest.mark.parametrize("name", ["A10G", "Quadro RTX 6000", "RTX 6000", "Radeon VII", ""])
def test_unknown_gpu_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"unknown GPU .*compute capability"):
        stack_compat.gpu_compute_capability(name)


def test_driver_470_reaches_ampere_at_most() -> None:
    reach = stack_compat.max_compute_capability_for_driver(stack_compat.parse_driver_version("470.199.02"))
    assert reach == (8, 6)
    assert stack_compat.gpu_compute_capability("RTX 4090") > reach


# --- the check --------------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "cuda", "torch", "vllm", "capability"),
    [
        ("535.104.05", "12.1.1", "2.3.0+cu121", "0.4.2", "8.9"),  # the mission stack on an RTX 4090
        ("530.30.02", "12.1", "2.3.0+cu121", "0.4.2", "9.0"),  # exactly the minimum, on an H100
        ("535.261.03", "12.1.1", "2.3.0", "0.4.2", None),  # bare torch version: vLLM rule only
        ("520.61.05", "11.8", "2.3.0+cu118", "0.4.2", "8.9"),  # cu118 already knows Ada
        ("580.65.06", "12.8.1", "2.7.0+cu128", "0.9.2", "10.0"),  # the current stack on a B200
        ("570.124.06", "12.8.1", "2.7.0+cu128", "0.9.0", "12.0"),  # RTX 5090 needs CUDA 12.8
        ("560.35.05", "12.6.3", "2.7.1+cu126", None, "8.0"),
        ("570.26", "12.8", "2.8.0+cu128", "0.10.2", "7.0"),  # V100 still fine on CUDA 12
        ("470.199.02", "11.4", None, None, "8.6"),  # 470 with Ampere and CUDA 11.4: fine
    ],
)
def test_compatible_combinations_pass(
    driver: str, cuda: str, torch: str | None, vllm: str | None, capability: str | None
) -> None:
    assert check(driver, cuda, torch=torch, vllm=vllm, compute_capability=capability) == []


def test_driver_470_with_cuda_12_1_is_refused_naming_530() -> None:
    problems = check("470.199.02", "12.1")
    problem = by_rule(problems, "driver-too-old-for-cuda")
    assert problem.found == "driver 470.199.02"
    assert problem.required == ">= 530.30.02"
    assert "530.30.02" in problem.message
    assert "CUDA 12.1" in problem.message


def test_torch_cu121_with_a_cuda_11_driver_is_refused() -> None:
    # 470.199.02 runs CUDA 11.4 toolkits, not the CUDA 12.1 runtime inside torch+cu121.
    problems = check("470.199.02", "11.4", torch="2.3.0+cu121")
    problem = by_rule(problems, "driver-too-old-for-torch")
    assert problem.required == ">= 530.30.02"
    assert "driver-too-old-for-cuda" not in rules(problems)


def test_vllm_0_4_2_with_torch_2_1_2_is_refused_naming_2_3_0() -> None:
    problems = check("535.104.05", "12.1.1", torch="2.1.2+cu121", vllm="0.4.2")
    assert rules(problems) == ["vllm-torch-mismatch"]
    assert problems[0].required == "torch == 2.3.0"
    assert "2.3.0" in problems[0].message


def test_rtx_4090_with_cuda_11_7_is_refused() -> None:
    capability = stack_compat.format_compute_capability(stack_compat.gpu_compute_capability("RTX 4090"))
    problems = check("515.48.07", "11.7.1", compute_capability=capability)
    problem = by_rule(problems, "cuda-too-old-for-gpu")
    assert problem.required == ">= 11.8"
    assert "8.9" in problem.message


def test_driver_470_cannot_drive_an_rtx_4090() -> None:
    problems = check("470.199.02", "11.4.4", compute_capability="8.9")
    assert rules(problems) == ["cuda-too-old-for-gpu", "driver-too-old-for-gpu"]
    problem = by_rule(problems, "driver-too-old-for-gpu")
    assert problem.required == ">= 520.61.05"
    assert "8.6 at most" in problem.message


def test_torch_cu118_needs_the_cuda_11_8_driver() -> None:
    problems = check("470.199.02", "11.4", torch="2.1.2+cu118")
    assert rules(problems) == ["driver-too-old-for-torch"]
    assert problems[0].required == ">= 520.61.05"


@pytest.mark.parametrize(
    ("driver", "cuda", "torch", "vllm", "capability", "rule", "required"),
    [
        ("535.104.05", "12.1.1", "2.3.0+cu124", None, None, "torch-cuda-tag-unpublished", "one of cu118, cu121"),
        ("535.104.05", "12.1.1", "2.3.0+cpu", None, None, "torch-not-cuda-build", "a CUDA build: cu118, cu121"),
        ("535.104.05", "12.1.1", "2.3.0+cu118", None, None, "torch-cuda-major-mismatch", "a cu12x build of torch"),
        ("535.104.05", "12.1.1", "2.3.1+cu121", "0.4.2", None, "vllm-torch-mismatch", "torch == 2.3.0"),
        ("580.65.06", "12.8.1", "2.8.0+cu128", "0.9.2", None, "vllm-torch-mismatch", "torch == 2.7.0"),
        ("550.54.15", "12.4.1", None, None, "10.0", "cuda-too-old-for-gpu", ">= 12.8"),
        ("550.54.15", "12.4.1", None, None, "10.0", "driver-too-old-for-gpu", ">= 570.26"),
        ("570.124.06", "12.8.1", "2.3.0+cu121", None, "12.0", "torch-cuda-too-old-for-gpu", "CUDA >= 12.8"),
        ("580.65.06", "13.0", None, None, "7.0", "cuda-dropped-gpu", "CUDA 12.x"),
        ("535.104.05", "12.7", None, None, None, "unknown-cuda-version", "Table 3"),
        ("535.104.05", "12.1.1", "1.13.1+cu117", None, None, "unknown-torch-version", "one of 2.1"),
        ("535.104.05", "12.1.1", None, "0.3.0", None, "unknown-vllm-version", "one of 0.4.2"),
        ("535.104.05", "12.1.1", None, None, "7.2", "unknown-compute-capability", "one of 7.0"),
    ],
)
def test_incompatible_combinations_are_refused(
    driver: str, cuda: str, torch: str | None, vllm: str | None, capability: str | None, rule: str, required: str
) -> None:
    problems = check(driver, cuda, torch=torch, vllm=vllm, compute_capability=capability)
    assert required in by_rule(problems, rule).required


@pytest.mark.parametrize(
    ("vllm", "transformers", "required"),
    [
        ("0.4.2", "4.39.3", "transformers >= 4.40.0"),
        ("0.9.2", "4.50.3", "transformers >= 4.51.1, < 4.54.0"),
        ("0.9.2", "4.54.0", "transformers >= 4.51.1, < 4.54.0"),
        ("0.11.0", "4.55.1", "transformers >= 4.55.2"),
    ],
)
def test_transformers_outside_the_vllm_range_is_refused(vllm: str, transformers: str, required: str) -> None:
    torch = VLLM_TORCH[stack_compat.parse_vllm_version(vllm).release]
    problems = check("580.65.06", "12.8.1", vllm=vllm, torch=torch, transformers=transformers)
    assert rules(problems) == ["vllm-transformers-mismatch"]
    assert problems[0].required == required
    assert transformers in problems[0].message


@pytest.mark.parametrize(("vllm", "transformers"), [("0.4.2", "4.40.0"), ("0.4.2", "4.57.6"), ("0.9.2", "4.53.3")])
def test_transformers_inside_the_vllm_range_passes(vllm: str, transformers: str) -> None:
    assert check("580.65.06", "12.8.1", vllm=vllm, transformers=transformers) == []


def test_garbage_input_raises_before_any_rule() -> None:
    with pytest.raises(ValueError, match="NVIDIA driver version 'banana'"):
        check("banana", "12.1")
    with pytest.raises(ValueError, match="vLLM version"):
        check("535.104.05", "12.1", vllm="latest")
    with pytest.raises(ValueError, match="transformers version"):
        check("535.104.05", "12.1", vllm="0.4.2", transformers="4.40.2+local")


def test_every_problem_names_a_rule_with_a_source_and_serialises() -> None:
    problems = check("470.199.02", "12.1", torch="2.3.0+cu121", vllm="0.4.2", compute_capability="8.9")
    assert len(problems) >= 3
    for problem in problems:
        assert problem.rule in RULES
        assert problem.as_dict().keys() == {"rule", "message", "found", "required", "source"}
        assert problem.source.startswith("https://")
        assert problem.rule in problem.line() and problem.required in problem.line()
        assert "\n" not in problem.line()


# --- the tables agree with each other ---------------------------------------


def test_every_named_gpu_has_a_minimum_cuda() -> None:
    assert set(GPU_COMPUTE_CAPABILITY.values()) <= set(COMPUTE_CAPABILITY_MIN_CUDA)


def test_every_minimum_cuda_has_a_driver_row() -> None:
    for capability, cuda in COMPUTE_CAPABILITY_MIN_CUDA.items():
        assert stack_compat.min_driver_for_compute_capability(capability) is not None, cuda


def test_every_torch_label_has_a_driver_row_and_every_vllm_torch_is_known() -> None:
    for tags in TORCH_CUDA_TAGS.values():
        for tag in tags:
            assert stack_compat.min_driver_for_cuda(stack_compat.cuda_tag_version(tag)) is not None, tag
    for torch in VLLM_TORCH.values():
        version = stack_compat.parse_torch_version(torch)
        assert (version.major, version.minor) in TORCH_CUDA_TAGS


def test_every_vllm_release_has_a_transformers_range() -> None:
    assert set(VLLM_TRANSFORMERS) == set(VLLM_TORCH)
    for low, high in VLLM_TRANSFORMERS.values():
        assert high is None or stack_compat.parse_transformers_version(low) < stack_compat.parse_transformers_version(
            high
        )


def test_driver_table_never_decreases_with_the_toolkit() -> None:
    rows = sorted(CUDA_TOOLKIT_MIN_DRIVER.items())
    drivers = [stack_compat.parse_driver_version(driver) for _, driver in rows]
    assert drivers == sorted(drivers)


# --- the shipped stacks ------------------------------------------------------


@pytest.mark.parametrize("name", sorted(load_stacks()))
def test_every_shipped_stack_passes_its_own_check(name: str) -> None:
    assert check_stack(load_stacks()[name], name) == []


@pytest.mark.parametrize("gpu", ["RTX 4090", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"])
def test_the_mission_stack_runs_the_mission_gpus(gpu: str) -> None:
    capability = stack_compat.format_compute_capability(stack_compat.gpu_compute_capability(gpu))
    assert check_stack(load_stacks()["mission-cu121"], "mission-cu121", compute_capability=capability) == []


def test_the_mission_stack_refuses_the_write_ups_driver() -> None:
    problems = check_stack(load_stacks()["mission-cu121"], "mission-cu121", driver="470.199.02")
    assert by_rule(problems, "driver-too-old-for-cuda").required == ">= 530.30.02"


@pytest.mark.parametrize(
    ("path", "value", "rule"),
    [
        ("driver.branch", "550", "stack-driver-branch-mismatch"),
        ("driver.min_version", "470.199.02", "driver-too-old-for-cuda"),
        ("cuda.packages", {"ubuntu2204": ["cuda-toolkit-12-2"]}, "stack-cuda-package-mismatch"),
        ("torch.cuda_tag", "cu118", "stack-torch-cuda-tag-mismatch"),
        ("vllm.image", "vllm/vllm-openai:v0.4.1", "stack-image-tag-mismatch"),
        ("vllm.version", "0.9.2", "vllm-torch-mismatch"),
        ("transformers.version", "4.39.3", "vllm-transformers-mismatch"),
    ],
)
def test_a_drifted_stack_is_refused(path: str, value: object, rule: str) -> None:
    stack = copy.deepcopy(load_stacks()["mission-cu121"])
    node = stack
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    assert rule in rules(check_stack(stack, "drifted"))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda stack: stack["driver"].pop("min_version"), "missing driver.min_version"),
        (lambda stack: stack["cuda"].__setitem__("version", 12.1), "quote versions"),
        (lambda stack: stack.pop("peft"), "missing peft.version"),
        (lambda stack: stack["peft"].__setitem__("version", "latest"), "PEFT version 'latest'"),
        (lambda stack: stack["transformers"].__setitem__("version", 4.4), "quote versions"),
        (lambda stack: stack["cuda"].__setitem__("packages", {}), "cuda.packages"),
        (lambda stack: stack["cuda"]["packages"].__setitem__("ubuntu2204", "cuda-toolkit-12-1"), "non-empty list"),
    ],
)
def test_a_malformed_stack_raises_value_error(mutate: Any, message: str) -> None:
    stack = copy.deepcopy(load_stacks()["mission-cu121"])
    mutate(stack)
    with pytest.raises(ValueError, match=message):
        check_stack(stack, "broken")
