"""JWT keys beyond one static key: two keys during a rotation, a JWKS URL, and revocation by jti."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from redis.exceptions import ConnectionError as RedisConnectionError

from llmfleet.serve.gateway.auth import Verifier, mint, revoked_key
from llmfleet.serve.gateway.config import GatewaySettings
from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.queue.config import SettingsError

Make = Callable[..., GatewaySettings]
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def _secret(tmp_path: Path, name: str) -> tuple[Path, str]:
    value = secrets.token_hex(32)
    path = tmp_path / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path, value


def _private_pem(key: PrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _public_pem(key: PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def _refusal(verifier: Verifier, token: str) -> APIError:
    with pytest.raises(APIError) as error:
        verifier.verify(token)
    return error.value


# --- Rotation ------------------------------------------------------------------------


def test_two_shared_secrets_verify_during_a_rotation(make_settings: Make, tmp_path: Path, secret_file: Path) -> None:
    current = secret_file.read_text().strip()
    old_file, old = _secret(tmp_path, "jwt.secret.old")
    verifier = Verifier(make_settings(LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES=json.dumps([str(old_file)])))
    assert verifier.verify(mint(subject="new", key=current)).subject == "new"
    assert verifier.verify(mint(subject="old", key=old)).subject == "old"
    stranger = secrets.token_hex(32)
    assert "signature is wrong" in _refusal(verifier, mint(subject="x", key=stranger)).message
    # Once the old file is dropped from the settings, its tokens are refused.
    assert (
        "signature is wrong"
        in _refusal(
            Verifier(make_settings(LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES=None)), mint(subject="old", key=old)
        ).message
    )


def test_a_claim_error_of_the_second_key_is_reported_as_such(make_settings: Make, tmp_path: Path) -> None:
    """The signature fits the second key; its expiry is what is wrong, and the 401 says so."""
    old_file, old = _secret(tmp_path, "jwt.secret.old")
    verifier = Verifier(make_settings(LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES=json.dumps([str(old_file)])))
    token = mint(subject="old", key=old, ttl_s=1, now=1_000_000)
    assert "expired" in _refusal(verifier, token).message


def test_two_public_keys_verify_during_a_rotation(make_settings: Make, tmp_path: Path) -> None:
    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    old_key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "new.pub").write_text(_public_pem(new_key))
    (tmp_path / "old.pub").write_text(_public_pem(old_key))
    verifier = Verifier(
        make_settings(
            LLMFLEET_GATEWAY_JWT_SECRET_FILE=None,
            LLMFLEET_GATEWAY_JWT_PUBLIC_KEY_FILE=str(tmp_path / "new.pub"),
            LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES=json.dumps([str(tmp_path / "old.pub")]),
            LLMFLEET_GATEWAY_JWT_ALGORITHMS='["RS256", "ES256"]',
        )
    )
    assert verifier.verify(mint(subject="n", key=_private_pem(new_key), algorithm="RS256")).subject == "n"
    assert verifier.verify(mint(subject="o", key=_private_pem(old_key), algorithm="ES256")).subject == "o"


def test_an_extra_key_file_is_checked_like_the_main_one(make_settings: Make, tmp_path: Path) -> None:
    short = tmp_path / "short.secret"
    short.write_text("too-short-for-hmac\n")
    short.chmod(0o600)
    with pytest.raises(SettingsError, match=r"EXTRA_KEY_FILES\[0\].*shorter than 32"):
        Verifier(make_settings(LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES=json.dumps([str(short)])))


def test_extra_key_files_do_not_go_with_a_jwks(make_settings: Make, tmp_path: Path, secret_file: Path) -> None:
    with pytest.raises(ValueError, match="EXTRA_KEY_FILES goes with"):
        make_settings(
            LLMFLEET_GATEWAY_JWT_SECRET_FILE=None,
            LLMFLEET_GATEWAY_JWT_JWKS_URL="https://idp.example/jwks.json",
            LLMFLEET_GATEWAY_JWT_ALGORITHMS='["RS256"]',
            LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES=json.dumps([str(secret_file)]),
        )


# --- JWKS URL --------------------------------------------------------------------------


class JWKSHandler(BaseHTTPRequestHandler):
    """Serves `document` (a class attribute the test changes) at /jwks.json and counts the requests."""

    document: ClassVar[dict[str, Any]] = {"keys": []}
    status: ClassVar[int] = 200
    requests: ClassVar[int] = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        type(self).requests += 1
        body = json.dumps(self.document).encode()
        self.send_response(self.status if self.path == "/jwks.json" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def jwks_server() -> Iterator[tuple[str, type[JWKSHandler]]]:
    handler = type("Handler", (JWKSHandler,), {"document": {"keys": []}, "status": 200, "requests": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _jwk(key: PrivateKey, kid: str) -> dict[str, Any]:
    public = key.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(public, as_dict=True)
    elif isinstance(public, ec.EllipticCurvePublicKey):
        jwk = jwt.algorithms.ECAlgorithm.to_jwk(public, as_dict=True)
    else:
        jwk = jwt.algorithms.OKPAlgorithm.to_jwk(public, as_dict=True)
    return {**jwk, "kid": kid, "use": "sig"}


def _url_verifier(make_settings: Make, url: str, algorithms: list[str], **env: str) -> Verifier:
    return Verifier(
        make_settings(
            LLMFLEET_GATEWAY_JWT_SECRET_FILE=None,
            LLMFLEET_GATEWAY_JWT_JWKS_URL=url,
            LLMFLEET_GATEWAY_JWT_ALGORITHMS=json.dumps(algorithms),
            **env,
        )
    )


def _authenticate(verifier: Verifier, token: str) -> str:
    return asyncio.run(verifier.authenticate(token)).subject


def _refused_async(verifier: Verifier, token: str) -> APIError:
    with pytest.raises(APIError) as error:
        asyncio.run(verifier.authenticate(token))
    return error.value


def test_jwks_url_keys_are_fetched_once_and_picked_by_kid(
    make_settings: Make, jwks_server: tuple[str, type[JWKSHandler]]
) -> None:
    url, handler = jwks_server
    one = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    two = ec.generate_private_key(ec.SECP256R1())
    handler.document = {"keys": [_jwk(one, "one"), _jwk(two, "two")]}
    verifier = _url_verifier(make_settings, url, ["RS256", "ES256"])
    assert _authenticate(verifier, mint(subject="a", key=_private_pem(one), algorithm="RS256", key_id="one")) == "a"
    assert _authenticate(verifier, mint(subject="b", key=_private_pem(two), algorithm="ES256", key_id="two")) == "b"
    assert _authenticate(verifier, mint(subject="c", key=_private_pem(one), algorithm="RS256", key_id="one")) == "c"
    assert handler.requests == 1
    # The kid names the key: a token of key one that claims kid two is refused.
    forged = mint(subject="x", key=_private_pem(one), algorithm="RS256", key_id="two")
    assert _refused_async(verifier, forged).status == 401


def test_an_unknown_kid_fetches_again_but_not_more_than_the_rate_limit(
    make_settings: Make, jwks_server: tuple[str, type[JWKSHandler]]
) -> None:
    url, handler = jwks_server
    one = ec.generate_private_key(ec.SECP256R1())
    new = ec.generate_private_key(ec.SECP256R1())
    handler.document = {"keys": [_jwk(one, "one")]}
    verifier = _url_verifier(make_settings, url, ["ES256"], LLMFLEET_GATEWAY_JWT_JWKS_MIN_REFRESH_S="0")
    assert _authenticate(verifier, mint(subject="a", key=_private_pem(one), algorithm="ES256", key_id="one")) == "a"
    handler.document = {"keys": [_jwk(one, "one"), _jwk(new, "new")]}  # the provider rotates
    assert _authenticate(verifier, mint(subject="b", key=_private_pem(new), algorithm="ES256", key_id="new")) == "b"
    assert handler.requests == 2

    limited = _url_verifier(make_settings, url, ["ES256"], LLMFLEET_GATEWAY_JWT_JWKS_MIN_REFRESH_S="60")
    assert _authenticate(limited, mint(subject="a", key=_private_pem(one), algorithm="ES256", key_id="one")) == "a"
    before = handler.requests
    for attempt in range(5):
        token = mint(subject="x", key=_private_pem(one), algorithm="ES256", key_id=f"made-up-{attempt}")
        error = _refused_async(limited, token)
        assert (error.status, error.code) == (401, "invalid_token")
        assert "not in the JWKS" in error.message
    assert handler.requests == before  # made-up kids within the minute fetch nothing


def test_an_unreachable_jwks_url_is_a_503_not_a_401(
    make_settings: Make, jwks_server: tuple[str, type[JWKSHandler]]
) -> None:
    url, handler = jwks_server
    handler.status = 500
    key = ec.generate_private_key(ec.SECP256R1())
    verifier = _url_verifier(make_settings, url, ["ES256"])
    error = _refused_async(verifier, mint(subject="a", key=_private_pem(key), algorithm="ES256", key_id="k"))
    assert (error.status, error.code) == (503, "jwks_unavailable")


def test_jwks_url_accepts_every_asymmetric_family_and_ignores_symmetric_keys(
    make_settings: Make, jwks_server: tuple[str, type[JWKSHandler]]
) -> None:
    url, handler = jwks_server
    keys: dict[str, PrivateKey] = {
        "PS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ES384": ec.generate_private_key(ec.SECP384R1()),
        "EdDSA": ed25519.Ed25519PrivateKey.generate(),
    }
    shared = secrets.token_bytes(32)
    oct_key = {"kty": "oct", "k": jwt.utils.base64url_encode(shared).decode(), "kid": "oct", "alg": "HS256"}
    handler.document = {"keys": [*(_jwk(key, alg) for alg, key in keys.items()), oct_key]}
    verifier = _url_verifier(make_settings, url, sorted(keys))
    for alg, key in keys.items():
        assert _authenticate(verifier, mint(subject=alg, key=_private_pem(key), algorithm=alg, key_id=alg)) == alg
    forged = jwt.encode(
        {"sub": "x", "iss": "llmfleet", "aud": "llmfleet", "exp": 2**31}, shared, "HS256", headers={"kid": "oct"}
    )
    assert _refused_async(verifier, forged).status == 401


@pytest.mark.parametrize(
    ("url", "accepted"),
    [
        ("https://idp.example/.well-known/jwks.json", True),
        ("http://127.0.0.1:8000/jwks.json", True),
        ("http://idp.example/jwks.json", False),
        ("file:///etc/jwks.json", False),
    ],
)
def test_a_jwks_url_must_be_https_off_loopback(make_settings: Make, url: str, accepted: bool) -> None:
    env = {
        "LLMFLEET_GATEWAY_JWT_SECRET_FILE": None,
        "LLMFLEET_GATEWAY_JWT_JWKS_URL": url,
        "LLMFLEET_GATEWAY_JWT_ALGORITHMS": '["RS256"]',
    }
    if accepted:
        assert make_settings(**env).jwt_jwks_url == url
    else:
        with pytest.raises(ValueError, match="JWKS_URL"):
            make_settings(**env)


# --- Revocation ------------------------------------------------------------------------


class FakeRedis:
    """Stands in for the gateway's Redis client: the revoked keys, and how often they were asked about."""

    def __init__(self, revoked: set[str] | None = None, *, down: bool = False) -> None:
        self.revoked = revoked or set()
        self.down = down
        self.asked: list[str] = []

    async def exists(self, key: str) -> int:
        self.asked.append(key)
        if self.down:
            raise RedisConnectionError("connection refused")
        return int(key in self.revoked)


