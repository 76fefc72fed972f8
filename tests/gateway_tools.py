"""Fixtures for the gateway's settings without any server: secret files, a tiny model, GatewaySettings.

Shared by the gateway's unit tests and `llmfleet token`'s (tests/unit/serve/gateway, tests/unit/ops),
whose conftest.py files import them.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet.lab.tiny import make_tiny_model
from llmfleet.serve.gateway.config import GatewaySettings


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny"
    make_tiny_model(path, seed=0)
    return path


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwt.secret"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def make_settings(
    tmp_path: Path, tiny_dir: Path, secret_file: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., GatewaySettings]:
    """GatewaySettings as the environment would give them (LLMFLEET_* variables), with overrides."""
    for name in list(os.environ):
        if name.startswith("LLMFLEET_"):
            monkeypatch.delenv(name)

    def make(**env: str | None) -> GatewaySettings:
        """Keyword names are the variables; None unsets one of the defaults."""
        values: dict[str, str | None] = {
            "LLMFLEET_GATEWAY_MODELS": json.dumps({"tiny": str(tiny_dir)}),
            "LLMFLEET_GATEWAY_JWT_SECRET_FILE": str(secret_file),
            **env,
        }
        for key, value in values.items():
            if value is None:
                monkeypatch.delenv(key, raising=False)
            else:
                monkeypatch.setenv(key, value)
        return GatewaySettings.from_env()

    return make
