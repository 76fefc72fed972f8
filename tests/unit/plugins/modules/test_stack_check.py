"""Unit tests for plugins/modules/stack_check.py, run as Ansible runs it.

Each case is an ad-hoc `ansible localhost -m stack_check` call with the
repository's plugins/modules and plugins/module_utils on the search paths, so
Ansible itself packages the module with ansible.module_utils.stack_compat.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible_adhoc import ansible_env
from tests.ansible_adhoc import run_module as run_adhoc_module

REPO = Path(__file__).parents[4]
MODULE = REPO / "plugins" / "modules" / "stack_check.py"
STACKS = yaml.safe_load((REPO / "playbooks" / "vars" / "stacks.yml").read_text(encoding="utf-8"))["gpu_stacks"]
ANSIBLE_BIN = Path(sys.executable).parent


def run_module(tmp_path: Path, args: dict[str, Any], check_mode: bool = False) -> tuple[int, dict[str, Any]]:
    """Run stack_check on localhost: the exit code of `ansible` and the module's result."""
    run = run_adhoc_module(tmp_path, "stack_check", args, check_mode=check_mode)
    return run.returncode, run.result


@pytest.mark.parametrize(
    "args",
    [
        {
            "driver": "535.104.05",
            "cuda": "12.1.1",
            "torch": "2.3.0+cu121",
            "vllm": "0.4.2",
            "compute_capability": "8.9",
        },
        {"driver": "535.104.05", "cuda": "12.1", "gpu": "NVIDIA GeForce RTX 4090"},
        {"stack": STACKS["mission-cu121"], "stack_name": "mission-cu121", "gpu": "NVIDIA H100 80GB HBM3"},
        {"stack": STACKS["current-cu128"], "stack_name": "current-cu128", "driver": "580.82.07", "gpu": "B200"},
    ],
)
def test_compatible_stacks_pass_and_change_nothing(tmp_path: Path, args: dict[str, Any]) -> None:
    code, result = run_module(tmp_path, args)
    assert code == 0, result
    assert result["failed"] is False
    assert result["ok"] is True
    assert result["problems"] == []
    assert result["changed"] is False


@pytest.mark.parametrize(
    ("args", "rule", "required"),
    [
        ({"driver": "470.199.02", "cuda": "12.1"}, "driver-too-old-for-cuda", ">= 530.30.02"),
        ({"driver": "470.199.02", "cuda": "11.4", "torch": "2.3.0+cu121"}, "driver-too-old-for-torch", ">= 530.30.02"),
        (
            {"driver": "535.104.05", "cuda": "12.1", "torch": "2.1.2+cu121", "vllm": "0.4.2"},
            "vllm-torch-mismatch",
            "torch == 2.3.0",
        ),
        (
            {"driver": "580.65.06", "cuda": "12.8.1", "vllm": "0.9.2", "transformers": "4.54.0"},
            "vllm-transformers-mismatch",
            "transformers >= 4.51.1, < 4.54.0",
        ),
        ({"driver": "520.61.05", "cuda": "11.7", "gpu": "RTX 4090"}, "cuda-too-old-for-gpu", ">= 11.8"),
        (
            {"stack": STACKS["mission-cu121"], "driver": "470.199.02", "gpu": "RTX 4090"},
            "driver-too-old-for-gpu",
            ">= 520.61.05",
        ),
    ],
)
def test_incompatible_stacks_fail_with_the_rule_and_minimum(
    tmp_path: Path, args: dict[str, Any], rule: str, required: str
) -> None:
    code, result = run_module(tmp_path, args)
    assert code != 0
    assert result["failed"] is True
    assert result["changed"] is False
    assert result["ok"] is False
    problem = next(problem for problem in result["problems"] if problem["rule"] == rule)
    assert problem["required"] == required
    assert f"[{rule}]" in result["msg"]
    assert f"required {required}" in result["msg"]


def test_check_mode_gives_the_same_verdict(tmp_path: Path) -> None:
    code, result = run_module(tmp_path, {"driver": "470.199.02", "cuda": "12.1"}, check_mode=True)
    assert code != 0
    assert [problem["rule"] for problem in result["problems"]] == ["driver-too-old-for-cuda"]
    code, result = run_module(tmp_path, {"stack": STACKS["mission-cu121"]}, check_mode=True)
    assert (code, result["ok"], result["changed"]) == (0, True, False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"driver": "banana", "cuda": "12.1"}, "stack_check: NVIDIA driver version 'banana' is not a version"),
        ({"cuda": "12.1"}, "driver required unless stack is given"),
        ({"driver": "535.104.05", "cuda": "12.1", "gpu": "A10G"}, "unknown GPU 'A10G'"),
        ({"driver": "535.104.05", "cuda": "12.1", "gpu": "L4", "compute_capability": "8.9"}, "mutually exclusive"),
        ({"stack": STACKS["mission-cu121"], "cuda": "12.4"}, "mutually exclusive"),
        ({"driver": "535.104.05"}, "one of the following is required"),
    ],
)
def test_unusable_input_fails_with_a_message(tmp_path: Path, args: dict[str, Any], message: str) -> None:
    code, result = run_module(tmp_path, args)
    assert code != 0
    assert result["failed"] is True
    assert message in result["msg"]


# --- documentation matches the code ------------------------------------------


def _module_constants() -> dict[str, Any]:
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    constants: dict[str, Any] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id in {"DOCUMENTATION", "EXAMPLES", "RETURN", "ARGUMENT_SPEC"}:
            assert node.value is not None  # type: ignore[attr-defined]
            constants[target.id] = ast.literal_eval(node.value)  # type: ignore[attr-defined]
    return constants


def test_documented_options_are_the_argument_spec() -> None:
    constants = _module_constants()
    documentation = yaml.safe_load(constants["DOCUMENTATION"])
    spec = constants["ARGUMENT_SPEC"]
    assert documentation["module"] == "stack_check"
    assert documentation["options"].keys() == spec.keys()
    for name, option in documentation["options"].items():
        assert option["type"] == spec[name]["type"], name
        assert option.get("default") == spec[name].get("default"), name
    assert documentation["attributes"]["check_mode"]["support"] == "full"
    for example in yaml.safe_load(constants["EXAMPLES"]):
        assert set(example["stack_check"]) <= spec.keys()
    assert {"ok", "problems", "checked"} <= yaml.safe_load(constants["RETURN"]).keys()


def test_ansible_doc_renders_the_module(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(ANSIBLE_BIN / "ansible-doc"), "--json", "stack_check"],
        cwd=tmp_path,
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["stack_check"]["doc"]
    assert doc["attributes"]["check_mode"]["support"] == "full"
