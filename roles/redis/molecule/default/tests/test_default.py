"""What an operator notices on a host after the redis role ran.

The services' own queue code (llmfleet.queue: the gateway's Producer and
registry reads, the worker's Consumer, their Lua scripts) runs here against the
test host's Redis as the two ACL users, over the address Redis binds besides
loopback: the ACL must allow exactly what they do, and refuse the rest.
converge.yml sets the test passwords, appendfsync always and a 64 MiB limit.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError

from llmfleet.serve.queue import registry
from llmfleet.serve.queue.config import QueueSettings
from llmfleet.serve.queue.consumer import Consumer
from llmfleet.serve.queue.jobs import Job, Result, now_ms
from llmfleet.serve.queue.producer import Limit, Producer

# TEST VALUES ONLY, as converge.yml sets them.
PASSWORDS = {"gateway": "molecule-test-only-gateway-3f9c2a", "worker": "molecule-test-only-worker-8d1e7b"}
ADMIN_FILE = "/etc/redis/admin.password"
SERVICE = "redis-server"
PORT = 6379


@pytest.fixture(scope="module")
def address(host) -> str:
    """The test host's own address (the role binds it besides loopback): reachable from here."""
    return host.check_output("hostname -I").split()[0]


@pytest.fixture(scope="module")
def admin_password(host) -> str:
    return host.file(ADMIN_FILE).content_string.strip()


def connect(address: str, user: str | None, password: str | None) -> redis.Redis:
    return redis.Redis(host=address, port=PORT, username=user, password=password, decode_responses=True)


@pytest.fixture(scope="module")
def admin(address, admin_password) -> redis.Redis:
    return connect(address, "default", admin_password)


