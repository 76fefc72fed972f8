"""The scaler's HTTP app under a real uvicorn on 127.0.0.1, with a real inventory read by ansible-inventory.

The playbook runner here is a STAND-IN (StandInRunner): it records what would
run and finishes when the test says, so tests can hold an action in flight.
test_scaler_runner.py runs real ansible-runner.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from llmfleet.serve.scaler.app import create_app
from llmfleet.serve.scaler.audit import read
from llmfleet.serve.scaler.config import ScalerSettings
from llmfleet.serve.scaler.runner import RunResult, RunSpec
from llmfleet.serve.scaler.state import load
from tests.scaler_tools import alert, notification
from tests.tools import free_loopback_port, wait_for

HOSTS = """\
all:
  children:
    gateways:
      hosts:
        gw1: {worker_count: 2}
    gpu_nodes:
      hosts:
        gpu1: {}
    gpu_standby:
      hosts:
        gpu3: {}
"""


class StandInRunner:
    """STAND-IN for ansible-runner: records each run; it ends when release() is called (or on cancel)."""

    def __init__(self) -> None:
        self.specs: list[RunSpec] = []
        self.started = threading.Event()
        self._release = threading.Event()
        self._cancelled = False

    def release(self) -> None:
        self._release.set()

    def cancel(self) -> None:
        self._cancelled = True
        self._release.set()

    async def run(self, spec: RunSpec) -> RunResult:
        self.specs.append(spec)
        self.started.set()
        await asyncio.to_thread(self._release.wait, 60)
        return RunResult("canceled" if self._cancelled else "successful", 0, 0.01)


@contextmanager
def serve(settings: ScalerSettings, runner: StandInRunner) -> Iterator[httpx.Client]:
    """The app under uvicorn in a thread; yields a client with the bearer token set."""
    app = create_app(settings, runner=runner)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped before it started"
        assert time.monotonic() < deadline, "uvicorn did not start in 30 s"
        time.sleep(0.02)
    token = settings.token_file.read_text().strip()
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{settings.port}", headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture
def settings(make_settings: Callable[..., ScalerSettings], tmp_path: Path) -> Callable[..., ScalerSettings]:
    (tmp_path / "inventory" / "hosts.yml").write_text(HOSTS)

    def make(**env: str) -> ScalerSettings:
        return make_settings(LLMFLEET_SCALER_PORT=str(free_loopback_port()), **env)

    return make


def decisions(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    result: list[dict[str, Any]] = response.json()["decisions"]
    return result


def metric(client: httpx.Client, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starts with {line_start}")


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong-token-of-some-length"}, 401), ({"Authorization": "Basic x"}, 401)],
)
def test_without_the_token_401(settings: Callable[..., ScalerSettings], headers: dict[str, str], status: int) -> None:
    runner = StandInRunner()
    config = settings()
    with serve(config, runner) as client:
        response = httpx.post(f"{client.base_url}/alerts", json=notification(alert()), headers=headers)
        assert response.status_code == status
        assert response.headers["www-authenticate"] == "Bearer"
        assert client.get("/status").status_code == 200
        assert httpx.get(f"{client.base_url}/status").status_code == 401
        assert metric(client, 'llmfleet_scaler_notifications_total{result="unauthorized"}') == 2
    assert runner.specs == []
    rejected = [r for r in read(config.state_dir / "audit.jsonl") if r["event"] == "rejected"]
    assert [r["status"] for r in rejected] == [401, 401]
    assert config.token_file.read_text().strip() not in (config.state_dir / "audit.jsonl").read_text()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "body: Invalid JSON"),
        (b"{}", "version: Field required"),
        (b'{"version": "3", "groupKey": "g", "status": "firing", "receiver": "r", "alerts": []}', "version: Input"),
        (b'{"version": "4", "groupKey": "g", "status": "firing", "receiver": "r", "alerts": []}', "alerts: List"),
        (b'{"version": "4", "groupKey": "g", "status": "burning", "receiver": "r", "alerts": [{}]}', "status: Input"),
        (
            b'{"version": "4", "groupKey": "g", "status": "firing", "receiver": "r",'
            b' "alerts": [{"status": "firing", "labels": {}, "startsAt": "yesterday", "fingerprint": "f"}]}',
            "alerts.0.startsAt",
        ),
    ],
)
def test_a_malformed_payload_is_400_with_the_reason(
    settings: Callable[..., ScalerSettings], body: bytes, reason: str
) -> None:
    runner = StandInRunner()
    config = settings()
    with serve(config, runner) as client:
        response = client.post("/alerts", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400
        assert reason in " ".join(response.json()["errors"])
        # The service carries on: a good notification right after is judged.
        assert decisions(client.post("/alerts", json=notification(alert("EngineDown", None, None))))[0]["code"] == (
            "not_scaling"
        )
    assert runner.specs == []


def test_an_oversized_body_is_413(settings: Callable[..., ScalerSettings]) -> None:
    config = settings(LLMFLEET_SCALER_MAX_BODY_BYTES="2048")
    with serve(config, StandInRunner()) as client:
        response = client.post("/alerts", json=notification(*[alert(fingerprint=f"f{i}") for i in range(40)]))
        assert response.status_code == 413


def test_other_alerts_and_unknown_kinds_are_declined_and_logged(settings: Callable[..., ScalerSettings]) -> None:
    runner = StandInRunner()
    config = settings()
    with serve(config, runner) as client:
        result = decisions(
            client.post(
                "/alerts", json=notification(alert("EngineDown", None, None), alert(kind="gpus", fingerprint="g"))
            )
        )
    assert [(d["outcome"], d["code"]) for d in result] == [("declined", "not_scaling"), ("declined", "unknown_kind")]
    audited = [r for r in read(config.state_dir / "audit.jsonl") if r["event"] == "decision"]
    assert [r["code"] for r in audited] == ["not_scaling", "unknown_kind"]
    assert audited[1]["alerts"][0]["fingerprint"] == "g"
    assert runner.specs == []


def test_dry_run_decides_and_audits_but_runs_and_changes_nothing(settings: Callable[..., ScalerSettings]) -> None:
    runner = StandInRunner()
    config = settings(LLMFLEET_SCALER_DRY_RUN="true")
    with serve(config, runner) as client:
        result = decisions(client.post("/alerts", json=notification(alert(kind="engines"))))
        assert [(d["outcome"], d["action"]["host"]) for d in result] == [("dry_run", "gpu3")]
        assert (
            metric(
                client, 'llmfleet_scaler_decisions_total{code="taken",direction="out",kind="engines",outcome="dry_run"}'
            )
            == 1
        )
    assert runner.specs == []
    state = load(config.state_dir / "state.json")
    assert state.in_flight is None and state.engines_added == ()


def test_one_action_at_a_time_then_commit_and_cooldown_across_a_restart(
    settings: Callable[..., ScalerSettings],
) -> None:
    runner = StandInRunner()
    config = settings()
    with serve(config, runner) as client:
        # Two notifications at once: one action runs, the other is declined busy.
        with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=60) as other:
            results: list[list[dict[str, Any]]] = []
            threads = [
                threading.Thread(
                    target=lambda c=c, k=k: results.append(
                        decisions(c.post("/alerts", json=notification(alert(kind=k, fingerprint=k), group_key=k)))
                    )
                )
                for c, k in ((client, "engines"), (other, "workers"))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        codes = sorted(d[0]["code"] for d in results)
        assert codes == ["busy", "taken"]
        runner.started.wait(10)
        taken = next(d[0] for d in results if d[0]["code"] == "taken")
        assert metric(client, "llmfleet_scaler_actions_running") == 1
        # While it runs, the state file already shows the host being added (for the plugin and the playbook).
        running = load(config.state_dir / "state.json")
        assert running.in_flight is not None and running.in_flight.id == taken["action"]["id"]
        # A resolved notification for the same alert cancels nothing.
        resolved = decisions(
            client.post(
                "/alerts",
                json=notification(
                    alert(kind=taken["kind"], fingerprint=taken["kind"], status="resolved"), group_key=taken["kind"]
                ),
            )
        )
        assert resolved[0]["code"] == "resolved"
        assert load(config.state_dir / "state.json").in_flight is not None
        runner.release()
        wait_for(lambda: load(config.state_dir / "state.json").in_flight is None, "the action to end")
        assert metric(client, "llmfleet_scaler_actions_running") == 0
    spec = runner.specs[0]
    if taken["kind"] == "engines":
        assert (spec.playbook, spec.limit, spec.extravars["scale_host"]) == (
            "playbooks/scale_out.yml",
            "gpu3:gateways:monitoring",  # every run rewrites Prometheus's targets on the monitoring hosts
            "gpu3",
        )
        assert load(config.state_dir / "state.json").engines_added == ("gpu3",)
    else:
        assert spec.extravars["scale_worker_counts"] == {"gw1": 3}
        assert load(config.state_dir / "state.json").worker_counts == {"gw1": 3}

    # A restarted scaler reads the cooldown back: the same kind again is declined.
    with serve(config, StandInRunner()) as client:
        again = decisions(
            client.post(
                "/alerts",
                json=notification(
                    alert(kind=taken["kind"], fingerprint="new", starts_at="2026-12-01T11:00:00Z"), group_key="again"
                ),
            )
        )
        assert again[0]["code"] == "cooldown"
    ends = [r for r in read(config.state_dir / "audit.jsonl") if r["event"] == "action_end"]
    assert [(e["action_id"], e["result"]) for e in ends] == [(taken["action"]["id"], "successful")]


def test_a_restart_mid_action_resumes_it(settings: Callable[..., ScalerSettings]) -> None:
    config = settings()
    first = StandInRunner()
    with serve(config, first) as client:
        taken = decisions(client.post("/alerts", json=notification(alert(kind="engines"))))[0]
        assert taken["code"] == "taken"
        first.started.wait(10)
    # Shutdown cancelled the playbook; the action stays in flight.
    interrupted = load(config.state_dir / "state.json").in_flight
    assert interrupted is not None and interrupted.id == taken["action"]["id"] and interrupted.attempt == 1

    second = StandInRunner()
    second.release()
    with serve(config, second):
        wait_for(lambda: load(config.state_dir / "state.json").in_flight is None, "the resumed action to end")
    assert [s.ident for s in second.specs] == [taken["action"]["id"]], "the same action, run again"
    assert second.specs[0].extravars == first.specs[0].extravars
    assert load(config.state_dir / "state.json").engines_added == ("gpu3",)
    events = [r["event"] for r in read(config.state_dir / "audit.jsonl")]
    assert events == ["decision", "action_end", "interrupted", "resumed", "action_end"]


class FailingRunner(StandInRunner):
    """STAND-IN for ansible-runner whose runs end `failed` at once, as a broken playbook's would."""

    async def run(self, spec: RunSpec) -> RunResult:
        self.specs.append(spec)
        return RunResult("failed", 2, 0.01)


