"""Unit tests for plugins/module_utils/model_validation/: is a model directory servable?

Every case starts from a real tiny Qwen2 model (llmfleet.lab.tiny, the model
the lab's vLLM serves) and breaks one thing the way exports and copies break
it, then checks the verdict names the file and says what to do.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmfleet.lab import tiny
from llmfleet.lab.tiny_adapter import make_tiny_adapter
from llmfleet.module_utils import model_validation as mv


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "tiny"
    tiny.make_tiny_model(path, seed=0)
    return path


@pytest.fixture
def model(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of the tiny model to break (same directory name, so adapters made for it match)."""
    path = tmp_path / "copy" / pristine.name
    shutil.copytree(pristine, path)
    return path


def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file with zeroed data, for dtypes the bf16 writer does not make."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in sorted(tensors.items()):
        size = math.prod(shape) * mv.DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def shard(model: Path, parts: int = 2) -> list[str]:
    """Re-save the tiny model's weights as parts shards with a model.safetensors.index.json."""
    config = json.loads((model / "config.json").read_text())
    weights = tiny.random_weights(tiny.tensor_shapes(config), seed=0)
    names = sorted(weights)
    weight_map: dict[str, str] = {}
    shard_names = []
    for number in range(parts):
        shard_name = f"model-{number + 1:05d}-of-{parts:05d}.safetensors"
        chunk = names[number::parts]
        (model / shard_name).write_bytes(tiny.safetensors_bytes({name: weights[name] for name in chunk}))
        weight_map.update(dict.fromkeys(chunk, shard_name))
        shard_names.append(shard_name)
    (model / "model.safetensors").unlink()
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (model / mv.WEIGHTS_INDEX).write_text(json.dumps(index, indent=2))
    return shard_names


def codes(report: dict[str, Any]) -> list[str]:
    return [problem["code"] for problem in report["problems"]]


def only_problem(report: dict[str, Any]) -> dict[str, str]:
    assert len(report["problems"]) == 1, report["problem_lines"]
    problem: dict[str, str] = report["problems"][0]
    return problem


# --- a good model ------------------------------------------------------------


def test_the_tiny_model_is_servable_and_its_facts_come_from_the_headers(pristine: Path) -> None:
    report = mv.check_model(str(pristine))
    assert report["ok"] is True, report["problem_lines"]
    assert report["problems"] == [] and report["warnings"] == []
    header = tiny.read_safetensors_header(pristine / "model.safetensors")
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    facts = report["facts"]
    assert facts["weights_bytes"] == sum(end - begin for begin, end in (t["data_offsets"] for t in tensors.values()))
    assert facts["parameters"] == sum(math.prod(t["shape"]) for t in tensors.values())
    assert {key: facts[key] for key in ("architecture", "layers", "attention_heads", "kv_heads", "head_dim")} == {
        "architecture": "Qwen2ForCausalLM",
        "layers": tiny.NUM_LAYERS,
        "attention_heads": tiny.NUM_HEADS,
        "kv_heads": tiny.NUM_KV_HEADS,
        "head_dim": tiny.HEAD_DIM,
    }
    assert (facts["dtype"], facts["dtype_bytes"], facts["max_positions"]) == ("bfloat16", 2, tiny.MAX_POSITIONS)
    assert mv.missing_planner_facts(facts) == []


@pytest.mark.parametrize("engine_version", mv.ENGINE_VERSIONS)
def test_both_pinned_engines_serve_qwen2(pristine: Path, engine_version: str) -> None:
    assert mv.check_model(str(pristine), engine_version=engine_version)["ok"] is True


def test_sharded_weights_with_an_index_are_servable(model: Path, pristine: Path) -> None:
    shard(model)
    report = mv.check_model(str(model))
    assert report["ok"] is True, report["problem_lines"]
    assert report["facts"]["weights_bytes"] == mv.check_model(str(pristine))["facts"]["weights_bytes"]
    assert len(report["facts"]["weights_files"]) == 2


def test_a_chat_template_file_counts_and_no_chat_needs_none(model: Path) -> None:
    edit_json(model / "tokenizer_config.json", lambda data: data.pop("chat_template"))
    assert codes(mv.check_model(str(model))) == ["missing-chat-template"]
    assert mv.check_model(str(model), chat=False)["ok"] is True
    (model / "chat_template.jinja").write_text(tiny.CHAT_TEMPLATE)
    assert mv.check_model(str(model))["ok"] is True


