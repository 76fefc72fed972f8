"""The pieces of the gateway test stack: redis-server, gateway and worker processes, a reply-stream tap.

conftest.py builds one Stack per test package from these; tests import the
helpers (wait_for, metric_value, ...) from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from llmfleet.lab.vllm_cpu import VllmServer
from llmfleet.paths import REPO_ROOT
from llmfleet.serve.gateway.auth import mint
from tests.tools import free_loopback_port

PREFIX = "lft"
GATEWAY_ID = "gw-test"
CLAIM_IDLE_MS = 3000
STARTUP_S = 30.0


def wait_for(
    condition: Callable[[], Any],
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    context: Callable[[], str] | None = None,
) -> Any:
    """Poll condition until it returns something truthy; fail with `what` (and `context()`) after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            details = f"\n{context()}" if context is not None else ""
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}{details}")
        time.sleep(interval_s)


def bench_token_file(stack: Stack, tmp_path: Path) -> Path:
    """A 0600 file holding a token of the bench tier, for `llmfleet bench --token-file`."""
    path = tmp_path / "token"
    path.write_text(stack.token("bench"))
    path.chmod(0o600)
    return path


def http_status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2, trust_env=False).status_code
    except httpx.HTTPError:
        return None


def service_acl(service: str, password: str) -> str:
    """The ACL line the redis role gives a service (roles/redis/vars/main.yml), for the queue prefix PREFIX.

    The gateway and the workers connect with exactly these rights, so a command
    the code sends but the role does not grant fails here, not first in a lab.
    """
    rules = yaml.safe_load((REPO_ROOT / "roles" / "redis" / "vars" / "main.yml").read_text())
    grants = rules["__redis_acl_services"][service]
    keys = " ".join(
        [f"~{PREFIX}:{key}" for key in grants["keys"]]
        + [f"%R~{PREFIX}:{key}" for key in grants.get("read_keys", [])]
        + [f"%W~{PREFIX}:{key}" for key in grants.get("write_keys", [])]
    )
    channels = " ".join(f"&{PREFIX}:{channel}" for channel in grants["channels"])
    commands = " ".join(f"+{command}" for command in rules["__redis_acl_connection_commands"] + grants["commands"])
    return f"user {service} on >{password} resetkeys {keys} resetchannels {channels} -@all {commands}"


