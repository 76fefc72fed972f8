"""Usage records and budgets: the key layout, the UTC day and month, the budget refusal's words and reset time."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.usage import (
    BudgetRefusal,
    UsageRow,
    budget_field,
    days,
    pair_member,
    parse_budget_field,
    reset_at,
    row_of,
    spend_keys,
    totals,
    utc_day,
    utc_month,
)

KEYS = Keys("llmfleet")


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def test_the_keys_sit_under_the_queue_prefix() -> None:
    assert KEYS.usage("2026-12-04", "alice", "tiny") == "llmfleet:usage:2026-12-04:alice:tiny"
    assert KEYS.usage_index("2026-12-04") == "llmfleet:usage:2026-12-04"
    assert KEYS.spend("d", "2026-12-04", "alice") == "llmfleet:spend:d:2026-12-04:alice"
    assert KEYS.budgets == "llmfleet:budgets"
    assert Keys("lft").usage("2026-12-04", "a", "m").startswith("lft:usage:")


def test_no_two_subject_and_model_pairs_share_a_record() -> None:
    # Unescaped, both would be llmfleet:usage:<day>:a:b:c.
    first = KEYS.usage("2026-12-04", "a:b", "c")
    second = KEYS.usage("2026-12-04", "a", "b:c")
    assert first != second
    assert first == "llmfleet:usage:2026-12-04:a%3Ab:c"
    # A literal "%3A" in a name is escaped too, so it cannot pass for an escaped colon.
    assert KEYS.usage("2026-12-04", "a%3Ab", "c") != first


def test_a_request_counts_on_the_utc_day_and_month_it_was_admitted() -> None:
    late = ms("2026-12-31T23:59:59.999")
    assert utc_day(late) == "2026-12-31"
    assert utc_month(late) == "2026-12"
    assert utc_day(late + 1) == "2027-01-01"
    assert utc_month(late + 1) == "2027-01"
    assert spend_keys(KEYS, "alice", late) == ("llmfleet:spend:d:2026-12-31:alice", "llmfleet:spend:m:2026-12:alice")


@pytest.mark.parametrize(
    ("period", "now", "reset"),
    [
        ("daily", "2026-12-04T13:05:00", "2026-12-05T00:00:00"),
        ("daily", "2026-12-31T23:59:59", "2027-01-01T00:00:00"),
        ("daily", "2028-02-28T00:00:00", "2028-02-29T00:00:00"),
        ("monthly", "2026-12-04T13:05:00", "2027-01-01T00:00:00"),
        ("monthly", "2026-01-31T10:00:00", "2026-02-01T00:00:00"),
        ("monthly", "2026-02-01T00:00:00", "2026-03-01T00:00:00"),
    ],
)
def test_budgets_reset_at_utc_midnight_or_the_first_of_next_month(period: str, now: str, reset: str) -> None:
    assert reset_at(period, ms(now)) == datetime.fromisoformat(reset).replace(tzinfo=UTC)  # type: ignore[arg-type]


def test_the_refusal_says_which_budget_and_when_it_resets() -> None:
    refusal = BudgetRefusal("daily", "tier", "free", budget=1000, spent=950, cost=100)
    now = ms("2026-12-04T23:00:00")
    message = refusal.message(now)
    assert "daily token budget of tier 'free' exceeded" in message
    assert "50 of 1000 are left" in message
    assert "resets at 2026-12-05T00:00:00Z" in message
    assert refusal.retry_after_s(now) == 3600

    monthly = BudgetRefusal("monthly", "sub", "alice", budget=10, spent=0, cost=20)
    message = monthly.message(ms("2026-12-04T23:00:00"))
    assert "monthly token budget of subject 'alice' exceeded" in message
    assert "resets at 2027-01-01T00:00:00Z" in message
    # Over the whole budget: waiting for the reset would not help.
    assert "this request alone is over the budget: lower max_tokens" in message
    assert "lower max_tokens" not in refusal.message(now)
    assert monthly.retry_after_s(ms("2026-12-31T23:59:59.5")) == 1


def test_budget_fields_read_back() -> None:
    assert budget_field("daily", "tier", "free") == "daily:tier:free"
    assert parse_budget_field("monthly:sub:a:b") == ("monthly", "sub", "a:b")
    for bad in ("weekly:tier:free", "daily:team:x", "daily:sub:", "nonsense"):
        assert parse_budget_field(bad) is None


def test_a_record_reads_back_by_its_index_member() -> None:
    member = pair_member("a:b", "tiny")
    row = row_of("2026-12-04", member, {"requests": "3", "errors": "1", "prompt_tokens": "30"})
    assert row == UsageRow("2026-12-04", "a:b", "tiny", 3, 1, 30, 0)
    assert row_of("2026-12-04", "not json", {}) is None
    assert row_of("2026-12-04", "[1, 2]", {}) is None


def test_totals_and_day_ranges() -> None:
    rows = [UsageRow("d", "a", "m", 2, 1, 10, 20), UsageRow("d", "b", "m", 3, 0, 5, 7)]
    assert totals(rows) == {"requests": 5, "errors": 1, "prompt_tokens": 15, "completion_tokens": 27}
    assert totals([]) == {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
    assert days(date(2026, 2, 27), date(2026, 3, 2)) == ["2026-02-27", "2026-02-28", "2026-03-01", "2026-03-02"]
    assert days(date(2026, 3, 2), date(2026, 3, 1)) == []