# --- bad models: one line per problem, naming the file and the fix -------------


def _drop_config_key(key: str) -> Callable[[Path], None]:
    return lambda model: edit_json(model / "config.json", lambda data: data.pop(key))


def _set_config(key: str, value: Any) -> Callable[[Path], None]:
    return lambda model: edit_json(model / "config.json", lambda data: data.__setitem__(key, value))


def _unlink(name: str) -> Callable[[Path], None]:
    return lambda model: (model / name).unlink()


def _truncate(name: str) -> Callable[[Path], None]:
    def change(model: Path) -> None:
        data = (model / name).read_bytes()
        (model / name).write_bytes(data[: len(data) - 1000])

    return change


def _bin_only(model: Path) -> None:
    (model / "model.safetensors").rename(model / "pytorch_model.bin")


def _mixed_dtypes(model: Path) -> None:
    write_safetensors(model / "model.safetensors", {"a.weight": ("BF16", [4, 4]), "b.weight": ("F32", [4])})


def _missing_shard(model: Path) -> None:
    (model / shard(model)[1]).unlink()


def _index_lists_a_tensor_the_shard_lacks(model: Path) -> None:
    first = shard(model)[0]
    edit_json(model / mv.WEIGHTS_INDEX, lambda data: data["weight_map"].__setitem__("lm_head.weight", first))


def _truncated_shard(model: Path) -> None:
    names = shard(model)
    _truncate(names[0])(model)


def _shards_without_index(model: Path) -> None:
    shard(model)
    (model / mv.WEIGHTS_INDEX).unlink()


@pytest.mark.parametrize(
    ("break_it", "code", "file", "fix"),
    [
        (_drop_config_key("rope_theta"), "missing-rope-theta", "config.json", "--fix-config rope_theta="),
        (_drop_config_key("num_key_value_heads"), "missing-num-key-value-heads", "config.json", "copy"),
        (_drop_config_key("architectures"), "no-architecture", "config.json", "Qwen2ForCausalLM"),
        (_set_config("architectures", ["TinyMagicForCausalLM"]), "unsupported-architecture", "config.json",
         "vLLM release that supports"),
        (_set_config("num_key_value_heads", 3), "bad-kv-heads", "config.json", "num_key_value_heads"),
        (_unlink("config.json"), "missing-config", "config.json", "copy config.json"),
        (_unlink("tokenizer.json"), "missing-tokenizer", "tokenizer.json", "copy the tokenizer files"),
        (_unlink("tokenizer_config.json"), "missing-tokenizer-config", "tokenizer_config.json", "copy"),
        (_truncate("model.safetensors"), "bad-weights", "model.safetensors", "copy the file again"),
        (_bin_only, "no-safetensors", "model.safetensors", "safetensors"),
        (_unlink("model.safetensors"), "no-weights", "model.safetensors", "copy the model's weights"),
        (_mixed_dtypes, "mixed-dtypes", "model.safetensors", "one dtype"),
        (_missing_shard, "missing-shard", "model-00002-of-00002.safetensors", "copy the file again"),
        (_index_lists_a_tensor_the_shard_lacks, "tensor-not-in-shard", "model-00001-of-00002.safetensors",
         "copy both again"),
        (_truncated_shard, "bad-shard", "model-00001-of-00002.safetensors", "copy the file again"),
        (_shards_without_index, "missing-weights-index", mv.WEIGHTS_INDEX, "index.json"),
    ],
)  # fmt: skip
def test_a_broken_model_is_refused_with_the_file_and_the_fix(
    model: Path, break_it: Callable[[Path], None], code: str, file: str, fix: str
) -> None:
    break_it(model)
    report = mv.check_model(str(model))
    assert report["ok"] is False
    problem = next((p for p in report["problems"] if p["code"] == code), None)
    assert problem is not None, report["problem_lines"]
    assert problem["file"] == str(model / file)
    assert fix in problem["fix"]
    line = report["problem_lines"][report["problems"].index(problem)]
    assert line.startswith(f"{model / file}: ") and "; fix: " in line and "\n" not in line


