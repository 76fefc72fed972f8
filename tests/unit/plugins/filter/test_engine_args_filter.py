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
    assert set(engine_filters.FilterModule().filters()) == {"vllm_args", "vllm_args_problems"}


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
