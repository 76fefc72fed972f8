"""Gateway settings: LLMFLEET_GATEWAY_* (plus LLMFLEET_REDIS_* and LLMFLEET_QUEUE_*).

Complex values (models, tiers, lists) are JSON, as pydantic-settings reads
them. The JWT key comes from one source: a shared secret (HS*), a PEM public
key (RS*/ES*/PS*/EdDSA), or a JWKS document in a file or at a URL; during a
rotation, more secret or public key files verify too. Placeholders and secrets
given as environment values are refused before the server binds its port.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmfleet.serve.queue.config import QueueSettings, RedisSettings, default_instance_id, refuse_secret_env

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA"}
)
# The shortest HMAC secret accepted: 256 bits as 64 hex characters would be
# ideal; 32 characters keeps brute force out of reach.
MIN_HMAC_SECRET_LENGTH = 32
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def check_jwks_url(url: str) -> None:
    """A JWKS URL must be https: over http anyone on the path could hand the gateway their own keys.

    Plain http is allowed to loopback only (a local key service, the tests).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"LLMFLEET_GATEWAY_JWT_JWKS_URL {url[:200]!r} is not an http(s) URL")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
        raise ValueError(
            f"LLMFLEET_GATEWAY_JWT_JWKS_URL {url[:200]!r}: use https (plain http is allowed to loopback only)"
        )