def test_failed_actions_back_off_then_give_up_until_an_operator_resets(
    settings: Callable[..., ScalerSettings],
) -> None:
    runner = FailingRunner()
    # No cooldown, so no back-off either (cooldown x 2^n): the give-up alone bounds the attempts.
    config = settings(
        LLMFLEET_SCALER_WORKERS__MIN="1",
        LLMFLEET_SCALER_WORKERS__MAX="8",
        LLMFLEET_SCALER_WORKERS__COOLDOWN_OUT_S="0",
        LLMFLEET_SCALER_MAX_FAILURES="3",
    )
    firing = alert(kind="workers")
    firing["annotations"]["scale_waiting"] = "100"

    def post() -> dict[str, Any]:
        [decision] = decisions(client.post("/alerts", json=notification(firing)))
        return decision

    def ended(count: int) -> bool:
        return len([r for r in read(config.state_dir / "audit.jsonl") if r["event"] == "action_end"]) == count

    with serve(config, runner) as client:
        for attempt in (1, 2, 3):
            decision = post()
            assert decision["code"] == "taken", decision
            # Sized to the backlog: 100 waiting over 32 slots (gw1's worker_concurrency, the role's default) is 4.
            assert decision["action"]["worker_counts"] == {"gw1": 6}
            wait_for(partial(ended, attempt), f"failed action {attempt} to end")
            assert metric(client, 'llmfleet_scaler_consecutive_failures{direction="out",kind="workers"}') == attempt
        assert metric(client, 'llmfleet_scaler_gave_up{direction="out",kind="workers"}') == 1
        assert metric(client, 'llmfleet_scaler_actions_total{direction="out",kind="workers",result="failed"}') == 3
        assert metric(client, "llmfleet_scaler_action_started_timestamp_seconds") == 0
        # Given up: the alert is declined, nothing runs, membership is as before.
        assert post()["code"] == "gave_up"
        assert len(runner.specs) == 3
        assert load(config.state_dir / "state.json").worker_counts == {}
        # The reset needs the token, and then the scaler acts on the alert again.
        assert httpx.post(f"{client.base_url}/failures/reset").status_code == 401
        assert client.post("/failures/reset", params={"kind": "sideways"}).status_code == 422
        assert client.post("/failures/reset", params={"kind": "workers"}).json() == {"reset": ["workers/out"]}
        assert metric(client, 'llmfleet_scaler_gave_up{direction="out",kind="workers"}') == 0
        assert post()["code"] == "taken"
    events = [r["event"] for r in read(config.state_dir / "audit.jsonl")]
    assert events.count("gave_up") == 1 and "reset" in events
    gave_up = next(r for r in read(config.state_dir / "audit.jsonl") if r["event"] == "gave_up")
    assert (gave_up["kind"], gave_up["direction"], gave_up["failures"]) == ("workers", "out", 3)
    # The failures survive a restart: the state file holds them.
    assert load(config.state_dir / "state.json").failures["workers/out"].count == 1