def wait_for_redis(address: str, admin_password: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if connect(address, "default", admin_password).ping():
                return
        except (redis.ConnectionError, redis.BusyLoadingError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def test_the_service_runs_and_starts_at_boot(host):
    service = host.service(SERVICE)
    assert service.is_running
    assert service.is_enabled


def test_files_belong_to_redis_and_stay_private(host):
    data = host.file("/var/lib/redis")
    assert (data.user, data.group, data.mode) == ("redis", "redis", 0o750)
    acl = host.file("/etc/redis/users.acl")
    assert (acl.user, acl.group, acl.mode) == ("redis", "redis", 0o600)
    conf = host.file("/etc/redis/redis.conf")
    assert (conf.user, conf.group, conf.mode) == ("redis", "redis", 0o640)
    admin = host.file(ADMIN_FILE)
    assert (admin.user, admin.group, admin.mode) == ("root", "root", 0o600)
    assert len(admin.content_string.strip()) == 64


def test_the_acl_file_holds_hashes_not_passwords(host):
    content = host.file("/etc/redis/users.acl").content_string
    for user, password in PASSWORDS.items():
        assert password not in content
        assert f"user {user} on #{hashlib.sha256(password.encode()).hexdigest()} " in content


def test_unauthenticated_commands_are_refused(address):
    with pytest.raises(AuthenticationError):
        connect(address, None, None).ping()
    with pytest.raises(AuthenticationError):
        connect(address, "default", "not-the-password").ping()
    with pytest.raises(AuthenticationError):
        connect(address, "gateway", PASSWORDS["worker"]).ping()


def test_loopback_refuses_unauthenticated_commands_too(host):
    reply = host.check_output("redis-cli -h 127.0.0.1 -p %s PING", str(PORT))
    assert "NOAUTH" in reply


def test_persistence_and_memory_settings(admin):
    config = admin.config_get("*")
    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "always"
    assert config["maxmemory-policy"] == "noeviction"
    assert config["maxmemory"] == str(64 * 1024 * 1024)
    assert config["slowlog-log-slower-than"] == "20000"
    assert config["save"] == ""
    assert config["protected-mode"] == "yes"


def settings() -> QueueSettings:
    return QueueSettings(prefix="llmfleet", claim_idle_ms=200)


def job(request_id: str, reply: str) -> Job:
    now = now_ms()
    return Job(
        id=request_id,
        kind="completion",
        model="tiny",
        payload={"prompt": "hi", "max_tokens": 4},
        stream=True,
        reply=reply,
        subject="alice",
        tenant="acme",
        lane="normal",
        prompt_tokens=1,
        max_tokens=4,
        enqueued_ms=now,
        deadline_ms=now + 60_000,
        queue_deadline_ms=now + 30_000,
    )


async def queue_round_trip(address: str) -> dict:
    """One request through the services' own code, each side as its own ACL user."""
    url = f"redis://{address}:{PORT}/0"
    gateway = aioredis.Redis.from_url(url, username="gateway", password=PASSWORDS["gateway"], decode_responses=True)
    worker = aioredis.Redis.from_url(url, username="worker", password=PASSWORDS["worker"], decode_responses=True)
    try:
        await gateway.client_setname("molecule-gateway")
        producer = Producer(gateway, settings(), "molecule-gw")
        consumer = Consumer(worker, worker, settings(), "molecule-worker")
        await producer.ensure_groups(["tiny"])
        await consumer.follow(["tiny"])

        # The worker's cancel listener, as llmfleet.serve.worker subscribes.
        pubsub = worker.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(producer.keys.cancel_channel)

        # Worker registry: the worker reports, the gateway reads.
        report = registry.EngineReport("http://engine:8000", True, {"tiny": 2048})
        await registry.publish(worker, producer.keys, "molecule-worker", [report], ttl_s=30, draining=False)
        snapshot = await registry.read(gateway, producer.keys)

        request_id = uuid.uuid4().hex
        limits = (Limit("subject", "requests", producer.keys.rate("sub", "req", "alice"), 100, 1),)
        admission = await producer.admit(
            job(request_id, producer.reply_key), mode="sync", limits=limits, concurrency_cap=4, lease_ms=60_000
        )
        depth = await producer.depth("tiny")

        entries = await consumer.take(4)
        if not entries:
            entries = await consumer.wait_take(4, 500)
        entry = entries[0]
        start = await consumer.begin(request_id)
        taken = Job.from_json(entry.fields["job"])
        seq = await consumer.chunk(taken, start.attempt, 1, "hel", 1, ["{}"])
        touched = await consumer.touch([entry])
        cancelled = await consumer.cancelled([request_id])
        worker_backlog = await consumer.backlog()
        delivered = await consumer.deliver(entry, taken, start.attempt, Result(200, {"text": "hello"}), fenced=True)

        result = await producer.result(request_id)
        state = await producer.job_state(request_id)
        replies = await gateway.xread({producer.reply_key: "0-0"}, count=10)
        await gateway.xinfo_stream(producer.reply_key)
        await gateway.xtrim(producer.reply_key, maxlen=1000)
        await producer.cancel(request_id, "alice")
        await registry.withdraw(worker, producer.keys, "molecule-worker")
        await pubsub.aclose()
        return {
            "workers": snapshot.workers,
            "admission": admission.outcome,
            "depth": depth["normal"],
            "start": start.outcome,
            "seq": seq,
            "touched": touched,
            "cancelled": cancelled,
            "pending": worker_backlog[("normal", "tiny")].pending,
            "delivered": delivered,
            "result": result.body if result else None,
            "state": state.get("state"),
            "reply_kinds": [fields["kind"] for _, rows in replies for _, fields in rows],
        }
    finally:
        await gateway.aclose()
        await worker.aclose()


def test_the_services_queue_code_runs_as_their_users(address):
    outcome = asyncio.run(queue_round_trip(address))
    assert outcome == {
        "workers": 1,
        "admission": "admitted",
        "depth": 1,
        "start": "run",
        "seq": 1,
        "touched": 1,
        "cancelled": set(),
        "pending": 1,
        "delivered": 1,
        "result": {"text": "hello"},
        "state": "done",
        "reply_kinds": ["chunk", "final"],
    }


async def reclaim_and_dead_letter(address: str) -> tuple[int, int]:
    """A dead worker's entry is reclaimed (XAUTOCLAIM) and, past its attempts, dead-lettered."""
    url = f"redis://{address}:{PORT}/0"
    gateway = aioredis.Redis.from_url(url, username="gateway", password=PASSWORDS["gateway"], decode_responses=True)
    worker = aioredis.Redis.from_url(url, username="worker", password=PASSWORDS["worker"], decode_responses=True)
    try:
        producer = Producer(gateway, settings(), "molecule-gw")
        ghost = Consumer(worker, worker, settings(), "molecule-ghost")
        heir = Consumer(worker, worker, settings(), "molecule-heir")
        # A worker reads only the queues of the models its engines serve (job() is for "tiny").
        await ghost.follow(["tiny"])
        await heir.follow(["tiny"])
        request_id = uuid.uuid4().hex
        await producer.admit(job(request_id, ""), mode="task", limits=(), concurrency_cap=0, lease_ms=1000)
        for entry in await ghost.take(100):
            if entry.request_id == request_id:
                break
        await asyncio.sleep(0.4)
        reclaimed = [entry for entry in await heir.reclaim(100) if entry.request_id == request_id]
        outcome = await heir.dead_letter(reclaimed[0], None, "test", 3, Result(502, {"error": "test"}))
        return len(reclaimed), outcome
    finally:
        await gateway.aclose()
        await worker.aclose()


def test_workers_can_reclaim_and_dead_letter(address):
    assert asyncio.run(reclaim_and_dead_letter(address)) == (1, 1)


FORBIDDEN_FOR_BOTH = [
    ("CONFIG", "GET", "*"),
    ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("BGREWRITEAOF",),
    ("SHUTDOWN",),
    ("ACL", "LIST"),
    ("EVAL", "return 1", "0"),
    ("SCRIPT", "FLUSH"),
    ("CLIENT", "KILL", "127.0.0.1:1"),
    ("GET", "other-app:secret"),
    ("SET", "llmfleetx:q:normal", "1"),
]


@pytest.mark.parametrize("user", ["gateway", "worker"])
@pytest.mark.parametrize("command", FORBIDDEN_FOR_BOTH, ids=" ".join)
def test_service_users_cannot_administer_or_leave_their_keys(address, user, command):
    client = connect(address, user, PASSWORDS[user])
    with pytest.raises(NoPermissionError):
        client.execute_command(*command)


@pytest.mark.parametrize(
    ("user", "command"),
    [
        # The worker has no business with rate limits, nor with publishing cancels.
        ("worker", ("HGETALL", "llmfleet:rl:sub:req:alice")),
        ("worker", ("PUBLISH", "llmfleet:cancel", "x")),
        # The gateway never reads streamed text or dead letters, nor takes work.
        ("gateway", ("GET", "llmfleet:partial:x")),
        ("gateway", ("XLEN", "llmfleet:dlq")),
        ("gateway", ("XREADGROUP", "GROUP", "workers", "gw", "COUNT", "1", "STREAMS", "llmfleet:q:normal", ">")),
        ("gateway", ("SUBSCRIBE", "llmfleet:cancel")),
    ],
    ids=lambda value: value if isinstance(value, str) else " ".join(value[:2]),
)
def test_each_service_user_has_only_its_own_rights(address, user, command):
    client = connect(address, user, PASSWORDS[user])
    with pytest.raises(NoPermissionError):
        client.execute_command(*command)


def test_a_channel_outside_the_prefix_is_refused(address):
    client = connect(address, "worker", PASSWORDS["worker"])
    with pytest.raises(NoPermissionError):
        client.execute_command("SUBSCRIBE", "other-app:events")


def restart_and_wait(host, address, admin_password, *, kill: bool) -> None:
    if kill:
        # Restart=always brings it back; with appendfsync always nothing acknowledged is lost.
        host.run_test("systemctl kill --signal=SIGKILL %s", SERVICE)
        time.sleep(1)
    else:
        host.run_test("systemctl restart %s", SERVICE)
    wait_for_redis(address, admin_password)


@pytest.mark.parametrize("kill", [False, True], ids=["restart", "kill -9"])
def test_acknowledged_writes_survive_a_restart(host, address, admin_password, kill):
    # Written by a Lua script (ADMIT), which the AOF stores as MULTI/EXEC: the
    # part Redis 7.0 drops on loading when the default user is off.
    request_id = uuid.uuid4().hex

    async def admit() -> str:
        client = aioredis.Redis(
            host=address, port=PORT, username="gateway", password=PASSWORDS["gateway"], decode_responses=True
        )
        try:
            producer = Producer(client, settings(), "molecule-durable")
            admission = await producer.admit(
                job(request_id, ""), mode="task", limits=(), concurrency_cap=0, lease_ms=1000
            )
            return admission.outcome
        finally:
            await client.aclose()

    assert asyncio.run(admit()) == "admitted"
    pid_before = host.check_output("systemctl show --property MainPID --value %s", SERVICE)
    restart_and_wait(host, address, admin_password, kill=kill)
    assert host.check_output("systemctl show --property MainPID --value %s", SERVICE) != pid_before
    admin = connect(address, "default", admin_password)
    assert admin.hget(f"llmfleet:job:{request_id}", "state") == "queued"
    ids = [fields["id"] for _, fields in admin.xrange("llmfleet:q:tiny:normal")]
    assert request_id in ids


def test_passwords_are_not_in_ps(host, admin_password):
    processes = host.check_output("ps -eo args --no-headers")
    assert "redis-server" in processes
    for secret in (*PASSWORDS.values(), admin_password):
        assert secret not in processes


def test_passwords_are_not_in_the_journal(host, admin_password):
    journal = host.check_output("journalctl --no-pager --output cat")
    assert "accept connections" in journal.lower()
    for secret in (*PASSWORDS.values(), admin_password):
        assert secret not in journal


def test_passwords_are_in_no_file_but_the_admin_one(host, admin_password):
    # Service passwords: nowhere on disk (the ACL file holds hashes). The admin
    # password: only in its root-only file.
    found = host.run(
        "grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e %s -e %s -e %s /",
        *PASSWORDS.values(),
        admin_password,
    )
    assert found.stdout.split() == [ADMIN_FILE]