class TierLimits(BaseModel):
    """One rate-limit tier; a token's `tier` claim picks it. 0 means no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int = Field(default=600, ge=0)
    tokens_per_minute: int = Field(default=1_000_000, ge=0, description="prompt + max_tokens, counted at admission")
    concurrency: int = Field(default=64, ge=0, description="requests of one subject queued or running at once")
    tenant_requests_per_minute: int = Field(default=0, ge=0)
    tenant_tokens_per_minute: int = Field(default=0, ge=0)


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_GATEWAY_", extra="ignore", frozen=True)

    # Required: no default. {"served-name": "/models/dir", ...}; each directory
    # holds the model's tokenizer.json and config.json.
    models: dict[str, Path] = Field(min_length=1, description="served model name -> model directory")
    max_model_len: dict[str, int] = Field(
        default_factory=dict, description="per-model override; else the engines' max_model_len, else config.json"
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    # Set: /metrics and /readyz answer only on this port, which the role publishes
    # where only the monitoring hosts reach; the API port answers them 404.
    ops_port: int | None = Field(
        default=None, ge=1, le=65535, description="port of /metrics and /readyz; unset: the API port serves them"
    )
    id: str = Field(default_factory=lambda: default_instance_id("gateway"), pattern=r"^[A-Za-z0-9_.:-]{1,128}$")

    jwt_secret_file: Path | None = Field(default=None, description="HS* shared secret")
    jwt_public_key_file: Path | None = Field(default=None, description="PEM public key for RS*/ES*/PS*/EdDSA")
    jwt_jwks_file: Path | None = Field(default=None, description="JWKS document (keys picked by kid)")
    jwt_jwks_url: str | None = Field(
        default=None, description="an identity provider's JWKS (https; http only to loopback), keys picked by kid"
    )
    # Rotation: the main key file signs (`llmfleet token --secret-file` is given it) and verifies; these only
    # verify. Same kind as the main file: shared secrets beside JWT_SECRET_FILE, PEM public keys beside
    # JWT_PUBLIC_KEY_FILE. A JWKS holds several keys itself.
    jwt_extra_key_files: tuple[Path, ...] = Field(
        default=(), description="more keys that verify tokens but do not sign them (key rotation)"
    )
    jwt_jwks_max_age_s: float = Field(default=900.0, gt=0, description="keys from the JWKS URL are fetched again after")
    jwt_jwks_min_refresh_s: float = Field(
        default=30.0, ge=0, description="fewest seconds between two fetches (an unknown kid asks for one)"
    )
    jwt_jwks_timeout_s: float = Field(default=5.0, gt=0, le=60)
    # Revocation by jti: `llmfleet token revoke` writes <prefix>:revoked:<jti>; the gateway refuses those
    # tokens, and every token without a jti (it could not be revoked).
    jwt_revocation: bool = Field(default=False, description="check every request's jti against Redis")
    jwt_algorithms: tuple[str, ...] = Field(default=("HS256",), min_length=1)
    jwt_issuer: str = "llmfleet"
    jwt_audience: str = "llmfleet"
    jwt_leeway_s: int = Field(default=30, ge=0, le=600)

    tiers: dict[str, TierLimits] = Field(default_factory=lambda: {"default": TierLimits()})
    default_tier: str = "default"

    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_tokens_cap: int = Field(default=4096, ge=1, description="largest max_tokens a request may ask for")
    truncate_prompts: bool = Field(
        default=False, description="cut over-long prompts to fit instead of answering 400 (operator opt-in)"
    )
    result_poll_s: float = Field(default=2.0, gt=0, description="how often a waiter first checks the result key")
    # Each check that finds nothing doubles the wait to the next, up to this: a request waiting a minute in a
    # backlog polls 6 times, not 30, and 600 of them no longer empty the Redis connection pool (issue 34).
    # The reply listener makes every waiter check at once when it gets over a Redis error (a restart can lose
    # notifications), so the longer wait only delays an answer whose notification was lost otherwise.
    result_poll_max_s: float = Field(
        default=30.0, gt=0, description="longest wait between a waiter's checks of the result key"
    )
    stream_keepalive_s: float = Field(
        default=10.0, gt=0, description="SSE keep-alive comment interval while a stream waits for its answer"
    )
    registry_max_age_s: float = Field(default=1.0, ge=0)
    # Off by default: a public endpoint does not publish its schema and a browser UI (issue 17, section 3).
    docs: bool = Field(default=False, description="serve /docs and /openapi.json")
    graceful_shutdown_s: int = Field(default=30, ge=0)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)

    @model_validator(mode="after")
    def _check(self) -> GatewaySettings:
        if self.result_poll_max_s < self.result_poll_s:
            raise ValueError(
                f"LLMFLEET_GATEWAY_RESULT_POLL_MAX_S ({self.result_poll_max_s:g}) is below"
                f" LLMFLEET_GATEWAY_RESULT_POLL_S ({self.result_poll_s:g}): the first wait cannot exceed the longest"
            )
        sources = (self.jwt_secret_file, self.jwt_public_key_file, self.jwt_jwks_file, self.jwt_jwks_url)
        if sum(source is not None for source in sources) != 1:
            raise ValueError(
                "set exactly one of LLMFLEET_GATEWAY_JWT_SECRET_FILE (HS*), LLMFLEET_GATEWAY_JWT_PUBLIC_KEY_FILE,"
                " LLMFLEET_GATEWAY_JWT_JWKS_FILE or LLMFLEET_GATEWAY_JWT_JWKS_URL (RS*/ES*/PS*/EdDSA)"
            )
        if self.jwt_extra_key_files and self.jwt_secret_file is None and self.jwt_public_key_file is None:
            raise ValueError(
                "LLMFLEET_GATEWAY_JWT_EXTRA_KEY_FILES goes with JWT_SECRET_FILE or JWT_PUBLIC_KEY_FILE; a JWKS"
                " rotates by holding both keys"
            )
        if self.jwt_jwks_url is not None:
            check_jwks_url(self.jwt_jwks_url)
        algorithms = set(self.jwt_algorithms)
        unknown = algorithms - HMAC_ALGORITHMS - ASYMMETRIC_ALGORITHMS
        if unknown:
            raise ValueError(
                f"LLMFLEET_GATEWAY_JWT_ALGORITHMS: {sorted(unknown)} not allowed; choose from"
                f" {sorted(HMAC_ALGORITHMS | ASYMMETRIC_ALGORITHMS)} (never 'none')"
            )
        if self.jwt_secret_file is not None and algorithms - HMAC_ALGORITHMS:
            raise ValueError("a JWT secret file verifies HS256/HS384/HS512 only; drop the other algorithms")
        if self.jwt_secret_file is None and algorithms & HMAC_ALGORITHMS:
            # Public keys must never be usable as HMAC secrets (algorithm confusion).
            raise ValueError("a public key or JWKS verifies RS*/ES*/PS*/EdDSA only; drop the HS algorithms")
        if self.ops_port == self.port:
            raise ValueError(
                f"LLMFLEET_GATEWAY_OPS_PORT {self.ops_port} is the API port: choose another, or unset it to serve"
                " /metrics and /readyz on the API port"
            )
        if self.default_tier not in self.tiers:
            raise ValueError(f"LLMFLEET_GATEWAY_DEFAULT_TIER {self.default_tier!r} is not in the tiers")
        for name in self.models:
            if not name or len(name) > 256:
                raise ValueError(f"model name {name!r} must be 1 to 256 characters")
        return self

    @classmethod
    def from_env(cls) -> GatewaySettings:
        """Settings from the environment; secrets read (and checked) now, not at the first request."""
        refuse_secret_env("LLMFLEET_GATEWAY_", ("JWT_SECRET", "JWT_KEY", "JWT_PUBLIC_KEY"))
        refuse_secret_env("LLMFLEET_REDIS_", ("PASSWORD",))
        settings = cls()  # type: ignore[call-arg]  # models comes from the environment
        settings.redis.password()
        return settings
