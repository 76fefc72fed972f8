"""JWT verification: what passes, what is a 401 and why, and how claims map to a principal."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from llmfleet.serve.gateway.auth import Verifier, bearer_token, mint
from llmfleet.serve.gateway.config import GatewaySettings
from llmfleet.serve.gateway.errors import APIError, unauthorized

Make = Callable[..., GatewaySettings]


@pytest.fixture
def verifier(make_settings: Make) -> Verifier:
    return Verifier(make_settings(LLMFLEET_GATEWAY_TIERS=json.dumps({"default": {}, "gold": {}})))


@pytest.fixture
def key(secret_file: Path) -> str:
    return secret_file.read_text().strip()


def refused(verifier: Verifier, token: str) -> str:
    with pytest.raises(APIError) as error:
        verifier.verify(token)
    assert error.value.status == 401
    assert error.value.headers["WWW-Authenticate"].startswith('Bearer realm="llmfleet", error="invalid_token"')
    return error.value.message


def test_a_minted_token_maps_its_claims(verifier: Verifier, key: str) -> None:
    token = mint(subject="alice", key=key, models=["tiny"], tenant="acme", priority="high", tier="gold")
    principal = verifier.verify(token)
    assert (principal.subject, principal.tenant, principal.lane, principal.tier) == ("alice", "acme", "high", "gold")
    assert principal.may_use("tiny") and not principal.may_use("other")
    assert principal.token_id


def test_defaults_tenant_lane_tier_and_all_models(verifier: Verifier, key: str) -> None:
    principal = verifier.verify(mint(subject="bob", key=key, priority=2))
    assert (principal.tenant, principal.lane, principal.tier) == ("bob", "low", "default")
    assert principal.may_use("anything")


@pytest.mark.parametrize(
    ("make_token", "reason"),
    [
        (lambda key: mint(subject="a", key=key, now=time.time() - 7200, ttl_s=3600), "expired"),
        (lambda key: mint(subject="a", key=key, now=time.time() + 3600), "not valid yet"),
        (lambda key: mint(subject="a", key="x" * 40), "signature is wrong"),
        (lambda key: mint(subject="a", key=key, audience="other"), "audience is wrong"),
        (lambda key: mint(subject="a", key=key, issuer="other"), "issuer is wrong"),
        (lambda key: mint(subject="a", key=key, algorithm="HS512"), "algorithm 'HS512' is not accepted"),
        (
            lambda key: jwt.encode(
                {"sub": "a", "iss": "llmfleet", "aud": "llmfleet", "exp": 2**31}, None, algorithm="none"
            ),
            "algorithm 'none'",
        ),
        (lambda key: jwt.encode({"sub": "a", "iss": "llmfleet", "aud": "llmfleet"}, key), "lacks the 'exp'"),
        (lambda key: jwt.encode({"iss": "llmfleet", "aud": "llmfleet", "exp": 2**31}, key), "lacks the 'sub'"),
        (lambda key: "a.b.c", "malformed"),
        (lambda key: mint(subject="a", key=key, tier="platinum"), "tier"),
        (lambda key: mint(subject="a", key=key, priority="urgent"), "priority"),
        (
            lambda key: jwt.encode(
                {"sub": "a", "iss": "llmfleet", "aud": "llmfleet", "exp": 2**31, "models": "tiny"}, key
            ),
            "'models'",
        ),
        (lambda key: mint(subject="x" * 300, key=key), "1 to 256 characters"),
    ],
)
def test_bad_tokens_are_401_with_the_reason(
    verifier: Verifier, key: str, make_token: Callable[[str], str], reason: str
) -> None:
    assert reason in refused(verifier, make_token(key))


def test_leeway_forgives_small_clock_skew(verifier: Verifier, key: str) -> None:
    token = mint(subject="a", key=key, now=time.time() - 3610, ttl_s=3600)  # expired 10 s ago, leeway 30 s
    assert verifier.verify(token).subject == "a"


def test_a_missing_claim_models_means_no_model(verifier: Verifier, key: str) -> None:
    token = jwt.encode({"sub": "a", "iss": "llmfleet", "aud": "llmfleet", "exp": 2**31}, key)
    assert not verifier.verify(token).may_use("tiny")


def test_bearer_header_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    for header in (None, "", "Basic abc", "Bearer"):
        with pytest.raises(APIError):
            bearer_token(header)


def _pem(private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


def test_rs256_with_a_public_key_file(make_settings: Make, tmp_path: Path) -> None:
    private_pem, public_pem = _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    public = tmp_path / "jwt.pub"
    public.write_text(public_pem)
    verifier = Verifier(
        make_settings(
            LLMFLEET_GATEWAY_JWT_SECRET_FILE=None,
            LLMFLEET_GATEWAY_JWT_PUBLIC_KEY_FILE=str(public),
            LLMFLEET_GATEWAY_JWT_ALGORITHMS='["RS256"]',
        )
    )
    assert verifier.verify(mint(subject="a", key=private_pem, algorithm="RS256")).subject == "a"
    # Algorithm confusion: an HS256 token whose HMAC key is the (public) PEM is refused.
    header = _b64({"alg": "HS256", "typ": "JWT"})
    claims = _b64({"sub": "a", "iss": "llmfleet", "aud": "llmfleet", "exp": 2**31})
    signature = hmac.new(public_pem.encode(), f"{header}.{claims}".encode(), hashlib.sha256).digest()
    forged = f"{header}.{claims}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"
    assert "algorithm 'HS256' is not accepted" in refused(verifier, forged)


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _jwks_verifier(make_settings: Make, tmp_path: Path, keys: list[dict[str, Any]], algorithms: list[str]) -> Verifier:
    """A verifier that reads these public keys from a JWKS file and accepts these algorithms."""
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    return Verifier(
        make_settings(
            LLMFLEET_GATEWAY_JWT_SECRET_FILE=None,
            LLMFLEET_GATEWAY_JWT_JWKS_FILE=str(path),
            LLMFLEET_GATEWAY_JWT_ALGORITHMS=json.dumps(algorithms),
        )
    )


def test_es256_with_a_jwks_file_picks_the_key_by_kid(make_settings: Make, tmp_path: Path) -> None:
    keys = {kid: ec.generate_private_key(ec.SECP256R1()) for kid in ("one", "two")}
    jwks = [
        {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key())), "kid": kid, "alg": "ES256", "use": "sig"}
        for kid, key in keys.items()
    ]
    verifier = _jwks_verifier(make_settings, tmp_path, jwks, ["ES256"])
    for kid, private in keys.items():
        private_pem, _ = _pem(private)
        assert verifier.verify(mint(subject=kid, key=private_pem, algorithm="ES256", key_id=kid)).subject == kid
    private_pem, _ = _pem(keys["one"])
    assert "signature is wrong" in refused(
        verifier, mint(subject="a", key=private_pem, algorithm="ES256", key_id="two")
    )
    assert "not in the JWKS" in refused(verifier, mint(subject="a", key=private_pem, algorithm="ES256", key_id="three"))


def test_a_remembered_token_still_expires(verifier: Verifier, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    token = mint(subject="a", key=key, ttl_s=60)
    assert verifier.verify(token).subject == "a"
    assert verifier.verify(token).subject == "a"  # from the cache
    later = time.time() + 60 + 31  # past exp + leeway
    monkeypatch.setattr(time, "time", lambda: later)
    checked = []

    def verify_again(again: str) -> tuple[object, float]:
        checked.append(again)
        raise unauthorized("token expired")

    monkeypatch.setattr(verifier, "_verify", verify_again)
    assert "expired" in refused(verifier, token)
    assert checked == [token]  # not served from the cache


def test_a_token_of_another_key_family_is_a_401_not_a_crash(make_settings: Make, tmp_path: Path) -> None:
    """A JWKS with an RSA and an EC key, both families accepted: an ES256 token naming the RSA key's kid."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwks = [
        {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key())), "kid": "rsa", "use": "sig"},
        {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key())), "kid": "ec", "use": "sig"},
    ]
    verifier = _jwks_verifier(make_settings, tmp_path, jwks, ["RS256", "ES256"])
    rsa_pem, _ = _pem(rsa_key)
    ec_pem, _ = _pem(ec_key)
    assert verifier.verify(mint(subject="r", key=rsa_pem, algorithm="RS256", key_id="rsa")).subject == "r"
    assert verifier.verify(mint(subject="e", key=ec_pem, algorithm="ES256", key_id="ec")).subject == "e"
    message = refused(verifier, mint(subject="a", key=ec_pem, algorithm="ES256", key_id="rsa"))
    assert message == "token algorithm does not fit the key it names"
    assert "does not fit" in refused(verifier, mint(subject="a", key=rsa_pem, algorithm="RS256", key_id="ec"))
