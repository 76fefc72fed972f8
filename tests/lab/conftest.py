"""Fixtures for the whole-stack lab scenario: one test lab for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.helpers import copy_lab_inventory, llmfleet_lab


@pytest.fixture(scope="session")
def lab_inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    inventory = copy_lab_inventory(tmp_path_factory.mktemp("lab") / "inventory")
    up = llmfleet_lab(inventory, "up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield inventory
    finally:
        llmfleet_lab(inventory, "down")


@pytest.fixture(scope="session")
def facts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("facts")
