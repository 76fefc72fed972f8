"""Fixtures for the whole-stack lab scenario: one test lab for the session."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.alert_sink import AlertSink
from tests.lab.helpers import (
    ALERT_SINK_PORT,
    LAB_CONTROLLER,
    LAB_TIMINGS,
    SITE_IN_ONE_BATCH,
    PlaybookRun,
    copy_lab_inventory,
    llmfleet_lab,
    run_playbook,
)


@pytest.fixture(scope="session")
def lab_inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    inventory = copy_lab_inventory(tmp_path_factory.mktemp("lab") / "inventory")
    started = time.monotonic()
    up = llmfleet_lab(inventory, "up")
    LAB_TIMINGS["llmfleet lab up"] = time.monotonic() - started
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield inventory
    finally:
        llmfleet_lab(inventory, "down")


@pytest.fixture(scope="session")
def facts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("facts")


@pytest.fixture(scope="session")
def alert_sink(lab_inventory: Path) -> Iterator[AlertSink]:
    """The operators' chat and the Watchdog's receiver, up from before the first site.yml run to the end."""
    with AlertSink(LAB_CONTROLLER, ALERT_SINK_PORT) as sink:
        yield sink


@pytest.fixture(scope="session")
def converged_site(lab_inventory: Path, facts_dir: Path, alert_sink: AlertSink) -> PlaybookRun:
    """The first site.yml run against the test lab, shared by every file that needs a converged site.

    tests/lab/test_monitoring.py sorts before test_site.py: whichever asks first converges the site, once.
    """
    return run_playbook(lab_inventory, "site.yml", *SITE_IN_ONE_BATCH, facts=facts_dir)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run test_scaling.py after test_site.py's tests and just before its teardown test.

    Scaling changes the site and puts it back; test_site.py's second run and check mode must judge the site as
    site.yml left it, and the teardown must come last.
    """
    scaling = [item for item in items if item.path.name == "test_scaling.py"]
    rest = [item for item in items if item.path.name != "test_scaling.py"]
    teardown = next((n for n, item in enumerate(rest) if item.name == "test_lab_down_leaves_nothing_behind"),
                    len(rest))
    items[:] = [*rest[:teardown], *scaling, *rest[teardown:]]
