"""plugins/filter/engine_args.py: vllm_args and vllm_args_problems, directly and through Ansible."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from tests.ansible_adhoc import run_adhoc

REPO = Path(__file__).parents[4]
_SPEC = importlib.util.spec_from_file_location(
    "llmfleet_filter_engine_args", REPO / "plugins" / "filter" / "engine_args.py"
)
assert _SPEC and _SPEC.loader
engine_filters = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(engine_filters)


def test_the_filters_are_registered() -> None:
    assert set(engine_filters.FilterModule().filters()) == {"vllm_args", "vllm_args_problems", "vllm_prefix_caching"}


def test_vllm_args_renders_typed_options() -> None:
    options = {"model": "/models/current", "tensor_parallel_size": 2, "enable_prefix_caching": True}
    assert engine_filters.vllm_args(options, "0.9.2") == [
        "--model", "/models/current", "--tensor-parallel-size", "2", "--enable-prefix-caching"
    ]  # fmt: skip


def test_vllm_args_stops_the_play_on_an_unknown_flag() -> None:
    with pytest.raises(AnsibleFilterError, match="did you mean --gpu-memory-utilization"):
        engine_filters.vllm_args({"gpu_memory_utilization_gpu0": 0.85}, "0.4.2")


def test_an_unkept_version_is_an_error_naming_the_kept_ones() -> None:
    with pytest.raises(AnsibleFilterError, match=r"kept: 0\.4\.2, 0\.9\.2, 0\.32\.0"):
        engine_filters.vllm_args({"model": "/m"}, "0.5.0")


def test_vllm_args_problems_lists_every_problem() -> None:
    assert engine_filters.vllm_args_problems(["--port", "8000"], "0.32.0") == []
    assert engine_filters.vllm_args_problems(["--gpu-memory-utilization-gpu0", "0.85", "--dtype"], "0.32.0") == [
        "unknown flag --gpu-memory-utilization-gpu0: did you mean --gpu-memory-utilization?",
        "--dtype needs a value",
    ]
    with pytest.raises(AnsibleFilterError, match="list of arguments"):
        engine_filters.vllm_args_problems("--port 8000", "0.32.0")


def test_ansible_loads_the_filter_and_refuses_the_write_ups_flag(tmp_path: Path) -> None:
    ok = run_adhoc(tmp_path, "debug", "msg={{ {'model': '/m', 'max_num_seqs': 8} | vllm_args('0.32.0') | join(' ') }}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert '"msg": "--model /m --max-num-seqs 8"' in ok.stdout
    refused = run_adhoc(tmp_path, "debug", "msg={{ {'gpu_memory_utilization_gpu0': 0.85} | vllm_args('0.4.2') }}")
    assert refused.returncode != 0
    assert "did you mean --gpu-memory-utilization?" in refused.stdout + refused.stderr


@pytest.mark.parametrize(
    ("version", "wanted", "flags"),
    [
        ("0.4.2", True, ["--enable-prefix-caching"]),  # a plain switch, off unless given
        ("0.4.2", False, []),
        ("0.9.2", True, []),  # the V1 engine caches prefixes by default: the argv stays as it was
        ("0.32.0", True, []),
        ("0.32.0", False, ["--no-enable-prefix-caching"]),
    ],
)
def test_prefix_caching_is_on_for_each_kept_release(version: str, wanted: bool, flags: list[str]) -> None:
    options = engine_filters.vllm_prefix_caching({"model": "/m"}, version, wanted)
    assert engine_filters.vllm_args(options, version) == ["--model", "/m", *flags]


@pytest.mark.parametrize("spelling", ["enable_prefix_caching", "enable-prefix-caching", "--enable-prefix-caching"])
def test_an_engines_own_prefix_caching_choice_is_kept(spelling: str) -> None:
    assert engine_filters.vllm_prefix_caching({spelling: False}, "0.32.0", True) == {spelling: False}
    assert engine_filters.vllm_args(
        engine_filters.vllm_prefix_caching({spelling: False}, "0.32.0", True), "0.32.0"
    ) == ["--no-enable-prefix-caching"]


def test_vllm_prefix_caching_refuses_bad_input() -> None:
    with pytest.raises(AnsibleFilterError, match="true or false"):
        engine_filters.vllm_prefix_caching({}, "0.32.0", "yes")
    with pytest.raises(AnsibleFilterError, match="kept: "):
        engine_filters.vllm_prefix_caching({}, "0.5.0", True)
    flags = engine_filters.engine_args.load_flags("0.32.0")
    without = {**flags, "options": [o for o in flags["options"] if o["dest"] != "enable_prefix_caching"]}
    with pytest.raises(engine_filters.engine_args.EngineArgsError, match="no --enable-prefix-caching"):
        engine_filters.engine_args.with_prefix_caching({}, without, True)


def test_ansible_renders_the_vllm_roles_prefix_caching(tmp_path: Path) -> None:
    """The preflight's chain: options | vllm_prefix_caching(version, wanted) | vllm_args(version)."""
    rendered = run_adhoc(
        tmp_path,
        "debug",
        "msg={{ {'model': '/m'} | vllm_prefix_caching('0.4.2', true) | vllm_args('0.4.2') | join(' ') }}",
    )
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert '"msg": "--model /m --enable-prefix-caching"' in rendered.stdout
