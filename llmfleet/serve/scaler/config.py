"""Scaler settings: LLMFLEET_SCALER_* (nested values with `__`, e.g. LLMFLEET_SCALER_WORKERS__MAX=8).

The bearer token Alertmanager sends is read from a file (token_file), never
from an environment value or the command line: both show in process lists.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmfleet.serve.queue.config import SettingsError, read_secret_file, refuse_secret_env

# A token shorter than this is refused at start-up.
MIN_TOKEN_LENGTH = 16
# Failed actions in a row, for one kind and direction, after which the scaler gives up on
# the alerts behind them; and the longest back-off between two attempts (policy.py).
DEFAULT_MAX_FAILURES = 3
DEFAULT_BACKOFF_MAX_S = 3600.0


class KindLimits(BaseModel):
    """Bounds and cooldowns of one kind of capacity.

    For engines, `min`/`max` count engine hosts (the inventory's engine group
    plus the standby hosts the scaler added); for workers, worker processes per
    gateway host. A cooldown runs from the end of the last action of the kind,
    whichever its direction, so a scale-in never follows a scale-out closely.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(ge=0)
    max: int = Field(ge=1)
    step: int = Field(
        default=1,
        ge=1,
        description="workers removed per gateway host per action, and the fewest added (a backlog may earn more)",
    )
    cooldown_out_s: float = Field(default=300.0, ge=0)
    cooldown_in_s: float = Field(default=1800.0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> KindLimits:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class ScalerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LLMFLEET_SCALER_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    host: str = "127.0.0.1"
    port: int = Field(default=9095, ge=1, le=65535)
    # Required: the file holding the bearer token Alertmanager sends.
    token_file: Path
    # State, audit log and ansible-runner's artifacts live here.
    state_dir: Path = Path("/var/lib/llmfleet-scaler")
    # The repository checkout holding ansible.cfg, playbooks/ and roles/.
    project_dir: Path
    # Inventory sources, as `ansible-playbook -i` takes them (JSON list).
    inventory: tuple[Path, ...] = Field(min_length=1)
    dry_run: bool = Field(default=False, description="decide and audit, run nothing, change no state")
    engine_group: str = "gpu_nodes"
    standby_group: str = "gpu_standby"
    gateway_group: str = "gateways"
    # Prometheus's hosts: every scaling run rewrites their scrape targets (playbooks/monitoring_targets.yml).
    monitoring_group: str = "monitoring"
    workers: KindLimits = KindLimits(min=1, max=8)
    engines: KindLimits = KindLimits(min=1, max=16)
    playbook_timeout_s: int = Field(default=3600, ge=1)
    # An action interrupted by a restart is run again (the playbooks are
    # idempotent) at most this many times in all; then it is abandoned.
    max_attempts: int = Field(default=2, ge=1)
    # After a failed action (failed, timeout, error, abandoned), the next one of the same kind and
    # direction waits cooldown x 2^(failures - 1), at most backoff_max_s; after max_failures in a
    # row the scaler gives up on the alerts behind them (`gave_up`) until a success, an alert it
    # has not failed on (a new firing), or POST /failures/reset.
    max_failures: int = Field(default=DEFAULT_MAX_FAILURES, ge=1)
    backoff_max_s: float = Field(default=DEFAULT_BACKOFF_MAX_S, ge=0)
    keep_artifacts: int = Field(default=100, ge=1, description="ansible-runner artifact directories kept")
    max_body_bytes: int = Field(default=1 << 20, ge=1024)

    @model_validator(mode="after")
    def _check(self) -> ScalerSettings:
        if not (self.project_dir / "playbooks" / "scale_out.yml").is_file():
            raise ValueError(f"{self.project_dir} holds no playbooks/scale_out.yml: point it at the checkout")
        return self

    def token(self) -> str:
        return read_secret_file(self.token_file, "LLMFLEET_SCALER_TOKEN_FILE", min_length=MIN_TOKEN_LENGTH)

    @classmethod
    def from_env(cls) -> ScalerSettings:
        """Settings from the environment; the token file is read (and checked) now, before a port is bound."""
        refuse_secret_env("LLMFLEET_SCALER_", ("TOKEN",))
        try:
            settings = cls()  # type: ignore[call-arg]  # required values come from the environment
        except ValidationError as error:
            raise SettingsError(describe(error)) from None
        settings.token()
        return settings


def describe(error: ValidationError) -> str:
    """One line per bad setting, named as its environment variable; never the value."""
    lines = ["invalid settings:"]
    for item in error.errors():
        name = "LLMFLEET_SCALER_" + "__".join(str(part) for part in item["loc"]).upper()
        lines.append(f"  {name}: {item['msg']}")
    return "\n".join(lines)
