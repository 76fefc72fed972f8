"""Shared by the scaler's unit and integration tests: Alertmanager payloads (version 4) and settings."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmfleet.paths import REPO_ROOT
from llmfleet.serve.scaler.config import ScalerSettings


def alert(
    name: str = "ScaleOutNeeded",
    kind: str | None = "workers",
    action: str | None = "out",
    *,
    status: str = "firing",
    fingerprint: str = "f1",
    starts_at: str = "2026-12-01T10:00:00Z",
    **labels: str,
) -> dict[str, Any]:
    """One alert as Alertmanager sends it; None leaves a label out."""
    all_labels = {"alertname": name, **labels}
    if kind is not None:
        all_labels["scale_kind"] = kind
    if action is not None:
        all_labels["scale_action"] = action
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": "test"},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://127.0.0.1:9090/graph",
        "fingerprint": fingerprint,
    }


def notification(*alerts: dict[str, Any], group_key: str = '{}:{alertname="ScaleOutNeeded"}') -> dict[str, Any]:
    firing = any(a["status"] == "firing" for a in alerts)
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": "scaler",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": list(alerts),
    }


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "scaler.token"
    path.write_text(secrets.token_hex(24) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def make_settings(tmp_path: Path, token_file: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., ScalerSettings]:
    """ScalerSettings as the environment gives them (LLMFLEET_SCALER_*), with overrides."""
    for name in list(os.environ):
        if name.startswith("LLMFLEET_"):
            monkeypatch.delenv(name)
    inventory = tmp_path / "inventory"
    inventory.mkdir()

    def make(**env: str) -> ScalerSettings:
        values = {
            "LLMFLEET_SCALER_TOKEN_FILE": str(token_file),
            "LLMFLEET_SCALER_STATE_DIR": str(tmp_path / "state"),
            "LLMFLEET_SCALER_PROJECT_DIR": str(REPO_ROOT),
            "LLMFLEET_SCALER_INVENTORY": f'["{inventory}"]',
            **env,
        }
        for key, value in values.items():
            monkeypatch.setenv(key, value)
        return ScalerSettings.from_env()

    return make
