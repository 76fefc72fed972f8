"""`llmfleet stack check|show`: exit codes, one line per refused rule, and --json."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from llmfleet import cli
from llmfleet.stacks import STACKS_FILE, load_stacks

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """cli.main with only the stack group registered: exit code, stdout, stderr."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("llmfleet.ops.stack",))

    def _run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.mark.parametrize(
    "argv",
    [
        ["--driver", "535.104.05", "--cuda", "12.1.1", "--torch", "2.3.0+cu121", "--vllm", "0.4.2"],
        ["--driver", "535.104.05", "--cuda", "12.1", "--gpu", "RTX 4090"],
        ["--driver", "580.65.06", "--cuda", "12.8.1", "--torch", "2.7.0+cu128", "--compute-capability", "sm_100"],
        ["--stack", "mission-cu121", "--gpu", "NVIDIA H100 80GB HBM3"],
        ["--stack", "mission-cu121", "--driver", "535.261.03"],
        ["--stack", "current-cu128", "--gpu", "NVIDIA GeForce RTX 5090"],
    ],
)
def test_compatible_versions_exit_0(run: Run, argv: list[str]) -> None:
    code, out, err = run("stack", "check", *argv)
    assert (code, err) == (0, "")
    assert out.startswith("ok: compatible")


@pytest.mark.parametrize(
    ("argv", "rule", "required"),
    [
        (["--driver", "470.199.02", "--cuda", "12.1"], "driver-too-old-for-cuda", ">= 530.30.02"),
        (["--driver", "470.199.02", "--cuda", "11.4", "--torch", "2.3.0+cu121"], "driver-too-old-for-torch",
         ">= 530.30.02"),
        (["--driver", "535.104.05", "--cuda", "12.1", "--torch", "2.1.2+cu121", "--vllm", "0.4.2"],
         "vllm-torch-mismatch", "torch == 2.3.0"),
        (["--driver", "535.104.05", "--cuda", "12.1", "--vllm", "0.4.2", "--transformers", "4.39.3"],
         "vllm-transformers-mismatch", "transformers >= 4.40.0"),
        (["--driver", "520.61.05", "--cuda", "11.7", "--gpu", "RTX 4090"], "cuda-too-old-for-gpu", ">= 11.8"),
        (["--driver", "470.199.02", "--cuda", "11.4", "--gpu", "RTX 4090"], "driver-too-old-for-gpu",
         ">= 520.61.05"),
        (["--stack", "mission-cu121", "--driver", "470.199.02"], "driver-too-old-for-cuda", ">= 530.30.02"),
        (["--stack", "mission-cu121", "--gpu", "NVIDIA B200"], "cuda-too-old-for-gpu", ">= 12.8"),
    ],
)
def test_incompatible_versions_exit_2_with_one_line_per_rule(
    run: Run, argv: list[str], rule: str, required: str
) -> None:
    code, out, err = run("stack", "check", *argv)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert all(line.startswith("llmfleet: refused [") for line in lines)
    line = next(line for line in lines if f"[{rule}]" in line)
    assert f"required {required}" in line

    code, out, _ = run("stack", "check", *argv, "--json")
    result = json.loads(out)
    assert code == 2
    assert result["ok"] is False
    assert len(result["problems"]) == len(lines)
    problem = next(problem for problem in result["problems"] if problem["rule"] == rule)
    assert problem["required"] == required
    assert {"rule", "message", "found", "required"} <= problem.keys()


def test_json_for_a_compatible_stack(run: Run) -> None:
    code, out, err = run("stack", "check", "--stack", "mission-cu121", "--gpu", "RTX 4090", "--json")
    result = json.loads(out)
    assert (code, err) == (0, "")
    assert result["ok"] is True
    assert result["problems"] == []
    assert result["checked"] == {
        "stack": "mission-cu121",
        "driver": "535.104.05",
        "cuda": "12.1.1",
        "torch": "2.3.0+cu121",
        "vllm": "0.4.2",
        "transformers": "4.40.2",
        "peft": "0.11.1",
        "compute_capability": "8.9",
        "gpu": "RTX 4090",
    }


@pytest.mark.parametrize("name", sorted(load_stacks()))
def test_every_stack_in_the_table_checks_clean(run: Run, name: str) -> None:
    code, out, _ = run("stack", "check", "--stack", name, "--json")
    assert code == 0, out
    assert json.loads(out)["ok"] is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--driver", "535"], "--cuda"),
        (["--cuda", "12.1"], "--driver"),
        (["--driver", "latest", "--cuda", "12.1"], "NVIDIA driver version 'latest'"),
        (["--driver", "535.104.05", "--cuda", "12.1", "--gpu", "A10G"], "unknown GPU 'A10G'"),
        (["--driver", "535.104.05", "--cuda", "12.1", "--compute-capability", "89"], "compute capability"),
        (["--stack", "mission-cu121", "--cuda", "12.4"], "cannot be combined with --stack"),
        (["--stack", "no-such-stack"], "known stacks: current-cu128, mission-cu121"),
    ],
)
def test_bad_input_exits_1_with_a_message(run: Run, argv: list[str], message: str) -> None:
    code, out, err = run("stack", "check", *argv)
    assert code == 1
    assert out == ""
    assert err.startswith("llmfleet: ")
    assert message in err


def test_a_drifted_table_is_refused(run: Run, tmp_path: Path) -> None:
    document = yaml.safe_load(STACKS_FILE.read_text(encoding="utf-8"))
    document["gpu_stacks"]["mission-cu121"]["vllm"]["image"] = "vllm/vllm-openai:latest"
    drifted = tmp_path / "stacks.yml"
    drifted.write_text(yaml.safe_dump(document), encoding="utf-8")
    code, _, err = run("stack", "check", "--stack", "mission-cu121", "--stacks-file", str(drifted))
    assert code == 2
    assert "[stack-image-tag-mismatch]" in err


def test_show_lists_every_stack(run: Run) -> None:
    code, out, _ = run("stack", "show")
    assert code == 0
    for name, stack in load_stacks().items():
        assert name in out
        assert stack["vllm"]["image"] in out


def test_show_one_stack_as_json(run: Run) -> None:
    code, out, _ = run("stack", "show", "mission-cu121", "--json")
    shown = json.loads(out)
    assert code == 0
    assert list(shown) == ["mission-cu121"]
    assert shown["mission-cu121"]["cuda"]["version"] == "12.1.1"
    assert shown["mission-cu121"]["vllm"]["image"] == "vllm/vllm-openai:v0.4.2"


def test_show_unknown_stack_exits_1(run: Run) -> None:
    code, _, err = run("stack", "show", "nope")
    assert code == 1
    assert "known stacks" in err


def test_the_installed_command_refuses_the_write_ups_pin() -> None:
    """The real entry point, with every command group registered."""
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "stack", "check", "--driver", "470.199.02", "--cuda", "12.1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "[driver-too-old-for-cuda]" in result.stderr
    assert "530.30.02" in result.stderr
