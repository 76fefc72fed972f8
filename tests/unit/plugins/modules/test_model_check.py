"""Unit tests for plugins/modules/model_check.py, run as Ansible runs it.

Each case is an ad-hoc `ansible localhost -m model_check` call with the
repository's plugins/modules and plugins/module_utils on the search paths, so
Ansible itself packages the module with ansible.module_utils.model_validation,
against a real tiny model and adapter made by llmfleet.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.lab import tiny
from llmfleet.lab.tiny_adapter import make_tiny_adapter
from tests.ansible_adhoc import ansible_env
from tests.ansible_adhoc import run_module as run_adhoc_module

REPO = Path(__file__).parents[4]
MODULE = REPO / "plugins" / "modules" / "model_check.py"
ANSIBLE_BIN = Path(sys.executable).parent


def run_module(
    tmp_path: Path, args: dict[str, Any], check_mode: bool = False, diff: bool = False
) -> tuple[int, dict[str, Any], str]:
    """Run model_check on localhost: the exit code, the module's result, and what came before it."""
    run = run_adhoc_module(tmp_path, "model_check", args, check_mode=check_mode, diff=diff)
    return run.returncode, run.result, run.output


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "tiny"
    tiny.make_tiny_model(path, seed=0)
    return path


@pytest.fixture
def model(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny"
    shutil.copytree(pristine, path)
    return path


def drop_rope_theta(model: Path) -> str:
    """Remove rope_theta from config.json as a careless export does; return the text written."""
    config = json.loads((model / "config.json").read_text())
    del config["rope_theta"]
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    (model / "config.json").write_text(text)
    return text


@pytest.mark.parametrize("engine_version", ["0.4.2", "0.9.2", "0.32.0"])
def test_a_servable_model_passes_with_its_facts(tmp_path: Path, pristine: Path, engine_version: str) -> None:
    code, result, _ = run_module(tmp_path, {"path": str(pristine), "engine_version": engine_version})
    assert code == 0, result
    assert (result["ok"], result["changed"], result["problems"]) == (True, False, [])
    assert result["engine_version"] == engine_version
    facts = result["facts"]
    assert (facts["layers"], facts["kv_heads"], facts["head_dim"], facts["dtype"]) == (2, 1, 64, "bfloat16")
    assert facts["weights_bytes"] == 723_200
    assert result["config_fix"] is None


def test_a_model_with_adapters(tmp_path: Path, pristine: Path) -> None:
    make_tiny_adapter(tmp_path / "lora", pristine, targets=("q_proj", "v_proj"), rank=8)
    code, result, _ = run_module(
        tmp_path, {"path": str(pristine), "adapters": [str(tmp_path / "lora")], "engine_version": "0.32.0"}
    )
    assert code == 0, result
    assert result["adapters"][0]["target_modules"] == ["q_proj", "v_proj"]
    assert result["facts"]["max_lora_rank"] == 8


@pytest.mark.parametrize(
    ("break_it", "fragment"),
    [
        (lambda model, adapter: drop_rope_theta(model), "config.json: rope_theta is missing"),
        (lambda model, adapter: (model / "tokenizer.json").unlink(), "tokenizer.json: is missing"),
        (lambda model, adapter: (adapter / "adapter_config.json").write_text(
            (adapter / "adapter_config.json").read_text().replace('"LORA"', '"IA3"')),
         "adapter_config.json: peft_type is 'IA3'"),
    ],
)  # fmt: skip
def test_a_broken_model_fails_naming_the_file_and_the_fix(
    tmp_path: Path, model: Path, break_it: Any, fragment: str
) -> None:
    adapter = tmp_path / "lora"
    make_tiny_adapter(adapter, model)
    break_it(model, adapter)
    code, result, _ = run_module(tmp_path, {"path": str(model), "adapters": [str(adapter)], "engine_version": "0.32.0"})
    assert code != 0
    assert (result["failed"], result["ok"], result["changed"]) == (True, False, False)
    assert f"{model} is not servable by vLLM 0.32.0: " in result["msg"]
    assert fragment in result["msg"]
    assert "; fix: " in result["msg"]
    assert len(result["problems"]) == 1


def test_check_mode_reports_a_config_fix_as_a_diff_without_writing(tmp_path: Path, model: Path) -> None:
    written = drop_rope_theta(model)
    args = {"path": str(model), "engine_version": "0.32.0", "config_fixes": {"rope_theta": 1000000.0}}
    code, result, output = run_module(tmp_path, args, check_mode=True, diff=True)
    assert code == 0, result
    assert (result["ok"], result["changed"]) == (True, True)
    assert result["config_fix"]["written"] is False
    assert "backup_file" not in result
    assert '+  "rope_theta": 1000000.0,' in output.splitlines()  # Ansible's --diff output
    assert "would set rope_theta" in output  # the warning
    assert (model / "config.json").read_text() == written
    assert not list(model.glob("config.json.orig-*"))


def test_a_config_fix_is_written_backed_up_and_idempotent(tmp_path: Path, model: Path) -> None:
    written = drop_rope_theta(model)
    args = {"path": str(model), "engine_version": "0.4.2", "config_fixes": {"rope_theta": 1000000.0}}
    code, result, output = run_module(tmp_path, args, diff=True)
    assert code == 0, result
    assert (result["changed"], result["config_fix"]["written"]) == (True, True)
    assert Path(result["backup_file"]).read_text() == written
    assert json.loads((model / "config.json").read_text())["rope_theta"] == 1000000.0
    assert f"set rope_theta in {model / 'config.json'} as asked; original saved as" in output
    code, again, _ = run_module(tmp_path, args)
    assert (code, again["changed"], again["ok"]) == (0, False, True)
    assert "backup_file" not in again
    assert len(list(model.glob("config.json.orig-*"))) == 1


def test_without_backup(tmp_path: Path, model: Path) -> None:
    drop_rope_theta(model)
    args = {"path": str(model), "engine_version": "0.32.0", "config_fixes": {"rope_theta": 1e6}, "backup": False}
    code, result, _ = run_module(tmp_path, args)
    assert (code, result["changed"]) == (0, True)
    assert not list(model.glob("config.json.orig-*"))


def test_warnings_are_ansible_warnings(tmp_path: Path, model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    config["torch_dtype"] = "float16"
    (model / "config.json").write_text(json.dumps(config))
    code, result, output = run_module(tmp_path, {"path": str(model), "engine_version": "0.32.0"})
    assert code == 0
    assert "model_warnings" not in result
    assert "[WARNING]: " in output
    assert "torch_dtype is float16 but the weights are bfloat16" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"engine_version": "0.9.9"}, "model_check: llmfleet has no serving data for vLLM '0.9.9'"),
        ({"path": "/nonexistent/model"}, "model_check: model directory /nonexistent/model does not exist"),
        ({"engine_version": None}, "missing required arguments: engine_version"),
        ({"chat": "sometimes"}, "chat"),
    ],
)
def test_unusable_input_fails_with_a_message(
    tmp_path: Path, pristine: Path, args: dict[str, Any], message: str
) -> None:
    full = {"path": str(pristine), "engine_version": "0.32.0", **args}
    full = {key: value for key, value in full.items() if value is not None}
    code, result, _ = run_module(tmp_path, full)
    assert code != 0
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
    assert documentation["module"] == "model_check"
    assert documentation["options"].keys() == spec.keys()
    for name, option in documentation["options"].items():
        for key in ("type", "default", "required", "elements"):
            assert option.get(key) == spec[name].get(key), (name, key)
    assert documentation["attributes"]["check_mode"]["support"] == "full"
    assert documentation["attributes"]["diff_mode"]["support"] == "full"
    for example in yaml.safe_load(constants["EXAMPLES"]):
        assert set(example["model_check"]) <= spec.keys()
        assert {"path", "engine_version"} <= set(example["model_check"])
    assert {"ok", "problems", "facts", "adapters", "config_fix", "backup_file"} <= yaml.safe_load(
        constants["RETURN"]
    ).keys()


def test_ansible_doc_renders_the_module(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(ANSIBLE_BIN / "ansible-doc"), "--json", "model_check"],
        cwd=tmp_path, env=ansible_env(tmp_path), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["model_check"]["doc"]
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert doc["options"]["engine_version"]["required"] is True
