"""`llmfleet usage`: its dates, its budgets document, the report it puts together, and the errors it gives."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from llmfleet import cli
from llmfleet.errors import LlmfleetError
from llmfleet.ops.usage import Report, budget_changes, parse_day, read_report, report_range, tokens
from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.usage import UsageRow, pair_member

Run = Callable[..., tuple[int, str, str]]
KEYS = Keys("llmfleet")


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("llmfleet.ops.usage",))

    def _run(*argv: str) -> tuple[int, str, str]:
        try:
            code = cli.main(list(argv))
        except SystemExit as exit_:  # argparse's refusals
            code = int(exit_.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("2026-13-01", "not a day of the calendar"),
        ("2026-02-30", "not a day of the calendar"),
        ("04.12.2026", "give a UTC day as YYYY-MM-DD"),
        ("2026-12-4", "give a UTC day as YYYY-MM-DD"),
        ("yesterday", "give a UTC day as YYYY-MM-DD"),
    ],
)
def test_a_bad_day_is_refused_with_the_option_named(text: str, words: str) -> None:
    with pytest.raises(LlmfleetError, match=words) as refused:
        parse_day(text, "--since")
    assert str(refused.value).startswith(f"--since {text!r}")


def test_the_range_defaults_to_this_month_so_far() -> None:
    today = date(2026, 12, 4)
    assert report_range(None, None, today) == (date(2026, 12, 1), today)
    assert report_range("2026-11-30", None, today) == (date(2026, 11, 30), today)
    assert report_range(None, "2026-10-15", today) == (date(2026, 10, 1), date(2026, 10, 15))
    with pytest.raises(LlmfleetError, match="--since 2026-12-05 is after --until 2026-12-04"):
        report_range("2026-12-05", "2026-12-04", today)
    with pytest.raises(LlmfleetError, match="more than 3660 days"):
        report_range("2000-01-01", "2026-12-04", today)


def test_bad_dates_exit_1_with_a_clear_line_before_redis_is_asked(run: Run) -> None:
    # No Redis listens on this URL: the refusal comes first.
    code, out, err = run("usage", "--since", "2026-12-32")
    assert code == 1
    assert out == ""
    assert err.strip() == "llmfleet: --since '2026-12-32': not a day of the calendar (day is out of range for month)"


def test_budget_values_must_be_whole_tokens(run: Run) -> None:
    assert tokens("1000") == 1000
    assert tokens("0") == 0
    for bad in ("-5", "1e6", "lots", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            tokens(bad)
    code, _out, err = run("usage", "budget", "set", "--tier", "free", "--daily", "-5")
    assert code == 2 and "is not a whole number of tokens" in err
    code, _out, err = run("usage", "budget", "set", "--tier", "free", "--sub", "alice", "--daily", "5")
    assert code == 2 and "not allowed with argument" in err
    code, _out, err = run("usage", "budget", "set", "--tier", "free")
    assert code == 1 and "give --daily N and/or --monthly N" in err


def test_a_budgets_document_names_what_to_set() -> None:
    document = {"tiers": {"free": {"daily": 1000, "monthly": 20000}}, "subjects": {"alice": {"daily": 0}}}
    assert budget_changes(document) == {"daily:tier:free": 1000, "monthly:tier:free": 20000, "daily:sub:alice": 0}
    assert budget_changes({"tiers": {}, "subjects": {}}) == {}
    for bad in (
        [],
        {"teams": {}},
        {"tiers": {"free": {"weekly": 5}}},
        {"tiers": {"free": {"daily": -1}}},
        {"tiers": {"free": {"daily": "5"}}},
        {"tiers": {"free": {"daily": True}}},
        {"subjects": {"alice": 5}},
    ):
        with pytest.raises(LlmfleetError):
            budget_changes(bad)


def test_apply_refuses_a_file_that_is_not_json(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "budgets.json"
    path.write_text("{not json")
    code, _out, err = run("usage", "budget", "apply", "--file", str(path))
    assert code == 1 and f"--file {path}: not JSON" in err
    code, _out, err = run("usage", "budget", "apply", "--file", str(tmp_path / "missing.json"))
    assert code == 1 and "No such file" in err


class FakePipeline:
    """The two commands a report sends, answered from dicts, in order (as a pipeline's execute does)."""

    def __init__(self, sets: dict[str, set[str]], hashes: dict[str, dict[str, str]]) -> None:
        self.sets, self.hashes = sets, hashes
        self.calls: list[Any] = []

    async def __aenter__(self) -> FakePipeline:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    def smembers(self, key: str) -> None:
        self.calls.append(self.sets.get(key, set()))

    def hgetall(self, key: str) -> None:
        self.calls.append(self.hashes.get(key, {}))

    async def execute(self) -> list[Any]:
        calls, self.calls = self.calls, []
        return calls


class FakeRedis:
    def __init__(self, sets: dict[str, set[str]], hashes: dict[str, dict[str, str]]) -> None:
        self.sets, self.hashes = sets, hashes

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        return FakePipeline(self.sets, self.hashes)


def record(requests: int, errors: int, prompt: int, completion: int) -> dict[str, str]:
    return {
        "requests": str(requests),
        "errors": str(errors),
        "prompt_tokens": str(prompt),
        "completion_tokens": str(completion),
    }


@pytest.fixture
def stored() -> FakeRedis:
    day1, day2 = "2026-12-01", "2026-12-02"
    sets = {
        KEYS.usage_index(day1): {pair_member("alice", "tiny"), pair_member("bob", "tiny"), "garbage"},
        KEYS.usage_index(day2): {pair_member("alice", "tiny"), pair_member("alice", "big"), pair_member("gone", "x")},
    }
    hashes = {
        KEYS.usage(day1, "alice", "tiny"): record(3, 1, 30, 60),
        KEYS.usage(day1, "bob", "tiny"): record(1, 0, 5, 7),
        KEYS.usage(day2, "alice", "tiny"): record(2, 0, 20, 40),
        KEYS.usage(day2, "alice", "big"): record(1, 1, 9, 0),
        # ("gone", "x") expired before its index: left out.
    }
    return FakeRedis(sets, hashes)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_report_gathers_the_days_and_filters(stored: FakeRedis, anyio_backend: str) -> None:
    everything = await read_report(stored, KEYS, date(2026, 11, 30), date(2026, 12, 2), None, None)  # type: ignore[arg-type]
    assert [(row.day, row.subject, row.model) for row in everything.rows] == [
        ("2026-12-01", "alice", "tiny"),
        ("2026-12-01", "bob", "tiny"),
        ("2026-12-02", "alice", "big"),
        ("2026-12-02", "alice", "tiny"),
    ]
    assert everything.as_json()["totals"] == {"requests": 7, "errors": 2, "prompt_tokens": 64, "completion_tokens": 107}
    alice = await read_report(stored, KEYS, date(2026, 12, 1), date(2026, 12, 2), "alice", "tiny")  # type: ignore[arg-type]
    assert alice.as_json()["totals"] == {"requests": 5, "errors": 1, "prompt_tokens": 50, "completion_tokens": 100}
    one_day = await read_report(stored, KEYS, date(2026, 12, 2), date(2026, 12, 2), None, "big")  # type: ignore[arg-type]
    assert [row.as_dict() for row in one_day.rows] == [
        {
            "day": "2026-12-02",
            "sub": "alice",
            "model": "big",
            "requests": 1,
            "errors": 1,
            "prompt_tokens": 9,
            "completion_tokens": 0,
        }
    ]
    nobody = await read_report(stored, KEYS, date(2026, 12, 1), date(2026, 12, 2), "carol", None)  # type: ignore[arg-type]
    assert nobody.rows == [] and nobody.as_json()["totals"]["requests"] == 0


def test_the_table_has_a_row_per_record_and_a_totals_line() -> None:
    report = Report(
        date(2026, 12, 1),
        date(2026, 12, 2),
        [UsageRow("2026-12-01", "alice", "tiny", 3, 1, 30, 60), UsageRow("2026-12-02", "bob", "tiny", 12, 0, 5, 700)],
    )
    lines = report.table().splitlines()
    assert lines[0].split() == ["day", "sub", "model", "requests", "errors", "prompt", "tokens", "completion", "tokens"]
    assert lines[1].split() == ["2026-12-01", "alice", "tiny", "3", "1", "30", "60"]
    assert lines[2].split() == ["2026-12-02", "bob", "tiny", "12", "0", "5", "700"]
    assert lines[3].split() == ["total", "15", "1", "35", "760"]
    # Numbers are right-aligned: every line ends in the same column.
    assert len({len(line) for line in lines}) == 1
    assert json.loads(json.dumps(report.as_json()))["rows"][1]["sub"] == "bob"
