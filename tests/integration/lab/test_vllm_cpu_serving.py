"""The tiny model served by real vLLM (CPU build) answers the OpenAI API and exports metrics."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from tokenizers import Tokenizer

from llmfleet.errors import LlmfleetError
from llmfleet.lab import vllm_cpu
from llmfleet.lab.vllm_cpu import VllmServer

TIMEOUT_S = 60


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    """A session that talks to the server directly, ignoring any proxy settings."""
    with requests.Session() as session:
        session.trust_env = False
        yield session


def _post(http: requests.Session, server: VllmServer, path: str, payload: dict[str, object]) -> dict[str, object]:
    response = http.post(f"{server.url}{path}", json=payload, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


@pytest.mark.vllm
def test_chat_completion_generates_tokens(http: requests.Session, vllm_server: VllmServer) -> None:
    body = _post(
        http,
        vllm_server,
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello, how are you?"}],
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    usage = body["usage"]
    assert isinstance(usage, dict)
    assert usage["completion_tokens"] > 0
    assert usage["completion_tokens"] <= 8
    # The ChatML template wrapped the message: more prompt tokens than the text alone.
    assert usage["prompt_tokens"] > 6
    choices = body["choices"]
    assert isinstance(choices, list) and choices
    message = choices[0]["message"]
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str)


@pytest.mark.vllm
def test_completion_generates_tokens(http: requests.Session, vllm_server: VllmServer) -> None:
    body = _post(
        http,
        vllm_server,
        "/v1/completions",
        {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0},
    )
    usage = body["usage"]
    assert isinstance(usage, dict)
    assert 0 < usage["completion_tokens"] <= 8
    choices = body["choices"]
    assert isinstance(choices, list) and choices
    assert isinstance(choices[0]["text"], str)


# Text where byte-level BPE pipelines part ways: digits (Qwen2 splits them one
# by one), a decomposed accent (NFC), the replacement character a detokenized
# partial byte sequence leaves in an answer, and a special token.
TOKENIZER_EDGE_TEXTS = (
    "ough you\ufffde 6",
    "Order 66 shipped 12 items at 2048 tokens each",
    "cafe\u0301 na\u00efve r\u00e9sum\u00e9",
    "unseen w\u00f6rds: \u65e5\u672c\u8a9e \U0001f642, it's I'LL",
    "  spaces\tand\nnewlines ",
    "<|im_start|>user\nhi 42<|im_end|>\n",
)


@pytest.mark.vllm
@pytest.mark.parametrize("text", TOKENIZER_EDGE_TEXTS)
def test_the_engine_counts_a_prompt_as_the_gateway_does(
    http: requests.Session, vllm_server: VllmServer, text: str
) -> None:
    # The gateway counts with tokenizer.json as it is (tokenizers); the engine with
    # the tokenizer class transformers builds for the model. They must agree.
    gateway = Tokenizer.from_file(str(vllm_server.model_dir / "tokenizer.json"))
    engine = _post(http, vllm_server, "/tokenize", {"model": "tiny", "prompt": text, "add_special_tokens": False})
    assert engine["tokens"] == gateway.encode(text, add_special_tokens=False).ids


@pytest.mark.vllm
def test_models_lists_tiny(http: requests.Session, vllm_server: VllmServer) -> None:
    response = http.get(f"{vllm_server.url}/v1/models", timeout=TIMEOUT_S)
    assert response.status_code == 200
    assert [model["id"] for model in response.json()["data"]] == ["tiny"]


@pytest.mark.vllm
def test_metrics_export_the_queue_gauges(http: requests.Session, vllm_server: VllmServer) -> None:
    response = http.get(f"{vllm_server.url}/metrics", timeout=TIMEOUT_S)
    assert response.status_code == 200
    assert "vllm:num_requests_waiting" in response.text
    assert "vllm:num_requests_running" in response.text
    assert "vllm:kv_cache_usage_perc" in response.text


@pytest.mark.vllm
def test_kv_cache_size_follows_the_configured_space(vllm_server: VllmServer) -> None:
    """The log line a capacity planner is checked against, and the formula behind it."""
    tokens = vllm_cpu.kv_cache_tokens_from_log(vllm_server.log_text())
    assert tokens is not None, "no 'CPU KV cache size: N tokens' line in the server log"
    config = json.loads((vllm_server.model_dir / "config.json").read_text())
    bytes_per_token = (
        2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2  # bf16
    )
    assert tokens == vllm_server.kv_cache_gib * 2**30 // bytes_per_token
    assert vllm_server.kv_cache_tokens() == tokens


def test_kv_cache_line_parser() -> None:
    line = (
        "(EngineCore pid=1) INFO 11-30 09:26:03 [kv_cache_utils.py:2327] CPU KV cache size:"
        " 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x"
    )
    assert vllm_cpu.kv_cache_tokens_from_log(f"noise\n{line}\nmore") == 2_097_152
    assert vllm_cpu.kv_cache_tokens_from_log("no such line") is None


def _fake_venv(tmp_path: Path, script: str) -> Path:
    """A 'venv' whose python is a shell script: start_server's waiting, without vLLM."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return tmp_path / "venv"


def _unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_start_server_reports_an_early_exit_with_the_log(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, 'echo "ValueError: Unsupported CPU attention configuration" >&2\nexit 3')
    with pytest.raises(LlmfleetError, match=r"exited with code 3(.|\n)*Unsupported CPU attention"):
        vllm_cpu.start_server(tmp_path, _unused_port(), 1, tmp_path / "server.log", venv=venv)


def test_start_server_gives_up_at_the_deadline_and_stops_the_process(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, 'echo "still loading"\necho $$ > "$0.pid"\nexec sleep 600')
    started = time.monotonic()
    with pytest.raises(LlmfleetError, match=r"did not answer .*/health within 2 s(.|\n)*still loading"):
        vllm_cpu.start_server(tmp_path, _unused_port(), 1, tmp_path / "server.log", venv=venv, startup_timeout_s=2)
    assert time.monotonic() - started < 20
    pid = int((venv / "bin" / "python.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