def test_missing_rope_theta_says_what_the_fallback_does(model: Path) -> None:
    _drop_config_key("rope_theta")(model)
    problem = only_problem(mv.check_model(str(model)))
    assert "10000.0" in problem["message"]
    assert "1000000.0" in problem["fix"]


def test_rope_theta_in_rope_parameters_counts(model: Path) -> None:
    def move(data: dict[str, Any]) -> None:
        data["rope_parameters"] = {"rope_theta": data.pop("rope_theta"), "rope_type": "default"}

    edit_json(model / "config.json", move)
    assert mv.check_model(str(model))["ok"] is True


def test_an_architecture_only_the_newer_engine_serves(model: Path) -> None:
    _set_config("architectures", ["Qwen3ForCausalLM"])(model)
    assert mv.check_model(str(model), engine_version="0.32.0")["ok"] is True
    problem = only_problem(mv.check_model(str(model), engine_version="0.4.2"))
    assert problem["code"] == "unsupported-architecture"
    assert "vLLM 0.4.2" in problem["message"]


def test_a_quantized_checkpoint_may_mix_dtypes(model: Path) -> None:
    _mixed_dtypes(model)
    _set_config("quantization_config", {"quant_method": "gptq", "bits": 4})(model)
    report = mv.check_model(str(model))
    assert "mixed-dtypes" not in codes(report)
    assert any("quantized" in warning for warning in report["warnings"])


def test_unknown_engine_release_and_missing_directory_are_bad_input(pristine: Path, tmp_path: Path) -> None:
    known = r"known releases: 0\.4\.2, 0\.9\.2, 0\.32\.0"
    with pytest.raises(ValueError, match=rf"no serving data for vLLM '0\.9\.9'; {known}"):
        mv.check_model(str(pristine), engine_version="0.9.9")
    with pytest.raises(ValueError, match="does not exist"):
        mv.check_model(str(tmp_path / "nope"))


