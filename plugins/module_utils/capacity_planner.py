"""How many tokens of KV cache fit, and which vLLM flags follow, from a model's facts and the GPUs.

This replaces KV-cache sizing by guesswork (DESIGN.md failure mode #7) and
refuses tensor-parallel sizes vLLM rejects (#5). Inputs are the facts
``model_validation.check_model`` reads from config.json and the safetensors
headers; nothing here reads files, so the same function backs the
``capacity_plan`` filter (controller side) and ``llmfleet plan``.

Stdlib only: Ansible may ship it to hosts as ``ansible.module_utils.capacity_planner``;
the CLI imports it as ``llmfleet.module_utils.capacity_planner``.

The arithmetic, and where each rule comes from
----------------------------------------------
KV bytes per token, per tensor-parallel rank::

    2 (K and V) x layers x kv_heads_per_rank x head_dim x bytes per KV element

kv_heads_per_rank = max(1, kv_heads // tp). When tp exceeds the KV heads vLLM
*replicates* them: each rank keeps one KV head, and tp must be a multiple of
kv_heads (vLLM: ``ModelConfig.get_num_kv_heads`` in vllm/config, "we replicate
the KV heads in the case where the number of KV heads is smaller than the tensor
parallel size so each GPU has at least one KV head"; ``QKVParallelLinear`` in
vllm/model_executor/layers/linear.py sets ``num_kv_head_replicas =
divide(tp_size, total_num_kv_heads)``, which asserts divisibility). Otherwise
kv_heads must be a multiple of tp. The attention heads must always be a multiple
of tp (``ModelConfig.verify_with_parallel_config``: "Total number of attention
heads (H) must be divisible by tensor parallel size (T)"). Every rank holds
every token's K/V for its heads, so the cache capacity in tokens is what one
rank's budget holds; replication costs memory, it adds no capacity.

The engine turns a byte budget into tokens in whole blocks (vLLM 0.32.0,
vllm/v1/core/kv_cache_utils.py): ``num_blocks = budget // (block_size x
page bytes per token x layers)``, then logs "KV cache size: N tokens" with
``N = int(num_blocks / cdiv(max_model_len, block_size) * max_model_len)``,
which is ``num_blocks x block_size`` when max_model_len is a multiple of the
block size. The planner computes exactly that. Block size: 16 on CUDA by
default; the CPU backend of vLLM 0.32.0 uses 128 (vllm/platforms/cpu.py).

Budget per rank:

* ``kv_cache_gib`` given (the CPU engine's VLLM_CPU_KVCACHE_SPACE, or an
  explicit --kv-cache-memory-bytes): exactly that many GiB, as the engine does.
* otherwise ``gpu_memory_gib x gpu_memory_utilization - weights per rank -
  reserve``. vLLM measures the reserve (activations of a profiling forward
  pass, CUDA context, NCCL buffers) at start-up; the planner can only ESTIMATE
  it: 1 GiB fixed (CUDA context, cuBLAS workspace, NCCL, CUDA graphs) plus the
  activations of one prefill of ``max(max_model_len, 2048)`` tokens (vLLM's
  default max_num_batched_tokens without chunked prefill): per token, two hidden
  vectors, the q/k/v and attention outputs and three intermediate-sized MLP
  tensors (sharded by tp), in the model dtype, plus float32 logits for 256
  sequences. Give ``reserve_gib`` to replace the estimate with a measured value.
  Weights per rank are weights_bytes / tp (replicated norms and KV projections
  make the true figure slightly larger).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

GIB = 1 << 30
DEFAULT_BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# vLLM's default --max-num-seqs (SchedulerConfig), the ceiling of the suggestion.
DEFAULT_MAX_NUM_SEQS = 256
# The fixed part of the reserve estimate (see the module docstring).
FIXED_RESERVE_BYTES = GIB
# vLLM profiles at least this many tokens (default max_num_batched_tokens).
MIN_PROFILE_TOKENS = 2048
KV_CACHE_DTYPE_BYTES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2}
REQUIRED_FACTS = ("layers", "attention_heads", "kv_heads", "head_dim", "dtype_bytes", "weights_bytes")


# Planning before the weights arrive: architectures whose parameter count
# config.json alone gives (decoder-only, RMSNorm, gated MLP, grouped-query
# attention), and whether their q/k/v projections carry biases: Qwen2 always
# (transformers' Qwen2Attention: q_proj, k_proj, v_proj with bias=True, o_proj
# without); Llama and Mistral only with config attention_bias.
PARAMETER_FORMULAS: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"qkv_bias": True},
    "LlamaForCausalLM": {"qkv_bias": None},
    "MistralForCausalLM": {"qkv_bias": None},
}
ESTIMATE_FACTS = ("hidden_size", "intermediate_size", "layers", "attention_heads", "kv_heads", "head_dim",
                  "vocab_size", "dtype_bytes")


def estimate_parameters(facts: Mapping[str, Any]) -> dict[str, int]:
    """Parameters of a decoder-only model from its config.json sizes: {part: count, ..., "total": count}.

    embed_tokens (vocab x hidden); per layer q_proj (hidden x heads x head_dim,
    plus its bias), k_proj and v_proj (hidden x kv_heads x head_dim, plus
    biases), o_proj (heads x head_dim x hidden), the gated MLP's gate_proj,
    up_proj and down_proj (3 x hidden x intermediate) and two RMSNorm weights
    (2 x hidden); the final norm (hidden); lm_head (vocab x hidden) unless
    tie_word_embeddings. ValueError for an architecture without a formula or
    missing sizes.
    """
    architecture = facts.get("architecture")
    formula = PARAMETER_FORMULAS.get(str(architecture))
    if formula is None:
        raise ValueError(
            f"cannot estimate the parameters of {architecture} from config.json (formulas for"
            f" {', '.join(PARAMETER_FORMULAS)}); give the model's weights"
        )
    missing = [key for key in ESTIMATE_FACTS if not facts.get(key)]
    if missing:
        raise ValueError(f"config.json does not give {', '.join(missing)}: cannot estimate the weights")
    hidden, inter, layers = int(facts["hidden_size"]), int(facts["intermediate_size"]), int(facts["layers"])
    q_size = int(facts["attention_heads"]) * int(facts["head_dim"])
    kv_size = int(facts["kv_heads"]) * int(facts["head_dim"])
    vocab = int(facts["vocab_size"])
    bias = formula["qkv_bias"] if formula["qkv_bias"] is not None else bool(facts.get("attention_bias"))
    attention = hidden * q_size + 2 * hidden * kv_size + q_size * hidden + ((q_size + 2 * kv_size) if bias else 0)
    mlp = 3 * hidden * inter + (2 * inter + hidden if facts.get("mlp_bias") else 0)
    parts = {
        "embed_tokens": vocab * hidden,
        "attention": layers * attention,
        "mlp": layers * mlp,
        "norms": layers * 2 * hidden + hidden,
        "lm_head": 0 if facts.get("tie_word_embeddings") else vocab * hidden,
    }
    parts["total"] = sum(parts.values())
    return parts


def with_estimated_weights(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts with weights_bytes estimated from config.json (parameters x dtype bytes), marked as estimated.

    For planning before the weights arrive: the planner then sizes the host
    exactly as with real weights, and says the weight bytes are an estimate.
    Facts that already hold weights_bytes (read from safetensors headers) are
    returned unchanged.
    """
    if facts.get("weights_bytes"):
        return dict(facts)
    parameters = estimate_parameters(facts)["total"]
    return {**facts, "parameters": parameters, "weights_bytes": parameters * int(facts["dtype_bytes"]),
            "weights_estimated": True}


