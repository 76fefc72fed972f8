"""The measurement of `llmfleet bench usage` (usagecost.py): requests through the queue's real scripts.

A redis-server on a free loopback port, in a temporary directory, with the
redis role's persistence (AOF, fsync every second), stopped at the end; the
rounds of both arms against it, in pairs (ABBA); and the worker's Python that
differs between the arms, timed on its own. Kept apart from usagecost.py because
it needs the service libraries (redis), which no `llmfleet` command may import
before it runs (tests/unit/test_cli_imports.py); usagecost.py imports it when the
command runs, so this module hands back plain readings (Reading) rather than
usagecost's Round, and imports nothing of it.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
import redis.asyncio as aioredis

from llmfleet.bench.peers import free_loopback_port
from llmfleet.errors import LlmfleetError
from llmfleet.serve.queue.config import QueueSettings
from llmfleet.serve.queue.consumer import Consumer, Entry
from llmfleet.serve.queue.jobs import Job, Result, now_ms
from llmfleet.serve.queue.producer import Producer

# One round's reading: (arm, requests, this process's CPU s, redis-server's CPU s, s inside the scripts).
Reading = tuple[str, int, float, float, float]

MODEL = "tiny"
# Subjects the requests cycle through: one usage record each per day and model, as a site's keys would have.
SUBJECTS = 50
REDIS_START_S = 20.0


@contextmanager
def redis_server(workdir: Path) -> Iterator[aioredis.Redis]:
    """A redis-server on a free loopback port, persisting as the redis role does; yields a client, then stops it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise LlmfleetError("redis-server is not installed: run scripts/bootstrap.sh (it installs Debian's)")
    port = free_loopback_port()
    password = secrets.token_hex(16)
    config = workdir / "redis.conf"
    config.touch(mode=0o600)
    config.write_text(
        f"port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir {workdir}\n"
        f'appendonly yes\nappendfsync everysec\nsave ""\nrequirepass {password}\n'
    )
    log = workdir / "redis.log"
    with log.open("ab") as out:
        process = subprocess.Popen([binary, str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, port, password, log)
        yield aioredis.Redis(port=port, password=password, decode_responses=True)
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_ready(process: subprocess.Popen[bytes], port: int, password: str, log: Path) -> None:
    deadline = time.monotonic() + REDIS_START_S
    with redis.Redis(port=port, password=password, socket_timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise LlmfleetError(f"redis-server exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            time.sleep(0.05)
    raise LlmfleetError(f"redis-server did not answer PING within {REDIS_START_S:g} s: {log.read_text()[-2000:]}")


def _job(number: int, settings: QueueSettings) -> Job:
    now = now_ms()
    subject = f"bench-{number % SUBJECTS}"
    return Job(
        id=secrets.token_hex(16),
        kind="chat",
        model=MODEL,
        payload={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
        stream=False,
        reply=f"{settings.prefix}:reply:bench",
        subject=subject,
        tenant=subject,
        lane="normal",
        prompt_tokens=12,
        max_tokens=16,
        enqueued_ms=now,
        deadline_ms=now + 60_000,
        queue_deadline_ms=now + 30_000,
    )


ANSWER = Result(
    200,
    {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
    },
)


async def _one_request(producer: Producer, consumer: Consumer, number: int) -> None:
    job = _job(number, producer.settings)
    admission = await producer.admit(
        job,
        mode="sync",
        limits=(),
        concurrency_cap=0,
        lease_ms=60_000,
        tier="bench",
        cost=job.prompt_tokens + job.max_tokens,
    )
    if admission.outcome != "admitted":
        raise LlmfleetError(f"ADMIT refused a benchmark request: {admission.outcome}")
    (entry,) = await consumer.take(1)
    start = await consumer.begin(entry.request_id)
    if start.outcome != "run" or await consumer.deliver(entry, job, start.attempt, ANSWER, fenced=False) != 1:
        raise LlmfleetError(f"the benchmark request {job.id} was not delivered once (BEGIN: {start.outcome})")


async def _redis_cpu_s(client: aioredis.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def _scripts_s(client: aioredis.Redis) -> float:
    """Redis's time inside EVALSHA so far: every script the path runs (redis-py's Script calls EVALSHA)."""
    stats = await client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0)) / 1e6


def python_cost(consumer: Consumer, baseline: Consumer, repeat: int = 20_000) -> float:
    """Milliseconds the records add to the worker's Python per request: building DELIVER's arguments.

    Both arms pass the same arguments (zeros for the baseline), so building them is the only Python that
    differs; timed on its own, the best of five runs of `repeat` calls each, far below the path's noise.
    """
    settings = consumer.settings
    job = _job(0, settings)
    entry = Entry("normal", "1-0", {"id": job.id}, model=MODEL)

    def per_call(arm: Consumer) -> float:
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeat):
                arm._deliver_args(entry, job, job.id, 1, ANSWER, fenced=False)
            best = min(best, time.perf_counter() - started)
        return 1000 * best / repeat

    return max(per_call(consumer) - per_call(baseline), 0.0)


async def measure(client: aioredis.Redis, rounds: int, per_round: int) -> tuple[list[Reading], float]:
    settings = QueueSettings(prefix="llmfleet-bench", max_depth=per_round + 10)
    producer = Producer(client, settings, "bench-gateway")
    arms = {
        "records": Consumer(client, client, settings, "bench-worker"),
        "baseline": Consumer(client, client, settings, "bench-worker", record_usage=False),
    }
    await producer.ensure_groups([MODEL])
    for consumer in arms.values():
        await consumer.follow([MODEL])
    # A first round of each arm warms Redis's script cache and Python's, and is not counted.
    for consumer in arms.values():
        for number in range(min(per_round, 200)):
            await _one_request(producer, consumer, number)
    measured: list[Reading] = []
    for pair in range(rounds):
        # Each pair in the other order than the last (ABBA), so that neither arm always runs on fuller Redis.
        for arm in ("records", "baseline") if pair % 2 == 0 else ("baseline", "records"):
            redis_before, scripts_before = await _redis_cpu_s(client), await _scripts_s(client)
            client_before = time.process_time()
            for number in range(per_round):
                await _one_request(producer, arms[arm], number)
            client_cpu = time.process_time() - client_before
            redis_cpu, scripts = await _redis_cpu_s(client) - redis_before, await _scripts_s(client) - scripts_before
            measured.append((arm, per_round, client_cpu, redis_cpu, scripts))
    return measured, python_cost(arms["records"], arms["baseline"])


async def run(rounds: int, per_round: int) -> tuple[list[Reading], float]:
    """Both arms' rounds, and what the records add to the worker's Python (ms a request)."""
    with tempfile.TemporaryDirectory(prefix="llmfleet-bench-usage-") as workdir, redis_server(Path(workdir)) as client:
        try:
            return await measure(client, rounds, per_round)
        finally:
            await client.aclose()
