"""Settings the gateway and the workers share: how to reach Redis, and the queue's shape.

Secrets are read from files (Docker secrets under /run/secrets), never from
environment values: an environment is visible in `docker inspect`, in
/proc/<pid>/environ and in crash reports. A file that still holds a placeholder
(CHANGE-ME, as vault.yml.example ships) is refused at start-up, so a half-made
deployment fails loudly instead of running with a guessable secret.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmfleet.errors import LlmfleetError
from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.lanes import depth_caps

T = TypeVar("T")

# Values that mean "nobody filled this in". Compared case-insensitively, whole value.
PLACEHOLDERS = frozenset({"change-me", "changeme", "change_me", "replace-me", "todo", "secret", "password", "xxx"})


class SettingsError(LlmfleetError):
    """A setting or secret file is missing, unsafe or still a placeholder."""

    exit_code = 2


def read_secret_file(path: Path, what: str, *, min_length: int = 1) -> str:
    """The stripped content of a secret file, refusing placeholders and world-readable files.

    Messages name the file and the setting, never the content.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise SettingsError(f"{what}: secret file {path} does not exist") from None
    except PermissionError:
        raise SettingsError(f"{what}: secret file {path} is not readable by this user (uid {os.getuid()})") from None
    if not stat.S_ISREG(info.st_mode):
        raise SettingsError(f"{what}: {path} is not a regular file")
    if info.st_mode & stat.S_IROTH:
        raise SettingsError(f"{what}: secret file {path} is readable by everyone; chmod 0400 (or 0600) it")
    try:
        value = path.read_text().strip()
    except (PermissionError, UnicodeDecodeError) as error:
        raise SettingsError(f"{what}: cannot read secret file {path}: {type(error).__name__}") from None
    if not value:
        raise SettingsError(f"{what}: secret file {path} is empty")
    if value.lower() in PLACEHOLDERS:
        raise SettingsError(
            f"{what}: secret file {path} still holds a placeholder; put a real value in the vault"
            " (for example `openssl rand -hex 32`) and redeploy"
        )
    if len(value) < min_length:
        raise SettingsError(f"{what}: secret in {path} is shorter than {min_length} characters; use a longer one")
    return value


ENV_PREFIXES = {
    "RedisSettings": "LLMFLEET_REDIS_",
    "QueueSettings": "LLMFLEET_QUEUE_",
    "GatewaySettings": "LLMFLEET_GATEWAY_",
    "WorkerSettings": "LLMFLEET_WORKER_",
}


def describe_validation_error(error: ValidationError) -> str:
    """One line per bad setting, named as its environment variable; never the input value (it could be a secret)."""
    prefix = ENV_PREFIXES.get(error.title, "")
    lines = []
    for item in error.errors():
        location = [str(part) for part in item["loc"]]
        if len(location) >= 2 and location[0] in ("redis", "queue"):
            location = [f"LLMFLEET_{location[0]}_{location[1]}".upper(), *location[2:]]
        elif location:
            location = [f"{prefix}{location[0]}".upper(), *location[1:]]
        lines.append(f"  {' '.join(location) or error.title}: {item['msg']}")
    return "\n".join(lines)