class PlanRefused(ValueError):
    """The request cannot work; reasons holds one line per cause, with the numbers."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def gib(value: float) -> str:
    """A byte count for a message: GiB, MiB or KiB with two decimals, plus exact bytes below 1 GiB."""
    for unit, name in ((GIB, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(value) >= unit or unit == 1 << 10:
            text = f"{value / unit:.2f} {name}"
            return text if abs(value) >= GIB else f"{text} ({int(value):,} bytes)"
    return f"{int(value)} bytes"  # pragma: no cover (the loop always returns)


def tensor_parallel_problems(attention_heads: int, kv_heads: int, tp: int) -> list[str]:
    """Why vLLM would refuse this tensor-parallel size for this model (empty: it accepts it)."""
    problems = []
    if attention_heads % tp:
        problems.append(
            f"tensor-parallel size {tp} does not divide the {attention_heads} attention heads"
            " (vLLM: heads must be divisible by the tensor parallel size)"
        )
    if tp > kv_heads and tp % kv_heads:
        problems.append(
            f"tensor-parallel size {tp} is above the {kv_heads} KV heads but not a multiple of them"
            " (vLLM replicates KV heads only when tp is a multiple of kv_heads)"
        )
    elif tp <= kv_heads and kv_heads % tp:
        problems.append(f"tensor-parallel size {tp} does not divide the {kv_heads} KV heads")
    return problems


def valid_tensor_parallel_sizes(attention_heads: int, kv_heads: int, up_to: int) -> list[int]:
    return [tp for tp in range(1, up_to + 1) if not tensor_parallel_problems(attention_heads, kv_heads, tp)]


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    return max(1, kv_heads // tp)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, tp: int = 1) -> int:
    """Bytes of K and V one token occupies on one tensor-parallel rank."""
    return 2 * layers * kv_heads_per_rank(kv_heads, tp) * head_dim * dtype_bytes


def kv_cache_tokens(budget_bytes: int, bytes_per_token: int, block_size: int, max_model_len: int) -> tuple[int, int]:
    """(num_blocks, tokens) for a byte budget, rounded as vLLM 0.32.0 rounds them."""
    blocks = budget_bytes // (block_size * bytes_per_token) if budget_bytes > 0 else 0
    blocks_per_sequence = -(-max_model_len // block_size)
    return blocks, int(blocks / blocks_per_sequence * max_model_len)


def reserve_estimate(facts: Mapping[str, Any], tp: int, max_model_len: int) -> int:
    """Activation and runtime memory per rank, estimated (see the module docstring)."""
    hidden = int(facts.get("hidden_size") or 0)
    heads, kv_heads, head_dim = int(facts["attention_heads"]), int(facts["kv_heads"]), int(facts["head_dim"])
    intermediate = int(facts.get("intermediate_size") or 4 * hidden)
    vocab = int(facts.get("vocab_size") or 0)
    dtype_bytes = int(facts["dtype_bytes"])
    tokens = max(max_model_len, MIN_PROFILE_TOKENS)
    q_size, kv_size = heads * head_dim // tp, kv_heads_per_rank(kv_heads, tp) * head_dim
    per_token = 2 * hidden + q_size + 2 * kv_size + q_size + 3 * intermediate // tp
    logits = DEFAULT_MAX_NUM_SEQS * vocab * 4
    return FIXED_RESERVE_BYTES + tokens * per_token * dtype_bytes + logits


def _number(value: Any, name: str, minimum: float = 0.0, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if integer and int(value) != value:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if value <= minimum:
        raise ValueError(f"{name} must be greater than {minimum:g}, got {value!r}")
    return int(value) if integer else value


def plan(
    facts: Mapping[str, Any],
    gpus: int,
    gpu_memory_gib: float | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    kv_cache_gib: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    reserve_gib: float | None = None,
    kv_cache_dtype: str = "auto",
) -> dict[str, Any]:
    """The capacity plan; PlanRefused with the numbers when the request cannot work.

    gpus is the number of GPUs the engine gets, and so its tensor-parallel size
    (DESIGN.md: TP equals the GPUs assigned; a smaller TP leaves GPUs idle, a
    larger one cannot start). ValueError (not PlanRefused) for unusable input:
    missing facts, non-numbers.
    """
    missing = [key for key in REQUIRED_FACTS if not facts.get(key)]
    if missing:
        raise ValueError(f"model facts lack {', '.join(missing)}; pass the facts model_check returns")
    layers, heads, kv_heads = int(facts["layers"]), int(facts["attention_heads"]), int(facts["kv_heads"])
    head_dim, weights_bytes = int(facts["head_dim"]), int(facts["weights_bytes"])
    tp = gpus = _number(gpus, "gpus", integer=True)
    block_size = _number(block_size, "block_size", integer=True)
    utilization = _number(gpu_memory_utilization, "gpu_memory_utilization")
    if utilization > 1:
        raise ValueError(f"gpu_memory_utilization is a fraction of GPU memory (0-1], got {utilization}")
    if gpu_memory_gib is None and kv_cache_gib is None:
        raise ValueError("give gpu_memory_gib (GPU memory per GPU) or kv_cache_gib (an explicit KV cache budget)")
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPE_BYTES)}, got {kv_cache_dtype!r}")
    element_bytes = KV_CACHE_DTYPE_BYTES[kv_cache_dtype] or int(facts["dtype_bytes"])

    reasons: list[str] = []
    tp_problems = tensor_parallel_problems(heads, kv_heads, tp)
    if tp_problems:
        reasons.extend(tp_problems)
        reasons.append(
            f"GPU counts (tensor-parallel sizes) that work for this model up to {max(tp, 8)}:"
            f" {valid_tensor_parallel_sizes(heads, kv_heads, max(tp, 8))}"
        )

    max_positions = int(facts.get("max_model_len") or facts.get("max_positions") or 0)
    scaled = bool(facts.get("max_positions")) and facts.get("max_positions") != max_positions
    length = _number(max_model_len, "max_model_len", integer=True) if max_model_len else max_positions
    if not length:
        raise ValueError("the model facts give no max positions; pass max_model_len")
    if max_positions and length > max_positions:
        origin = "max_position_embeddings x rope_scaling factor" if scaled else "max_position_embeddings"
        reasons.append(
            f"max_model_len {length} exceeds the model's {max_positions} positions ({origin});"
            f" use --max-model-len {max_positions} or less"
        )

    per_token = kv_bytes_per_token(layers, kv_heads, head_dim, element_bytes, tp)
    weights_per_rank = -(-weights_bytes // tp)
    gpu_bytes = int(_number(gpu_memory_gib, "gpu_memory_gib") * GIB) if gpu_memory_gib is not None else None
    usable = int(gpu_bytes * utilization) if gpu_bytes is not None else None
    estimated = reserve_gib is None
    reserve = reserve_estimate(facts, tp, length) if estimated else int(float(reserve_gib or 0) * GIB)
    if kv_cache_gib is not None:
        budget = int(_number(kv_cache_gib, "kv_cache_gib") * GIB)
        source = "kv_cache_gib"
        if usable is not None and weights_per_rank + budget + reserve > usable:
            reasons.append(
                f"weights ({gib(weights_per_rank)} per GPU) + KV cache ({gib(budget)}) + reserve"
                f" ({gib(reserve)}{', estimated' if estimated else ''}) need"
                f" {gib(weights_per_rank + budget + reserve)} but {gpu_memory_gib} GiB x {utilization} ="
                f" {gib(usable)} is usable"
            )
    else:
        assert usable is not None
        budget = usable - weights_per_rank - reserve
        source = "gpu_memory"
        if weights_per_rank > usable:
            needed = -(-weights_bytes // max(usable, 1))
            bigger = [n for n in valid_tensor_parallel_sizes(heads, kv_heads, max(2 * needed, 8)) if n >= needed]
            advice = f"use {bigger[0]} GPUs or more" if bigger else "no GPU count this model allows is enough"
            reasons.append(
                f"the weights need {gib(weights_per_rank)} per GPU at tensor-parallel size {tp}"
                f" ({gib(weights_bytes)} in all) but {gpu_memory_gib} GiB x {utilization} = {gib(usable)} is usable:"
                f" {advice}, GPUs with more memory, or a quantized model"
            )
        elif budget <= 0:
            reasons.append(
                f"nothing is left for the KV cache: {gib(usable)} usable - {gib(weights_per_rank)} weights per GPU"
                f" - {gib(reserve)} reserve{' (estimated)' if estimated else ''} = {gib(budget)}"
            )
    blocks, tokens = kv_cache_tokens(budget, per_token, block_size, length)
    blocks_per_sequence = -(-length // block_size)
    if not reasons and tokens < length:
        fitting = blocks * block_size
        reasons.append(
            f"one sequence of max_model_len {length} needs {blocks_per_sequence * block_size} tokens of KV cache"
            f" ({gib(blocks_per_sequence * block_size * per_token)}) but only {fitting} fit"
            f" ({gib(budget)} / {per_token} bytes per token); use --max-model-len {fitting} or less, or more memory"
        )
    if reasons:
        raise PlanRefused(reasons)

    concurrency = blocks / blocks_per_sequence
    max_num_seqs = max(1, min(DEFAULT_MAX_NUM_SEQS, math.floor(concurrency)))
    suggested = {
        "--tensor-parallel-size": tp,
        "--max-model-len": length,
        "--max-num-seqs": max_num_seqs,
        "--gpu-memory-utilization": utilization,
    }
    return {
        "gpus": gpus,
        "tensor_parallel_size": tp,
        "kv_heads": kv_heads,
        "kv_heads_per_rank": kv_heads_per_rank(kv_heads, tp),
        "kv_head_replicas": tp // kv_heads if tp > kv_heads else 1,
        "kv_cache_dtype_bytes": element_bytes,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_all_ranks": per_token * tp,
        "kv_bytes_per_token_model": kv_bytes_per_token(layers, kv_heads, head_dim, element_bytes, 1),
        "weights_bytes": weights_bytes,
        "weights_estimated": bool(facts.get("weights_estimated")),
        "weights_bytes_per_rank": weights_per_rank,
        "gpu_memory_bytes": gpu_bytes,
        "gpu_memory_utilization": utilization,
        "reserve_bytes": reserve if usable is not None else 0,
        "reserve_is_estimate": estimated,
        "kv_cache_source": source,
        "kv_cache_bytes": budget,
        "block_size": block_size,
        "kv_cache_blocks": blocks,
        "kv_cache_tokens": tokens,
        "max_positions": max_positions,
        "max_model_len": length,
        "max_concurrency": round(concurrency, 2),
        "sequences_at_max_model_len": math.floor(concurrency),
        "max_num_seqs": max_num_seqs,
        "suggested_flags": suggested,
        "suggested_args": [part for flag, value in suggested.items() for part in (flag, str(value))],
    }
