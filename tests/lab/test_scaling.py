"""Alert-driven scaling in the whole-stack lab, end to end with real parts.

Load through the gateway keeps every engine busy (the lab's saturation point
is one request running per engine: inventories/lab/group_vars/monitoring/lab.yml):
Prometheus on mon1 fires ScaleOutNeeded (scale_kind engines), Alertmanager
posts it to the scaler, and the scaler runs playbooks/scale_out.yml through
ansible-runner: gpu3, the standby host, gets an engine, the workers learn of it,
Prometheus scrapes it, and it serves. When the load drops to a trickle (a
few requests a second, never none), ScaleInPossible follows: the scaler
drains gpu3's engine and removes it (scale_in.yml). Every request the gateway
accepted is answered.

The same load shows that answers do not fill Redis (issue 17): while it runs,
redis1's memory limit (noeviction) is held just above what the queue's
retention should keep, far below what keeping every answer would take, and no
admission is refused (RedisMemory).

The scaler runs on the build machine (the lab's lab_controller_address), not on
mon1: it reaches the hosts through this machine's Docker engine, as every lab
playbook does. The alert thresholds are the lab's
(inventories/lab/group_vars/monitoring/lab.yml). The workers' count is held
(min = max = 2): this scenario scales engine hosts, and the worker-bound
decision is proven by promtool (tests/unit/roles/promtool/scaling.yml) and the
scaler's own tests.

conftest.py runs this file after test_site.py's tests and before the teardown:
it changes the site, then puts it back as it was.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llmfleet.paths import REPO_ROOT, cache_dir
from llmfleet.serve.queue.config import QueueSettings
from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.producer import KEEP_READ_MS
from tests.lab.helpers import (
    PLAYBOOK_LOGS,
    PlaybookRun,
    copy_lab_inventory,
    mint_token,
    on_host,
    prometheus,
    run_playbook,
    wait_for,
)
from tests.tools import LLMFLEET

SCALER_ADDRESS, SCALER_PORT = "10.78.0.1", 9095  # lab_controller_address in the test lab
SCALER = f"http://{SCALER_ADDRESS}:{SCALER_PORT}"
SCALER_LOGS = PLAYBOOK_LOGS.parent / "lab-scaler"  # kept after the run: audit, runner artifacts, the scaler's log
GATEWAY = "http://10.78.0.10:8080"
ALERTMANAGER = "http://10.78.0.30:9093"  # mon1's Alertmanager in the test lab
STANDBY_HOST, STANDBY_ENGINE = "gpu3", "10.78.0.43:8000"
BASE_ENGINES = {"10.78.0.41:8000", "10.78.0.41:8001", "10.78.0.42:8000"}
REQUEST = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 32, "ignore_eos": True}
# Enough clients to keep every engine running requests (the lab's saturation point: one each on average); fewer while
# the scale-out runs, so the new engine gets traffic without starving the playbook of the machine's two cores.
HEAVY_CLIENTS, LIGHT_CLIENTS = 16, 3
# Scale-in's traffic: one client pausing after each answer, a few requests a second and never none, but at most one
# running at a time, which the three engines left after scale-in carry far under their scale-out point.
TRICKLE_CLIENTS, TRICKLE_PAUSE_S = 1, 0.3

# redis1, the lab's Redis, and the queue's keys there. The lab's gateway and workers run the queue's defaults
# (inventories/lab sets no LLMFLEET_QUEUE_*): a delivered plain answer's result and job record are kept
# DELIVERED_GRACE_S, its final event on the gateway's reply stream KEEP_READ_S.
REDIS_HOST = "redis1"
GATEWAY_HOST, SERVICE_CONTAINERS = "gw1", ("llmfleet-gateway-1", "llmfleet-worker-1", "llmfleet-worker-2")
QUEUE = Keys(QueueSettings.model_fields["prefix"].default)
DELIVERED_GRACE_S: int = QueueSettings.model_fields["delivered_grace_s"].default
KEEP_READ_S = KEEP_READ_MS // 1000
# Each a little longer as the lab sees it: the gateway shortens the TTLs and trims its stream at its next trim (once
# a second), and Redis reclaims an expired key at one of its next expire cycles (ten a second).
RESULT_WINDOW_S, REPLY_WINDOW_S = DELIVERED_GRACE_S + 2, KEEP_READ_S + 2
# The role's admin access, as its own checks use it (roles/redis, vars/main.yml: __redis_cli): the default user,
# whose password sh reads inside the container from the root-only file (it never leaves the host), on loopback (the
# role binds 127.0.0.1 besides the lab address), without TLS. Commands go one a line on stdin.
REDIS_CLI = 'REDISCLI_AUTH="$(cat /etc/redis/admin.password)" redis-cli -h 127.0.0.1 -p 6379 --no-auth-warning'
REDIS_ERRORS = ("ERR", "WRONGPASS", "NOAUTH", "NOPERM", "WRONGTYPE", "OOM")
# Answers of the load to wait for before measuring one answer's size, and how many delivered ones to measure.
CALIBRATION_ANSWERS, SAMPLED_ANSWERS = 300, 20
# The limit is MEMORY_MARGIN x what the retention keeps, plus an allowance for what the load adds besides its answers
# (at least MEMORY_ALLOWANCE_FLOOR more than measured), set again every MEMORY_SAMPLE_S (RedisMemory).
MEMORY_MARGIN, MEMORY_ALLOWANCE_FLOOR, MEMORY_SAMPLE_S = 1.5, 1 << 20, 2.0


@dataclass
class Timeline:
    """Seconds since the epoch of each step, for the printed split and for the scale-in test."""

    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks.setdefault(name, time.time() if at is None else at)


TIMELINE = Timeline()


class Load:
    """Clients posting completions through the gateway until stopped.

    Plain sync requests, without an Idempotency-Key: their answers are those the
    queue keeps only until delivered plus a grace, which RedisMemory relies on (a
    keyed answer is kept LLMFLEET_QUEUE_RESULT_TTL_S for its retry, an hour, so a
    keyed load would keep all of its answers). A broken connection is retried as a
    new request. The final status of every request is counted, and when each
    answer came.
    """

    def __init__(self, token: str, clients: int, pause_s: float = 0.0) -> None:
        self.outcomes: Counter[int | str] = Counter()  # 200, '503 queue_full', 'ReadTimeout'
        self.retried_connections = 0
        # time.monotonic() of each 200, in order (appended under the lock).
        self._answered_at: list[float] = []
        self._headers = {"Authorization": f"Bearer {token}"}
        self._pause_s = pause_s  # between one answer and the next request: a trickle instead of a closed loop
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(300)
        assert not any(thread.is_alive() for thread in self._threads), "a client still waits for its answer"

    def answers(self, since: float = 0.0) -> int:
        """Requests answered 200 since that time.monotonic() (all of them by default)."""
        with self._lock:
            return len(self._answered_at) - bisect.bisect_left(self._answered_at, since)

    def _client(self) -> None:
        with httpx.Client(timeout=300, headers=self._headers) as http:
            while not self._stop.is_set():
                status = self._request(http)
                with self._lock:
                    self.outcomes[status] += 1
                    if status == 200:
                        self._answered_at.append(time.monotonic())
                if status != 200:
                    self._stop.wait(0.2)  # counted; no tight loop against a refusing gateway
                elif self._pause_s:
                    self._stop.wait(self._pause_s)

    def _request(self, http: httpx.Client) -> int | str:
        failure = "never sent"
        for _ in range(5):
            try:
                response = http.post(f"{GATEWAY}/v1/completions", json=REQUEST)
            except httpx.TransportError as error:
                failure = type(error).__name__
                with self._lock:
                    self.retried_connections += 1
                continue
            return _outcome(response)
        return failure


def _outcome(response: httpx.Response) -> int | str:
    """200, or the status with the error code the gateway gave ("503 model_unavailable"): a failure says why."""
    if response.status_code == 200:
        return 200
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "no error code"
    return f"{response.status_code} {code}"


def _service_warnings(since: float) -> str:
    """The gateway's and the workers' warnings and errors since that time.time(): why a request failed."""
    lines = []
    for container in SERVICE_CONTAINERS:
        logs = on_host(GATEWAY_HOST, "docker", "logs", "--since", f"{since:.0f}", container)
        lines += [f"{container}: {line}" for line in logs.splitlines() if "WARNING" in line or "ERROR" in line]
    return "\n".join(lines[-40:]) or "none"


def _audit() -> list[dict[str, Any]]:
    path = SCALER_LOGS / "state" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _taken(direction: str) -> dict[str, Any] | None:
    return next((record for record in _audit() if record["event"] == "decision" and record["outcome"] == "taken"
                 and record["kind"] == "engines" and record["direction"] == direction), None)


def _action_end(action_id: str) -> dict[str, Any] | None:
    return next((record for record in _audit()
                 if record["event"] == "action_end" and record.get("action_id") == action_id), None)


def _report(text: str) -> None:
    """Print a timing (scripts/test.sh shows a passed test's output, -rP) and keep it beside the audit log."""
    print(text)
    with (SCALER_LOGS / "timings.txt").open("a") as timings:
        timings.write(text + "\n")


def _run_output(end: dict[str, Any]) -> str:
    """The end of a scaler run's Ansible output (ansible-runner's artifacts), for a failure's message."""
    stdout = Path(end["artifacts"] or "/nonexistent") / "stdout"
    return f"{end}\n{stdout.read_text()[-5000:] if stdout.exists() else '(no output kept)'}"


def _engine_image() -> str:
    """The lab's engine image, as `llmfleet lab up` wrote its reference (the lab's vllm_image)."""
    return (cache_dir() / "images" / "vllm-cpu.ref").read_text().strip()


def _image_copied_in(end: dict[str, Any]) -> list[str]:
    """The hosts a scaler run copied an image archive to (its "Copy the image archive" task changed there)."""
    stdout = (Path(end["artifacts"]) / "stdout").read_text()
    sections = re.split(r"^TASK \[", stdout, flags=re.M)
    copies = [section for section in sections if section.startswith("image_delivery : Copy the image archive")]
    return [host for section in copies for host in re.findall(r"^changed: \[([^\]]+)\]", section, re.M)]


def _served_by(engine: str) -> float:
    text = httpx.get(f"http://{engine}/metrics", timeout=10).text
    return sum(float(value) for value in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def _scraped_engines() -> set[str]:
    active = prometheus("targets", state="active")["activeTargets"]
    return {target["labels"]["instance"] for target in active if target["labels"]["job"] == "vllm"}


def _intake_rate() -> float:
    """Prompt tokens a second over the last minute; no series yet means no request since the gateways started."""
    result = prometheus("query", query="sum(rate(llmfleet_gateway_prompt_tokens_sum[1m]))")["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _note_pending_scale_out() -> None:
    """When Prometheus first found ScaleOutNeeded's condition true (the alert's activeAt, before `for:`)."""
    for alert in prometheus("alerts")["alerts"]:
        if alert["labels"]["alertname"] == "ScaleOutNeeded" and alert["labels"].get("scale_kind") == "engines":
            TIMELINE.mark("condition true", _seconds(alert["activeAt"]))


def _failed_engine_scrapes(marks: dict[str, float]) -> float:
    """Scrapes of the vllm job that failed (up 0) between the load's start and the scaler's decision."""
    window = max(int(marks["scaler took the alert"] - marks["load started"]), 5)
    query = (f'sum(count_over_time(up{{job="vllm"}}[{window}s]) - sum_over_time(up{{job="vllm"}}[{window}s]))')
    result = prometheus("query", query=query, time=str(marks["scaler took the alert"]))["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _check_running(scaler: subprocess.Popen[bytes]) -> None:
    if scaler.poll() is not None:
        raise AssertionError(f"the scaler exited: {(SCALER_LOGS / 'scaler.log').read_text()[-3000:]}")


def _scale_out_taken(scaler: subprocess.Popen[bytes]) -> dict[str, Any] | None:
    _check_running(scaler)
    _note_pending_scale_out()
    return _taken("out")


def _scale_in_taken(scaler: subprocess.Popen[bytes]) -> dict[str, Any] | None:
    _check_running(scaler)
    return _taken("in")


def _seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _redis(*commands: str) -> str:
    """redis-cli's output for admin commands to redis1's Redis, one session; raw (no tty): a nil is an empty line."""
    output = on_host(REDIS_HOST, "sh", "-c", f'printf "%s\\n" "$@" | {REDIS_CLI}', "sh", *commands)
    # redis-cli exits 0 on an error reply: look for one.
    assert not any(line.startswith(REDIS_ERRORS) for line in output.splitlines()), (commands[:3], output[-500:])
    return output


def _redis_keys(pattern: str) -> list[str]:
    """The keys matching pattern (redis-cli --scan: SCAN in small steps, never KEYS)."""
    return on_host(REDIS_HOST, "sh", "-c", f'{REDIS_CLI} --scan --pattern "$1"', "sh", pattern).split()


def _redis_fields(output: str) -> dict[str, str]:
    """The `name:value` lines of INFO's output."""
    pairs = (line.strip().partition(":") for line in output.splitlines() if not line.startswith("#"))
    return {name: value for name, colon, value in pairs if colon}


def _oom_refusals() -> int:
    """Commands redis1 refused for its memory limit since it started (INFO errorstats)."""
    match = re.search(r"^errorstat_OOM:count=(\d+)", _redis("INFO errorstats"), re.M)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class AnswerSizes:
    """Bytes one delivered answer of the load holds in redis1, from MEMORY USAGE of real keys.

    MEMORY USAGE leaves out each key's entry in the expiry table, a few dozen bytes: the margin covers them.
    """

    stored: int  # its result and job record, kept DELIVERED_GRACE_S after delivery (an hour if all were kept)
    reply: int  # its final event on the gateway's reply stream, kept KEEP_READ_S
    sampled: int  # the delivered answers measured


def _delivered_answer_sizes(loads: list[Load]) -> AnswerSizes | None:
    """What a delivered answer of the load holds in redis1; None until CALIBRATION_ANSWERS answers came."""
    if sum(load.answers() for load in loads) < CALIBRATION_ANSWERS:
        return None
    results = _redis_keys(QUEUE.result("*"))[:1000]
    ttls = _redis(*(f"TTL {key}" for key in results)).splitlines() if results else []
    # A delivered plain answer has at most the grace left; one not yet delivered, or an earlier test's task or keyed
    # answer, about LLMFLEET_QUEUE_RESULT_TTL_S (an hour). The quiet minute before the load let the earlier delivered
    # answers expire: these are the load's.
    delivered = [key.removeprefix(QUEUE.result("")) for key, ttl in zip(results, ttls, strict=True)
                 if 0 < int(ttl) <= DELIVERED_GRACE_S][:SAMPLED_ANSWERS]
    streams = _redis_keys(QUEUE.reply("*"))
    if len(delivered) < SAMPLED_ANSWERS or not streams:
        return None
    usage = _redis(*(f"MEMORY USAGE {key} SAMPLES 0"
                     for request_id in delivered for key in (QUEUE.result(request_id), QUEUE.job(request_id))))
    lines = usage.splitlines()
    # A key that expired meanwhile answers nil, an empty line: leave that answer out.
    stored = [int(result) + int(job) for result, job in zip(lines[::2], lines[1::2], strict=True) if result and job]
    # The load's gateway's stream is the longest: one an earlier test's restart left holds that gateway's last 30 s.
    lengths = [int(length) for length in _redis(*(f"XLEN {stream}" for stream in streams)).splitlines()]
    length, stream = max(zip(lengths, streams, strict=True))
    if not stored or length == 0:
        return None
    stream_bytes = int(_redis(f"MEMORY USAGE {stream} SAMPLES 0"))
    return AnswerSizes(sum(stored) // len(stored), stream_bytes // length, len(stored))


@dataclass(frozen=True)
class MemorySample:
    used: int  # redis1's used_memory
    limit: int  # its maxmemory, set just before
    kept: int  # what the retention should keep then (RedisMemory.kept)
    dropped: int  # what it had let go by then: the results and job records of the answers older than RESULT_WINDOW_S


class RedisMemory:
    """redis1's memory while the load runs: its limit held just above what the retention should keep.

    Every MEMORY_SAMPLE_S the limit is set to the used memory before the load, plus an allowance for what the load
    adds besides its answers (client buffers, the queue's backlog: measured once answers were, and at least
    MEMORY_ALLOWANCE_FLOOR more), plus MEMORY_MARGIN x what the retention keeps at that moment: the load's answers of
    the last RESULT_WINDOW_S x their result and job record, of the last REPLY_WINDOW_S x their reply event (sizes
    measured on real keys). The policy stays the role's noeviction: over the limit Redis refuses every write, the
    admissions first, and the gateway answers 503.

    Why the limit follows the load rather than stands: the load is a burst at its peak rate (the heavy clients, until
    the scaler acts, about 45 s) and then a long light tail (while scale_out.yml runs, 2 to 4 minutes). A limit fixed
    for what the burst's last minute keeps would hold most of the whole load's answers too (7,178 in a lab run): it
    could not fail were every answer kept. Following the load, the limit comes down with the tail's rate, where every
    answer kept would not fit: at some sample, the memory used plus the answers the retention had let go by then
    exceeds that sample's limit (_check_redis_memory asserts it from the measured figures). Not "every answer against
    the headroom over the memory before the load": half the allowance is slack for a growth that may not come, and a
    fast scale-out left too few answers to pass it (4,914 in a CI run).

    Expected figures: a result like a 32-token completion's is about 620 bytes of JSON; on redis-server 7.0.15 its
    result key took 744 bytes, its job record 264 and its reply event 767, and 2,000 of them raised used_memory by
    1,850 bytes each. Keeping every answer would take 7,000 to 11,000 x ~1 KB, 7 to 11 MB (the reply stream is
    trimmed either way); at, say, 20 answers a second in the tail the retention keeps 20 x (62 x 1.0 + 32 x 0.77)
    KB, ~1.7 MB, so the limit stands ~2.6 MB plus the allowance (1 to a few MB) above the memory before the load.
    """

    def __init__(self) -> None:
        lines = _redis("CONFIG GET maxmemory maxmemory-policy").split()
        config = dict(zip(lines[::2], lines[1::2], strict=True))
        assert config["maxmemory-policy"] == "noeviction", config  # the role's, which the check is about
        self.role_maxmemory = int(config["maxmemory"])
        assert self.role_maxmemory > 0, config
        self.used_before = self.peak_before = self.oom_before = 0
        self.sizes = AnswerSizes(0, 0, 0)
        self.besides_answers = self.allowance = 0
        self.samples: list[MemorySample] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def before_load(self) -> None:
        memory = _redis_fields(_redis("INFO memory"))
        self.used_before, self.peak_before = int(memory["used_memory"]), int(memory["used_memory_peak"])
        self.oom_before = _oom_refusals()

    def hold(self, loads: list[Load], sizes: AnswerSizes) -> None:
        """Hold the limit at what the load needs, from now until stop()."""
        self.sizes = sizes
        used = int(_redis_fields(_redis("INFO memory"))["used_memory"])
        # What the load added besides the answers kept now; it may grow as much again, and a worker's restart in the
        # scale-out opens new connections before the old ones close.
        self.besides_answers = max(used - self.used_before - self.kept(loads, time.monotonic()), 0)
        self.allowance = self.besides_answers + max(self.besides_answers, MEMORY_ALLOWANCE_FLOOR)
        self._thread = threading.Thread(target=self._hold, args=(loads,), daemon=True)
        self._thread.start()

    def kept(self, loads: list[Load], now: float) -> int:
        """Bytes the retention should keep at `now`, by the times the answers came.

        Answers a broken connection left to no one keep LLMFLEET_QUEUE_RESULT_TTL_S: counted for the whole load.
        """
        stored = sum(load.answers(since=now - RESULT_WINDOW_S) + load.retried_connections for load in loads)
        replies = sum(load.answers(since=now - REPLY_WINDOW_S) for load in loads)
        return self.sizes.stored * stored + self.sizes.reply * replies

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _hold(self, loads: list[Load]) -> None:
        try:
            while True:
                now = time.monotonic()
                kept = self.kept(loads, now)
                limit = min(self.used_before + self.allowance + int(MEMORY_MARGIN * kept), self.role_maxmemory)
                let_go = sum(load.answers() - load.answers(since=now - RESULT_WINDOW_S) for load in loads)
                output = _redis(f"CONFIG SET maxmemory {limit}", "INFO memory")
                assert output.startswith("OK"), output[:300]
                used = int(_redis_fields(output)["used_memory"])
                self.samples.append(MemorySample(used, limit, kept, self.sizes.stored * let_go))
                if self._stop.wait(MEMORY_SAMPLE_S):
                    return
        except BaseException as error:  # a thread's failure would pass unseen: _check_redis_memory reports it
            self.failure = error


@pytest.fixture
def redis_memory() -> Iterator[RedisMemory]:
    """redis1's memory, watched and limited by the test; the role's maxmemory back after it, whatever its outcome."""
    memory = RedisMemory()
    try:
        yield memory
    finally:
        memory.stop()
        # The tests that follow (and the teardown's checks) see Redis as the role configured it.
        assert _redis(f"CONFIG SET maxmemory {memory.role_maxmemory}").strip() == "OK"


def _check_redis_memory(memory: RedisMemory, answered: int) -> None:
    """Report redis1's figures for the load, then assert that its answers never filled the limit."""
    assert memory.failure is None, f"holding redis1's memory limit failed: {memory.failure!r}"
    assert memory.samples, "redis1's memory was never sampled"
    oom_after = _oom_refusals()
    fields = _redis_fields(_redis("INFO memory"))
    redis_peak = int(fields["used_memory_peak"])
    tightest = max(memory.samples, key=lambda sample: sample.used / sample.limit)
    peak = max(memory.samples, key=lambda sample: sample.used)
    # The sample where keeping every answer would have come nearest the limit (past it, if the check can fail).
    closest = max(memory.samples, key=lambda sample: sample.used + sample.dropped - sample.limit)
    _report(f"redis1 memory: maxmemory {memory.role_maxmemory} B (the role's), {memory.used_before} B used before "
            f"the load; an answer holds {memory.sizes.stored} B (result and job record) + {memory.sizes.reply} B "
            f"(reply event), MEMORY USAGE of {memory.sizes.sampled}; allowance {memory.allowance} B "
            f"({memory.besides_answers} B besides the answers when measured)")
    _report(f"  {len(memory.samples)} samples: peak {peak.used} B used against a limit of {peak.limit} B; tightest "
            f"{tightest.used} of {tightest.limit} B; Redis's own peak {redis_peak} B"
            f"{'' if redis_peak > memory.peak_before else ' (from before the load)'}")
    _report(f"  {answered} answers; every answer kept, the closest sample would have used {closest.used} + "
            f"{closest.dropped} B let go against its limit of {closest.limit} B; OOM refusals {memory.oom_before} -> "
            f"{oom_after}")
    assert oom_after == memory.oom_before, f"redis1 refused {oom_after - memory.oom_before} commands for memory"
    assert tightest.used < tightest.limit, tightest
    # The check could fail: had the retention kept every answer (their results and job records stay an hour), the
    # memory would have passed the limit at that sample, and admissions would have been refused.
    assert closest.used + closest.dropped > closest.limit, (
        f"the load cannot tell the retention from keeping every answer: at the closest sample, {closest.used} B used "
        f"+ {closest.dropped} B let go fit the limit of {closest.limit} B ({answered} answers of "
        f"{memory.sizes.stored} B)")


@pytest.fixture(scope="module", autouse=True)
def converged(converged_site: PlaybookRun) -> None:
    assert converged_site.returncode == 0, converged_site.output[-5000:]


@pytest.fixture(scope="module")
def scaler(
    lab_inventory: Path, facts_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    """`llmfleet scaler serve` on the build machine, configured for the test lab, until the module ends."""
    shutil.rmtree(SCALER_LOGS, ignore_errors=True)
    (SCALER_LOGS / "state").mkdir(parents=True)
    secrets = yaml.safe_load((lab_inventory / "group_vars" / "all" / "lab_secrets.yml").read_text())
    token_file = tmp_path_factory.mktemp("scaler") / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(secrets["alertmanager_scaler_token"])
    settings = {
        "TOKEN_FILE": str(token_file), "PROJECT_DIR": str(REPO_ROOT), "INVENTORY": json.dumps([str(lab_inventory)]),
        "HOST": SCALER_ADDRESS, "PORT": str(SCALER_PORT), "STATE_DIR": str(SCALER_LOGS / "state"),
        # gpu1 and gpu2 serve; gpu3 is the one standby host. A scale-in may follow the scale-out after 20 s
        # (a site's default is 30 min).
        "ENGINES__MIN": "2", "ENGINES__MAX": "3", "ENGINES__COOLDOWN_OUT_S": "60", "ENGINES__COOLDOWN_IN_S": "20",
        "WORKERS__MIN": "2", "WORKERS__MAX": "2",
    }
    # The test lab's own fact cache, as run_playbook's: the operator's lab has hosts of the same names.
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts_dir),
           **{f"LLMFLEET_SCALER_{name}": value for name, value in settings.items()}}
    with (SCALER_LOGS / "scaler.log").open("wb") as log:
        process = subprocess.Popen([*LLMFLEET, "scaler", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or _healthy(), "the scaler to answer /healthz", timeout_s=60)
        assert process.poll() is None, (SCALER_LOGS / "scaler.log").read_text()
        yield process
    finally:
        process.terminate()
        process.wait(120)


def _healthy() -> bool:
    try:
        return httpx.get(f"{SCALER}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_load_adds_the_standby_host_whose_engine_then_serves(
    scaler: subprocess.Popen[bytes], redis_memory: RedisMemory, tmp_path: Path
) -> None:
    assert _scraped_engines() == BASE_ENGINES
    # site.yml put the engine image on the standby host (engines.yml's standby play), running no engine there.
    on_host(STANDBY_HOST, "docker", "image", "inspect", "--format", "{{.Id}}", _engine_image())
    standby_engines = on_host(STANDBY_HOST, "docker", "ps", "--all", "--quiet", "--filter", "label=llmfleet.role=vllm")
    assert standby_engines.strip() == "", f"{STANDBY_HOST} runs engines before any scale-out: {standby_engines}"
    # Start from a quiet minute: a ScaleOutNeeded left firing by an earlier test's load has resolved, and the
    # timings below start from this load.
    wait_for(lambda: _intake_rate() == 0, "a minute without requests", timeout_s=180)
    token = mint_token(tmp_path, "--tier", "bench", "--ttl", "1h")
    redis_memory.before_load()
    TIMELINE.mark("load started")
    heavy, light = Load(token, HEAVY_CLIENTS), Load(token, LIGHT_CLIENTS)
    loads = [heavy, light]
    try:
        # Issue 17: from the first answers on, redis1's memory limit stands just above what the retention keeps.
        sizes = wait_for(partial(_delivered_answer_sizes, loads), "delivered answers to measure in redis1")
        redis_memory.hold(loads, sizes)
        decision = wait_for(partial(_scale_out_taken, scaler), "the scaler to take a scale-out",
                            timeout_s=300)
        heavy.stop()
        TIMELINE.mark("scaler took the alert", decision["time"])
        action = decision["action"]
        assert action["host"] == STANDBY_HOST, decision
        alert = decision["alerts"][0]
        assert alert["name"] == "ScaleOutNeeded", decision
        TIMELINE.mark("alert fired", _seconds(alert["starts_at"]))
        end = wait_for(partial(_action_end, action["id"]), "the scale-out playbook to end", timeout_s=900)
        TIMELINE.mark("scale-out ended", end["time"])
        assert end["result"] == "successful", _run_output(end)
        assert _image_copied_in(end) == [], f"scale_out.yml copied the engine image: {_run_output(end)}"
        wait_for(lambda: _served_by(STANDBY_ENGINE) > 0, "the new engine to serve a request", timeout_s=120)
        TIMELINE.mark("new engine served")
    finally:
        light.stop()
        heavy.stop()
        redis_memory.stop()
    outcomes = heavy.outcomes + light.outcomes
    # A 503 may be an admission redis1 refused for memory: the message shows its tightest sample.
    tightest = max(redis_memory.samples, key=lambda sample: sample.used / sample.limit, default=None)
    assert set(outcomes) == {200}, (f"requests not answered: {dict(outcomes)}; redis1's tightest memory: {tightest}"
                                    f"; the services' warnings:\n{_service_warnings(TIMELINE.marks['load started'])}")
    # Prometheus follows the new membership: the new engine is scraped, and up.
    assert _scraped_engines() == BASE_ENGINES | {STANDBY_ENGINE}
    marks = TIMELINE.marks
    retried = heavy.retried_connections + light.retried_connections
    _report(f"scale-out: {sum(outcomes.values())} requests answered, {retried} broken connections retried "
          "as new requests")
    def span(start: str, stop: str) -> str:
        return f"{marks[stop] - marks[start]:.1f} s"

    _report(f"  load started to the condition true (seen by a scrape): {span('load started', 'condition true')}")
    _report(f"  alerting, condition true to the scaler's decision: {span('condition true', 'scaler took the alert')}"
          f" (for: {span('condition true', 'alert fired')}, group wait and webhook"
          f" {span('alert fired', 'scaler took the alert')})")
    # When `for:` runs much longer than the lab's 15 s, the condition went false between evaluations: say whether
    # an engine scrape failed meanwhile (a scrape past its 4 s timeout on the loaded machine drops the series).
    _report(f"  engine scrapes failed from the load's start to the decision: {_failed_engine_scrapes(marks):.0f}")
    _report(f"  Ansible, the decision to the first request served on {STANDBY_HOST}: "
          f"{span('scaler took the alert', 'new engine served')} (scale_out.yml {end['duration_s']:.1f} s)")
    _check_redis_memory(redis_memory, sum(load.answers() for load in loads))


def test_a_trickle_removes_the_added_host_drained(scaler: subprocess.Popen[bytes], tmp_path: Path) -> None:
    assert "new engine served" in TIMELINE.marks, "the scale-out did not happen: nothing to scale in"
    # Light, steady traffic that never stops (issue 34): one client, a short pause after each answer, so a
    # request or none runs at any moment. ScaleInPossible must fire through it, and the drain must cut none of it.
    token = mint_token(tmp_path, "--tier", "bench", "--ttl", "1h")
    trickle = Load(token, TRICKLE_CLIENTS, pause_s=TRICKLE_PAUSE_S)
    started = time.time()
    try:
        decision = wait_for(partial(_scale_in_taken, scaler), "the scaler to take a scale-in", timeout_s=300)
        assert decision["action"]["host"] == STANDBY_HOST, decision
        end = wait_for(partial(_action_end, decision["action"]["id"]), "the scale-in playbook to end",
                       timeout_s=600)
        assert end["result"] == "successful", _run_output(end)
        # The trickle goes on after the drain: its next answers come from the engines that stay.
        drained = time.monotonic()
        wait_for(lambda: trickle.answers(since=drained) >= TRICKLE_CLIENTS * 3, "the trickle to be answered after "
                 "the scale-in", timeout_s=60)
    finally:
        trickle.stop()
    assert set(trickle.outcomes) == {200}, f"trickle requests not answered: {dict(trickle.outcomes)}"
    minutes = (time.time() - started) / 60
    # At least one answer every 5 s, the lab's scrape and evaluation interval: traffic at every evaluation.
    assert trickle.answers() / minutes >= 12, f"not a trickle: {trickle.answers()} answers in {minutes:.1f} min"
    _report(f"scale-in under a trickle of {trickle.answers() / minutes:.0f} requests a minute, all answered: trickle "
            f"started to the scaler's decision {decision['time'] - started:.1f} s, drained and removed by the "
            f"playbook in {end['duration_s']:.1f} s")
    state = json.loads((SCALER_LOGS / "state" / "state.json").read_text())
    assert state["engines_added"] == [] and state["membership"]["engine_hosts"] == [], state


def test_a_failed_scale_out_leaves_the_standby_host_with_no_engine(facts_dir: Path, tmp_path: Path) -> None:
    # Issue 34 item 6: scale_out.yml for gpu3, as the scaler runs it (its membership through the inventory plugin),
    # with the engine's readiness wait cut to 5 s so that it fails while the engine is still starting: the run must
    # fail, remove the engine it started, and lift its silence, so the host the scaler keeps as standby runs nothing.
    inventory = copy_lab_inventory(tmp_path / "inventory")
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 1, "membership": {"engine_hosts": [STANDBY_HOST], "worker_counts": {}}}))
    (inventory / "scaler.yml").write_text(yaml.safe_dump({"plugin": "llmfleet_scaler", "state_file": str(state)}))
    silenced_before = _standby_silences()
    run = run_playbook(inventory, "scale_out.yml", "--limit", f"{STANDBY_HOST}:gateways:monitoring",
                       "--tags", "engines,worker", "-e", "scale_kind=engines", "-e", f"scale_host={STANDBY_HOST}",
                       "-e", "vllm_ready_timeout=5", facts=facts_dir, log_as="failed_scale_out")
    assert run.returncode != 0, run.output[-5000:]
    unwrapped = " ".join(run.output.split())
    assert "Wait until each engine lists its served model failed" in unwrapped, run.output[-5000:]
    assert "Remove the engines a failed scale-out started" in unwrapped, run.output[-5000:]
    engines = on_host(STANDBY_HOST, "docker", "ps", "--all", "--filter", "label=llmfleet.role=vllm",
                      "--format", "{{.Names}}")
    assert engines.strip() == "", f"{STANDBY_HOST} still has engine containers after the failed scale-out: {engines}"
    # The run stopped at the failed host's play: the workers were not told of an engine that never served.
    assert "PLAY [Stage the models and run the engines" in run.output
    assert "PLAY [Run the workers and the gateways]" not in run.output, run.output[-5000:]
    # Its two silences (on instance and on host) were made, and lifted by the rescue.
    made = {key: silence for key, silence in _standby_silences().items() if key not in silenced_before}
    assert len(made) == 2 and all(s["status"]["state"] == "expired" for s in made.values()), made


def _standby_silences() -> dict[str, dict[str, Any]]:
    """The silences scale_out.yml made for the standby host, by id."""
    return {silence["id"]: silence for silence in httpx.get(f"{ALERTMANAGER}/api/v2/silences", timeout=10).json()
            if silence["createdBy"] == "llmfleet scale_out.yml"
            and f"planned maintenance of {STANDBY_HOST} (" in silence["comment"]}
