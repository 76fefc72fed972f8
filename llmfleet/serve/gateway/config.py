"""Gateway settings: LLMFLEET_GATEWAY_* (plus LLMFLEET_REDIS_* and LLMFLEET_QUEUE_*).

Complex values (models, tiers, lists) are JSON, as pydantic-settings reads
them. The JWT key is one file: a shared secret (HS*), a PEM public key
(RS*/ES*/PS*/EdDSA) or a JWKS document. Placeholders and secrets given as
environment values are refused before the server binds its port.
"""

from __future__ import annotations

from pathlib import Path

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
    result_poll_s: float = Field(default=2.0, gt=0, description="how often a waiter also checks the result key")
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
        key_files = [f for f in (self.jwt_secret_file, self.jwt_public_key_file, self.jwt_jwks_file) if f is not None]
        if len(key_files) != 1:
            raise ValueError(
                "set exactly one of LLMFLEET_GATEWAY_JWT_SECRET_FILE (HS256), LLMFLEET_GATEWAY_JWT_PUBLIC_KEY_FILE"
                " or LLMFLEET_GATEWAY_JWT_JWKS_FILE (RS256/ES256)"
            )
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