def _revocable(make_settings: Make) -> Verifier:
    return Verifier(make_settings(LLMFLEET_GATEWAY_JWT_REVOCATION="true", LLMFLEET_QUEUE_PREFIX="fleet"))


def _check(verifier: Verifier, token: str, redis: FakeRedis) -> str:
    return asyncio.run(verifier.authenticate(token, redis)).subject  # type: ignore[arg-type]


def test_a_revoked_token_is_refused_even_when_cached(make_settings: Make, secret_file: Path) -> None:
    verifier = _revocable(make_settings)
    token = mint(subject="alice", key=secret_file.read_text().strip())
    token_id = jwt.decode(token, options={"verify_signature": False})["jti"]
    redis = FakeRedis()
    assert _check(verifier, token, redis) == "alice"
    assert _check(verifier, token, redis) == "alice"  # the verified-token cache, asked again each time
    assert redis.asked == [f"fleet:revoked:{token_id}"] * 2
    assert revoked_key(verifier.keys, token_id) == f"fleet:revoked:{token_id}"
    redis.revoked.add(f"fleet:revoked:{token_id}")
    for _ in range(2):
        with pytest.raises(APIError) as error:
            _check(verifier, token, redis)
        assert (error.value.status, error.value.code, error.value.kind) == (
            401,
            "token_revoked",
            "authentication_error",
        )
    assert len(redis.asked) == 3  # once known revoked, the process remembers it


def test_with_revocation_on_a_token_without_jti_is_refused(make_settings: Make, secret_file: Path) -> None:
    claims = {"sub": "a", "iss": "llmfleet", "aud": "llmfleet", "exp": 2**31}
    token = jwt.encode(claims, secret_file.read_text().strip(), "HS256")
    with pytest.raises(APIError, match="jti") as error:
        _check(_revocable(make_settings), token, FakeRedis())
    assert error.value.status == 401
    assert (
        _check(Verifier(make_settings(LLMFLEET_GATEWAY_JWT_REVOCATION="false")), token, FakeRedis()) == "a"
    )  # revocation off: no jti needed


def test_revocation_fails_closed_when_redis_is_down(make_settings: Make, secret_file: Path) -> None:
    token = mint(subject="alice", key=secret_file.read_text().strip())
    with pytest.raises(APIError) as error:
        _check(_revocable(make_settings), token, FakeRedis(down=True))
    assert (error.value.status, error.value.code) == (503, "queue_unavailable")
