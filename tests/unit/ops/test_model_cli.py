"""`llmfleet model make-tiny-adapter` and `llmfleet model check`: files, exit codes, output."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet import cli
from llmfleet.lab import tiny, tiny_adapter
from llmfleet.module_utils import model_validation

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> Run:
    """cli.main with only the model group registered: exit code, stdout, stderr (log records included)."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", (cli.MODEL_COMMANDS,))

    def _run(*argv: str) -> tuple[int, str, str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            code = cli.main(list(argv))
        captured = capsys.readouterr()
        logged = "".join(f"{record.getMessage()}\n" for record in caplog.records)
        return code, captured.out, captured.err + logged

    return _run


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "tiny"
    tiny.make_tiny_model(path, seed=0)
    return path


@pytest.fixture
def model(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "copy" / "tiny"
    shutil.copytree(pristine, path)
    return path


def _contents(path: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(path.iterdir())}


# --- make-tiny-adapter -------------------------------------------------------------


def test_make_tiny_adapter_writes_a_peft_lora_adapter(run: Run, pristine: Path, tmp_path: Path) -> None:
    code, out, _ = run("model", "make-tiny-adapter", str(tmp_path / "a"), "--base", str(pristine))
    assert code == 0
    assert out.startswith("wrote a tiny LoRA adapter (r=8, targets q_proj,v_proj, seed 0,")
    assert {file.name for file in (tmp_path / "a").iterdir()} == set(tiny_adapter.FILES)
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert {key: config[key] for key in ("peft_type", "task_type", "r", "lora_alpha", "target_modules")} == {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
    }
    assert config["base_model_name_or_path"] == str(pristine.resolve())
    header = tiny.read_safetensors_header(tmp_path / "a" / "adapter_model.safetensors")
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    assert len(tensors) == tiny.NUM_LAYERS * 2 * 2
    q_size, kv_size = tiny.NUM_HEADS * tiny.HEAD_DIM, tiny.NUM_KV_HEADS * tiny.HEAD_DIM
    layer0 = "base_model.model.model.layers.0.self_attn"
    assert tensors[f"{layer0}.q_proj.lora_A.weight"]["shape"] == [8, tiny.HIDDEN_SIZE]
    assert tensors[f"{layer0}.q_proj.lora_B.weight"]["shape"] == [q_size, 8]
    assert tensors[f"{layer0}.v_proj.lora_B.weight"]["shape"] == [kv_size, 8]
    assert {entry["dtype"] for entry in tensors.values()} == {"BF16"}


def test_make_tiny_adapter_is_deterministic_per_seed(run: Run, pristine: Path, tmp_path: Path) -> None:
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        assert run("model", "make-tiny-adapter", str(tmp_path / name), "--base", str(pristine), "--seed", seed)[0] == 0
    assert _contents(tmp_path / "a") == _contents(tmp_path / "b")
    a, c = _contents(tmp_path / "a"), _contents(tmp_path / "c")
    assert a["adapter_model.safetensors"] != c["adapter_model.safetensors"]
    assert a["adapter_config.json"] == c["adapter_config.json"]


def test_make_tiny_adapter_with_mlp_targets_and_rank(run: Run, pristine: Path, tmp_path: Path) -> None:
    code, _, _ = run(
        "model", "make-tiny-adapter", str(tmp_path / "a"), "--base", str(pristine),
        "--targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "--rank", "4", "--alpha", "8",
    )  # fmt: skip
    assert code == 0
    header = tiny.read_safetensors_header(tmp_path / "a" / "adapter_model.safetensors")
    assert header["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]["shape"] == [
        4,
        tiny.INTERMEDIATE_SIZE,
    ]
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["lora_alpha"] == 8


def test_rerun_overwrites_an_earlier_tiny_adapter(run: Run, pristine: Path, tmp_path: Path) -> None:
    assert run("model", "make-tiny-adapter", str(tmp_path / "a"), "--base", str(pristine))[0] == 0
    assert run("model", "make-tiny-adapter", str(tmp_path / "a"), "--base", str(pristine), "--rank", "16")[0] == 0
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["r"] == 16


@pytest.mark.parametrize(
    ("extra", "prepare", "message"),
    [
        (["--targets", "q_proj,lm_head"], None, "unknown: lm_head"),
        (["--targets", ","], None, "--targets must name modules"),
        (["--rank", "0"], None, "--rank must be a positive integer"),
        ([], "foreign", "was not made by `llmfleet model make-tiny-adapter`"),
        (["--base", "/nonexistent/base"], None, "does not exist"),
    ],
)
def test_make_tiny_adapter_refuses_bad_input(
    run: Run, pristine: Path, tmp_path: Path, extra: list[str], prepare: str | None, message: str
) -> None:
    if prepare == "foreign":
        (tmp_path / "a").mkdir()
        (tmp_path / "a" / "notes.txt").write_text("mine")
    code, out, err = run("model", "make-tiny-adapter", str(tmp_path / "a"), "--base", str(pristine), *extra)
    assert code == 1
    assert out == ""
    assert message in err


# --- check ------------------------------------------------------------------------------


def test_check_a_servable_model_exits_0_with_a_summary(run: Run, pristine: Path, tmp_path: Path) -> None:
    tiny_adapter.make_tiny_adapter(tmp_path / "lora", pristine)
    code, out, err = run("model", "check", str(pristine), "--adapter", str(tmp_path / "lora"))
    assert (code, err) == (0, "")
    first, second = out.splitlines()
    assert first.startswith(f"ok: {pristine} is servable by vLLM 0.32.0: Qwen2ForCausalLM, 2 layers, 2 heads (1 KV)")
    assert "723,200 weight bytes" in first
    assert second == f"ok: adapter {tmp_path / 'lora'}: LoRA r=8 (--max-lora-rank 8), targets q_proj, v_proj"


def test_check_knows_the_current_stack_engine(run: Run, pristine: Path) -> None:
    """current-cu128 in playbooks/vars/stacks.yml pins vLLM 0.9.2."""
    code, out, err = run("model", "check", str(pristine), "--engine-version", "0.9.2")
    assert (code, err) == (0, "")
    assert out.startswith(f"ok: {pristine} is servable by vLLM 0.9.2: Qwen2ForCausalLM")


def test_check_refuses_with_one_line_per_problem(run: Run, model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    del config["rope_theta"]
    (model / "config.json").write_text(json.dumps(config))
    (model / "tokenizer.json").unlink()
    code, out, err = run("model", "check", str(model), "--engine-version", "0.4.2")
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"llmfleet: refused {model / 'config.json'}: rope_theta is missing")
    assert lines[1].startswith(f"llmfleet: refused {model / 'tokenizer.json'}: is missing")
    assert all("; fix: " in line for line in lines)

    code, out, _ = run("model", "check", str(model), "--json")
    report = json.loads(out)
    assert (code, report["ok"]) == (2, False)
    assert [problem["code"] for problem in report["problems"]] == ["missing-rope-theta", "missing-tokenizer"]
    assert report["facts"]["weights_bytes"] == 723_200


def test_check_no_chat_skips_the_template(run: Run, model: Path) -> None:
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    assert run("model", "check", str(model))[0] == 2
    assert run("model", "check", str(model), "--no-chat")[0] == 0


def test_fix_config_shows_a_diff_logs_and_backs_up(run: Run, model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    del config["rope_theta"]
    original = json.dumps(config, indent=2, sort_keys=True) + "\n"
    (model / "config.json").write_text(original)

    code, out, err = run("model", "check", str(model), "--fix-config", "rope_theta=1000000.0", "--dry-run")
    assert code == 0
    assert '+  "rope_theta": 1000000.0,' in out.splitlines()
    assert "--dry-run" in err and "nothing written" in err
    assert (model / "config.json").read_text() == original

    code, out, err = run("model", "check", str(model), "--fix-config", "rope_theta=1000000.0")
    assert code == 0
    assert out.startswith(f"--- {model / 'config.json'} (before)\n+++ {model / 'config.json'} (after)\n")
    (backup,) = model.glob("config.json.orig-*")
    assert backup.read_text() == original
    assert f"changed {model / 'config.json'} as asked: set rope_theta; original saved as {backup}" in err
    assert json.loads((model / "config.json").read_text())["rope_theta"] == 1000000.0

    code, out, err = run("model", "check", str(model), "--fix-config", "rope_theta=1000000.0")
    assert code == 0
    assert "already has the values" in err
    assert not out.startswith("---")
    assert len(list(model.glob("config.json.orig-*"))) == 1


def test_fix_config_with_json_output_carries_the_diff(run: Run, model: Path) -> None:
    code, out, _ = run("model", "check", str(model), "--fix-config", "rope_theta=500000.0", "--dry-run", "--json")
    fix = json.loads(out)["config_fix"]
    assert code == 0
    assert (fix["changed"], fix["written"], fix["keys"]) == (True, False, ["rope_theta"])
    assert '+  "rope_theta": 500000.0,' in fix["diff"]


def test_base_name_lets_a_renamed_model_match(run: Run, pristine: Path, tmp_path: Path) -> None:
    tiny_adapter.make_tiny_adapter(tmp_path / "lora", pristine)
    config_path = tmp_path / "lora" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = "Qwen/Qwen2-1.5B"
    config_path.write_text(json.dumps(config))
    code, _, err = run("model", "check", str(pristine), "--adapter", str(tmp_path / "lora"))
    assert code == 2
    assert "--base-name Qwen/Qwen2-1.5B" in err
    code, _, _ = run("model", "check", str(pristine), "--adapter", str(tmp_path / "lora"), "--base-name", "Qwen2-1.5B")
    assert code == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/nonexistent/model"], "does not exist"),
        (["{model}", "--engine-version", "0.9.9"], "no serving data for vLLM '0.9.9'"),
        (["{model}", "--fix-config", "rope_theta"], "must be KEY=VALUE"),
    ],
)
def test_check_bad_input_exits_1(run: Run, pristine: Path, argv: list[str], message: str) -> None:
    code, out, err = run("model", "check", *(arg.replace("{model}", str(pristine)) for arg in argv))
    assert (code, out) == (1, "")
    assert err.startswith("llmfleet: ")
    assert message in err


def test_the_installed_command_refuses_a_missing_shard(pristine: Path, tmp_path: Path) -> None:
    """The real entry point, with every command group registered, on a sharded model missing a shard."""
    model = tmp_path / "sharded"
    shutil.copytree(pristine, model)
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    (model / model_validation.WEIGHTS_INDEX).write_text(json.dumps(index))
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "model", "check", str(model)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2, result.stderr
    assert f"{model / 'model-00002-of-00002.safetensors'}: is listed in model.safetensors.index.json" in result.stderr
