"""Usage records per subject, model and UTC day, and the token budgets admission checks against them.

Recorded by the worker, inside the DELIVER script (scripts.py) that stores a
request's first result: no round trip of its own, and exactly once per
request (a duplicate or fenced-off result records nothing). The day is the
UTC day the gateway admitted the request (Job.enqueued_ms), so a request
admitted at 23:59:59 counts, and is charged, on the day it was admitted.

Keys (after `<prefix>:`, keys.py):

- `usage:<day>:<sub>:<model>`: hash `requests`, `errors`, `prompt_tokens`,
  `completion_tokens`; kept usage_retention_days after the day's last write;
- `usage:<day>`: set of the (subject, model) pairs with a record that day
  (JSON arrays), so that a report reads what exists without SCAN;
- `spend:d:<day>:<sub>` and `spend:m:<month>:<sub>`: hash `used` (prompt +
  completion tokens of answered requests) and `held` (the estimates of the
  subject's admitted requests not answered yet): what budgets count;
- `budgets`: hash `<daily|monthly>:<tier|sub>:<name>` -> tokens, written by
  the gateway role on deploy and by `llmfleet usage budget`, read by ADMIT
  on every request (a change applies to the next request).

A subject's own budget replaces its tier's for that period (0: none for the
subject); without either, the period has no budget. Errors are answers that
are not 200: engine errors, timeouts, cancellations, dead letters.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from llmfleet.serve.queue.keys import Keys

Period = Literal["daily", "monthly"]
Scope = Literal["tier", "sub"]
PERIODS: tuple[Period, ...] = ("daily", "monthly")
SCOPES: tuple[Scope, ...] = ("tier", "sub")
# How long the spend counters outlive their period: long enough for the last answers of the period to release
# their estimates, short enough that nothing accumulates.
SPEND_DAY_TTL_S = 3 * 86_400
SPEND_MONTH_TTL_S = 62 * 86_400
RECORD_FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens")
DAY_MS = 86_400_000


def utc_day(ms: int) -> str:
    """The UTC day of a timestamp in milliseconds: YYYY-MM-DD."""
    return _day_name(ms // DAY_MS)


@functools.lru_cache(maxsize=8)
def _day_name(day: int) -> str:
    # Every request names its day twice or more (usage and spend keys): formatting it once a day is cheaper.
    return datetime.fromtimestamp(day * 86_400, UTC).strftime("%Y-%m-%d")


def utc_month(ms: int) -> str:
    """The UTC month of a timestamp in milliseconds: YYYY-MM."""
    return _day_name(ms // DAY_MS)[:7]


def pair_member(subject: str, model: str) -> str:
    """The member of a day's index set that names one (subject, model) record."""
    return json.dumps([subject, model], separators=(",", ":"))


def spend_keys(keys: Keys, subject: str, ms: int) -> tuple[str, str]:
    """The day's and the month's spend counters of a subject, for a request admitted at ms."""
    return keys.spend("d", utc_day(ms), subject), keys.spend("m", utc_month(ms), subject)


def budget_field(period: str, scope: str, name: str) -> str:
    """A field of the budgets hash: period daily|monthly, scope tier|sub."""
    return f"{period}:{scope}:{name}"


def parse_budget_field(field: str) -> tuple[Period, Scope, str] | None:
    """(period, scope, name) of a field of the budgets hash; None for anything else."""
    period, _, rest = field.partition(":")
    scope, _, name = rest.partition(":")
    if period not in PERIODS or scope not in SCOPES or not name:
        return None
    return period, scope, name


def reset_at(period: Period, now_ms: int) -> datetime:
    """When a period's budget starts afresh: the next UTC midnight, or the first of next month at 00:00 UTC."""
    now = datetime.fromtimestamp(now_ms / 1000, UTC)
    if period == "daily":
        return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


@dataclass(frozen=True)
class BudgetRefusal:
    """Which budget refused a request (ADMIT's answer), and what it had left."""

    period: Period
    scope: Scope
    name: str  # the tier's or the subject's name
    budget: int
    spent: int  # used + held when the request came
    cost: int

    def message(self, now_ms: int) -> str:
        reset = reset_at(self.period, now_ms)
        owner = f"tier {self.name!r}" if self.scope == "tier" else f"subject {self.name!r}"
        left = max(self.budget - self.spent, 0)
        message = (
            f"{self.period} token budget of {owner} exceeded: this request needs up to {self.cost} tokens"
            f" (prompt + max_tokens), {left} of {self.budget} are left; it resets at"
            f" {reset.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        )
        if self.cost > self.budget:
            message += "; this request alone is over the budget: lower max_tokens or shorten the prompt"
        return message

    def retry_after_s(self, now_ms: int) -> int:
        return max(1, int(reset_at(self.period, now_ms).timestamp() - now_ms / 1000 + 0.999))


@dataclass(frozen=True)
class UsageRow:
    day: str
    subject: str
    model: str
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, str | int]:
        return {
            "day": self.day,
            "sub": self.subject,
            "model": self.model,
            "requests": self.requests,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


def row_of(day: str, member: str, record: Mapping[str, str]) -> UsageRow | None:
    """One record read back: its index member (subject, model) and its hash; None for a malformed member."""
    try:
        subject, model = json.loads(member)
    except (ValueError, TypeError):
        return None
    if not isinstance(subject, str) or not isinstance(model, str):
        return None
    counts = {name: int(record.get(name) or 0) for name in RECORD_FIELDS}
    return UsageRow(day, subject, model, **counts)


def totals(rows: Iterable[UsageRow]) -> dict[str, int]:
    out = dict.fromkeys(RECORD_FIELDS, 0)
    for row in rows:
        out["requests"] += row.requests
        out["errors"] += row.errors
        out["prompt_tokens"] += row.prompt_tokens
        out["completion_tokens"] += row.completion_tokens
    return out


def days(since: date, until: date) -> list[str]:
    """Every day from since to until, both included."""
    count = (until - since).days + 1
    return [(since + timedelta(days=offset)).isoformat() for offset in range(max(count, 0))]
