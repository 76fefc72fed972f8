"""`llmfleet model make-tiny`: a small, deterministic, loadable Qwen2 model."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from llmfleet import cli
from llmfleet.errors import LlmfleetError
from llmfleet.lab import tiny

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "llmfleet-tiny-model.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny.make_tiny_model(path, seed=0)
    return path


def _contents(path: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(path.iterdir())}


def _config(path: Path) -> dict[str, object]:
    config: dict[str, object] = json.loads((path / "config.json").read_text())
    return config


def test_writes_the_expected_files(model_dir: Path) -> None:
    assert {file.name for file in model_dir.iterdir()} == EXPECTED_FILES


def test_same_seed_gives_identical_bytes(model_dir: Path, tmp_path: Path) -> None:
    tiny.make_tiny_model(tmp_path / "again", seed=0)
    assert _contents(tmp_path / "again") == _contents(model_dir)


def test_another_process_writes_identical_bytes(model_dir: Path, tmp_path: Path) -> None:
    """Hash seeds and thread pools differ between processes; the bytes must not."""
    code = "import sys; from pathlib import Path; from llmfleet.lab.tiny import make_tiny_model; "
    code += "make_tiny_model(Path(sys.argv[1]), seed=0)"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "RAYON_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "other")], check=True, env=env)
    assert _contents(tmp_path / "other") == _contents(model_dir)


def test_other_seed_changes_only_the_weights(model_dir: Path, tmp_path: Path) -> None:
    tiny.make_tiny_model(tmp_path / "other", seed=1)
    first, second = _contents(model_dir), _contents(tmp_path / "other")
    assert first["model.safetensors"] != second["model.safetensors"]
    assert first["tokenizer.json"] == second["tokenizer.json"]
    assert first["config.json"] == second["config.json"]


def test_config_describes_a_small_qwen2(model_dir: Path) -> None:
    config = _config(model_dir)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["model_type"] == "qwen2"
    assert config["hidden_size"] == 128
    assert config["num_hidden_layers"] == 2
    assert config["num_attention_heads"] == 2
    assert config["num_key_value_heads"] == 1
    assert config["head_dim"] == 64
    assert config["torch_dtype"] == "bfloat16"
    assert config["tie_word_embeddings"] is True
    assert config["rope_theta"] == 1000000.0
    assert isinstance(config["intermediate_size"], int)
    assert isinstance(config["max_position_embeddings"], int)
    assert isinstance(config["rms_norm_eps"], float)
    assert config["vocab_size"] == tokenizer.get_vocab_size()
    assert config["bos_token_id"] == tokenizer.token_to_id("<|endoftext|>")
    assert config["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert tokenizer.token_to_id("<|im_end|>") in generation["eos_token_id"]


def test_safetensors_header_matches_config(model_dir: Path) -> None:
    path = model_dir / "model.safetensors"
    raw = path.read_bytes()
    (header_length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_length])
    assert header.pop("__metadata__") == {"format": "pt"}
    config = _config(model_dir)
    assert {name: tuple(entry["shape"]) for name, entry in header.items()} == tiny.tensor_shapes(config)
    # What a Qwen2 loader looks for, spelled out rather than derived.
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], 128]
    assert header["model.layers.1.self_attn.k_proj.bias"]["shape"] == [64]
    assert header["model.layers.1.self_attn.q_proj.weight"]["shape"] == [128, 128]
    assert "model.layers.0.self_attn.o_proj.bias" not in header
    assert "lm_head.weight" not in header  # tied to the embedding
    # Tensors are contiguous, in bf16, and fill the file exactly.
    data_start = 8 + header_length
    spans = sorted(tuple(entry["data_offsets"]) for entry in header.values())
    assert spans[0][0] == 0
    assert all(end == next_begin for (_, end), (next_begin, _) in itertools.pairwise(spans))
    assert data_start + spans[-1][1] == len(raw)
    for entry in header.values():
        begin, end = entry["data_offsets"]
        assert entry["dtype"] == "BF16"
        assert end - begin == 2 * math.prod(entry["shape"])


def test_weights_are_small_and_norms_are_one(model_dir: Path) -> None:
    raw = (model_dir / "model.safetensors").read_bytes()
    header = tiny.read_safetensors_header(model_dir / "model.safetensors")
    data_start = 8 + struct.unpack("<Q", raw[:8])[0]

    def tensor(name: str) -> np.ndarray:
        begin, end = header[name]["data_offsets"]
        halves = np.frombuffer(raw[data_start + begin : data_start + end], dtype="<u2")
        return (halves.astype(np.uint32) << 16).view(np.float32)

    assert np.all(tensor("model.norm.weight") == 1.0)
    embedding = tensor("model.embed_tokens.weight")
    assert 0.015 < float(embedding.std()) < 0.025
    assert abs(float(embedding.mean())) < 0.002


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3F80),
        (-2.0, 0xC000),
        (0.0, 0x0000),
        (1.00390625, 0x3F80),  # halfway, even below: round down
        (1.01171875, 0x3F82),  # halfway, odd below: round up to even
        (1.0 + 2**-8 + 2**-20, 0x3F81),  # above halfway: round up
        (float("inf"), 0x7F80),
        (float("nan"), 0x7FC0),
    ],
)
def test_bf16_rounds_to_nearest_even(value: float, bits: int) -> None:
    encoded = tiny.to_bf16_bytes(np.array([value], dtype=np.float32))
    assert int.from_bytes(encoded, "little") == bits


def test_model_is_a_few_hundred_kilobytes(model_dir: Path) -> None:
    total = sum(file.stat().st_size for file in model_dir.iterdir())
    assert 100_000 < total < 1_000_000


def test_tokenizer_round_trips_text(model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert 400 <= tokenizer.get_vocab_size() <= 600
    for text in ["Hello, world!", "  spaces\tand\nnewlines ", "unseen wörds: ümlaut, 日本語, emoji 🙂"]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
    encoded = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert encoded.ids[0] == tokenizer.token_to_id("<|im_start|>")
    assert encoded.ids[-1] == tokenizer.token_to_id("<|im_end|>")


def test_tokenizer_config_has_a_chatml_template(model_dir: Path) -> None:
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    assert "<|im_start|>" in template
    assert "<|im_end|>" in template
    assert "add_generation_prompt" in template
    assert config["eos_token"] == "<|im_end|>"
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for token_id, added in config["added_tokens_decoder"].items():
        assert tokenizer.token_to_id(added["content"]) == int(token_id)


def test_rerun_overwrites_an_earlier_tiny_model(tmp_path: Path) -> None:
    path = tmp_path / "model"
    tiny.make_tiny_model(path, seed=1)
    tiny.make_tiny_model(path, seed=0)
    fresh = tmp_path / "fresh"
    tiny.make_tiny_model(fresh, seed=0)
    assert _contents(path) == _contents(fresh)


def test_empty_directory_is_used(tmp_path: Path) -> None:
    tiny.make_tiny_model(tmp_path, seed=0)
    assert {file.name for file in tmp_path.iterdir()} == EXPECTED_FILES


def test_refuses_a_directory_with_other_content(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"precious": true}')
    with pytest.raises(LlmfleetError, match="not made by `llmfleet model make-tiny`"):
        tiny.make_tiny_model(tmp_path, seed=0)
    assert [file.name for file in tmp_path.iterdir()] == ["config.json"]
    assert (tmp_path / "config.json").read_text() == '{"precious": true}'


def test_refuses_a_tiny_model_with_extra_files(tmp_path: Path) -> None:
    tiny.make_tiny_model(tmp_path, seed=0)
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(LlmfleetError, match=r"other files \(notes.txt\)"):
        tiny.make_tiny_model(tmp_path, seed=1)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.write_text("not a directory")
    with pytest.raises(LlmfleetError, match="not a directory"):
        tiny.make_tiny_model(target, seed=0)


def _model_parser() -> argparse.ArgumentParser:
    """The `llmfleet` parser with only the model group, whose commands come from the lab and ops modules."""
    parser = argparse.ArgumentParser(prog="llmfleet")
    cli.register_group(parser.add_subparsers(dest="command", required=True), cli.MODEL_COMMANDS)
    return parser


def test_cli_make_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _model_parser().parse_args(["model", "make-tiny", str(tmp_path / "m"), "--seed", "3"])
    assert args.handler(args) == 0
    assert json.loads((tmp_path / "m" / "llmfleet-tiny-model.json").read_text())["seed"] == 3
    assert str(tmp_path / "m") in capsys.readouterr().out


def test_cli_model_needs_a_subcommand() -> None:
    with pytest.raises(SystemExit):
        _model_parser().parse_args(["model"])


def test_tokenizer_splits_as_qwen2s_does(model_dir: Path) -> None:
    # transformers builds a qwen2 model's tokenizer with NFC and one token per digit;
    # tokenizer.json must do the same, since the gateway counts with it as it is.
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    digits = tokenizer.encode(" 2048", add_special_tokens=False).tokens
    assert [token.lstrip("\u0120") for token in digits] == ["", "2", "0", "4", "8"]
    assert tokenizer.encode("cafe\u0301").ids == tokenizer.encode("caf\u00e9").ids
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
