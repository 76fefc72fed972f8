"""What an operator notices after the redis and redis_exporter roles ran (converge.yml: test passwords, 64 MiB limit).

The exporter must read Redis's statistics as its own ACL user, and that user
must be unable to read or change anything else.
"""

from __future__ import annotations

import httpx
import pytest
import redis
from redis.exceptions import NoPermissionError

# TEST VALUE ONLY, as converge.yml sets it.
EXPORTER_PASSWORD = "molecule-test-only-exporter-7e3f08"
PORT = 9121
SERVICE = "prometheus-redis-exporter"
ENV_FILE = "/etc/default/prometheus-redis-exporter"


@pytest.fixture(scope="module")
def address(host) -> str:
    return str(host.check_output("hostname -I").split()[0])


@pytest.fixture(scope="module")
def metrics(address) -> str:
    return httpx.get(f"http://{address}:{PORT}/metrics", timeout=10).text


@pytest.fixture(scope="module")
def exporter_user(address) -> redis.Redis:
    return redis.Redis(host=address, port=6379, username="exporter", password=EXPORTER_PASSWORD,
                       decode_responses=True)


def test_the_service_runs_and_starts_at_boot(host):
    service = host.service(SERVICE)
    assert service.is_running
    assert service.is_enabled


def test_it_listens_on_the_hosts_address_only(host, address):
    assert host.socket(f"tcp://{address}:{PORT}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{PORT}").is_listening


def test_it_reads_redis_as_its_user(metrics):
    lines = metrics.splitlines()
    assert "redis_up 1" in lines
    # INFO's maxmemory, as the redis role set it (64mb): what RedisMemoryHigh divides by.
    assert "redis_memory_max_bytes 6.7108864e+07" in lines
    assert any(line.startswith("redis_memory_used_bytes ") for line in lines)


def test_the_password_is_in_a_root_only_file_and_nowhere_in_ps(host):
    env = host.file(ENV_FILE)
    assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
    assert EXPORTER_PASSWORD in env.content_string
    assert EXPORTER_PASSWORD not in host.check_output("ps auxww")
    assert EXPORTER_PASSWORD not in host.check_output(f"systemctl show {SERVICE}")


def test_the_acl_file_holds_the_exporters_hash_only(host):
    acl = host.file("/etc/redis/users.acl").content_string
    assert "user exporter on #" in acl
    assert EXPORTER_PASSWORD not in acl


@pytest.mark.parametrize(
    "command",
    [("GET", "llmfleet:job:1"), ("XLEN", "llmfleet:q:default"), ("KEYS", "*"), ("CONFIG", "GET", "*"),
     ("SET", "x", "1"), ("FLUSHALL",), ("ACL", "LIST"), ("SLOWLOG", "GET"), ("EVALSHA", "0" * 40, "0")],
)
def test_the_exporter_user_reads_no_key_and_changes_nothing(exporter_user, command):
    with pytest.raises(NoPermissionError):
        exporter_user.execute_command(*command)


def test_the_exporter_meets_no_refusal_but_slowlog_get(host, address):
    """Every scrape's commands are allowed, except SLOWLOG GET, refused on purpose (its entries carry prompts)."""
    admin = redis.Redis(host=address, port=6379, username="default",
                        password=host.file("/etc/redis/admin.password").content_string.strip(), decode_responses=True)
    admin.acl_log_reset()
    for _ in range(2):
        httpx.get(f"http://{address}:{PORT}/metrics", timeout=10).raise_for_status()
    refused = {entry["object"] for entry in admin.acl_log() if entry["username"] == "exporter"}
    assert refused <= {"slowlog|get"}, refused
