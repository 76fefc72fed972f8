"""`llmfleet plan`: the capacity plan for a model directory, exit codes and refusals with numbers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet import cli
from llmfleet.lab import tiny
from llmfleet.paths import REPO_ROOT

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """cli.main with only the plan group registered: exit code, stdout, stderr."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("llmfleet.ops.planner",))

    def _run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "tiny"
    tiny.make_tiny_model(path, seed=0)
    return path


def test_plan_for_the_cpu_engine_budget(run: Run, model: Path) -> None:
    code, out, err = run("plan", "--model", str(model), "--gpus", "1", "--kv-cache-gib", "1", "--block-size", "128")
    assert (code, err) == (0, "")
    assert "512 bytes per token per GPU" in out
    assert "16,384 blocks of 128 = 2,097,152 tokens" in out
    assert "1,024 sequences of 2,048 tokens" in out
    assert out.splitlines()[-1] == (
        "flags    --tensor-parallel-size 1 --max-model-len 2048 --max-num-seqs 256 --gpu-memory-utilization 0.9"
    )


def test_plan_json_has_the_figures(run: Run, model: Path) -> None:
    code, out, _ = run(
        "plan", "--model", str(model), "--gpus", "2", "--gpu-memory-gib", "24", "--reserve-gib", "2",
        "--max-model-len", "1024", "--json",
    )  # fmt: skip
    plan = json.loads(out)
    assert code == 0
    assert plan["ok"] is True
    assert (plan["tensor_parallel_size"], plan["kv_bytes_per_token"], plan["weights_bytes"]) == (2, 512, 723_200)
    budget = int(24 * 2**30 * 0.9) - 723_200 // 2 - 2 * 2**30
    assert plan["kv_cache_bytes"] == budget
    assert plan["kv_cache_tokens"] == budget // (16 * 512) * 16
    assert plan["kv_head_replicas"] == 2
    assert plan["suggested_flags"] == {
        "--tensor-parallel-size": 2,
        "--max-model-len": 1024,
        "--max-num-seqs": 256,
        "--gpu-memory-utilization": 0.9,
    }
    assert plan["model"]["architecture"] == "Qwen2ForCausalLM"


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--gpus", "3", "--gpu-memory-gib", "24"], ["tensor-parallel size 3 does not divide the 2 attention heads",
                                                      "work for this model up to 8: [1, 2]"]),
        (["--gpus", "1", "--gpu-memory-gib", "0.0005"], ["the weights need 706.25 KiB (723,200 bytes) per GPU"]),
        (["--gpus", "1", "--gpu-memory-gib", "1"], ["nothing is left for the KV cache"]),
        (["--gpus", "1", "--gpu-memory-gib", "24", "--max-model-len", "4096"],
         ["max_model_len 4096 exceeds the model's 2048 positions", "--max-model-len 2048 or less"]),
        (["--gpus", "1", "--kv-cache-gib", "0.0001"],
         ["needs 2048 tokens of KV cache", "but only 208 fit", "--max-model-len 208 or less"]),
    ],
)  # fmt: skip
def test_impossible_requests_exit_2_with_the_numbers(
    run: Run, model: Path, argv: list[str], fragments: list[str]
) -> None:
    code, out, err = run("plan", "--model", str(model), *argv)
    assert (code, out) == (2, "")
    assert all(line.startswith("llmfleet: refused ") for line in err.splitlines())
    for fragment in fragments:
        assert fragment in err
    code, out, _ = run("plan", "--model", str(model), *argv, "--json")
    refusal = json.loads(out)
    assert (code, refusal["ok"]) == (2, False)
    assert any(fragments[0] in reason for reason in refusal["reasons"])