def start_service(program: str, load: Callable[[], T], run: Callable[[T], int]) -> int:
    """Configure logging from LLMFLEET_LOG_LEVEL, load settings, then run; exit 2 on bad settings.

    A bad setting is one line per problem on stderr, named as its environment
    variable, never with its value (it could be a secret).
    """
    logging.basicConfig(
        level=log_level(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,  # the CLI configured WARNING before dispatching here
    )
    try:
        loaded = load()
    except ValidationError as error:
        print(f"{program}: invalid settings:\n{describe_validation_error(error)}", file=sys.stderr)
        return 2
    except SettingsError as error:
        print(f"{program}: {error}", file=sys.stderr)
        return error.exit_code
    return run(loaded)


def run_against_redis(
    program: str, client_name: str, work: Callable[[aioredis.Redis, Keys], Awaitable[int]]
) -> int:
    """A one-shot command against the queue's Redis: settings loaded as the services load them
    (start_service), then work(client, keys); a Redis error is one line on stderr and exit 1."""

    def load() -> tuple[RedisSettings, QueueSettings]:
        redis_settings = RedisSettings()
        redis_settings.password()  # a missing or unreadable password file fails here, as a bad setting
        return redis_settings, QueueSettings()

    async def run(settings: tuple[RedisSettings, QueueSettings]) -> int:
        redis_settings, queue = settings
        client = redis_settings.client(name=client_name)
        try:
            return await work(client, Keys(queue.prefix))
        except RedisError as error:
            print(f"{program}: Redis at {redis_settings.url}: {error}", file=sys.stderr)
            return 1
        finally:
            await client.aclose()

    return start_service(program, load, lambda settings: asyncio.run(run(settings)))


def log_level() -> str:
    return os.environ.get("LLMFLEET_LOG_LEVEL", "INFO").upper()


def refuse_secret_env(prefix: str, names: tuple[str, ...]) -> None:
    """Refuse secrets passed as environment values: they belong in files."""
    for name in names:
        variable = f"{prefix}{name}"
        if variable in os.environ:
            raise SettingsError(
                f"{variable} is set, but secrets are read only from files: set {variable}_FILE to a file"
                " holding the value (a Docker secret under /run/secrets) and unset the variable"
            )


class RedisSettings(BaseSettings):
    """LLMFLEET_REDIS_*: where Redis is and who we are to it (an ACL user)."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_REDIS_", extra="ignore", frozen=True)

    url: str = Field(default="redis://127.0.0.1:6379/0", description="redis:// or rediss:// URL, without a password")
    username: str | None = Field(default=None, description="ACL user (the redis role makes one per service)")
    password_file: Path | None = Field(default=None, description="file holding the ACL user's password")
    socket_timeout_s: float = Field(default=5.0, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    max_connections: int = Field(default=64, ge=4)

    @field_validator("url")
    @classmethod
    def _url_has_no_password(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"LLMFLEET_REDIS_URL must start with redis://, rediss:// or unix://, not {parts.scheme}://"
            )
        if parts.password:
            raise ValueError("LLMFLEET_REDIS_URL must not carry a password: put it in LLMFLEET_REDIS_PASSWORD_FILE")
        return value

    def password(self) -> str | None:
        if self.password_file is None:
            return None
        return read_secret_file(self.password_file, "LLMFLEET_REDIS_PASSWORD_FILE")

    def client(self, *, blocking_s: float = 0.0, name: str | None = None) -> aioredis.Redis:
        """A client with retries on dropped connections and a loading Redis.

        blocking_s: the longest BLOCK this client's commands use; its socket
        timeout is longer by socket_timeout_s so a blocking read is not cut off.
        """
        retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=3)
        # Blocking: a burst wider than max_connections waits for a free connection
        # (up to socket_timeout_s) instead of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url,
            username=self.username,
            password=self.password(),
            socket_timeout=self.socket_timeout_s + blocking_s,
            socket_connect_timeout=self.connect_timeout_s,
            max_connections=self.max_connections,
            timeout=self.socket_timeout_s,
            retry=retry,
            retry_on_error=[RedisConnectionError, RedisTimeoutError, BusyLoadingError],
            health_check_interval=30,
            decode_responses=True,
            client_name=name,
        )
        client = aioredis.Redis(connection_pool=pool)
        client.auto_close_connection_pool = True  # aclose() closes the pool this client made
        return client


LaneName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]


class QueueSettings(BaseSettings):
    """LLMFLEET_QUEUE_*: the queue's shape; the gateway and the workers must agree on it."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_QUEUE_", extra="ignore", frozen=True)

    prefix: str = Field(default="llmfleet", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="prefix of every key")
    lanes: tuple[LaneName, ...] = Field(
        default=("high", "normal", "low"), min_length=1, description="priority lanes, highest first"
    )
    default_lane: LaneName = "normal"
    max_depth: int = Field(default=10_000, ge=1, description="queued + in-flight entries before 503")
    lane_reserve: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="share of max_depth each lane leaves free for the lanes above it (lanes.py)",
    )
    lower_lane_every: int = Field(
        default=10,
        ge=2,
        le=1000,
        description="every Nth entry a worker takes comes from a lower lane that has work (lanes.py)",
    )
    backpressure_retry_after_s: int = Field(default=2, ge=1)
    queue_timeout_s: float = Field(default=120.0, gt=0, description="longest wait in the queue before 504")
    request_timeout_s: float = Field(default=300.0, gt=0, description="longest engine time for one request")
    result_ttl_s: int = Field(
        default=3600,
        ge=10,
        description="how long results stay readable: tasks, keyed (Idempotency-Key) requests, undelivered answers",
    )
    delivered_grace_s: int = Field(
        default=60,
        ge=1,
        description="how long a sync or stream answer stays stored after the gateway delivered it",
    )
    claim_idle_ms: int = Field(default=30_000, ge=200, description="idle time after which a dead worker's entry moves")
    max_attempts: int = Field(default=3, ge=1, description="starts of one request before it is dead-lettered")
    poison_after: int = Field(
        default=2, ge=1, description="engines that died serving one request before it is dead-lettered as poison"
    )
    reply_maxlen: int = Field(default=100_000, ge=1000, description="approximate cap of each reply stream")
    dead_letter_maxlen: int = Field(default=100_000, ge=100)
    engine_stale_s: float = Field(default=10.0, gt=0, description="a worker's engine report older than this is ignored")
    usage_retention_days: int = Field(
        default=400, ge=1, le=3650, description="how long the usage records of one UTC day are kept after it (usage.py)"
    )

    @model_validator(mode="after")
    def _lanes_consistent(self) -> QueueSettings:
        if self.default_lane not in self.lanes:
            raise ValueError(f"LLMFLEET_QUEUE_DEFAULT_LANE {self.default_lane!r} is not one of {list(self.lanes)}")
        if len(set(self.lanes)) != len(self.lanes):
            raise ValueError(f"LLMFLEET_QUEUE_LANES has duplicates: {list(self.lanes)}")
        if self.lane_reserve * (len(self.lanes) - 1) >= 1:
            raise ValueError(
                f"LLMFLEET_QUEUE_LANE_RESERVE {self.lane_reserve} x {len(self.lanes) - 1} lanes below the highest"
                " reserves the whole queue and leaves the lowest lane nothing; make it below"
                f" {1 / (len(self.lanes) - 1):.3g}"
            )
        return self

    def depth_cap(self, lane: str) -> int:
        """The depth (all lanes together) at which a request for `lane` gets a 503."""
        return depth_caps(self.max_depth, len(self.lanes), self.lane_reserve)[self.lanes.index(lane)]

    def lane_for(self, priority: str | int | None) -> str:
        """The lane a token's priority claim maps to: a lane name, or an index (0 = highest)."""
        if priority is None:
            return self.default_lane
        if isinstance(priority, int) and not isinstance(priority, bool):
            return self.lanes[min(max(priority, 0), len(self.lanes) - 1)]
        if isinstance(priority, str) and priority in self.lanes:
            return priority
        raise ValueError(f"priority {priority!r} is not a lane ({', '.join(self.lanes)}) or a lane index")


def default_instance_id(kind: str) -> str:
    """hostname-pid: unique per process, readable in XINFO CONSUMERS and logs."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}"