@dataclass
class RedisServer:
    """redis-server on a loopback port, persisting with AOF (appendfsync always) in its own directory.

    Users: `gateway` and `worker` with the redis role's rights, and `llmfleet`
    with all rights for the tests' own looks, all with the same password.
    """

    dir: Path
    port: int
    password: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.dir / "redis.conf"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode yes\ndir {self.dir}\n"
            'appendonly yes\nappendfsync always\nsave ""\n'
            # The services connect as an ACL user. The default user keeps all permissions but gets a random
            # password nobody knows: Redis 7.0 replays an AOF as the default user, and with `user default off`
            # it drops every MULTI/EXEC block (each Lua script's writes) with NOPERM: the data would be lost.
            f"user default on >{secrets.token_hex(16)} ~* &* +@all\n"
            f"user llmfleet on >{self.password} ~* &* +@all\n"
            f"{service_acl('gateway', self.password)}\n{service_acl('worker', self.password)}\n"
        )
        self.config.chmod(0o600)
        with (self.dir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                ["redis-server", str(self.config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for(self._ready, STARTUP_S, f"redis-server on port {self.port}")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"redis-server exited with {self.process.returncode}: {(self.dir / 'redis.log').read_text()}")
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(
            port=self.port, username="llmfleet", password=self.password, decode_responses=True, socket_timeout=10
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown save, only what the AOF already holds survives."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.start()


@dataclass
class Service:
    """A gateway or worker process (`python -m llmfleet.serve.gateway|worker`), its log in a file."""

    name: str
    module: str
    env: dict[str, str]
    log_path: Path
    health_url: str
    # Where /metrics and /readyz are: the gateway's ops listener; a worker serves them beside /healthz.
    ops_url: str | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module],
                env=self.env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout_s: float = STARTUP_S) -> Service:
        def ready() -> bool:
            if not self.alive():
                pytest.fail(f"{self.name} exited early:\n{self.log()[-3000:]}")
            return http_status(self.health_url) == 200

        wait_for(ready, timeout_s, f"{self.name} at {self.health_url}")
        return self

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit. Returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                if self.module == "llmfleet.serve.worker":  # log what it is stuck on (see worker.app._dump_tasks)
                    self.process.send_signal(signal.SIGUSR1)
                    time.sleep(1)
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> str:
        base = self.ops_url or self.health_url.rsplit("/", 1)[0]
        return httpx.get(f"{base}/metrics", timeout=5, trust_env=False).text


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    want = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        sample, value = line.rsplit(" ", 1)
        metric, _, label_text = sample.partition("{")
        if metric != name:
            continue
        found = ",".join(sorted(label_text.rstrip("}").split(","))) if label_text else ""
        if found == want:
            return float(value)
    return 0.0


class ReplyTap:
    """Follows the gateway's reply stream from another connection and counts final answers per request.

    This is the count that "exactly once" is about: how many answers reached
    the gateway for one request id, whatever the workers did.
    """

    def __init__(self, redis_server: RedisServer) -> None:
        self.redis_server = redis_server
        self.key = f"{PREFIX}:reply:{GATEWAY_ID}"
        self.finals: Counter[str] = Counter()
        self.chunks: Counter[str] = Counter()
        self._stop = threading.Event()
        with redis_server.client() as client:
            info = client.xinfo_stream(self.key) if client.exists(self.key) else {}
        self._last = str(info.get("last-generated-id", "0-0")) if info else "0-0"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = None
        while not self._stop.is_set():
            try:
                if client is None:
                    client = self.redis_server.client()
                response = client.xread({self.key: self._last}, count=1000, block=200)
                for _stream, entries in response or ():
                    for entry_id, fields in entries:
                        self._last = entry_id
                        counter = self.finals if fields.get("kind") == "final" else self.chunks
                        counter[fields.get("id", "")] += 1
            except redis.RedisError:
                client = None
                time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class Stack:
    tmp: Path
    redis: RedisServer
    vllm: VllmServer
    secret_file: Path
    base_env: dict[str, str]
    gateway: Service | None = None
    workers: list[Service] = field(default_factory=list)
    _worker_count: int = 0

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.health_url.rsplit("/", 1)[0]

    @property
    def ops_url(self) -> str:
        assert self.gateway is not None and self.gateway.ops_url is not None
        return self.gateway.ops_url

    def client(self, timeout_s: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout_s, trust_env=False)

    def token(self, subject: str = "alice", **claims: Any) -> str:
        return mint(subject=subject, key=self.secret_file.read_text().strip(), **claims)

    def auth(self, subject: str = "alice", **claims: Any) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(subject, **claims)}"}

    def start_gateway(self) -> Service:
        port, ops_port = free_loopback_port(), free_loopback_port()
        while ops_port == port:
            ops_port = free_loopback_port()
        env = {
            **self.base_env,
            "LLMFLEET_REDIS_USERNAME": "gateway",
            "LLMFLEET_GATEWAY_PORT": str(port),
            # As the role runs it: /metrics and /readyz on their own listener.
            "LLMFLEET_GATEWAY_OPS_PORT": str(ops_port),
            "LLMFLEET_GATEWAY_ID": GATEWAY_ID,
            # A stack's settings may name more models (engines for each: test_model_lanes.py).
            "LLMFLEET_GATEWAY_MODELS": self.base_env.get("LLMFLEET_GATEWAY_MODELS")
            or json.dumps({"tiny": str(self.vllm.model_dir)}),
            "LLMFLEET_GATEWAY_JWT_SECRET_FILE": str(self.secret_file),
            "LLMFLEET_GATEWAY_TIERS": json.dumps(
                {
                    "default": {"requests_per_minute": 100_000, "tokens_per_minute": 100_000_000, "concurrency": 512},
                    "tight": {"requests_per_minute": 2, "tokens_per_minute": 100_000, "concurrency": 4},
                }
            ),
            "LLMFLEET_GATEWAY_RESULT_POLL_S": "1.0",
            # A replayed stream's keep-alive comments show within a test's patience (default 10 s).
            "LLMFLEET_GATEWAY_STREAM_KEEPALIVE_S": "0.5",
            "LLMFLEET_GATEWAY_REGISTRY_MAX_AGE_S": "0.2",
            # A SIGTERM gives waiting requests 3 s, not 30, before they are abandoned (and cancelled).
            "LLMFLEET_GATEWAY_GRACEFUL_SHUTDOWN_S": "3",
            # The schema for Schemathesis and the route checks (off by default).
            "LLMFLEET_GATEWAY_DOCS": "true",
        }
        self.gateway = (
            Service(
                "gateway",
                "llmfleet.serve.gateway",
                env,
                self.tmp / "gateway.log",
                f"http://127.0.0.1:{port}/healthz",
                ops_url=f"http://127.0.0.1:{ops_port}",
            )
            .start()
            .wait_ready()
        )
        return self.gateway

    def start_worker(self, engines: list[str] | None = None, **settings: str) -> Service:
        self._worker_count += 1
        port = free_loopback_port()
        name = f"worker-{self._worker_count}"
        env = {
            **self.base_env,
            "LLMFLEET_REDIS_USERNAME": "worker",
            "LLMFLEET_WORKER_ID": name,
            "LLMFLEET_WORKER_ENGINES": json.dumps(engines or [self.vllm.url]),
            "LLMFLEET_WORKER_LISTEN_PORT": str(port),
            "LLMFLEET_WORKER_HEALTH_INTERVAL_S": "0.5",
            # A CI machine under load answers /health slowly: slow is not dead (the default is 2 s).
            "LLMFLEET_WORKER_HEALTH_TIMEOUT_S": "10",
            "LLMFLEET_WORKER_EJECT_S": "30",
            "LLMFLEET_WORKER_DRAIN_TIMEOUT_S": "20",
            "LLMFLEET_WORKER_CONCURRENCY": "16",
            **{f"LLMFLEET_WORKER_{key.upper()}": value for key, value in settings.items()},
        }
        worker = (
            Service(name, "llmfleet.serve.worker", env, self.tmp / f"{name}.log", f"http://127.0.0.1:{port}/readyz")
            .start()
            .wait_ready()
        )
        self.workers.append(worker)
        return worker

    def live_workers(self) -> list[Service]:
        return [worker for worker in self.workers if worker.alive()]

    def wait_gateway_ready(self) -> None:
        wait_for(lambda: http_status(f"{self.ops_url}/readyz") == 200, STARTUP_S, "the gateway's /readyz")

    def ensure_one_worker(self) -> Service:
        """Leave exactly one plain worker running (tests that replace workers call this at the end)."""
        live = self.live_workers()
        for worker in live[1:]:
            worker.stop()
        worker = live[0] if live else self.start_worker()
        self.wait_gateway_ready()
        return worker

    def logs(self) -> str:
        parts = [f"--- {service.name}\n{service.log()[-4000:]}" for service in [self.gateway, *self.workers] if service]
        return "\n".join(parts)


