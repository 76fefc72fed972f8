"""The state file: atomic writes, one scaler per directory, and what a restart reads back."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from llmfleet.errors import LlmfleetError
from llmfleet.serve.scaler.state import Action, State, StateLockedError, StateStore, load


def action(**fields: object) -> Action:
    values: dict[str, object] = {"id": "a1", "kind": "engines", "direction": "out", "host": "gpu3", "started_at": 1.0}
    values.update(fields)
    return Action.model_validate(values)


def test_save_then_a_new_store_reads_the_same_state(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.open() == State()
    state = State(
        engines_added=("gpu3",),
        worker_counts={"gw1": 3},
        last_action_end={"engines": 5.0},
        acted={"k": 9.0},
        in_flight=action(id="a2", host="gpu4"),
    )
    saved = store.save(state)
    store.close()
    reopened = StateStore(tmp_path)
    assert reopened.open() == saved
    reopened.close()
    # The file carries the effective membership the inventory plugin reads.
    data = json.loads((tmp_path / "state.json").read_text())
    assert data["membership"] == {"engine_hosts": ["gpu3", "gpu4"], "worker_counts": {"gw1": 3}}
    assert data["version"] == 1


def test_the_file_is_replaced_whole_and_not_world_readable(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.open()
    for count in range(5):
        store.save(State(worker_counts={"gw1": count}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.lock"], "no temporary file left"
    assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o640
    assert load(tmp_path / "state.json").worker_counts == {"gw1": 4}
    store.close()


def test_a_second_scaler_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first = StateStore(tmp_path)
    first.open()
    with pytest.raises(StateLockedError, match="another scaler holds"):
        StateStore(tmp_path).open()
    first.close()
    second = StateStore(tmp_path)
    second.open()
    second.close()


def test_a_corrupt_state_file_is_an_error_not_a_reset(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"version": 1, "engines_added": [')
    with pytest.raises(LlmfleetError, match="not a scaler state file"):
        StateStore(tmp_path).open()


def test_effective_membership_applies_the_worker_counts_in_flight() -> None:
    state = State(
        worker_counts={"gw1": 2, "gw2": 2}, in_flight=action(kind="workers", host=None, worker_counts={"gw1": 3})
    )
    assert state.effective().worker_counts == {"gw1": 3, "gw2": 2}
