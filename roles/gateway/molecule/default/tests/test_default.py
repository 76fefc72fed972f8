"""What an operator notices on a gateway host after the worker and gateway roles ran.

converge.yml runs two workers and one gateway from the service image against
the test host's real Redis, with a STAND-IN engine address where nothing
listens (no vLLM here; the whole-stack lab serves real traffic). The workers
must start, register in Redis and report that engine unhealthy; the gateway
must verify tokens and say why it is not ready. Secrets must appear only as
0400 files mounted under /run/secrets: never in `docker inspect` or logs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jwt
import pytest

from llmfleet.serve.gateway.auth import mint

# TEST VALUES ONLY, as converge.yml and prepare.yml set them.
SECRETS = {
    "jwt": "molecule-test-only-jwt-key-6b1f0e93c2d4a857",
    "previous jwt": "molecule-test-only-previous-jwt-key-0c7d2e94",
    "gateway": "molecule-test-only-gateway-5a0d71",
    "worker": "molecule-test-only-worker-c3e98b",
}
WORKERS = ["llmfleet-worker-1", "llmfleet-worker-2"]
GATEWAY = "llmfleet-gateway-1"
UID = 2100
STOP_TIMEOUTS = {"llmfleet-worker-1": 10, "llmfleet-worker-2": 10, GATEWAY: 15}


@pytest.fixture(scope="module")
def address(host) -> str:
    """The address the role published the gateway on (the test host's own; `hostname -I` would list docker0 too)."""
    published: str = host.check_output(f"docker port {GATEWAY} 8080/tcp").splitlines()[0]
    return published.rsplit(":", 1)[0]


def inspect(host, container: str) -> dict[str, Any]:
    answer: list[dict[str, Any]] = json.loads(host.check_output(f"docker inspect {container}"))
    return answer[0]


def wait_for(probe, timeout_s: float = 60):
    """probe() until it returns something true; its last answer otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(1)


@pytest.mark.parametrize("container", [*WORKERS, GATEWAY])
def test_container_is_locked_down(host, container: str) -> None:
    info = inspect(host, container)
    config, hostconfig = info["Config"], info["HostConfig"]
    assert info["State"]["Running"]
    assert config["User"] == f"{UID}:{UID}"
    assert hostconfig["ReadonlyRootfs"] is True
    assert "/tmp" in hostconfig["Tmpfs"]
    assert "no-new-privileges:true" in hostconfig["SecurityOpt"]
    assert hostconfig["CapDrop"] == ["ALL"]
    assert hostconfig["RestartPolicy"]["Name"] == "unless-stopped"
    assert hostconfig["LogConfig"] == {"Type": "json-file", "Config": {"max-file": "5", "max-size": "20m"}}
    assert config["StopTimeout"] == STOP_TIMEOUTS[container]
    assert "/healthz" in " ".join(config["Healthcheck"]["Test"])


@pytest.mark.parametrize("container", [*WORKERS, GATEWAY])
def test_container_becomes_healthy(host, container: str) -> None:
    status = wait_for(lambda: inspect(host, container)["State"]["Health"]["Status"] == "healthy")
    assert status, inspect(host, container)["State"]["Health"]


@pytest.mark.parametrize("container", [*WORKERS, GATEWAY])
def test_secrets_are_files_only(host, container: str) -> None:
    info = inspect(host, container)
    env = dict(item.split("=", 1) for item in info["Config"]["Env"])
    assert env["LLMFLEET_REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password"
    mounts = {mount["Destination"]: mount for mount in info["Mounts"]}
    assert mounts["/run/secrets/redis_password"]["RW"] is False
    raw = host.check_output(f"docker inspect {container}") + host.check_output(f"docker logs {container} 2>&1")
    for secret in SECRETS.values():
        assert secret not in raw


def test_gateway_gets_its_jwt_key_as_a_file(host) -> None:
    env = dict(item.split("=", 1) for item in inspect(host, GATEWAY)["Config"]["Env"])
    assert env["LLMFLEET_GATEWAY_JWT_SECRET_FILE"] == "/run/secrets/gateway_jwt_secret"
    assert json.loads(env["LLMFLEET_GATEWAY_MODELS"]) == {"tiny": "/models/tiny"}


@pytest.mark.parametrize(
    "path",
    [
        "/etc/llmfleet/worker/redis_password",
        "/etc/llmfleet/gateway/redis_password",
        "/etc/llmfleet/gateway/jwt_secret",
        "/etc/llmfleet/gateway/jwt_previous_1",
    ],
)
def test_secret_files_are_0400_owned_by_the_container_user(host, path: str) -> None:
    secret = host.file(path)
    assert secret.mode == 0o400
    assert secret.uid == UID


def test_gateway_has_the_tokenizer_but_no_weights(host) -> None:
    files = host.check_output("ls /srv/llmfleet/gateway/models/tiny").split()
    assert sorted(files) == ["config.json", "tokenizer.json", "tokenizer_config.json"]


@pytest.mark.parametrize("index", [0, 1])
def test_worker_is_alive_but_not_ready_with_its_engine_down(address: str, index: int) -> None:
    port = 9400 + index
    assert httpx.get(f"http://{address}:{port}/healthz", timeout=5).status_code == 200
    ready = httpx.get(f"http://{address}:{port}/readyz", timeout=5)
    assert (ready.status_code, ready.text.strip()) == (503, "no healthy engine")
    metrics = httpx.get(f"http://{address}:{port}/metrics", timeout=5).text
    assert f'llmfleet_engine_up{{engine="http://{address}:8000"}} 0.0' in metrics


def test_workers_register_in_redis_and_report_the_engine_unhealthy(host) -> None:
    admin = host.file("/etc/redis/admin.password").content_string.strip()

    def cli(*args: str) -> str:
        return host.check_output(f"REDISCLI_AUTH={admin} redis-cli --no-auth-warning -h 127.0.0.1 " + " ".join(args))

    hostname = host.check_output("hostname")
    ids = {f"{hostname}-{name}" for name in WORKERS}
    assert wait_for(lambda: ids <= set(cli("SMEMBERS", "llmfleet:workers").split()))
    for worker in ids:
        report = json.loads(cli("GET", f"llmfleet:engines:{worker}"))
        assert [(engine["healthy"], engine["url"].rsplit(":", 1)[-1]) for engine in report["engines"]] == [
            (False, "8000")
        ]


def test_gateway_sees_the_workers_and_is_not_ready(address: str) -> None:
    assert httpx.get(f"http://{address}:8080/healthz", timeout=5).status_code == 200
    # /readyz and /metrics are on the ops listener (gateway_ops_port), never on the API port.
    ready = httpx.get(f"http://{address}:9300/readyz", timeout=5)
    assert ready.status_code == 503
    body = ready.json()
    assert body["redis"] is True and body["workers"] == 2 and body["healthy_engines"] == 0, body
    assert "llmfleet_gateway_redis_up 1.0" in httpx.get(f"http://{address}:9300/metrics", timeout=5).text
    for path in ("/readyz", "/metrics"):
        assert httpx.get(f"http://{address}:8080{path}", timeout=5).status_code == 404, path


def test_gateway_verifies_tokens_with_the_delivered_key(address: str) -> None:
    url = f"http://{address}:8080/v1/chat/completions"
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    forged = mint(subject="mallory", key="not-the-key-" + "x" * 32, models=["tiny"])
    assert httpx.post(url, json=request, headers={"Authorization": f"Bearer {forged}"}, timeout=10).status_code == 401
    token = mint(subject="molecule", key=SECRETS["jwt"], models=["tiny"])
    answer = httpx.post(url, json=request, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    # Past auth, the model check and the tokenizer: refused only because no engine is healthy.
    assert answer.status_code == 503, answer.text
    assert "Retry-After" in answer.headers


def _chat(address: str, token: str) -> httpx.Response:
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    return httpx.post(
        f"http://{address}:8080/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_a_token_signed_with_the_previous_key_verifies_during_the_rotation(address: str) -> None:
    answer = _chat(address, mint(subject="molecule", key=SECRETS["previous jwt"], models=["tiny"]))
    # Past auth: refused only because no engine is healthy.
    assert answer.status_code == 503, answer.text


def test_a_revoked_token_is_refused(host, address: str) -> None:
    token = mint(subject="molecule", key=SECRETS["jwt"], models=["tiny"])
    assert _chat(address, token).status_code == 503
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    admin = host.file("/etc/redis/admin.password").content_string.strip()
    host.check_output(
        f"REDISCLI_AUTH={admin} redis-cli --no-auth-warning -h 127.0.0.1 SET llmfleet:revoked:{jti} 1 EX 3600"
    )
    refused = _chat(address, token)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "token_revoked", refused.text



def test_the_service_image_carries_only_what_serves(host) -> None:
    # The image installs llmfleet bare (files/images/llmfleet-service): no Ansible, and the CLI offers the
    # serving commands only, pointing at the ops extra for the rest.
    usage = host.check_output(f"docker exec {GATEWAY} llmfleet --help")
    for command in ("gateway", "worker", "token"):
        assert f"    {command} " in usage
    for command in ("lab", "image", "scaler", "bench"):
        assert f"    {command} " not in usage
    assert "llmfleet[ops]" in usage
    ansible = host.run(f"docker exec {GATEWAY} python3 -c 'import ansible'")
    assert ansible.rc != 0 and "No module named 'ansible'" in ansible.stderr
