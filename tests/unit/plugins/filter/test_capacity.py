"""Unit tests for plugins/filter/capacity.py: the capacity planner as a Jinja filter.

The filter is called directly, and once through a real `ansible localhost -m
debug` so the plugin imports the shared planner from the installed llmfleet
package (llmfleet.module_utils), as it does on a controller.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from tests.ansible_adhoc import run_adhoc

REPO = Path(__file__).parents[4]
_SPEC = importlib.util.spec_from_file_location("llmfleet_filter_capacity", REPO / "plugins" / "filter" / "capacity.py")
assert _SPEC and _SPEC.loader
capacity = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(capacity)


# What model_check returns for the tiny model (llmfleet.lab.tiny).
TINY_FACTS: dict[str, Any] = {
    "architecture": "Qwen2ForCausalLM",
    "layers": 2,
    "attention_heads": 2,
    "kv_heads": 1,
    "head_dim": 64,
    "hidden_size": 128,
    "intermediate_size": 256,
    "vocab_size": 512,
    "dtype": "bfloat16",
    "dtype_bytes": 2,
    "weights_bytes": 723_200,
    "max_positions": 2048,
    "max_model_len": 2048,
}


def test_the_filter_is_registered() -> None:
    assert capacity.FilterModule().filters() == {"capacity_plan": capacity.capacity_plan}


@pytest.mark.parametrize(
    ("gpus", "options", "expected"),
    [
        (1, {"kv_cache_gib": 1, "block_size": 128}, {"kv_cache_tokens": 2_097_152, "kv_bytes_per_token": 512}),
        (2, {"gpu_memory_gib": 80, "reserve_gib": 1}, {"tensor_parallel_size": 2, "kv_head_replicas": 2}),
        (1, {"gpu_memory_gib": 24, "max_model_len": 1024}, {"max_model_len": 1024, "max_num_seqs": 256}),
    ],
)
def test_plans(gpus: int, options: dict[str, Any], expected: dict[str, Any]) -> None:
    plan = capacity.capacity_plan(TINY_FACTS, gpus, **options)
    assert {key: plan[key] for key in expected} == expected
    assert {"kv_bytes_per_token", "kv_cache_tokens", "weights_bytes", "tensor_parallel_size"} <= plan.keys()


@pytest.mark.parametrize(
    ("facts", "gpus", "options", "message"),
    [
        (TINY_FACTS, 3, {"gpu_memory_gib": 80}, "capacity_plan refused: tensor-parallel size 3 does not divide"),
        (TINY_FACTS, 1, {"gpu_memory_gib": 80, "max_model_len": 4096}, "exceeds the model's 2048 positions"),
        ({**TINY_FACTS, "weights_bytes": 200 * 2**30}, 1, {"gpu_memory_gib": 80}, "the weights need 200.00 GiB"),
        (TINY_FACTS, 1, {}, "capacity_plan: give gpu_memory_gib"),
        (TINY_FACTS, 1, {"gpu_memory_gib": 80, "gpu_count": 2}, "unexpected keyword argument 'gpu_count'"),
        (["not", "facts"], 1, {"gpu_memory_gib": 80}, "expects the facts dict that model_check returns"),
    ],
)
def test_refusals_and_bad_input_raise_ansible_filter_error(
    facts: Any, gpus: int, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        capacity.capacity_plan(facts, gpus, **options)


def _debug(tmp_path: Path, expression: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "facts.json").write_text(json.dumps({"facts": TINY_FACTS}))
    return run_adhoc(tmp_path, "debug", f"msg={{{{ {expression} }}}}", "-e", f"@{tmp_path / 'facts.json'}")


def test_ansible_loads_the_filter_and_its_planner(tmp_path: Path) -> None:
    result = _debug(tmp_path, "(facts | capacity_plan(gpus=1, kv_cache_gib=1, block_size=128)).kv_cache_tokens")
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"msg": 2097152' in result.stdout


def test_ansible_stops_on_a_refusal(tmp_path: Path) -> None:
    result = _debug(tmp_path, "facts | capacity_plan(gpus=3, gpu_memory_gib=80)")
    assert result.returncode != 0
    assert "tensor-parallel size 3 does not divide the 2 attention heads" in result.stdout + result.stderr
