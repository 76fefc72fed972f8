"""Token revocation for real: `llmfleet token revoke` as the redis role's revoker user, the gateway as its
gateway user, one redis-server on loopback with the role's ACL (roles/redis/vars/main.yml), and the gateway
app answering through its own lifespan and Redis client.

Needs only redis-server (no engine, no Docker).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jwt
import pytest
import redis
import yaml
from fastapi.testclient import TestClient

from llmfleet.paths import REPO_ROOT
from llmfleet.serve.gateway.app import create_app
from llmfleet.serve.gateway.auth import mint
from llmfleet.serve.gateway.config import GatewaySettings
from tests.integration.serve.gateway.gatewaystack import STARTUP_S, wait_for
from tests.tools import free_loopback_port

PREFIX = "revtest"


def role_acl(service: str, password: str) -> str:
    """The ACL line roles/redis/templates/users.acl.j2 writes for a service, with a plain-text password."""
    rules = yaml.safe_load((REPO_ROOT / "roles" / "redis" / "vars" / "main.yml").read_text())
    grants = rules["__redis_acl_services"][service]
    keys = [f"~{PREFIX}:{key}" for key in grants["keys"]]
    keys += [f"%R~{PREFIX}:{key}" for key in grants.get("read_keys", [])]
    keys += [f"%W~{PREFIX}:{key}" for key in grants.get("write_keys", [])]
    channels = " ".join(f"&{PREFIX}:{channel}" for channel in grants["channels"])
    connection = rules["__redis_acl_connection_commands"] if grants.get("connection_commands", True) else []
    commands = " ".join(f"+{command}" for command in connection + grants["commands"])
    return f"user {service} on >{password} resetkeys {' '.join(keys)} resetchannels {channels} -@all {commands}"


@dataclass
class Site:
    port: int
    passwords: dict[str, Path]
    secret: str
    settings: GatewaySettings

    def client(self, user: str) -> redis.Redis:
        password = self.passwords[user].read_text()
        return redis.Redis(port=self.port, username=user, password=password, decode_responses=True)

    def revoke(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("LLMFLEET_")}
        env.update(
            {
                "LLMFLEET_REDIS_URL": f"redis://127.0.0.1:{self.port}/0",
                "LLMFLEET_REDIS_USERNAME": "revoker",
                "LLMFLEET_REDIS_PASSWORD_FILE": str(self.passwords["revoker"]),
                "LLMFLEET_QUEUE_PREFIX": PREFIX,
            }
        )
        return subprocess.run(
            [sys.executable, "-m", "llmfleet", "token", "revoke", *args],
            input=stdin,
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def site(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    port = free_loopback_port()
    passwords: dict[str, Path] = {}
    for user in ("gateway", "revoker", "admin"):
        passwords[user] = tmp_path / f"{user}.password"
        passwords[user].write_text(secrets.token_hex(24))
        passwords[user].chmod(0o600)
    config = tmp_path / "redis.conf"
    config.write_text(
        f'port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir {tmp_path}\nsave ""\nappendonly no\n'
        f"user default on >{secrets.token_hex(16)} ~* &* +@all\n"
        f"user admin on >{passwords['admin'].read_text()} ~* &* +@all\n"
        f"{role_acl('gateway', passwords['gateway'].read_text())}\n"
        f"{role_acl('revoker', passwords['revoker'].read_text())}\n"
    )
    config.chmod(0o600)
    secret_file = tmp_path / "jwt.secret"
    secret_file.write_text(secrets.token_hex(32))
    secret_file.chmod(0o600)
    with (tmp_path / "redis.log").open("ab") as log:
        process = subprocess.Popen(["redis-server", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        probe = redis.Redis(port=port, username="gateway", password=passwords["gateway"].read_text())

        def ready() -> bool:
            try:
                return bool(probe.ping())
            except redis.RedisError:
                return False

        wait_for(ready, STARTUP_S, f"redis-server on port {port}")
        for name in list(os.environ):
            if name.startswith("LLMFLEET_"):
                monkeypatch.delenv(name)
        for name, value in {
            "LLMFLEET_GATEWAY_MODELS": json.dumps({"tiny": str(tiny_model)}),
            "LLMFLEET_GATEWAY_JWT_SECRET_FILE": str(secret_file),
            "LLMFLEET_GATEWAY_JWT_REVOCATION": "true",
            "LLMFLEET_REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "LLMFLEET_REDIS_USERNAME": "gateway",
            "LLMFLEET_REDIS_PASSWORD_FILE": str(passwords["gateway"]),
            "LLMFLEET_QUEUE_PREFIX": PREFIX,
        }.items():
            monkeypatch.setenv(name, value)
        yield Site(port, passwords, secret_file.read_text(), GatewaySettings.from_env())
    finally:
        process.terminate()
        process.wait(timeout=30)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_revoked_token_gets_401_token_revoked_from_the_gateway(site: Site) -> None:
    token = mint(subject="alice", key=site.secret, ttl_s=3600)
    other = mint(subject="alice", key=site.secret, ttl_s=3600)
    token_id = jwt.decode(token, options={"verify_signature": False})["jti"]
    with TestClient(create_app(site.settings)) as client:
        assert client.get("/v1/models", headers=_bearer(token)).status_code == 200  # verified, now cached
        done = site.revoke("--token-file", "-", stdin=token)
        assert done.returncode == 0, done.stderr
        assert token_id in done.stdout
        answer = client.get("/v1/models", headers=_bearer(token))
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "token_revoked"
        assert client.get("/v1/models", headers=_bearer(other)).status_code == 200  # another jti of alice
    # Kept for the token's remaining life plus the largest leeway (600 s), not forever.
    with site.client("admin") as admin:
        assert 3600 < admin.ttl(f"{PREFIX}:revoked:{token_id}") <= 3600 + 600


def test_revoke_by_jti_and_the_least_privilege_of_both_users(site: Site) -> None:
    done = site.revoke("--jti", "abc123", "--ttl", "2h")
    assert done.returncode == 0, done.stderr
    with site.client("admin") as admin:
        assert 7200 < admin.ttl(f"{PREFIX}:revoked:abc123") <= 7200 + 600
    with site.client("gateway") as gateway:
        assert gateway.exists(f"{PREFIX}:revoked:abc123") == 1
        # The gateway may read the list but never write it: it cannot revoke, nor unrevoke, a token.
        for command in (["SET", f"{PREFIX}:revoked:other", "1"], ["EXPIRE", f"{PREFIX}:revoked:abc123", "1"]):
            with pytest.raises(redis.exceptions.NoPermissionError):
                gateway.execute_command(*command)
    with site.client("revoker") as revoker:
        # The revoker may write revocations and nothing else.
        for command in (
            ["GET", f"{PREFIX}:revoked:abc123"],
            ["TTL", f"{PREFIX}:revoked:abc123"],
            ["DEL", f"{PREFIX}:revoked:abc123"],
            ["SET", f"{PREFIX}:q:high", "1"],
            ["SET", "elsewhere", "1"],
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                revoker.execute_command(*command)


def test_revoke_refuses_a_token_without_jti(site: Site) -> None:
    claims = {"sub": "a", "iss": "llmfleet", "aud": "llmfleet", "exp": 2**31}
    done = site.revoke("--token-file", "-", stdin=jwt.encode(claims, site.secret, "HS256"))
    assert done.returncode != 0
    assert "no jti" in done.stderr
