"""Planning before the weights arrive: parameters estimated from config.json alone.

Checked against the published parameter counts of Qwen2-1.5B and Qwen2-7B
(their configs typed into tests/unit/fixtures/configs/ from the published
numbers) and against the real safetensors bytes of the tiny model llmfleet
generates: all within 1% (they match exactly).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmfleet.lab import tiny
from llmfleet.module_utils import capacity_planner as cp
from llmfleet.module_utils import model_validation
from llmfleet.paths import REPO_ROOT

CONFIGS = REPO_ROOT / "tests" / "unit" / "fixtures" / "configs"


def config_facts(directory: Path) -> dict[str, Any]:
    """The facts the model check reads from a directory holding only config.json."""
    report = model_validation.check_model(str(directory), chat=False)
    facts: dict[str, Any] = report["facts"]
    assert "weights_bytes" not in facts
    return facts


@pytest.mark.parametrize(
    ("model", "published"),
    [("qwen2-1.5b-instruct", 1_543_714_304), ("qwen2-7b-instruct", 7_615_616_512)],
)
def test_published_qwen2_parameter_counts(model: str, published: int) -> None:
    estimate = cp.estimate_parameters(config_facts(CONFIGS / model))
    assert abs(estimate["total"] - published) / published < 0.01
    assert estimate["total"] == published


def test_tied_and_untied_embeddings() -> None:
    small = cp.estimate_parameters(config_facts(CONFIGS / "qwen2-1.5b-instruct"))
    large = cp.estimate_parameters(config_facts(CONFIGS / "qwen2-7b-instruct"))
    assert small["lm_head"] == 0
    assert large["lm_head"] == large["embed_tokens"] == 152064 * 3584


def test_the_tiny_models_real_weight_bytes(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    tiny.make_tiny_model(model, seed=0)
    real = model_validation.check_model(str(model), chat=False)["facts"]
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    (only_config / "config.json").write_text((model / "config.json").read_text())
    estimated = cp.with_estimated_weights(config_facts(only_config))
    assert estimated["weights_estimated"] is True
    assert abs(estimated["weights_bytes"] - real["weights_bytes"]) / real["weights_bytes"] < 0.01
    assert (estimated["parameters"], estimated["weights_bytes"]) == (real["parameters"], real["weights_bytes"])


def test_the_plan_says_its_weights_are_estimated() -> None:
    facts = cp.with_estimated_weights(config_facts(CONFIGS / "qwen2-7b-instruct"))
    plan = cp.plan(facts, 1, gpu_memory_gib=143771 / 1024, max_model_len=32768)
    assert plan["weights_estimated"] is True
    assert plan["weights_bytes"] == 2 * 7_615_616_512


def test_real_weights_are_left_alone() -> None:
    facts = {"weights_bytes": 123, "architecture": "Qwen2ForCausalLM"}
    assert cp.with_estimated_weights(facts) == facts


def test_llama_attention_bias_comes_from_its_config() -> None:
    shape = {"architecture": "LlamaForCausalLM", "hidden_size": 64, "intermediate_size": 128, "layers": 1,
             "attention_heads": 4, "kv_heads": 2, "head_dim": 16, "vocab_size": 100, "dtype_bytes": 2}
    plain = cp.estimate_parameters(shape)["total"]
    biased = cp.estimate_parameters({**shape, "attention_bias": True})["total"]
    assert biased - plain == 64 + 2 * 32  # q, k and v biases


@pytest.mark.parametrize(
    ("change", "words"),
    [({"architecture": "GPTNeoXForCausalLM"}, "cannot estimate the parameters of GPTNeoXForCausalLM"),
     ({"intermediate_size": None}, "does not give intermediate_size")],
)
def test_what_cannot_be_estimated_is_refused(change: dict[str, Any], words: str) -> None:
    facts = {**config_facts(CONFIGS / "qwen2-1.5b-instruct"), **change}
    with pytest.raises(ValueError, match=words):
        cp.with_estimated_weights(facts)


def test_fixture_configs_are_json_with_the_published_sizes() -> None:
    config = json.loads((CONFIGS / "qwen2-1.5b-instruct" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (1536, 28, 2)