# --- safetensors headers -------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x00", "too short"),
        (struct.pack("<Q", 10**9) + b"{}", "declares a 1000000000-byte header"),
        (struct.pack("<Q", 4) + b"nope", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 64) + json.dumps({"t": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 6]}})
         .encode().ljust(64) + bytes(8), "gives it 6 bytes"),
    ],
)  # fmt: skip
def test_unreadable_safetensors_headers(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(content)
    with pytest.raises(mv.SafetensorsError, match=message):
        mv.read_safetensors_header(str(path))


# --- adapters --------------------------------------------------------------------


@pytest.fixture
def adapter(pristine: Path, tmp_path: Path) -> Path:
    """A real tiny LoRA adapter for the pristine tiny model: q_proj and v_proj, r=8."""
    path = tmp_path / "adapter"
    make_tiny_adapter(path, pristine, seed=0)
    return path


def adapter_report(model: Path, adapter: Path, **options: Any) -> dict[str, Any]:
    return mv.check_model(str(model), adapters=[str(adapter)], **options)


@pytest.mark.parametrize("engine_version", mv.ENGINE_VERSIONS)
def test_an_adapter_on_q_and_v_only_is_servable(pristine: Path, adapter: Path, engine_version: str) -> None:
    """The write-up claims LoRA needs all of q/k/v/o; vLLM serves any subset it knows."""
    report = adapter_report(pristine, adapter, engine_version=engine_version)
    assert report["ok"] is True, report["problem_lines"]
    (facts,) = report["adapters"]
    assert facts["target_modules"] == facts["tensor_modules"] == ["q_proj", "v_proj"]
    assert (facts["rank"], facts["max_lora_rank"]) == (8, 8)
    assert (report["facts"]["max_lora_rank"], report["facts"]["max_loras"]) == (8, 1)


def test_an_adapter_on_every_linear_module_is_servable(pristine: Path, tmp_path: Path) -> None:
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    make_tiny_adapter(tmp_path / "all", pristine, targets=targets, rank=12)
    report = adapter_report(pristine, tmp_path / "all")
    assert report["ok"] is True, report["problem_lines"]
    assert report["adapters"][0]["max_lora_rank"] == 16


def _set_adapter(key: str, value: Any) -> Callable[[Path], None]:
    return lambda adapter: edit_json(adapter / mv.ADAPTER_CONFIG, lambda data: data.__setitem__(key, value))


@pytest.mark.parametrize(
    ("break_it", "code", "file", "fix"),
    [
        (_set_adapter("peft_type", "PREFIX_TUNING"), "wrong-peft-type", mv.ADAPTER_CONFIG, "merge"),
        (_set_adapter("peft_type", "LOHA"), "wrong-peft-type", mv.ADAPTER_CONFIG, "merge"),
        (_set_adapter("target_modules", ["q_proj", "v_proj", "lm_head"]), "unsupported-target-module",
         mv.ADAPTER_CONFIG, "retrain without them"),
        (_set_adapter("target_modules", ["q_proj", "qkv"]), "unsupported-target-module", mv.ADAPTER_CONFIG,
         "merge the adapter"),
        (_set_adapter("r", 1024), "rank-too-big", mv.ADAPTER_CONFIG, "retrain with r <= 512"),
        (_set_adapter("rank_pattern", {"q_proj": 600}), "rank-too-big", mv.ADAPTER_CONFIG, "r <= 512"),
        (_set_adapter("r", 0), "bad-rank", mv.ADAPTER_CONFIG, "copy"),
        (_set_adapter("bias", "all"), "lora-bias", mv.ADAPTER_CONFIG, "bias='none'"),
        (_set_adapter("use_dora", True), "dora", mv.ADAPTER_CONFIG, "merge"),
        (_set_adapter("modules_to_save", ["embed_tokens"]), "modules-to-save", mv.ADAPTER_CONFIG, "merge"),
        (_set_adapter("base_model_name_or_path", "Qwen/Qwen2-1.5B"), "base-model-mismatch", mv.ADAPTER_CONFIG,
         "--base-name Qwen/Qwen2-1.5B"),
        (_unlink(mv.ADAPTER_CONFIG), "missing-adapter-config", mv.ADAPTER_CONFIG, "merged model"),
        (_unlink(mv.ADAPTER_WEIGHTS), "missing-adapter-weights", mv.ADAPTER_WEIGHTS, "safetensors"),
    ],
)  # fmt: skip
def test_a_bad_adapter_is_refused_with_the_file_and_the_fix(
    pristine: Path, adapter: Path, break_it: Callable[[Path], None], code: str, file: str, fix: str
) -> None:
    break_it(adapter)
    report = adapter_report(pristine, adapter)
    assert report["ok"] is False
    problem = next((p for p in report["problems"] if p["code"] == code), None)
    assert problem is not None, report["problem_lines"]
    assert problem["file"] == str(adapter / file)
    assert fix in problem["fix"]


@pytest.mark.parametrize(("rank", "ok_042", "flag_032"), [(8, True, 8), (64, True, 64), (65, False, 128)])
def test_rank_limits_differ_by_engine(pristine: Path, tmp_path: Path, rank: int, ok_042: bool, flag_032: int) -> None:
    make_tiny_adapter(tmp_path / "a", pristine, rank=rank)
    old = adapter_report(pristine, tmp_path / "a", engine_version="0.4.2")
    assert old["ok"] is ok_042
    if not ok_042:
        assert codes(old) == ["rank-too-big"]
        assert "maximum LoRA rank 64 (--max-lora-rank accepts 8, 16, 32, 64)" in old["problems"][0]["message"]
    new = adapter_report(pristine, tmp_path / "a", engine_version="0.32.0")
    assert new["ok"] is True
    assert new["adapters"][0]["max_lora_rank"] == flag_032


def test_lm_head_is_a_lora_target_for_llama_but_not_qwen2_on_0_32(model: Path, adapter: Path) -> None:
    _set_adapter("target_modules", ["q_proj", "lm_head"])(adapter)
    assert codes(adapter_report(model, adapter)) == ["unsupported-target-module"]
    _set_config("architectures", ["LlamaForCausalLM"])(model)
    assert adapter_report(model, adapter)["ok"] is True


def test_the_base_matches_by_recorded_name(pristine: Path, adapter: Path) -> None:
    _set_adapter("base_model_name_or_path", "Qwen/Qwen2-1.5B")(adapter)
    assert adapter_report(pristine, adapter, base_names=["Qwen/Qwen2-1.5B"])["ok"] is True
    _set_adapter("base_model_name_or_path", "/train/checkpoints/tiny/")(adapter)
    assert adapter_report(pristine, adapter)["ok"] is True  # same directory name


def test_an_adapter_for_another_base_is_caught_by_its_shapes(pristine: Path, tmp_path: Path) -> None:
    make_tiny_adapter(tmp_path / "kv", pristine, targets=("k_proj", "v_proj"))
    other = tmp_path / "tiny"  # same name, so the name check passes; two KV heads instead of one
    shutil.copytree(pristine, other)
    _set_config("num_key_value_heads", 2)(other)
    problem = only_problem(adapter_report(other, tmp_path / "kv"))
    assert problem["code"] == "adapter-shape-mismatch"
    assert "expected [128, r]" in problem["message"]


def test_an_adapter_that_is_not_a_directory(pristine: Path, tmp_path: Path) -> None:
    problem = only_problem(adapter_report(pristine, tmp_path / "missing"))
    assert (problem["code"], problem["file"]) == ("missing-adapter", str(tmp_path / "missing"))


def test_smallest_max_lora_rank() -> None:
    assert [mv.smallest_max_lora_rank(rank, "0.32.0") for rank in (1, 2, 8, 300, 512, 513)] == [
        1, 8, 8, 320, 512, None,
    ]  # fmt: skip
    assert [mv.smallest_max_lora_rank(rank, "0.4.2") for rank in (1, 9, 64, 65)] == [8, 16, 64, None]
    assert [mv.smallest_max_lora_rank(rank, "0.9.2") for rank in (1, 65, 300, 512, 513)] == [8, 128, 320, 512, None]


# --- vLLM 0.9.2, the current-cu128 stack's engine: its own data, not 0.4.2's or 0.32.0's ---


def test_the_current_stack_engine_is_a_known_release() -> None:
    assert mv.CURRENT_ENGINE_VERSION == "0.9.2"
    assert mv.ENGINE_VERSIONS == ("0.4.2", "0.9.2", "0.32.0")
    assert len(mv.SUPPORTED_ARCHITECTURES["0.9.2"]) == 90


@pytest.mark.parametrize(
    ("architecture", "served_by"),
    [
        ("Qwen3ForCausalLM", {"0.4.2": False, "0.9.2": True, "0.32.0": True}),
        ("Gemma2ForCausalLM", {"0.4.2": False, "0.9.2": True, "0.32.0": True}),
        ("Qwen3NextForCausalLM", {"0.4.2": False, "0.9.2": False, "0.32.0": True}),
        ("LlavaForConditionalGeneration", {"0.4.2": True, "0.9.2": False, "0.32.0": False}),
        ("PersimmonForCausalLM", {"0.4.2": False, "0.9.2": True, "0.32.0": False}),
    ],
)
def test_architectures_follow_each_release(model: Path, architecture: str, served_by: dict[str, bool]) -> None:
    _set_config("architectures", [architecture])(model)
    for version, served in served_by.items():
        report = mv.check_model(str(model), engine_version=version)
        assert report["ok"] is served, (version, report["problem_lines"])
        if not served:
            problem = only_problem(report)
            assert problem["code"] == "unsupported-architecture"
            assert f"vLLM {version}" in problem["message"]


@pytest.mark.parametrize(("rank", "flag_092"), [(1, 8), (65, 128), (300, 320)])
def test_0_9_2_rank_flags(pristine: Path, tmp_path: Path, rank: int, flag_092: int) -> None:
    make_tiny_adapter(tmp_path / "a", pristine, rank=rank)
    report = adapter_report(pristine, tmp_path / "a", engine_version="0.9.2")
    assert report["ok"] is True, report["problem_lines"]
    assert report["adapters"][0]["max_lora_rank"] == flag_092
    old = adapter_report(pristine, tmp_path / "a", engine_version="0.4.2")
    assert old["ok"] is (rank <= 64)


def test_0_9_2_refuses_a_rank_above_512(pristine: Path, tmp_path: Path) -> None:
    make_tiny_adapter(tmp_path / "a", pristine, rank=520)
    problem = only_problem(adapter_report(pristine, tmp_path / "a", engine_version="0.9.2"))
    assert problem["code"] == "rank-too-big"
    assert "maximum LoRA rank 512 (--max-lora-rank accepts 8, 16, 32, 64, 128, 256, 320, 512)" in problem["message"]


@pytest.mark.parametrize(
    ("architecture", "lm_head_ok"),
    [
        # 0.9.2's Qwen3ForCausalLM has no embedding_modules; 0.32.0's has.
        ("Qwen3ForCausalLM", {"0.9.2": False, "0.32.0": True}),
        # 0.9.2 serves Mistral with LlamaForCausalLM (embeddings); 0.32.0's MistralForCausalLM clears them.
        ("MistralForCausalLM", {"0.9.2": True, "0.32.0": False}),
    ],
)
def test_lm_head_as_a_target_differs_between_0_9_2_and_0_32(
    model: Path, adapter: Path, architecture: str, lm_head_ok: dict[str, bool]
) -> None:
    _set_config("architectures", [architecture])(model)
    _set_adapter("target_modules", ["q_proj", "lm_head"])(adapter)
    for version, ok in lm_head_ok.items():
        report = adapter_report(model, adapter, engine_version=version)
        assert codes(report) == ([] if ok else ["unsupported-target-module"]), (version, report["problem_lines"])


def test_phi3_adapters_use_fused_names_on_0_9_2(model: Path, adapter: Path) -> None:
    _set_config("architectures", ["Phi3ForCausalLM"])(model)
    prefix = "base_model.model.model.layers.0.self_attn.qkv_proj"
    fused = {f"{prefix}.lora_A.weight": ("BF16", [8, 128]), f"{prefix}.lora_B.weight": ("BF16", [256, 8])}
    write_safetensors(adapter / mv.ADAPTER_WEIGHTS, fused)
    _set_adapter("target_modules", ["qkv_proj"])(adapter)
    assert adapter_report(model, adapter, engine_version="0.9.2")["ok"] is True
    _set_adapter("target_modules", ["q_proj"])(adapter)
    assert codes(adapter_report(model, adapter, engine_version="0.9.2")) == ["unsupported-target-module"]


def test_modules_to_save_is_refused_by_0_9_2_even_for_a_classifier_head(pristine: Path, adapter: Path) -> None:
    _set_adapter("modules_to_save", ["score"])(adapter)
    assert adapter_report(pristine, adapter, engine_version="0.32.0")["ok"] is True
    assert adapter_report(pristine, adapter, engine_version="0.4.2")["ok"] is True  # 0.4.2 ignored it
    problem = only_problem(adapter_report(pristine, adapter, engine_version="0.9.2"))
    assert (problem["code"], problem["file"]) == ("modules-to-save", str(adapter / mv.ADAPTER_CONFIG))
    _set_adapter("modules_to_save", [])(adapter)
    assert adapter_report(pristine, adapter, engine_version="0.9.2")["ok"] is True


def test_lora_bias_names_the_0_9_2_flag(pristine: Path, adapter: Path) -> None:
    _set_adapter("bias", "lora_only")(adapter)
    current = only_problem(adapter_report(pristine, adapter, engine_version="0.9.2"))
    assert current["code"] == "lora-bias"
    assert "--enable-lora-bias" in current["message"] and "--enable-lora-bias" in current["fix"]
    lab = only_problem(adapter_report(pristine, adapter, engine_version="0.32.0"))
    assert lab["code"] == "lora-bias"
    assert "--enable-lora-bias" not in lab["message"] + lab["fix"]


@pytest.mark.parametrize("version", ["0.9.2", "0.32.0"])
def test_dora_is_refused_by_both_newer_releases(pristine: Path, adapter: Path, version: str) -> None:
    _set_adapter("use_dora", True)(adapter)
    assert only_problem(adapter_report(pristine, adapter, engine_version=version))["code"] == "dora"


# --- explicit config fixes -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rope_theta=1000000.0", ("rope_theta", 1000000.0)),
        ("use_sliding_window=false", ("use_sliding_window", False)),
        ("rope_scaling=null", ("rope_scaling", None)),
        ("model_type=qwen2", ("model_type", "qwen2")),
        ("eos_token_id=[2, 0]", ("eos_token_id", [2, 0])),
    ],
)
def test_parse_fix(text: str, expected: tuple[str, Any]) -> None:
    assert mv.parse_fix(text) == expected


