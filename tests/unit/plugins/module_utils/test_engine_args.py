"""plugins/module_utils/engine_args.py: vLLM flags checked against each kept release's real list."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.module_utils import engine_args
from llmfleet.stacks import load_stacks

VERSIONS = ["0.4.2", "0.9.2", "0.32.0"]
# The engine binds every interface inside its container (DESIGN.md failure mode #4).
ALL_INTERFACES = "0.0.0.0"  # noqa: S104
# Flags every kept release has, in the spelling all of them accept.
COMMON_ARGV = [
    "--model", "/models/current", "--served-model-name", "qwen2-1.5b-sft",
    "--host", ALL_INTERFACES, "--port", "8000",
    "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9",
    "--max-model-len", "4096", "--max-num-seqs", "64", "--dtype", "bfloat16",
    "--enable-lora", "--lora-modules", "sql=/adapters/sql", "chat=/adapters/chat", "--max-lora-rank", "16",
]  # fmt: skip


def flags(version: str) -> dict[str, Any]:
    return engine_args.load_flags(version)


def problems(argv: list[str], version: str = "0.32.0") -> list[str]:
    return engine_args.check_args(argv, flags(version))[1]


def test_every_stack_and_the_lab_engine_have_a_flag_list() -> None:
    wanted = {str(stack["vllm"]["version"]) for stack in load_stacks().values()}
    wanted.add("0.32.0")
    assert wanted <= set(engine_args.known_versions())


@pytest.mark.parametrize("version", VERSIONS)
def test_the_write_ups_per_gpu_flag_is_refused_with_the_real_one(version: str) -> None:
    found = problems(["--model", "/m", "--gpu-memory-utilization-gpu0", "0.85"], version)
    assert found == ["unknown flag --gpu-memory-utilization-gpu0: did you mean --gpu-memory-utilization?"]


@pytest.mark.parametrize("version", VERSIONS)
def test_valid_args_pass_and_come_back_unchanged(version: str) -> None:
    normalised, found = engine_args.check_args(COMMON_ARGV, flags(version))
    assert found == []
    assert normalised == COMMON_ARGV


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--max-model-len"], "--max-model-len needs a value"),
        (["--max-model-len", "--enforce-eager"], "--max-model-len needs a value"),
        (["--lora-modules"], "--lora-modules needs a value"),
        (["--dtype", "bf16"], "--dtype 'bf16' is not one of auto, bfloat16, float, float16, float32, half"),
        (["--dtype", "bfloat"], "did you mean bfloat16?"),
        (["--tensor-parallel-size", "two"], "--tensor-parallel-size takes an int, not 'two'"),
        (["--gpu-memory-utilization", "90%"], "--gpu-memory-utilization takes a float, not '90%'"),
        (["--enforce-eager=yes"], "--enforce-eager takes no value (got 'yes')"),
        (["--compilation-config", "{level: 3"], "--compilation-config takes JSON, not '{level: 3'"),
        (["--max-model-len", "4x"], "--max-model-len takes an integer, 4k or auto, not '4x'"),
    ],
)
def test_bad_values_are_refused(argv: list[str], expected: str) -> None:
    found = problems(argv)
    assert len(found) == 1 and expected in found[0], found


def test_a_choice_is_checked_per_release() -> None:
    # fp8_e4m3 arrived after 0.4.2, whose --kv-cache-dtype knows auto and fp8 only.
    assert problems(["--kv-cache-dtype", "fp8_e4m3"], "0.9.2") == []
    assert problems(["--kv-cache-dtype", "fp8_e4m3"], "0.4.2") == [
        "--kv-cache-dtype 'fp8_e4m3' is not one of auto, fp8: did you mean fp8?"
    ]


def test_a_flag_given_twice_is_refused_also_through_an_alias() -> None:
    found = problems(["--model", "/a", "--model", "/b", "-tp", "2", "--tensor-parallel-size", "4"])
    assert found == [
        "--model given twice (--model and --model): vLLM keeps only the last; give it once",
        "--tensor-parallel-size given twice (-tp and --tensor-parallel-size): vLLM keeps only the last; give it once",
    ]
    assert problems(["--middleware", "a.b", "--middleware", "c.d"]) == []  # an append flag


def test_a_positional_model_is_refused_for_the_server_entrypoint() -> None:
    (found,) = problems(["/models/current", "--port", "8000"])
    assert found.startswith("positional argument '/models/current'")
    assert "--model /models/current" in found


def test_an_abbreviation_argparse_would_accept_must_be_written_in_full() -> None:
    assert problems(["--gpu-memory-util", "0.9"]) == [
        "abbreviated flag --gpu-memory-util: write it in full as --gpu-memory-utilization"
    ]


def test_underscores_are_normalised_where_the_release_reads_them() -> None:
    normalised, found = engine_args.check_args(["--max_model_len=4096", "-tp", "2"], flags("0.9.2"))
    assert found == []
    assert normalised == ["--max-model-len", "4096", "--tensor-parallel-size", "2"]
    # 0.4.2's plain ArgumentParser refuses them.
    assert problems(["--max_model_len", "4096"], "0.4.2") == [
        "unknown flag --max_model_len: did you mean --max-model-len?"
    ]


def test_negated_switches_dotted_json_keys_and_dash_o() -> None:
    argv = ["--no-enable-prefix-caching", "--compilation-config.mode", "3", "-O3", "--port=-1"]
    normalised, found = engine_args.check_args(argv, flags("0.32.0"))
    assert found == []
    assert normalised == [
        "--no-enable-prefix-caching", "--compilation-config.mode", "3", "--optimization-level", "3", "--port", "-1"
    ]  # fmt: skip
    # In 0.4.2 --enable-prefix-caching is a plain switch, with no --no- form.
    assert problems(["--no-enable-prefix-caching"], "0.4.2") == [
        "unknown flag --no-enable-prefix-caching: did you mean --enable-prefix-caching?"
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_rendered_typed_options_pass_the_checker(version: str) -> None:
    options: dict[str, Any] = {
        "model": "/models/current",
        "served_model_name": "qwen2-1.5b-sft",
        "host": ALL_INTERFACES,
        "port": 8000,
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "enforce_eager": True,
        "disable_log_stats": False,  # a plain switch: left out
        "enable_lora": True,
        "lora_modules": ["sql=/adapters/sql", "chat=/adapters/chat"],
        "max_lora_rank": 16,
        "download_dir": None,  # left out: the engine's default
    }
    argv = engine_args.render_args(options, flags(version))
    assert argv == [
        "--model", "/models/current", "--served-model-name", "qwen2-1.5b-sft", "--host", ALL_INTERFACES,
        "--port", "8000", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9",
        "--max-model-len", "4096", "--dtype", "bfloat16", "--enforce-eager", "--enable-lora",
        "--lora-modules", "sql=/adapters/sql", "chat=/adapters/chat", "--max-lora-rank", "16",
    ]  # fmt: skip
    normalised, found = engine_args.check_args(argv, flags(version))
    assert found == [] and normalised == argv


def test_rendering_json_false_switches_and_append_flags() -> None:
    argv = engine_args.render_args(
        {
            "--enable-prefix-caching": False,
            "compilation-config": {"mode": 3, "cudagraph_capture_sizes": [1, 2]},
            "middleware": ["a.b", "c.d"],
        },
        flags("0.32.0"),
    )
    assert argv == [
        "--no-enable-prefix-caching",
        "--compilation-config", '{"cudagraph_capture_sizes":[1,2],"mode":3}',
        "--middleware", "a.b", "--middleware", "c.d",
    ]  # fmt: skip


def test_rendering_refuses_unknown_and_mistyped_options_all_at_once() -> None:
    with pytest.raises(engine_args.EngineArgsError) as raised:
        engine_args.render_args(
            {"gpu_memory_utilization_gpu0": 0.85, "enforce_eager": "yes", "port": True, "dtype": "bf16"},
            flags("0.32.0"),
        )
    assert raised.value.problems == [
        "unknown flag --gpu-memory-utilization-gpu0: did you mean --gpu-memory-utilization?",
        "--enforce-eager is a switch: give true or false, not 'yes'",
        "--port takes a value, not true/false",
    ]
    with pytest.raises(engine_args.EngineArgsError, match="--dtype 'bf16' is not one of"):
        engine_args.render_args({"dtype": "bf16"}, flags("0.32.0"))


def test_an_unknown_version_names_the_kept_ones() -> None:
    with pytest.raises(ValueError, match=r"no flag list for vLLM 0\.1\.0 .*kept: 0\.4\.2, 0\.9\.2, 0\.32\.0"):
        engine_args.load_flags("0.1.0")
