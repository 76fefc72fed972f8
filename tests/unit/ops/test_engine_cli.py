"""`llmfleet engine check-args|flags`: exit codes, one line per problem, the version chosen."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from llmfleet import cli

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """cli.main with only the engine group registered: exit code, stdout, stderr."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("llmfleet.ops.engine",))

    def _run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


def test_valid_args_exit_0_and_print_the_normalised_argv(run: Run) -> None:
    code, out, err = run("engine", "check-args", "--", "--model", "/models/a b", "-tp", "2", "--max_num_seqs=8")
    assert (code, err) == (0, "")
    assert out == "--model '/models/a b' --tensor-parallel-size 2 --max-num-seqs 8\n"


def test_the_write_ups_flag_exits_2_naming_the_real_one(run: Run) -> None:
    code, out, err = run(
        "engine", "check-args", "--stack", "mission-cu121", "--",
        "--gpu-memory-utilization-gpu0", "0.85", "--dtype", "bf16",
    )  # fmt: skip
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "llmfleet: refused for vLLM 0.4.2: unknown flag --gpu-memory-utilization-gpu0:"
        " did you mean --gpu-memory-utilization?",
        "llmfleet: refused for vLLM 0.4.2: --dtype 'bf16' is not one of auto, half, float16, bfloat16, float,"
        " float32: did you mean bfloat16?",
    ]


@pytest.mark.parametrize(("which", "version"), [(["--stack", "current-cu128"], "0.9.2"), ([], "0.32.0")])
def test_the_version_comes_from_the_stack_or_the_lab(run: Run, which: list[str], version: str) -> None:
    code, out, _ = run("engine", "check-args", *which, "--json", "--", "--enable-lora", "--max-loras", "x")
    assert code == 2
    assert json.loads(out) == {
        "ok": False,
        "problems": ["--max-loras takes an int, not 'x'"],
        "argv": ["--enable-lora", "--max-loras", "x"],
        "vllm_version": version,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vllm-version", "0.1.0"], "no flag list for vLLM 0.1.0"),
        (["--stack", "no-such-stack"], "no stack 'no-such-stack'"),
    ],
)
def test_an_unknown_version_or_stack_exits_1(run: Run, argv: list[str], message: str) -> None:
    code, _, err = run("engine", "check-args", *argv, "--", "--port", "8000")
    assert code == 1
    assert message in err


def test_flags_lists_names_aliases_and_values(run: Run) -> None:
    code, out, _ = run("engine", "flags", "--vllm-version", "0.9.2")
    assert code == 0
    lines = out.splitlines()
    assert "--tensor-parallel-size, -tp <int>" in lines
    assert "--enable-prefix-caching, --no-enable-prefix-caching" in lines
    assert "--dtype {auto,bfloat16,float,float16,float32,half}" in lines
    assert not any(line.startswith("--gpu-memory-utilization-gpu0") for line in lines)
