"""A tiny, real, servable model with random weights, made without torch or a download.

vLLM cannot start without a model, and nothing can be downloaded on the machines
this project is tested on. So the tests make one: a Qwen2ForCausalLM with two
layers and hidden size 128, random bf16 weights written by a small safetensors
writer (numpy only), and a byte-level BPE tokenizer trained here with the
`tokenizers` library on a few built-in lines. It answers nonsense, but it goes
through the whole serving path (tokenizer, chat template, attention, KV cache,
sampling, metrics), and its shape is known exactly, which is what a capacity
planner check needs.

Same seed, same bytes: the weights come from numpy's seeded generator, the
tokenizer trainer is deterministic on a fixed corpus (the unit tests check it
across processes), and the JSON files llmfleet writes have sorted keys.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from llmfleet.errors import LlmfleetError

# Special tokens, in id order: they get ids 0, 1 and 2.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

VOCAB_SIZE = 512
HIDDEN_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 2
NUM_KV_HEADS = 1
# Explicit: CPU attention in vLLM rejects small head sizes (16); 64 works.
HEAD_DIM = 64
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 2048
ROPE_THETA = 1000000.0
RMS_NORM_EPS = 1e-6
INIT_STD = 0.02

# Names of everything make_tiny_model writes. MARKER says "llmfleet made this
# directory", which is what lets a second run overwrite it and nothing else.
MARKER = "llmfleet-tiny-model.json"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
FILES = (CONFIG, GENERATION_CONFIG, MARKER, WEIGHTS, TOKENIZER, TOKENIZER_CONFIG)

# ChatML with tool calling, laid out as Qwen2 chat templates do (so that
# vLLM's `hermes` tool parser reads the model's calls), without a default
# system prompt:
# - `tools` go into the system turn as one JSON object per line inside
#   <tools></tools>, followed by how to call them (<tool_call>{"name": ...,
#   "arguments": {...}}</tool_call>); a first system or developer message
#   leads that turn;
# - an assistant turn that called tools carries its calls in that form;
# - consecutive `tool` results share one user turn, each in <tool_response>.
CHAT_TEMPLATE = """\
{%- set ns = namespace(rest=messages) -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}
{{- messages[0]['content'] + '\n\n' -}}
{%- set ns.rest = messages[1:] -%}
{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}
{{- '\n' + (tool | tojson) -}}
{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments' -}}
{{- ' within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in ns.rest -%}
{%- set role = 'system' if message['role'] == 'developer' else message['role'] -%}
{%- if role == 'tool' -%}
{%- if loop.first or loop.previtem['role'] != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem['role'] != 'tool' -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- elif role == 'assistant' and message['tool_calls'] -%}
{{- '<|im_start|>assistant' -}}
{%- if message['content'] -%}
{{- '\n' + message['content'] -}}
{%- endif -%}
{%- for call in message['tool_calls'] -%}
{%- set function = call['function'] if call['function'] is defined else call -%}
{{- '\n<tool_call>\n{"name": "' + function['name'] + '", "arguments": ' -}}
{{- (function['arguments'] | tojson) if function['arguments'] is mapping else function['arguments'] -}}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + role + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# How Qwen2's tokenizer splits text before byte-level BPE: digits one by one,
# a word with at most one leading non-letter, punctuation runs, whitespace.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The tokenizer's training text. Enough distinct words to fill VOCAB_SIZE
# with merges; changing it changes every tiny model's bytes.
CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "vLLM serves large language models with paged attention and continuous batching.",
    "A tiny model with random weights is enough to test the serving path end to end.",
    "Operators deploy inference servers on bare-metal GPU hosts with Ansible playbooks.",
    "Prometheus scrapes the metrics endpoint; Grafana draws the dashboards.",
    "The capacity planner predicts how many tokens fit in the key-value cache.",
    "Hello, world! How are you today? I am fine, thank you.",
    "user: What is the capital of France? assistant: The capital of France is Paris.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 65536.",
    "def main(argv):\n    return 0\n",
    '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}',
    "Every request streams tokens back to the client until it reaches max_tokens or a stop token.",
    "Rolling restarts drain one host at a time so the fleet keeps serving traffic.",
)

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class TinyModel:
    """What make_tiny_model wrote."""

    path: Path
    seed: int
    files: tuple[Path, ...]

    @property
    def size_bytes(self) -> int:
        return sum(file.stat().st_size for file in self.files)


def train_tokenizer() -> Tokenizer:
    """Train the byte-level BPE tokenizer on CORPUS (deterministic), in Qwen2's pipeline.

    transformers 5 loads a model_type qwen2 tokenizer as Qwen2Tokenizer, which
    keeps tokenizer.json's vocabulary and merges but applies its own NFC
    normalizer and split pattern; the gateway reads tokenizer.json as it is.
    Training with that same pipeline keeps the two counts equal (GPT-2's plain
    byte-level split had made " 6" one piece here and two in the engine).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(CORPUS), trainer=trainer)
    return tokenizer


def model_config(vocab_size: int, special_ids: Mapping[str, int]) -> dict[str, Any]:
    """The Hugging Face config.json of the tiny Qwen2 model."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": special_ids[ENDOFTEXT],
        "eos_token_id": special_ids[IM_END],
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "head_dim": HEAD_DIM,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": NUM_KV_HEADS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def tensor_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor Qwen2ForCausalLM loads, with its shape, derived from config.

    The output projection is tied to the embedding, so there is no lm_head.weight.
    """
    hidden = int(config["hidden_size"])
    head_dim = int(config["head_dim"])
    q_size = int(config["num_attention_heads"]) * head_dim
    kv_size = int(config["num_key_value_heads"]) * head_dim
    intermediate = int(config["intermediate_size"])
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (int(config["vocab_size"]), hidden),
        "model.norm.weight": (hidden,),
    }
    for layer in range(int(config["num_hidden_layers"])):
        prefix = f"model.layers.{layer}"
        shapes.update(
            {
                f"{prefix}.input_layernorm.weight": (hidden,),
                f"{prefix}.post_attention_layernorm.weight": (hidden,),
                f"{prefix}.self_attn.q_proj.weight": (q_size, hidden),
                f"{prefix}.self_attn.q_proj.bias": (q_size,),
                f"{prefix}.self_attn.k_proj.weight": (kv_size, hidden),
                f"{prefix}.self_attn.k_proj.bias": (kv_size,),
                f"{prefix}.self_attn.v_proj.weight": (kv_size, hidden),
                f"{prefix}.self_attn.v_proj.bias": (kv_size,),
                f"{prefix}.self_attn.o_proj.weight": (hidden, q_size),
                f"{prefix}.mlp.gate_proj.weight": (intermediate, hidden),
                f"{prefix}.mlp.up_proj.weight": (intermediate, hidden),
                f"{prefix}.mlp.down_proj.weight": (hidden, intermediate),
            }
        )
    return shapes


def random_weights(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, FloatArray]:
    """Normal(0, INIT_STD) weights and biases, norms at 1, drawn in sorted name order."""
    rng = np.random.default_rng(seed)
    weights: dict[str, FloatArray] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            weights[name] = rng.normal(0.0, INIT_STD, size=shape).astype(np.float32)
    return weights


def to_bf16_bytes(array: FloatArray) -> bytes:
    """bfloat16 little-endian bytes: float32's upper 16 bits, rounded to nearest even."""
    floats = np.ascontiguousarray(array, dtype=np.float32)
    bits = floats.view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    upper = ((bits + rounding) >> np.uint32(16)).astype("<u2")
    # Rounding could carry a NaN's payload into infinity; keep NaN a (quiet) NaN.
    upper[np.isnan(floats)] = 0x7FC0
    return upper.tobytes()


def safetensors_bytes(tensors: Mapping[str, FloatArray]) -> bytes:
    """Serialise float32 arrays as a bf16 safetensors file.

    Layout: an 8-byte little-endian header length, a JSON header (name -> dtype,
    shape, [begin, end) offsets into the data), padded with spaces to a multiple
    of 8, then the tensors' bytes back to back in sorted name order.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        data = to_bf16_bytes(tensors[name])
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    return struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(chunks)


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (used by tests and checks)."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header: dict[str, Any] = json.loads(file.read(length))
    return header


def _json_bytes(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:  # only if CORPUS or the trainer settings were broken
        raise LlmfleetError(f"the tiny tokenizer has no {token} token")
    return token_id


def tiny_model_files(seed: int) -> dict[str, bytes]:
    """The name and content of every file of the tiny model for this seed."""
    tokenizer = train_tokenizer()
    special_ids = {token: _token_id(tokenizer, token) for token in SPECIAL_TOKENS}
    config = model_config(tokenizer.get_vocab_size(), special_ids)
    weights = random_weights(tensor_shapes(config), seed)
    added_tokens = {
        str(special_ids[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added_tokens,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "model_max_length": MAX_POSITIONS,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "unk_token": None,
    }
    generation_config = {
        "bos_token_id": special_ids[ENDOFTEXT],
        "eos_token_id": [special_ids[IM_END], special_ids[ENDOFTEXT]],
        "pad_token_id": special_ids[ENDOFTEXT],
        "do_sample": False,
    }
    marker = {"generator": "llmfleet model make-tiny", "seed": seed, "format": 2}
    return {
        CONFIG: _json_bytes(config),
        GENERATION_CONFIG: _json_bytes(generation_config),
        MARKER: _json_bytes(marker),
        WEIGHTS: safetensors_bytes(weights),
        TOKENIZER: (tokenizer.to_str(pretty=True) + "\n").encode(),
        TOKENIZER_CONFIG: _json_bytes(tokenizer_config),
    }


def _partial_name(name: str) -> str:
    return f".{name}.partial"


def _check_destination(path: Path, names: Collection[str], marker: str, what: str, command: str) -> None:
    """Refuse anything but a missing or empty directory, or an earlier output of the same command."""
    if not path.exists():
        return
    if not path.is_dir():
        raise LlmfleetError(f"{path} exists and is not a directory; pick another path for the {what}")
    entries = sorted(entry.name for entry in path.iterdir())
    if not entries:
        return
    if marker not in entries:
        raise LlmfleetError(
            f"{path} is not empty and was not made by `{command}` (no {marker});"
            " refusing to write into it: pick an empty or new directory"
        )
    ours = set(names) | {_partial_name(name) for name in names}
    foreign = [name for name in entries if name not in ours]
    if foreign:
        raise LlmfleetError(
            f"{path} holds a {what} but also other files ({', '.join(foreign)});"
            " refusing to overwrite it: move them away or pick another directory"
        )


def write_generated_dir(
    path: Path, files: Mapping[str, bytes], marker: str, what: str, command: str
) -> tuple[Path, ...]:
    """Write generated files into path (created if missing); return them, sorted.

    An existing directory is only written into when it is empty or holds an
    earlier output of the same command (its marker file) and nothing else. Each
    file is written beside its final name and renamed into place, so an
    interrupted run leaves whole files.
    """
    _check_destination(path, files.keys(), marker, what, command)
    path.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    # The marker goes first: it claims the directory, so a rerun after an
    # interrupted run recognises the files (whole or partial) as its own.
    for name in sorted(files, key=lambda name: name != marker):
        target = path / name
        partial = path / _partial_name(name)
        partial.write_bytes(files[name])
        partial.replace(target)
        written.append(target)
    return tuple(sorted(written))


def make_tiny_model(path: Path, seed: int = 0) -> TinyModel:
    """Write the tiny model into path (created if missing) and return what was written.

    See write_generated_dir for which directories it writes into, and how.
    """
    written = write_generated_dir(path, tiny_model_files(seed), MARKER, "tiny model", "llmfleet model make-tiny")
    return TinyModel(path=path, seed=seed, files=written)
