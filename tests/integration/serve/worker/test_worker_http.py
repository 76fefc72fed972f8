"""The worker's HTTP listener as Docker, Prometheus and the lab see it, from a real worker process.

The worker runs as deployed (`python -m llmfleet.serve.worker`) against a real
redis-server with the redis role's ACL user. Its engine is a STAND-IN
(gatewaystack.StubEngine: healthy to probes, 503 to requests): these tests
are about the listener and Redis, and send no request to an engine.

What is pinned: each path's status, Content-Type and body, exactly as the
worker role's healthcheck (/healthz), its deploy check (/readyz) and the
Prometheus scrape (/metrics) read them; and that the listener tells the truth
through a Redis that is not there yet, goes away and comes back.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import secrets
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from llmfleet.serve.worker.metrics import WorkerMetrics
from tests.integration.serve.gateway.gatewaystack import (
    PREFIX,
    STARTUP_S,
    RedisServer,
    Service,
    StubEngine,
    serving,
    wait_for,
)
from tests.tools import free_loopback_port

CONCURRENCY = 7
_names = itertools.count(1)


class Answer(NamedTuple):
    status: int
    content_type: str
    body: bytes


def fetch(port: int, path: str, method: str = "GET") -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return Answer(response.status, response.getheader("Content-Type", ""), response.read())
    finally:
        connection.close()


def answer_or_none(port: int, path: str) -> Answer | None:
    try:
        return fetch(port, path)
    except OSError:
        return None


class Lab(NamedTuple):
    redis: RedisServer
    password_file: Path
    engine: str
    tmp: Path


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("worker-http")
    password = secrets.token_hex(24)
    password_file = tmp / "redis.password"
    password_file.write_text(password)
    password_file.chmod(0o600)
    redis_server = RedisServer(tmp / "redis", free_loopback_port(), password)
    redis_server.start()
    try:
        with serving(StubEngine, hits=Counter()) as engine:
            yield Lab(redis_server, password_file, engine, tmp)
    finally:
        redis_server.kill()


def start_worker(lab: Lab, name: str, engines: list[str]) -> tuple[Service, int]:
    """A worker process as the role runs it (its own ACL user); (the service, its listen port)."""
    port = free_loopback_port()
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("LLMFLEET_")},
        "LLMFLEET_REDIS_URL": f"redis://127.0.0.1:{lab.redis.port}/0",
        "LLMFLEET_REDIS_USERNAME": "worker",
        "LLMFLEET_REDIS_PASSWORD_FILE": str(lab.password_file),
        "LLMFLEET_QUEUE_PREFIX": PREFIX,
        "LLMFLEET_WORKER_ID": name,
        "LLMFLEET_WORKER_ENGINES": json.dumps(engines),
        "LLMFLEET_WORKER_LISTEN_PORT": str(port),
        "LLMFLEET_WORKER_CONCURRENCY": str(CONCURRENCY),
        "LLMFLEET_WORKER_HEALTH_INTERVAL_S": "0.5",
        "LLMFLEET_WORKER_DRAIN_TIMEOUT_S": "5",
        "LLMFLEET_LOG_LEVEL": "INFO",
    }
    service = Service(name, "llmfleet.serve.worker", env, lab.tmp / f"{name}.log", f"http://127.0.0.1:{port}/healthz")
    return service.start().wait_ready(), port


@pytest.fixture
def worker(lab: Lab) -> Iterator[tuple[Service, int]]:
    service, port = start_worker(lab, f"worker-{next(_names)}", [lab.engine])
    try:
        wait_for(lambda: fetch(port, "/readyz").status == 200, STARTUP_S, "/readyz", context=service.log)
        yield service, port
    finally:
        assert service.stop() == 0, service.log()[-3000:]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/healthz", Answer(200, "text/plain", b"ok\n")),
        ("/readyz", Answer(200, "text/plain", b"ready\n")),
        ("/readyz?verbose=1", Answer(200, "text/plain", b"ready\n")),
        ("/", Answer(404, "text/plain", b"not found\n")),
        ("/metrics/", Answer(404, "text/plain", b"not found\n")),
        ("/health", Answer(404, "text/plain", b"not found\n")),
    ],
)
def test_probe_paths_answer_exactly_what_the_role_and_docker_read(
    worker: tuple[Service, int], path: str, expected: Answer
) -> None:
    _service, port = worker
    assert fetch(port, path) == expected


def test_metrics_is_prometheus_text_with_every_worker_metric(lab: Lab, worker: tuple[Service, int]) -> None:
    _service, port = worker
    answer = fetch(port, "/metrics")
    assert (answer.status, answer.content_type) == (200, CONTENT_TYPE_LATEST)
    families = {family.name: family for family in text_string_to_metric_families(answer.body.decode())}
    # Every metric the worker defines, by the name Prometheus stores (counters without _total).
    expected = {metric.name for metric in WorkerMetrics().registry.collect()}
    assert len(expected) >= 20
    assert expected <= set(families), sorted(expected - set(families))
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families.values()
        for sample in family.samples
    }
    assert samples[("llmfleet_worker_concurrency", ())] == CONCURRENCY
    assert samples[("llmfleet_engine_up", (("engine", lab.engine),))] == 1
    # The queue's depth, per lane of each model the worker's engines serve: reported from the first
    # report after the worker followed the model, so wait for it rather than race it.
    depth = 'llmfleet_queue_depth{lane="normal",model="tiny"} 0.0'
    wait_for(lambda: depth in fetch(port, "/metrics").body.decode(), 10, depth)
    # The same report's signals for the alerts: nothing waits, so the oldest wait is 0; the engine is not drained.
    text = fetch(port, "/metrics").body.decode()
    for line in ('llmfleet_queue_waiting{lane="normal",model="tiny"} 0.0',
                 'llmfleet_queue_oldest_wait_seconds{lane="normal",model="tiny"} 0.0',
                 f'llmfleet_engine_drained{{engine="{lab.engine}"}} 0.0'):
        assert line in text, line


def test_head_answers_the_headers_without_a_body(worker: tuple[Service, int]) -> None:
    _service, port = worker
    assert fetch(port, "/healthz", "HEAD") == Answer(200, "text/plain", b"")


def test_readyz_is_503_with_the_reason_while_no_engine_is_healthy(lab: Lab) -> None:
    service, port = start_worker(lab, "worker-no-engine", [f"http://127.0.0.1:{free_loopback_port()}"])
    try:
        wait_for(
            lambda: answer_or_none(port, "/readyz") == Answer(503, "text/plain", b"no healthy engine\n"),
            STARTUP_S,
            "/readyz to say no healthy engine",
            context=service.log,
        )
        assert fetch(port, "/healthz") == Answer(200, "text/plain", b"ok\n")
    finally:
        assert service.stop() == 0, service.log()[-3000:]


def test_the_listener_tells_the_truth_through_a_redis_outage(lab: Lab) -> None:
    """Up before Redis, through a Redis kill and its restart: /healthz stays 200, /readyz follows Redis."""
    lab.redis.kill()
    service = None
    try:
        service, port = start_worker(lab, "worker-outage", [lab.engine])
        unreachable = Answer(503, "text/plain", b"redis unreachable\n")
        assert fetch(port, "/readyz") == unreachable
        lab.redis.start()
        ready = Answer(200, "text/plain", b"ready\n")
        wait_for(lambda: fetch(port, "/readyz") == ready, STARTUP_S, "ready once Redis is up", context=service.log)
        lab.redis.kill()
        wait_for(lambda: fetch(port, "/readyz") == unreachable, STARTUP_S, "Redis gone", context=service.log)
        assert fetch(port, "/healthz") == Answer(200, "text/plain", b"ok\n")
        assert fetch(port, "/metrics").status == 200
        lab.redis.start()
        wait_for(
            lambda: fetch(port, "/readyz") == ready, STARTUP_S, "ready again after the restart", context=service.log
        )
        assert service.alive()
    finally:
        if not (lab.redis.process and lab.redis.process.poll() is None):
            lab.redis.start()
        if service is not None:
            assert service.stop() == 0, service.log()[-3000:]


def test_sigterm_reports_draining_on_readyz_until_the_listener_closes(lab: Lab) -> None:
    service, port = start_worker(lab, "worker-drain", [lab.engine])
    wait_for(lambda: fetch(port, "/readyz").status == 200, STARTUP_S, "/readyz", context=service.log)
    # A drain takes at least one blocking read (block_ms, 1 s) before the listener closes: polled every
    # 10 ms, /readyz is caught saying so.
    seen: list[Answer | None] = []
    service.signal(signal.SIGTERM)
    wait_for(
        lambda: seen.append(answer_or_none(port, "/readyz")) or not service.alive(),
        STARTUP_S,
        "the worker to exit",
        interval_s=0.01,
    )
    assert service.stop() == 0
    assert Answer(503, "text/plain", b"draining\n") in seen, seen[:5]
