"""JWT verification (PyJWT) and the claims a token carries.

Verification: the header's `alg` must be in the configured allow-list (never
`none`, and never an HMAC algorithm with a public key); the signature, `exp`
and `nbf` (with leeway), `iss` and `aud` are checked; `exp` and `sub` are
required. Any failure is a 401 that says which check failed.

Claims:
    sub       the subject: rate limits and concurrency are counted per subject
    tenant    the tenant (default: the subject): tenant-wide rate limits
    models    list of served model names, or "*"; no claim means no model (403)
    priority  a lane name ("high") or index (0 = highest); default: the default lane
    tier      a rate-limit tier from the settings; default: the default tier
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from jwt.exceptions import (
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidAlgorithmError,
    InvalidAudienceError,
    InvalidIssuerError,
    InvalidKeyError,
    InvalidSignatureError,
    InvalidTokenError,
    MissingRequiredClaimError,
    PyJWKError,
    PyJWKSetError,
)

from llmfleet.serve.gateway.config import MIN_HMAC_SECRET_LENGTH, GatewaySettings
from llmfleet.serve.gateway.errors import APIError, unauthorized
from llmfleet.serve.queue.config import PLACEHOLDERS, SettingsError, read_secret_file

MAX_CLAIM_LENGTH = 256
# Verified tokens remembered per process (see Verifier.verify).
CACHE_SIZE = 10_000


@dataclass(frozen=True)
class Principal:
    """Who is calling, as the verified token says."""

    subject: str
    tenant: str
    models: frozenset[str]
    lane: str
    tier: str
    token_id: str | None = None

    def may_use(self, model: str) -> bool:
        return "*" in self.models or model in self.models


def _read_public(path: Path, what: str) -> str:
    """Public keys are not secret, but a placeholder or an empty file is still refused."""
    try:
        text = path.read_text().strip()
    except OSError as error:
        raise SettingsError(f"{what}: cannot read {path}: {error.strerror or type(error).__name__}") from None
    if not text or text.lower() in PLACEHOLDERS:
        raise SettingsError(f"{what}: {path} is empty or still a placeholder")
    return text


class Verifier:
    def __init__(self, settings: GatewaySettings) -> None:
        self.algorithms = list(settings.jwt_algorithms)
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self.leeway = settings.jwt_leeway_s
        self.queue = settings.queue
        self.tiers = frozenset(settings.tiers)
        self.default_tier = settings.default_tier
        self._key: Any = None
        self._jwks: dict[str, Any] = {}
        self._cache: dict[str, tuple[Principal, float]] = {}
        if settings.jwt_secret_file is not None:
            self._key = read_secret_file(
                settings.jwt_secret_file, "LLMFLEET_GATEWAY_JWT_SECRET_FILE", min_length=MIN_HMAC_SECRET_LENGTH
            )
        elif settings.jwt_public_key_file is not None:
            pem = _read_public(settings.jwt_public_key_file, "LLMFLEET_GATEWAY_JWT_PUBLIC_KEY_FILE")
            try:
                self._key = load_pem_public_key(pem.encode())
            except (ValueError, TypeError) as error:
                raise SettingsError(
                    f"LLMFLEET_GATEWAY_JWT_PUBLIC_KEY_FILE: {settings.jwt_public_key_file} is not a PEM public key"
                    f" ({type(error).__name__})"
                ) from None
        elif settings.jwt_jwks_file is not None:
            text = _read_public(settings.jwt_jwks_file, "LLMFLEET_GATEWAY_JWT_JWKS_FILE")
            try:
                keyset = jwt.PyJWKSet.from_json(text)
            except (ValueError, PyJWKSetError, PyJWKError) as error:
                raise SettingsError(
                    f"LLMFLEET_GATEWAY_JWT_JWKS_FILE: {settings.jwt_jwks_file} is not a usable JWKS ({error})"
                ) from None
            self._jwks = {key.key_id or "": key.key for key in keyset.keys}

    def _key_for(self, header: dict[str, Any]) -> Any:
        if not self._jwks:
            return self._key
        kid = header.get("kid")
        if kid is None and len(self._jwks) == 1:
            return next(iter(self._jwks.values()))
        if not isinstance(kid, str) or kid not in self._jwks:
            raise unauthorized("token key id (kid) is not in the JWKS")
        return self._jwks[kid]

    def verify(self, token: str) -> Principal:
        """The principal of a valid token; a 401 APIError saying why otherwise.

        Clients send the same token many times: a verified token is remembered
        (by its exact text, signature included) until it expires, so repeats
        skip the parsing and the signature check but never the expiry check.
        """
        cached = self._cache.get(token)
        if cached is not None:
            principal, expires = cached
            if time.time() <= expires + self.leeway:
                return principal
            del self._cache[token]
        principal, expires = self._verify(token)
        if len(self._cache) >= CACHE_SIZE:
            self._cache.pop(next(iter(self._cache)))  # the oldest entry (dicts keep insertion order)
        self._cache[token] = (principal, expires)
        return principal

    def _verify(self, token: str) -> tuple[Principal, float]:
        try:
            header = jwt.get_unverified_header(token)
        except InvalidTokenError:
            raise unauthorized("malformed token") from None
        algorithm = header.get("alg")
        if algorithm not in self.algorithms:
            raise unauthorized(f"token algorithm {str(algorithm)[:20]!r} is not accepted")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key_for(header),
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "sub", "iss", "aud"]},
            )
        except ExpiredSignatureError:
            raise unauthorized("token expired") from None
        except ImmatureSignatureError:
            raise unauthorized("token not valid yet (nbf/iat in the future)") from None
        except InvalidAudienceError:
            raise unauthorized("token audience is wrong") from None
        except InvalidIssuerError:
            raise unauthorized("token issuer is wrong") from None
        except InvalidSignatureError:
            raise unauthorized("token signature is wrong") from None
        except InvalidAlgorithmError:
            raise unauthorized("token algorithm is not accepted") from None
        except MissingRequiredClaimError as error:
            raise unauthorized(f"token lacks the {error.claim!r} claim") from None
        except InvalidTokenError as error:
            raise unauthorized(f"invalid token ({type(error).__name__})") from None
        except (InvalidKeyError, TypeError, ValueError):
            # An accepted algorithm of another family than the key the token names (ES256 on an RSA key of a
            # JWKS that holds both): PyJWT cannot even try the signature. The client's error, not the server's.
            raise unauthorized("token algorithm does not fit the key it names") from None
        return self._principal(claims), float(claims["exp"])

    def _principal(self, claims: dict[str, Any]) -> Principal:
        subject = _claim_text(claims, "sub")
        tenant = _claim_text(claims, "tenant") if "tenant" in claims else subject
        models_claim = claims.get("models", [])
        if models_claim == "*":
            models = frozenset({"*"})
        elif isinstance(models_claim, list) and all(isinstance(m, str) for m in models_claim):
            models = frozenset(models_claim)
        else:
            raise unauthorized("token claim 'models' must be a list of model names or \"*\"")
        priority = claims.get("priority")
        if priority is not None and not isinstance(priority, str | int):
            raise unauthorized("token claim 'priority' must be a lane name or index")
        try:
            lane = self.queue.lane_for(priority)
        except ValueError as error:
            raise unauthorized(f"token claim 'priority': {error}"[:200]) from None
        tier = claims.get("tier", self.default_tier)
        if not isinstance(tier, str) or tier not in self.tiers:
            raise unauthorized(f"token claim 'tier' names no configured tier ({', '.join(sorted(self.tiers))})")
        token_id = claims.get("jti")
        return Principal(subject, tenant, models, lane, tier, token_id if isinstance(token_id, str) else None)


def _claim_text(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_CLAIM_LENGTH:
        raise unauthorized(f"token claim {name!r} must be a string of 1 to {MAX_CLAIM_LENGTH} characters")
    return value


def mint(
    *,
    subject: str,
    key: str,
    algorithm: str = "HS256",
    ttl_s: int = 3600,
    issuer: str = "llmfleet",
    audience: str = "llmfleet",
    models: Sequence[str] = ("*",),
    tenant: str | None = None,
    priority: str | int | None = None,
    tier: str | None = None,
    key_id: str | None = None,
    now: float | None = None,
) -> str:
    """A signed token for the gateway (HS*: key is the shared secret; RS*/ES*: a PEM private key)."""
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "sub": subject,
        "iss": issuer,
        "aud": audience,
        "iat": issued,
        "nbf": issued,
        "exp": issued + ttl_s,
        "jti": uuid.uuid4().hex,
        "models": "*" if list(models) == ["*"] else list(models),
    }
    if tenant is not None:
        claims["tenant"] = tenant
    if priority is not None:
        claims["priority"] = priority
    if tier is not None:
        claims["tier"] = tier
    headers = {"kid": key_id} if key_id else None
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized("missing bearer token (Authorization: Bearer <JWT>)")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("the Authorization header must be 'Bearer <JWT>'")
    return token.strip()


def forbidden_model(model: str) -> APIError:
    return APIError(
        403, f"this token may not use model {model!r}", "permission_error", "model_not_allowed", param="model"
    )
