"""Unit tests for plugins/module_utils/capacity_planner.py: KV cache arithmetic and refusals.

Known models check the formula (2 x layers x KV heads x head_dim x bytes); the
tiny model checks the whole plan; refusals carry the numbers an operator needs.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.module_utils import capacity_planner as cp

GIB = cp.GIB

# Shapes from the models' published config.json files.
QWEN2_1_5B: dict[str, Any] = {
    "architecture": "Qwen2ForCausalLM",
    "layers": 28,
    "attention_heads": 12,
    "kv_heads": 2,
    "head_dim": 128,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "vocab_size": 151936,
    "dtype_bytes": 2,
    "weights_bytes": 3_087_467_520,
    "max_positions": 32768,
    "max_model_len": 32768,
}
LLAMA_3_70B: dict[str, Any] = {
    "architecture": "LlamaForCausalLM",
    "layers": 80,
    "attention_heads": 64,
    "kv_heads": 8,
    "head_dim": 128,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "dtype_bytes": 2,
    "weights_bytes": 141_107_412_992,
    "max_positions": 8192,
    "max_model_len": 8192,
}
# The tiny model llmfleet generates (llmfleet.lab.tiny): what the lab's vLLM serves.
TINY: dict[str, Any] = {
    "architecture": "Qwen2ForCausalLM",
    "layers": 2,
    "attention_heads": 2,
    "kv_heads": 1,
    "head_dim": 64,
    "hidden_size": 128,
    "intermediate_size": 256,
    "vocab_size": 512,
    "dtype_bytes": 2,
    "weights_bytes": 723_200,
    "max_positions": 2048,
    "max_model_len": 2048,
}


@pytest.mark.parametrize(
    ("facts", "tp", "expected"),
    [
        (TINY, 1, 512),  # 2 x 2 layers x 1 KV head x 64 x 2 bytes
        (QWEN2_1_5B, 1, 28_672),  # 28 KiB per token
        (QWEN2_1_5B, 2, 14_336),  # one KV head per GPU
        (QWEN2_1_5B, 4, 14_336),  # 2 KV heads over 4 GPUs: replicated, still one head per GPU
        (LLAMA_3_70B, 1, 327_680),  # 320 KiB per token
        (LLAMA_3_70B, 8, 40_960),
    ],
)
def test_kv_bytes_per_token_per_rank(facts: dict[str, Any], tp: int, expected: int) -> None:
    bytes_per_token = cp.kv_bytes_per_token(
        facts["layers"], facts["kv_heads"], facts["head_dim"], facts["dtype_bytes"], tp
    )
    assert bytes_per_token == expected


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "fragment"),
    [
        (2, 1, 3, "does not divide the 2 attention heads"),
        (12, 2, 8, "does not divide the 12 attention heads"),
        (12, 2, 3, "above the 2 KV heads but not a multiple of them"),
        (32, 8, 16, None),  # 16 is a multiple of 8: KV heads replicated twice
        (32, 8, 4, None),
        (28, 4, 7, "above the 4 KV heads but not a multiple"),
        (48, 12, 8, "does not divide the 12 KV heads"),
    ],
)
def test_tensor_parallel_rules(heads: int, kv_heads: int, tp: int, fragment: str | None) -> None:
    problems = cp.tensor_parallel_problems(heads, kv_heads, tp)
    if fragment is None:
        assert problems == []
    else:
        assert any(fragment in problem for problem in problems), problems


def test_valid_tensor_parallel_sizes() -> None:
    assert cp.valid_tensor_parallel_sizes(12, 2, 8) == [1, 2, 4, 6]
    assert cp.valid_tensor_parallel_sizes(64, 8, 16) == [1, 2, 4, 8, 16]


@pytest.mark.parametrize(
    ("budget", "per_token", "block", "length", "expected"),
    [
        (GIB, 512, 16, 2048, (131_072, 2_097_152)),
        (GIB, 512, 128, 2048, (16_384, 2_097_152)),
        (GIB + 511, 512, 16, 2048, (131_072, 2_097_152)),  # a partial block is not a block
        (10_000, 512, 16, 2048, (1, 16)),
        (GIB, 512, 16, 2001, (131_072, int(131_072 / 126 * 2001))),  # vLLM's formula, not blocks x 16
        (0, 512, 16, 2048, (0, 0)),
        (-5, 512, 16, 2048, (0, 0)),
    ],
)
def test_kv_cache_tokens_round_as_vllm_does(
    budget: int, per_token: int, block: int, length: int, expected: tuple[int, int]
) -> None:
    assert cp.kv_cache_tokens(budget, per_token, block, length) == expected


def test_tiny_model_with_an_explicit_budget_is_exact() -> None:
    plan = cp.plan(TINY, gpus=1, kv_cache_gib=1, block_size=cp.CPU_BLOCK_SIZE)
    assert plan["kv_bytes_per_token"] == 512
    assert plan["kv_cache_bytes"] == GIB
    assert (plan["kv_cache_blocks"], plan["kv_cache_tokens"]) == (16_384, 2_097_152)
    assert plan["sequences_at_max_model_len"] == 1024
    assert plan["max_num_seqs"] == cp.DEFAULT_MAX_NUM_SEQS
    assert plan["tensor_parallel_size"] == 1
    assert plan["reserve_bytes"] == 0
    assert plan["suggested_args"] == [
        "--tensor-parallel-size", "1", "--max-model-len", "2048", "--max-num-seqs", "256",
        "--gpu-memory-utilization", "0.9",
    ]  # fmt: skip


def test_gpu_budget_is_memory_times_utilization_minus_weights_and_reserve() -> None:
    plan = cp.plan(QWEN2_1_5B, gpus=2, gpu_memory_gib=24, gpu_memory_utilization=0.9, reserve_gib=2)
    weights_per_rank = -(-QWEN2_1_5B["weights_bytes"] // 2)
    budget = int(24 * GIB * 0.9) - weights_per_rank - 2 * GIB
    assert plan["kv_cache_bytes"] == budget
    assert plan["reserve_is_estimate"] is False
    assert plan["kv_bytes_per_token"] == 14_336
    assert plan["kv_bytes_per_token_all_ranks"] == 28_672
    assert plan["kv_head_replicas"] == 1
    assert plan["kv_cache_tokens"] == (budget // (16 * 14_336)) * 16
    assert plan["max_num_seqs"] == min(256, plan["kv_cache_tokens"] // 32768)
    assert plan["suggested_flags"]["--tensor-parallel-size"] == 2


def test_the_reserve_is_an_estimate_unless_given() -> None:
    plan = cp.plan(QWEN2_1_5B, gpus=1, gpu_memory_gib=80)
    assert plan["reserve_is_estimate"] is True
    assert cp.FIXED_RESERVE_BYTES < plan["reserve_bytes"] < 4 * GIB
    assert plan["kv_cache_bytes"] == int(80 * GIB * 0.9) - QWEN2_1_5B["weights_bytes"] - plan["reserve_bytes"]


def test_replicated_kv_heads_are_reported() -> None:
    plan = cp.plan(QWEN2_1_5B, gpus=4, gpu_memory_gib=24, max_model_len=8192)
    assert (plan["kv_heads_per_rank"], plan["kv_head_replicas"]) == (1, 2)


def test_fp8_kv_cache_halves_the_bytes_per_token() -> None:
    assert cp.plan(TINY, gpus=1, kv_cache_gib=1, kv_cache_dtype="fp8")["kv_bytes_per_token"] == 256


# --- refusals, with the numbers ---------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "options", "fragments"),
    [
        (TINY, {"gpus": 3, "gpu_memory_gib": 24}, ["tensor-parallel size 3 does not divide the 2 attention heads",
                                                   "work for this model up to 8: [1, 2]"]),
        (QWEN2_1_5B, {"gpus": 3, "gpu_memory_gib": 24}, ["above the 2 KV heads but not a multiple of them"]),
        (LLAMA_3_70B, {"gpus": 1, "gpu_memory_gib": 80},
         ["the weights need 131.42 GiB per GPU", "80 GiB x 0.9 = 72.00 GiB is usable", "use 2 GPUs or more"]),
        (LLAMA_3_70B, {"gpus": 2, "gpu_memory_gib": 75}, ["nothing is left for the KV cache", "reserve (estimated)"]),
        (TINY, {"gpus": 1, "gpu_memory_gib": 24, "max_model_len": 4096},
         ["max_model_len 4096 exceeds the model's 2048 positions", "--max-model-len 2048 or less"]),
        (TINY, {"gpus": 1, "kv_cache_gib": 0.0005, "max_model_len": 2048},
         ["needs 2048 tokens of KV cache", "only 1040 fit", "--max-model-len 1040 or less"]),
        (TINY, {"gpus": 1, "kv_cache_gib": 20, "gpu_memory_gib": 16},
         ["+ KV cache (20.00 GiB)", "16 GiB x 0.9 = 14.40 GiB is usable"]),
    ],
)  # fmt: skip
def test_impossible_requests_are_refused_with_the_numbers(
    facts: dict[str, Any], options: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(cp.PlanRefused) as refused:
        cp.plan(facts, **options)
    text = " | ".join(refused.value.reasons)
    for fragment in fragments:
        assert fragment in text


def test_a_scaled_rope_context_is_named_in_the_refusal() -> None:
    facts = {**QWEN2_1_5B, "max_positions": 32768, "max_model_len": 131072}
    assert cp.plan(facts, gpus=1, gpu_memory_gib=80, max_model_len=65536)["max_model_len"] == 65536
    with pytest.raises(cp.PlanRefused, match=r"131072 positions \(max_position_embeddings x rope_scaling factor\)"):
        cp.plan(facts, gpus=1, gpu_memory_gib=80, max_model_len=262144)


@pytest.mark.parametrize(
    ("facts", "options", "message"),
    [
        ({}, {"gpus": 1, "gpu_memory_gib": 80}, "model facts lack layers"),
        (TINY, {"gpus": 1}, "give gpu_memory_gib"),
        (TINY, {"gpus": 0, "gpu_memory_gib": 80}, "gpus must be greater than 0"),
        (TINY, {"gpus": 1.5, "gpu_memory_gib": 80}, "gpus must be a whole number"),
        (TINY, {"gpus": "2", "gpu_memory_gib": 80}, "gpus must be a number"),
        (TINY, {"gpus": 1, "gpu_memory_gib": 80, "gpu_memory_utilization": 90}, "a fraction"),
        (TINY, {"gpus": 1, "gpu_memory_gib": 80, "kv_cache_dtype": "int4"}, "kv_cache_dtype must be one of"),
    ],
)
def test_unusable_input_is_a_value_error_not_a_refusal(
    facts: dict[str, Any], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        cp.plan(facts, **options)
    assert not isinstance(raised.value, cp.PlanRefused)


@pytest.mark.parametrize(
    ("value", "text"),
    [(3 * GIB, "3.00 GiB"), (723_200, "706.25 KiB (723,200 bytes)"), (5 << 20, "5.00 MiB (5,242,880 bytes)")],
)
def test_byte_counts_in_messages(value: int, text: str) -> None:
    assert cp.gib(value) == text
