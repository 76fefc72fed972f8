"""The scaler's durable state: one JSON file, written atomically, held by one scaler at a time.

What it records:
- committed membership: the standby hosts the scaler added as engine hosts (in
  the order added) and the worker count it set per gateway host;
- the end of the last action per kind (the cooldowns run from it);
- the alert keys that drove actions, and until when a repeat of one is a
  duplicate;
- the action in flight, written before its playbook starts, so a scaler
  restarted mid-action knows what was running;
- failed actions in a row per kind and direction (`failures`): the back-off
  and the give-up (policy.py) read them; a success clears them.

`membership` in the file is the effective view (committed plus the action in
flight) that the inventory plugin plugins/inventory/llmfleet_scaler.py reads:
a host being added is already an engine host to the playbook adding it, and to
any `site.yml` run meanwhile.

Writes go to a temporary file in the same directory, are fsynced, renamed over
the old file, and the directory is fsynced: a crash leaves the old state or the
new one, never half of one. An exclusive flock on `state.lock`, held for the
life of the process, keeps a second scaler off the same directory.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llmfleet.errors import LlmfleetError

Kind = Literal["workers", "engines"]
Direction = Literal["out", "in"]


class Action(BaseModel):
    """One scaling action: what it changes, the alerts behind it, and when it started."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: Kind
    direction: Direction
    host: str | None = Field(default=None, description="engines: the host added or removed")
    worker_counts: dict[str, int] = Field(default_factory=dict, description="workers: the target per gateway host")
    alert_keys: tuple[str, ...] = ()
    alert_names: tuple[str, ...] = ()
    started_at: float
    attempt: int = Field(default=1, ge=1)


class Failures(BaseModel):
    """Failed actions in a row of one kind and direction, since its last success (or an operator's reset)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(ge=1)
    last_end: float = Field(description="when the last failed action ended; the back-off runs from it")
    alert_keys: tuple[str, ...] = Field(default=(), description="the alerts behind the failed actions")


def failure_key(kind: str, direction: str) -> str:
    """The key of State.failures: `engines/out`, `workers/in`, ..."""
    return f"{kind}/{direction}"


class Membership(BaseModel):
    """What the inventory plugin applies: engine hosts to add to the engine group, worker counts per host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine_hosts: tuple[str, ...] = ()
    worker_counts: dict[str, int] = Field(default_factory=dict)


class State(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    engines_added: tuple[str, ...] = ()
    worker_counts: dict[str, int] = Field(default_factory=dict)
    last_action_end: dict[str, float] = Field(default_factory=dict, description="kind -> end of its last action")
    acted: dict[str, float] = Field(default_factory=dict, description="alert key -> end of its duplicate window")
    in_flight: Action | None = None
    # Added after version 1 was first written; a file without it reads as no failures.
    failures: dict[str, Failures] = Field(default_factory=dict, description="kind/direction -> failures in a row")
    membership: Membership = Field(default_factory=Membership, description="derived on save; read by the plugin")

    def effective(self) -> Membership:
        engines = list(self.engines_added)
        counts = dict(self.worker_counts)
        action = self.in_flight
        if action is not None and action.kind == "engines" and action.host and action.host not in engines:
            engines.append(action.host)  # being added (a host being removed is still in engines_added)
        if action is not None and action.kind == "workers":
            counts.update(action.worker_counts)
        return Membership(engine_hosts=tuple(engines), worker_counts=counts)


class StateLockedError(LlmfleetError):
    exit_code = 2


class StateStore:
    """The state file in `directory`; `open()` takes the lock, `save()` replaces the file atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "state.json"
        self._lock_fd: int | None = None

    def open(self) -> State:
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        fd = os.open(self.directory / "state.lock", os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLockedError(
                f"another scaler holds {self.directory}/state.lock; run one scaler per state directory"
            ) from None
        self._lock_fd = fd
        return load(self.path)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def save(self, state: State) -> State:
        if self._lock_fd is None:
            raise RuntimeError("StateStore.save before open")
        state = state.model_copy(update={"membership": state.effective()})
        write_atomically(self.path, state.model_dump_json(indent=2) + "\n")
        return state


def load(path: Path) -> State:
    """The state in `path`; an empty state if there is no file yet. A corrupt file is an error, never reset."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return State()
    try:
        return State.model_validate_json(text)
    except ValueError as error:
        raise LlmfleetError(
            f"{path} is not a scaler state file ({error.__class__.__name__}); restore it from a backup or move it"
            " away to start empty (then re-check which standby hosts serve)"
        ) from None


def write_atomically(path: Path, text: str, mode: int = 0o640) -> None:
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as stream:
            os.fchmod(stream.fileno(), mode)
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