@contextlib.contextmanager
def running_stack(
    tmp: Path,
    vllm: VllmServer,
    engines: list[str] | None = None,
    worker: dict[str, str] | None = None,
    **settings: str,
) -> Iterator[Stack]:
    """A Redis, a gateway and one worker, all on loopback; settings add to or override the LLMFLEET_* values.

    The worker calls engines (default: vllm) with its start_worker settings in worker.
    """
    password_file = tmp / "redis.password"
    password_file.write_text(secrets.token_hex(24))
    password_file.chmod(0o600)
    secret_file = tmp / "jwt.secret"
    secret_file.write_text(secrets.token_hex(32))
    secret_file.chmod(0o600)
    redis_server = RedisServer(tmp / "redis", free_loopback_port(), password_file.read_text())
    redis_server.start()
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("LLMFLEET_")}
    base_env.update(
        {
            "LLMFLEET_REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/0",
            "LLMFLEET_REDIS_USERNAME": "llmfleet",
            "LLMFLEET_REDIS_PASSWORD_FILE": str(password_file),
            "LLMFLEET_QUEUE_PREFIX": PREFIX,
            "LLMFLEET_QUEUE_REQUEST_TIMEOUT_S": "60",
            "LLMFLEET_QUEUE_QUEUE_TIMEOUT_S": "60",
            "LLMFLEET_LOG_LEVEL": "INFO",
            **settings,
        }
    )
    stack = Stack(tmp, redis_server, vllm, secret_file, base_env)
    try:
        stack.start_gateway()
        stack.start_worker(engines, **(worker or {}))
        stack.wait_gateway_ready()
        yield stack
    finally:
        for service in [*stack.workers, stack.gateway]:
            if service is not None and service.alive():
                service.stop(timeout_s=10)
        redis_server.kill()