@pytest.mark.parametrize("text", ["rope_theta", "=1", ""])
def test_parse_fix_refuses_what_is_not_key_value(text: str) -> None:
    with pytest.raises(ValueError, match="KEY=VALUE"):
        mv.parse_fix(text)


def test_a_fix_in_check_mode_reports_the_fixed_directory_and_writes_nothing(model: Path) -> None:
    _drop_config_key("rope_theta")(model)
    before = (model / "config.json").read_text()
    report = mv.check_model(str(model), config_fixes={"rope_theta": 1000000.0})
    assert report["ok"] is True
    fix = report["config_fix"]
    assert (fix["changed"], fix["written"], fix["backup_file"], fix["keys"]) == (True, False, None, ["rope_theta"])
    assert '+  "rope_theta": 1000000.0,' in fix["diff"].splitlines()
    assert (model / "config.json").read_text() == before
    assert not list(model.glob("config.json.orig-*"))


def test_a_written_fix_keeps_a_backup_and_the_file_style(model: Path) -> None:
    _drop_config_key("rope_theta")(model)
    original = (model / "config.json").read_text()
    report = mv.check_model(str(model), config_fixes={"rope_theta": 1000000.0}, write_fixes=True)
    fix = report["config_fix"]
    assert fix["written"] is True
    assert Path(fix["backup_file"]).read_text() == original
    assert Path(fix["backup_file"]).name.startswith("config.json.orig-")
    fixed = (model / "config.json").read_text()
    assert json.loads(fixed)["rope_theta"] == 1000000.0
    assert fixed == json.dumps(json.loads(fixed), indent=2, sort_keys=True) + "\n"  # sorted, as it was
    changes = [line for line in fix["diff"].splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changes == ['+  "rope_theta": 1000000.0,']
    again = mv.check_model(str(model), config_fixes={"rope_theta": 1000000.0}, write_fixes=True)["config_fix"]
    assert (again["changed"], again["backup_file"]) == (False, None)


def test_a_fix_keeps_unsorted_key_order(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    unsorted = {"model_type": config.pop("model_type"), **config}
    (model / "config.json").write_text(json.dumps(unsorted, indent=2) + "\n")
    fix = mv.plan_config_fixes(str(model), {"rope_theta": 500000.0})
    assert next(iter(json.loads(fix.after))) == "model_type"
    assert fix.keys == ["rope_theta"]


def test_a_fix_changes_the_type_when_asked(model: Path) -> None:
    """1000000 and 1000000.0 compare equal in Python; the fix is still a change of the file."""
    assert mv.plan_config_fixes(str(model), {"rope_theta": 1000000}).keys == ["rope_theta"]
    assert mv.plan_config_fixes(str(model), {"rope_theta": 1000000.0}).changed is False


def test_backup_names_never_collide(tmp_path: Path) -> None:
    import datetime

    path = tmp_path / "config.json"
    now = datetime.datetime(2026, 11, 30, 10, 15, tzinfo=datetime.timezone.utc)  # noqa: UP017
    first = mv.backup_name(str(path), now)
    assert first.endswith("config.json.orig-20261130T101500Z")
    Path(first).write_text("x")
    assert mv.backup_name(str(path), now).endswith("config.json.orig-20261130T101500Z-1")


def test_an_adapter_given_as_the_model_is_named_as_one(pristine: Path, adapter: Path) -> None:
    # Failure mode 2's other confusion: one problem that says what the directory is, not a missing
    # config.json, weights and tokenizer.
    report = mv.check_model(str(adapter))
    problem = only_problem(report)
    assert report["ok"] is False
    assert problem["code"] == "adapter-as-model"
    assert problem["file"] == str(adapter / mv.ADAPTER_CONFIG)
    base = json.loads((adapter / mv.ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    assert f"holds a LoRA adapter trained on {base}, not a model" in problem["message"]
    assert "give the base model's directory as the model" in problem["fix"]


def test_a_model_directory_with_an_adapter_beside_its_config_is_checked_as_a_model(model: Path, adapter: Path) -> None:
    # A merged export may keep adapter_config.json beside config.json: it is a model, checked as one.
    shutil.copy(adapter / mv.ADAPTER_CONFIG, model / mv.ADAPTER_CONFIG)
    report = mv.check_model(str(model))
    assert report["ok"] is True, report["problem_lines"]
