"""Running an action's playbook through ansible-runner, with its artifacts kept under the state directory.

ansible-runner (Ansible's own library for running playbooks from Python, what
AWX and Event-Driven Ansible use underneath) runs `ansible-playbook` as a child
process, writes every event, the stdout and the return code under
`<state_dir>/runner/artifacts/<action id>/`, and can cancel a run from a
callback. It is blocking, so it runs in a thread; the event loop keeps
answering webhooks meanwhile.

The scaler passes two inventory sources: the operator's, and a generated
`<state_dir>/inventory/scaler.yml` naming the inventory plugin and the state
file, so its own runs see the membership (the host being added among the
engine hosts) whether or not the operator's inventory names the plugin too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmfleet.serve.scaler.config import ScalerSettings
from llmfleet.serve.scaler.state import Action, write_atomically

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """One ansible-playbook run: the playbook (relative to the project), its variables, limit and tags."""

    ident: str
    playbook: str
    extravars: dict[str, Any]
    limit: str | None = None
    tags: str | None = None


@dataclass(frozen=True)
class RunResult:
    status: str  # ansible-runner's: successful, failed, timeout, canceled; or error (it could not start)
    rc: int | None
    duration_s: float
    artifacts: Path | None = None
    detail: str = ""

    @property
    def succeeded(self) -> bool:
        return self.status == "successful"


class PlaybookRunner(Protocol):
    async def run(self, spec: RunSpec) -> RunResult: ...

    def cancel(self) -> None: ...


def run_spec(action: Action, settings: ScalerSettings) -> RunSpec:
    """The playbook run for an action.

    engines out: the engine play for the new host only (limit), without the drain
    around the change (no worker knows the new engine yet), then the gateway
    play's worker role (tag `worker`) so the workers learn of it; scale_out.yml
    waits until every worker sees it serving.
    engines in: scale_in.yml drains the host, stops its engines, then re-runs
    the worker role without it.
    workers: the worker role on the gateway hosts with the new counts.
    """
    playbook = f"playbooks/scale_{action.direction}.yml"
    extravars: dict[str, Any] = {
        "scale_kind": action.kind,
        "scale_action_id": action.id,
        "scale_engine_group": settings.engine_group,
        "llmfleet_gateway_group": settings.gateway_group,
        "scale_standby_group": settings.standby_group,
        "llmfleet_monitoring_group": settings.monitoring_group,
    }
    hosts = f"{settings.gateway_group}:{settings.monitoring_group}"
    if action.kind == "engines":
        extravars["scale_host"] = action.host
        tags = "engines,worker" if action.direction == "out" else "worker"
        return RunSpec(action.id, playbook, extravars, limit=f"{action.host}:{hosts}", tags=tags)
    extravars["scale_worker_counts"] = dict(action.worker_counts)
    return RunSpec(action.id, playbook, extravars, limit=hosts, tags="worker")


def plugin_source(settings: ScalerSettings) -> Path:
    """Write (if changed) the inventory source that applies the state file; return its path."""
    path = settings.state_dir / "inventory" / "scaler.yml"
    text = (
        "# Written by the scaler: applies its state file to the inventory (plugins/inventory/llmfleet_scaler.py).\n"
        "plugin: llmfleet_scaler\n"
        f"state_file: {settings.state_dir / 'state.json'}\n"
        f"engine_group: {settings.engine_group}\n"
        f"standby_group: {settings.standby_group}\n"
        "missing_ok: true\n"
    )
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        write_atomically(path, text)
    return path


@dataclass
class AnsibleRunner:
    settings: ScalerSettings
    _cancel: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Ask a running playbook to stop (on shutdown): ansible-runner terminates it and reports `canceled`."""
        self._cancel.set()

    async def run(self, spec: RunSpec) -> RunResult:
        return await asyncio.to_thread(self._run, spec)

    def _run(self, spec: RunSpec) -> RunResult:
        import ansible_runner  # type: ignore[import-untyped]  # ships no type information

        settings = self.settings
        private = settings.state_dir / "runner"
        private.mkdir(mode=0o750, parents=True, exist_ok=True)
        # ansible-playbook from this venv first: the scaler's ansible-core, whatever PATH the service got.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
        started = time.monotonic()
        try:
            inventory = [str(path.resolve()) for path in settings.inventory] + [str(plugin_source(settings))]
            result = ansible_runner.run(
                private_data_dir=str(private),
                project_dir=str(settings.project_dir),
                playbook=spec.playbook,
                inventory=inventory,
                extravars=spec.extravars,
                limit=spec.limit,
                tags=spec.tags,
                ident=spec.ident,
                envvars={"ANSIBLE_CONFIG": str(settings.project_dir / "ansible.cfg"), "PATH": path},
                # Variables on the command line, not in files under runner/env/ (the artifacts keep the command).
                suppress_env_files=True,
                quiet=True,
                timeout=settings.playbook_timeout_s,
                rotate_artifacts=settings.keep_artifacts,
                cancel_callback=self._cancel.is_set,
            )
        except Exception as error:  # a runner that cannot start must not take the service down
            log.exception("ansible-runner could not run %s", spec.playbook)
            return RunResult("error", None, time.monotonic() - started, detail=f"{type(error).__name__}: {error}")
        artifacts = Path(result.config.artifact_dir) if getattr(result, "config", None) else None
        return RunResult(str(result.status), result.rc, time.monotonic() - started, artifacts)
