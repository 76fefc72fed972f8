"""JWT verification (PyJWT) and the claims a token carries.

Verification: the header's `alg` must be in the configured allow-list (never
`none`, and never an HMAC algorithm with a public key); the signature, `exp`
and `nbf` (with leeway), `iss` and `aud` are checked; `exp` and `sub` are
required. Any failure is a 401 that says which check failed.

Keys: one shared secret or PEM public key, plus the extra files of a rotation
(tried in order: the current key first); or a JWKS, from a file or from an
identity provider's URL (fetched when first needed, again after
jwt_jwks_max_age_s, and at once for a kid it does not know, at most once per
jwt_jwks_min_refresh_s).

Revocation (jwt_revocation): a token whose `jti` is under
`<prefix>:revoked:<jti>` in Redis is a 401 `token_revoked`, checked on every
request, cached token or not; `llmfleet token revoke` writes the key, with the
token's remaining life as its TTL.

Claims:
    sub       the subject: rate limits and concurrency are counted per subject
    tenant    the tenant (default: the subject): tenant-wide rate limits
    models    list of served model names, or "*"; no claim means no model (403)
    priority  a lane name ("high") or index (0 = highest); default: the default lane
    tier      a rate-limit tier from the settings; default: the default tier
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import redis.asyncio as aioredis
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
from redis.exceptions import RedisError

from llmfleet.serve.gateway.config import MIN_HMAC_SECRET_LENGTH, GatewaySettings
from llmfleet.serve.gateway.errors import APIError, queue_error, queue_unavailable, unauthorized
from llmfleet.serve.queue.config import PLACEHOLDERS, SettingsError, read_secret_file
from llmfleet.serve.queue.keys import Keys

log = logging.getLogger(__name__)

MAX_CLAIM_LENGTH = 256
# Verified tokens remembered per process (see Verifier.verify), and revoked token ids.
CACHE_SIZE = 10_000
# The largest JWKS document accepted from a URL.
MAX_JWKS_BYTES = 1 << 20


def revoked_key(keys: Keys, token_id: str) -> str:
    """The Redis key whose presence revokes the token with this jti (a string; its value does not matter)."""
    return f"{keys.prefix}:revoked:{token_id}"


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


def parse_jwks(text: str | bytes, where: str) -> dict[str, Any]:
    """kid -> verifying key of a JWKS document; symmetric ("oct") and encryption keys are left out."""
    try:
        document = json.loads(text)
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise ValueError("no 'keys' list")
        usable = [
            key
            for key in document["keys"]
            if isinstance(key, dict) and key.get("kty") != "oct" and key.get("use", "sig") == "sig"
        ]
        keyset = jwt.PyJWKSet(usable)
    except (ValueError, PyJWKSetError, PyJWKError) as error:
        raise SettingsError(f"{where} is not a usable JWKS ({str(error)[:200]})") from None
    return {key.key_id or "": key.key for key in keyset.keys}


class RemoteJWKS:
    """Keys of an identity provider's JWKS URL, fetched on demand and kept for max_age_s.

    A kid it does not know triggers a fetch (the provider rotated), but at most
    one per min_refresh_s, so tokens with made-up kids cannot turn the gateway
    into a load generator against the provider. A failed fetch keeps the keys
    it had. Fetches are rare: each uses its own short-lived HTTP client.
    """

    def __init__(self, url: str, *, max_age_s: float, min_refresh_s: float, timeout_s: float) -> None:
        self.url = url
        self.max_age_s = max_age_s
        self.min_refresh_s = min_refresh_s
        self.timeout_s = timeout_s
        self.keys: dict[str, Any] = {}
        self.fetches = 0
        self._fetched_at = -float("inf")
        self._tried_at = -float("inf")
        self._lock = asyncio.Lock()

    def _wants(self, kid: Any) -> bool:
        known = kid in self.keys if isinstance(kid, str) else len(self.keys) == 1
        if known and time.monotonic() - self._fetched_at < self.max_age_s:
            return False
        return time.monotonic() - self._tried_at >= self.min_refresh_s

    async def ready_for(self, kid: Any) -> None:
        """Fetch the keys if this kid is unknown or the keys are old, unless the last try was too recent."""
        if not self._wants(kid):
            return
        async with self._lock:
            if not self._wants(kid):  # another request fetched them while this one waited
                return
            self._tried_at = time.monotonic()
            self.fetches += 1
            try:
                # aiohttp, the workers' client: the service image carries no other.
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                async with (
                    aiohttp.ClientSession(timeout=timeout, trust_env=False) as session,
                    session.get(self.url, headers={"Accept": "application/json"}) as response,
                ):
                    response.raise_for_status()
                    content = b""
                    async for chunk in response.content.iter_chunked(1 << 16):
                        content += chunk
                        if len(content) > MAX_JWKS_BYTES:  # refused below; a huge document is never read whole
                            break
                if len(content) > MAX_JWKS_BYTES:
                    raise SettingsError(f"JWKS at {self.url} is larger than {MAX_JWKS_BYTES} bytes")
                self.keys = parse_jwks(content, f"JWKS at {self.url}")
                self._fetched_at = time.monotonic()
            except (aiohttp.ClientError, TimeoutError, SettingsError) as error:
                log.warning("cannot fetch the JWKS at %s (keeping %d known keys): %s", self.url, len(self.keys), error)


class Verifier:
    def __init__(self, settings: GatewaySettings) -> None:
        self.algorithms = list(settings.jwt_algorithms)
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self.leeway = settings.jwt_leeway_s
        self.queue = settings.queue
        self.tiers = frozenset(settings.tiers)
        self.default_tier = settings.default_tier
        self.revocation = settings.jwt_revocation
        self.keys = Keys(settings.queue.prefix)
        # The current key first: during a rotation a token of the current key needs one signature check.
        self._keys: list[Any] = []
        self._jwks: dict[str, Any] = {}
        self._remote: RemoteJWKS | None = None
        self._cache: dict[str, tuple[Principal, float]] = {}
        self._revoked: dict[str, None] = {}  # jti of tokens Redis said are revoked (they stay revoked)
        if settings.jwt_secret_file is not None:
            for path, what in self._key_files(settings.jwt_secret_file, settings, "LLMFLEET_GATEWAY_JWT_SECRET_FILE"):
                self._keys.append(read_secret_file(path, what, min_length=MIN_HMAC_SECRET_LENGTH))
        elif settings.jwt_public_key_file is not None:
            for path, what in self._key_files(
                settings.jwt_public_key_file, settings, "LLMFLEET_GATEWAY_JWT_PUBLIC_KEY_FILE"
            ):
                pem = _read_public(path, what)
                try:
                    self._keys.append(load_pem_public_key(pem.encode()))
                except (ValueError, TypeError) as error:
                    raise SettingsError(f"{what}: {path} is not a PEM public key ({type(error).__name__})") from None
        elif settings.jwt_jwks_file is not None:
            text = _read_public(settings.jwt_jwks_file, "LLMFLEET_GATEWAY_JWT_JWKS_FILE")
            self._jwks = parse_jwks(text, f"LLMFLEET_GATEWAY_JWT_JWKS_FILE: {settings.jwt_jwks_file}")
        elif settings.jwt_jwks_url is not None:
            self._remote = RemoteJWKS(
                settings.jwt_jwks_url,
                max_age_s=settings.jwt_jwks_max_age_s,
                min_refresh_s=settings.jwt_jwks_min_refresh_s,
                timeout_s=settings.jwt_jwks_timeout_s,
            )

    @staticmethod
    def _key_files(main: Path, settings: GatewaySettings, what: str) -> list[tuple[Path, str]]:
        extra = "LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES"
        return [(main, what), *((path, f"{extra}[{i}]") for i, path in enumerate(settings.jwt_extra_key_files))]

    def _keys_for(self, header: dict[str, Any]) -> list[Any]:
        if self._remote is not None:
            jwks = self._remote.keys
            if not jwks:
                # The provider has not answered yet: not the client's fault, and worth a retry.
                raise APIError(
                    503,
                    "the identity provider's keys (JWKS) could not be fetched; retry shortly",
                    "server_error",
                    "jwks_unavailable",
                    headers={"Retry-After": "5"},
                )
        elif self._jwks:
            jwks = self._jwks
        else:
            return self._keys
        kid = header.get("kid")
        if kid is None and len(jwks) == 1:
            return list(jwks.values())
        if not isinstance(kid, str) or kid not in jwks:
            raise unauthorized("token key id (kid) is not in the JWKS")
        return [jwks[kid]]

    async def authenticate(self, token: str, redis: aioredis.Redis | None = None) -> Principal:
        """verify(), plus what needs the network: the JWKS URL's keys, and the revocation list in Redis."""
        if self._remote is not None and token not in self._cache:
            try:
                kid = jwt.get_unverified_header(token).get("kid")
            except InvalidTokenError:
                kid = None  # verify() says what is wrong with it
            await self._remote.ready_for(kid)
        principal = self.verify(token)
        if self.revocation:
            await self._refuse_revoked(token, principal, redis)
        return principal

    async def _refuse_revoked(self, token: str, principal: Principal, redis: aioredis.Redis | None) -> None:
        token_id = principal.token_id
        if token_id is None:
            self._cache.pop(token, None)
            raise unauthorized("token lacks the 'jti' claim (this gateway revokes tokens by jti)")
        revoked = token_id in self._revoked
        if not revoked:
            if redis is None:
                raise queue_unavailable()
            try:
                revoked = bool(await redis.exists(revoked_key(self.keys, token_id)))
            except RedisError as error:
                raise queue_error(error) from None
        if revoked:
            self._cache.pop(token, None)
            if token_id not in self._revoked:
                if len(self._revoked) >= CACHE_SIZE:
                    self._revoked.pop(next(iter(self._revoked)))
                self._revoked[token_id] = None
            raise APIError(
                401,
                "this token has been revoked",
                "authentication_error",
                "token_revoked",
                headers={
                    "WWW-Authenticate": (
                        'Bearer realm="llmfleet", error="invalid_token", error_description="token revoked"'
                    )
                },
            )

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
        keys = self._keys_for(header)
        try:
            claims = self._decode(token, keys)
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

    def _decode(self, token: str, keys: list[Any]) -> dict[str, Any]:
        """The claims, checked with the first key whose signature fits (the others of a rotation after it).

        A rotation may change the family (RSA to EC): a key of another family than the token's
        algorithm is passed over; if no key fits, a wrong signature is reported before a wrong family.
        """
        failures: list[Exception] = []
        for key in keys:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    key,
                    algorithms=self.algorithms,
                    audience=self.audience,
                    issuer=self.issuer,
                    leeway=self.leeway,
                    options={"require": ["exp", "sub", "iss", "aud"]},
                )
            except (InvalidSignatureError, InvalidKeyError, TypeError, ValueError) as error:
                failures.append(error)
                continue
            return claims
        signature = [error for error in failures if isinstance(error, InvalidSignatureError)]
        raise (signature or failures or [InvalidSignatureError("no key")])[0]

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