class StubEngine(BaseHTTPRequestHandler):
    """A STAND-IN for a broken engine: healthy to probes (/health, /v1/models lists tiny), 503 to every request.

    Real vLLM cannot be made to fail on demand; everything else in the stack is real.
    """

    hits: Counter[str]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        content = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def do_GET(self) -> None:
        self.hits[self.path] += 1
        if self.path == "/health":
            self._reply(200, {})
        elif self.path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 2048}]})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.hits[self.path] += 1
        self._reply(503, {"object": "error", "message": "engine is dead", "type": "ServiceUnavailable", "code": 503})


class EngineProxy(BaseHTTPRequestHandler):
    """In front of the real vLLM at `upstream`: GETs (the workers' health checks) pass through unchanged."""

    upstream: str
    release: threading.Event

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        response = httpx.get(f"{self.upstream}{self.path}", timeout=30, trust_env=False)
        self.send_response(response.status_code)
        self.send_header("Content-Type", response.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(response.content)))
        self.end_headers()
        self.wfile.write(response.content)


class GatedProxy(EngineProxy):
    """A STAND-IN slow link in front of the real vLLM: a POST's whole answer is held until `release` is set.

    A request through it is in flight for certain until the test lets it finish,
    however fast the engine or slow the machine (a real tiny model answers
    1500 tokens before a starved test process has looked twice).
    """

    hits: Counter[str] | None = None  # POSTs by path, when the test counts them

    def do_POST(self) -> None:
        if self.hits is not None:
            self.hits[self.path] += 1
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {"Content-Type": "application/json"}
        answer = httpx.post(f"{self.upstream}{self.path}", content=body, headers=headers, timeout=120)
        self.release.wait()
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)


class StallingProxy(EngineProxy):
    """A STAND-IN network fault in front of the real vLLM: a POST's stream stops after `events` SSE events.

    The held response stays open until `release` is set, so a worker reading it is
    mid-stream for certain, however fast the engine or slow the machine.
    """

    events: int

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {"Content-Type": "application/json"}
        with httpx.stream("POST", f"{self.upstream}{self.path}", content=body, headers=headers, timeout=60) as answer:
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "text/event-stream"))
            self.send_header("Connection", "close")
            self.end_headers()
            sent = 0
            for line in answer.iter_lines():
                self.wfile.write(f"{line}\n".encode())
                if line.startswith("data:"):
                    sent += 1
                    if sent >= self.events:
                        break
            self.wfile.flush()
        self.release.wait()


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], **attributes: Any) -> Iterator[str]:
    """Serve handler (a subclass given `attributes`) on a free loopback port; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type(handler.__name__, (handler,), attributes))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def engine_proxy(handler: type[EngineProxy], **attributes: Any) -> Iterator[tuple[str, threading.Event]]:
    """A proxy in front of the real vLLM: (its URL, its release event, set on the way out so no answer hangs)."""
    release = threading.Event()
    with serving(handler, release=release, **attributes) as url:
        try:
            yield url, release
        finally:
            release.set()
