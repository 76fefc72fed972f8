"""Alertmanager's webhook payload, version 4, as a pydantic model.

https://prometheus.io/docs/alerting/latest/configuration/#webhook_config
describes the fields. Unknown fields are allowed (a later Alertmanager may add
some); missing or mistyped ones are a 400 with the reason.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Alert(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime  # Alertmanager's spelling, as every field here
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = Field(min_length=1, max_length=128)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


class Notification(BaseModel):
    """One webhook call: a group of alerts that Alertmanager routed to the scaler."""

    model_config = ConfigDict(extra="allow", frozen=True)

    version: Literal["4"]
    groupKey: str = Field(min_length=1, max_length=4096)
    truncatedAlerts: int = Field(default=0, ge=0)
    status: Literal["firing", "resolved"]
    receiver: str
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[Alert] = Field(min_length=1)
