"""Worker settings: LLMFLEET_WORKER_* (plus LLMFLEET_REDIS_* and LLMFLEET_QUEUE_*)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmfleet.serve.queue.config import (
    QueueSettings,
    RedisSettings,
    default_instance_id,
    read_secret_file,
    refuse_secret_env,
)


def _engine_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"engine URL {value!r} must be http(s)://HOST:PORT")
    if parts.username or parts.password:
        raise ValueError(f"engine URL {parts.hostname}: credentials do not belong in the URL")
    if parts.path not in ("", "/"):
        raise ValueError(f"engine URL {value!r}: give the server root; /v1/... is added by the worker")
    return value.rstrip("/")


EngineUrl = Annotated[str, AfterValidator(_engine_url)]
# How a worker chooses the engine for an attempt (pool.py).
Policy = Literal["least_outstanding", "prefix_affinity"]


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_WORKER_", extra="ignore", frozen=True)

    # Required: no default. A JSON list, e.g. ["http://10.0.0.5:8000","http://10.0.0.6:8000"].
    engines: tuple[EngineUrl, ...] = Field(min_length=1, description="vLLM OpenAI servers this worker calls")
    # The engines' API key (vLLM's --api-key), sent as a bearer token on every engine request.
    engine_key_file: Path | None = Field(default=None, description="file holding the engines' API key")
    id: str = Field(default_factory=lambda: default_instance_id("worker"), pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    concurrency: int = Field(default=32, ge=1, le=4096, description="engine requests in flight at once")
    retries: int = Field(default=2, ge=0, le=10, description="extra engine attempts on connection errors and 5xx")
    retry_backoff_s: float = Field(default=0.1, ge=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)
    slow_checks_to_remove: int = Field(
        default=3, ge=1, le=100, description="health checks timed out in a row that take an admitted engine out"
    )
    eject_after: int = Field(default=2, ge=1, description="consecutive request failures that eject an engine")
    eject_s: float = Field(default=10.0, ge=0, description="shortest ejection before a health check may re-admit")
    drain_timeout_s: float = Field(default=30.0, ge=0, description="SIGTERM: time to finish in-flight work")
    block_ms: int = Field(default=1000, ge=10, le=30_000, description="longest blocking read on an empty queue")
    # How an attempt chooses its engine (pool.py, affinity.py; docs/gateway.md, "Choosing an engine").
    policy: Policy = Field(default="least_outstanding", description="engine choice for models not in model_policies")
    # A JSON object, model -> policy, e.g. {"qwen2-1.5b-chat": "prefix_affinity"}.
    model_policies: dict[str, Policy] = Field(default_factory=dict, description="engine choice per served model")
    affinity_epsilon: float = Field(
        default=0.25, gt=0, le=10, description="prefix_affinity: an engine takes at most (1 + this) x the mean load"
    )
    affinity_prefix_chars: int = Field(
        default=8192, ge=16, le=1_000_000, description="prefix_affinity: leading characters of a request it hashes"
    )
    listen_host: str = Field(default="127.0.0.1", description="address of /metrics, /healthz and /readyz")
    listen_port: int = Field(default=9400, ge=0, le=65535, description="0 disables the HTTP endpoint")
    redis: RedisSettings = Field(default_factory=RedisSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)

    @model_validator(mode="after")
    def _check(self) -> WorkerSettings:
        if len(set(self.engines)) != len(self.engines):
            raise ValueError(f"LLMFLEET_WORKER_ENGINES lists an engine twice: {list(self.engines)}")
        return self

    @property
    def heartbeat_s(self) -> float:
        """How often held entries are touched: well inside claim_idle_ms."""
        return self.queue.claim_idle_ms / 3000

    def engine_key(self) -> str | None:
        """The engines' API key from engine_key_file; None when the engines take none."""
        if self.engine_key_file is None:
            return None
        return read_secret_file(self.engine_key_file, "LLMFLEET_WORKER_ENGINE_KEY_FILE")

    @classmethod
    def from_env(cls) -> WorkerSettings:
        refuse_secret_env("LLMFLEET_REDIS_", ("PASSWORD",))
        refuse_secret_env("LLMFLEET_WORKER_", ("ENGINE_KEY",))
        settings = cls()  # type: ignore[call-arg]  # engines comes from the environment
        # Read now: a bad secret file stops start-up, not the first request.
        settings.redis.password()
        settings.engine_key()
        return settings
