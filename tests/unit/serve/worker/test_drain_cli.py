"""`llmfleet worker drain|undrain` refusals that need no Redis (the drain itself runs in tests/integration)."""

from __future__ import annotations

import os
import subprocess

from tests.tools import LLMFLEET, free_loopback_port


def _rotation(*args: str) -> subprocess.CompletedProcess[str]:
    closed = free_loopback_port()  # bound once, closed now: connections are refused
    env = {key: value for key, value in os.environ.items() if not key.startswith("LLMFLEET_")}
    env["LLMFLEET_REDIS_URL"] = f"redis://127.0.0.1:{closed}/0"
    return subprocess.run(
        [*LLMFLEET, "worker", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_unreachable_redis_is_named_and_exits_1() -> None:
    result = _rotation("drain", "--engine", "http://127.0.0.1:8000", "--timeout", "5")
    assert result.returncode == 1, result.stderr
    assert "llmfleet worker drain: Redis at redis://127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_engine_is_required() -> None:
    result = _rotation("undrain")
    assert result.returncode == 2
    assert "--engine" in result.stderr