def test_a_model_that_cannot_be_sized_is_refused(run: Run, model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    # Weights that are there but unreadable (a directory without weights is
    # planned from config.json instead: the tests at the end of this file).
    (broken / "model.safetensors").write_bytes(b"\x00" * 4)
    code, _, err = run("plan", "--model", str(broken), "--gpus", "1", "--gpu-memory-gib", "24")
    assert code == 2
    assert "cannot plan" in err and "weights_bytes" in err and "model.safetensors:" in err


def test_problems_that_do_not_change_the_plan_are_a_warning(run: Run, model: Path, tmp_path: Path) -> None:
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(model, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    code, out, err = run("plan", "--model", str(no_tokenizer), "--gpus", "1", "--kv-cache-gib", "1")
    assert code == 0
    assert "2,097,152 tokens" in out
    assert "reports 1 problem(s)" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "1"], "give gpu_memory_gib"),
        (["--gpus", "0", "--gpu-memory-gib", "24"], "gpus must be greater than 0"),
        (["--gpus", "1", "--gpu-memory-gib", "24", "--gpu-memory-utilization", "1.5"], "a fraction"),
        (["--gpus", "1", "--kv-cache-gib", "1", "--engine-version", "0.1"], "no serving data"),
    ],
)
def test_bad_input_exits_1(run: Run, model: Path, argv: list[str], message: str) -> None:
    code, out, err = run("plan", "--model", str(model), *argv)
    assert (code, out) == (1, "")
    assert message in err


def test_missing_model_directory_exits_1(run: Run, tmp_path: Path) -> None:
    code, _, err = run("plan", "--model", str(tmp_path / "nope"), "--gpus", "1", "--kv-cache-gib", "1")
    assert code == 1
    assert "does not exist" in err


def test_the_installed_command(model: Path) -> None:
    """The real entry point, with every command group registered."""
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "plan", "--model", str(model), "--gpus", "3", "--gpu-memory-gib", "80"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "tensor-parallel size 3 does not divide the 2 attention heads" in result.stderr


# --- Before the weights arrive: config.json only, or --config FILE; --gpu-facts ---------
# The GPU memory comes from the gpu_facts module's reading of the real H200
# (tests/unit/fixtures/real-h200/gpu_facts.json); the shapes are Qwen2-1.5B and
# Qwen2-7B's published configs (tests/unit/fixtures/configs/).

FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures"
@pytest.fixture
def h200_facts(tmp_path: Path) -> Path:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(json.loads((FIXTURES / "real-h200" / "gpu_facts.json").read_text())["nvml"]))
    return path


@pytest.mark.parametrize(
    ("model", "weights", "sequences"),
    [("qwen2-1.5b-instruct", 3_087_428_608, 137), ("qwen2-7b-instruct", 15_231_233_024, 60)],
)
def test_a_config_file_is_planned_with_estimated_weights_on_the_real_h200(
    run: Run, h200_facts: Path, model: str, weights: int, sequences: int
) -> None:
    config = FIXTURES / "configs" / model / "config.json"
    code, out, err = run("plan", "--config", str(config), "--gpu-facts", str(h200_facts), "--max-model-len", "32768")
    assert code == 0, err
    assert f"{weights:,} weight bytes (ESTIMATED from config.json" in out
    assert "140.40 GiB x 0.9" in out  # 143771 MiB, the H200 as NVML reports it
    assert f"fits     {sequences} sequences of 32,768 tokens" in out
    assert "no weights yet" in err and "ESTIMATED" in err


def test_a_directory_with_only_config_json_is_planned(run: Run, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((FIXTURES / "configs" / "qwen2-1.5b-instruct" / "config.json").read_text())
    code, out, err = run("plan", "--model", str(tmp_path), "--gpus", "1", "--gpu-memory-gib", "80", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["weights_estimated"] is True
    assert plan["model"]["parameters"] == 1_543_714_304


def test_an_architecture_without_a_formula_is_refused(run: Run, tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "configs" / "qwen2-1.5b-instruct" / "config.json").read_text())
    config["architectures"] = ["Qwen2MoeForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, _out, err = run("plan", "--config", str(tmp_path / "config.json"), "--gpus", "1", "--gpu-memory-gib", "80")
    assert code == 2
    assert "cannot estimate the parameters of Qwen2MoeForCausalLM" in err


def test_gpu_facts_without_gpus_is_refused(run: Run, tmp_path: Path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"state": "absent", "gpus": []}))
    config = FIXTURES / "configs" / "qwen2-1.5b-instruct" / "config.json"
    code, _out, err = run("plan", "--config", str(config), "--gpu-facts", str(facts))
    assert code == 1
    assert "lists no GPU with memory_total_mib" in err
