"""Shared fixtures for integration tests: the tiny model and one real vLLM (CPU) server.

The server is started once per session and shared: it takes about a minute to
start, and the first run also builds the vLLM venv (a few minutes, ~3.5 GB, then
cached under LLMFLEET_CACHE). Tests that use it carry `@pytest.mark.vllm`;
deselect them with `-m "not vllm"`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.lab import vllm_cpu
from llmfleet.lab.tiny import make_tiny_model
from tests.tools import free_loopback_port

# A known KV cache size, so tests can predict the engine's token capacity:
# tokens = GiB * 2**30 / (2 * layers * kv_heads * head_dim * bytes per value).
VLLM_KV_CACHE_GIB = 1


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2 model directory (seed 0), made with llmfleet's own code."""
    path = tmp_path_factory.mktemp("tiny-model") / "tiny"
    make_tiny_model(path, seed=0)
    return path


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[vllm_cpu.VllmServer]:
    """One vLLM server on 127.0.0.1 serving the tiny model as "tiny", for the whole session.

    Tests read `url`, `log_path` (the engine's log, with the "CPU KV cache size:
    N tokens" line), `kv_cache_gib` (VLLM_CPU_KVCACHE_SPACE) and `model_dir`;
    they must not stop it.
    """
    venv = vllm_cpu.ensure_venv()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    server = vllm_cpu.start_server(
        tiny_model,
        port=free_loopback_port(),
        kv_cache_gib=VLLM_KV_CACHE_GIB,
        log_path=log_path,
        venv=venv,
        served_model_name="tiny",
    )
    try:
        yield server
    finally:
        server.stop()
