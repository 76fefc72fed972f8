"""`llmfleet usage`: the usage records per subject, model and UTC day, and the token budgets.

    llmfleet usage [--since 2026-12-01] [--until 2026-12-04] [--sub alice] [--model tiny] [--json]
    llmfleet usage budget set (--tier free | --sub alice) [--daily N] [--monthly N]
    llmfleet usage budget unset (--tier free | --sub alice) [--daily] [--monthly]
    llmfleet usage budget list [--json]
    llmfleet usage budget apply --file budgets.json     (what the gateway role runs on deploy)

The workers record usage and the gateways read budgets in Redis
(llmfleet/serve/queue/usage.py); this command only needs Redis, so it is a
serving command: it runs from the gateway's image, with its environment
(LLMFLEET_REDIS_URL, LLMFLEET_REDIS_USERNAME, LLMFLEET_REDIS_PASSWORD_FILE,
LLMFLEET_QUEUE_PREFIX), as `llmfleet token revoke` does. A budget set here
applies to the next request: nothing restarts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmfleet.errors import LlmfleetError
from llmfleet.serve.queue.usage import (
    PERIODS,
    UsageRow,
    budget_field,
    days,
    parse_budget_field,
    row_of,
    totals,
)

if TYPE_CHECKING:  # imported when Redis is asked, not for every `llmfleet` command
    import redis.asyncio as aioredis

    from llmfleet.serve.queue.keys import Keys

# A report reads one index set per day: ten years at most (the longest retention QueueSettings allows).
MAX_REPORT_DAYS = 3660
COLUMNS = ("day", "sub", "model", "requests", "errors", "prompt tokens", "completion tokens")


def parse_day(text: str, option: str) -> date:
    """YYYY-MM-DD (a UTC day) -> date; anything else is refused with the option's name."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text.strip()):
        raise LlmfleetError(f"{option} {text!r}: give a UTC day as YYYY-MM-DD (e.g. 2026-12-04)")
    try:
        return date.fromisoformat(text.strip())
    except ValueError as error:
        raise LlmfleetError(f"{option} {text!r}: not a day of the calendar ({error})") from None


def report_range(since: str | None, until: str | None, today: date) -> tuple[date, date]:
    """The days a report covers: --until defaults to today (UTC), --since to the first of --until's month."""
    last = parse_day(until, "--until") if until else today
    first = parse_day(since, "--since") if since else last.replace(day=1)
    if first > last:
        raise LlmfleetError(f"--since {first} is after --until {last}")
    if (last - first).days + 1 > MAX_REPORT_DAYS:
        raise LlmfleetError(f"--since {first} to --until {last} is more than {MAX_REPORT_DAYS} days; narrow it")
    return first, last


def tokens(text: str) -> int:
    """A budget in tokens: a whole number, 0 or more (0: no budget)."""
    if not re.fullmatch(r"\d{1,15}", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens (0 or more)")
    return int(text)


@dataclass(frozen=True)
class Report:
    since: date
    until: date
    rows: list[UsageRow]

    def as_json(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "rows": [row.as_dict() for row in self.rows],
            "totals": totals(self.rows),
        }

    def table(self) -> str:
        lines = [[row.day, row.subject, row.model, *map(str, _counts(row))] for row in self.rows]
        total = totals(self.rows)
        lines.append(["total", "", "", *(str(total[name]) for name in total)])
        widths = [max(len(cell) for cell in column) for column in zip(COLUMNS, *lines, strict=True)]

        def line(cells: list[str] | tuple[str, ...]) -> str:
            # Text left, numbers right.
            return "  ".join(
                cell.ljust(width) if index < 3 else cell.rjust(width)
                for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()

        return "\n".join([line(COLUMNS), *(line(cells) for cells in lines)])


def _counts(row: UsageRow) -> tuple[int, int, int, int]:
    return row.requests, row.errors, row.prompt_tokens, row.completion_tokens


async def read_report(
    client: aioredis.Redis, keys: Keys, since: date, until: date, subject: str | None, model: str | None
) -> Report:
    """The records of [since, until], filtered: two pipelined round trips (the index sets, then the records)."""
    wanted = days(since, until)
    async with client.pipeline(transaction=False) as pipe:
        for day in wanted:
            pipe.smembers(keys.usage_index(day))
        indexes = await pipe.execute()
    pairs: list[tuple[str, str, str, str]] = []  # day, member, subject, model
    for day, members in zip(wanted, indexes, strict=True):
        for member in sorted(str(item) for item in members):
            named = row_of(day, member, {})
            if named is None:
                continue
            if subject is not None and named.subject != subject:
                continue
            if model is not None and named.model != model:
                continue
            pairs.append((day, member, named.subject, named.model))
    async with client.pipeline(transaction=False) as pipe:
        for day, _member, name, served in pairs:
            pipe.hgetall(keys.usage(day, name, served))
        records = await pipe.execute() if pairs else []
    rows = []
    for (day, member, _name, _served), record in zip(pairs, records, strict=True):
        row = row_of(day, member, {str(key): str(value) for key, value in record.items()})
        if row is not None and record:  # a record that expired before its index: nothing to report
            rows.append(row)
    rows.sort(key=lambda row: (row.day, row.subject, row.model))
    return Report(since, until, rows)


def budget_changes(document: Any) -> dict[str, int]:
    """The fields of the budgets hash a budgets document sets: {"tiers": {name: {daily, monthly}}, "subjects": ...}."""
    if not isinstance(document, dict) or set(document) - {"tiers", "subjects"}:
        raise LlmfleetError('a budgets document is {"tiers": {NAME: {"daily": N, "monthly": N}}, "subjects": {...}}')
    changes: dict[str, int] = {}
    for section, scope in (("tiers", "tier"), ("subjects", "sub")):
        entries = document.get(section) or {}
        if not isinstance(entries, dict):
            raise LlmfleetError(f"budgets: {section} must map names to {{daily, monthly}}")
        for name, budgets in entries.items():
            if not isinstance(budgets, dict) or set(budgets) - set(PERIODS):
                raise LlmfleetError(f"budgets: {section}.{name}: give daily and/or monthly, nothing else")
            for period, value in budgets.items():
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise LlmfleetError(f"budgets: {section}.{name}.{period}: {value!r} is not a number of tokens")
                changes[budget_field(period, scope, str(name))] = value
    return changes


def _owner(args: argparse.Namespace) -> tuple[str, str]:
    if (args.tier is None) == (args.sub is None):
        raise LlmfleetError(f"llmfleet usage budget {args.budget_command}: give --tier NAME or --sub SUBJECT")
    return ("tier", args.tier) if args.tier is not None else ("sub", args.sub)


def _with_redis(program: str, work: Any) -> int:
    from llmfleet.serve.queue.config import run_against_redis

    return run_against_redis(program, "llmfleet-usage", work)


def report(args: argparse.Namespace) -> int:
    since, until = report_range(args.since, args.until, datetime.now(UTC).date())

    async def work(client: aioredis.Redis, keys: Keys) -> int:
        found = await read_report(client, keys, since, until, args.sub, args.model)
        print(json.dumps(found.as_json(), indent=2) if args.json else found.table())
        return 0

    return _with_redis("llmfleet usage", work)


def budget_set(args: argparse.Namespace) -> int:
    scope, name = _owner(args)
    values = {period: getattr(args, period) for period in PERIODS if getattr(args, period) is not None}
    if not values:
        raise LlmfleetError("llmfleet usage budget set: give --daily N and/or --monthly N (0: no budget)")

    async def work(client: aioredis.Redis, keys: Keys) -> int:
        await client.hset(keys.budgets, mapping={budget_field(p, scope, name): v for p, v in values.items()})
        for period, value in values.items():
            print(f"{period} budget of {scope} {name}: {value} tokens" + (" (none)" if value == 0 else ""))
        return 0

    return _with_redis("llmfleet usage budget set", work)


def budget_unset(args: argparse.Namespace) -> int:
    scope, name = _owner(args)
    periods = [period for period in PERIODS if getattr(args, period)] or list(PERIODS)

    async def work(client: aioredis.Redis, keys: Keys) -> int:
        removed = await client.hdel(keys.budgets, *(budget_field(period, scope, name) for period in periods))
        print(f"removed {removed} budget(s) of {scope} {name}")
        return 0

    return _with_redis("llmfleet usage budget unset", work)


def budget_list(args: argparse.Namespace) -> int:
    async def work(client: aioredis.Redis, keys: Keys) -> int:
        found = await client.hgetall(keys.budgets)
        entries = []
        for field, value in sorted(found.items()):
            parsed = parse_budget_field(str(field))
            if parsed is not None:
                entries.append({"period": parsed[0], "scope": parsed[1], "name": parsed[2], "tokens": int(value)})
        if args.json:
            print(json.dumps(entries, indent=2))
        else:
            for entry in entries:
                print(f"{entry['scope']} {entry['name']}: {entry['period']} {entry['tokens']} tokens")
        return 0

    return _with_redis("llmfleet usage budget list", work)


def budget_apply(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        document = json.loads(text)
    except OSError as error:
        raise LlmfleetError(f"--file {args.file}: {error.strerror or type(error).__name__}") from None
    except ValueError as error:
        raise LlmfleetError(f"--file {args.file}: not JSON ({error})") from None
    changes = budget_changes(document)

    async def work(client: aioredis.Redis, keys: Keys) -> int:
        fields = list(changes)
        current = await client.hmget(keys.budgets, fields) if fields else []
        differ = {
            field: value for (field, value), now in zip(changes.items(), current, strict=True) if now != str(value)
        }
        if differ:
            await client.hset(keys.budgets, mapping={field: value for field, value in differ.items()})
        # One JSON line: the gateway role reads `changed` from it.
        print(json.dumps({"changed": bool(differ), "set": sorted(differ)}))
        return 0

    return _with_redis("llmfleet usage budget apply", work)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "usage",
        help="usage per subject, model and UTC day; token budgets",
        description=(
            "Report the usage records the workers keep in Redis: requests, errors, prompt and completion tokens per"
            " subject (the token's sub), model and UTC day, with a totals line. Redis settings come from"
            " LLMFLEET_REDIS_URL, LLMFLEET_REDIS_USERNAME and LLMFLEET_REDIS_PASSWORD_FILE, the prefix from"
            " LLMFLEET_QUEUE_PREFIX (run it in a gateway container: it has them all)."
        ),
    )
    parser.add_argument("--since", help="first UTC day, YYYY-MM-DD (default: the first of --until's month)")
    parser.add_argument("--until", help="last UTC day, YYYY-MM-DD (default: today)")
    parser.add_argument("--sub", help="only this subject")
    parser.add_argument("--model", help="only this model")
    parser.add_argument("--json", action="store_true", help="print JSON: since, until, rows and totals")
    parser.set_defaults(handler=report)
    commands = parser.add_subparsers(dest="usage_command", metavar="COMMAND")
    budget = commands.add_parser(
        "budget",
        help="set, remove, list or apply daily and monthly token budgets",
        description=(
            "Token budgets live in Redis (<prefix>:budgets) and apply to the next request, without a restart. A"
            " subject's own budget replaces its tier's for that period; 0 means none."
        ),
    )
    actions = budget.add_subparsers(dest="budget_command", metavar="ACTION", required=True)
    set_parser = actions.add_parser("set", help="set a tier's or a subject's daily and/or monthly budget")
    unset_parser = actions.add_parser(
        "unset", help="remove a tier's or a subject's budget (a subject then has its tier's)"
    )
    for action in (set_parser, unset_parser):
        owner = action.add_mutually_exclusive_group(required=True)
        owner.add_argument("--tier", help="a rate-limit tier (every subject of the tier gets this budget)")
        owner.add_argument("--sub", help="one subject")
    set_parser.add_argument("--daily", type=tokens, help="tokens per UTC day (prompt + completion); 0: none")
    set_parser.add_argument("--monthly", type=tokens, help="tokens per UTC month (prompt + completion); 0: none")
    set_parser.set_defaults(handler=budget_set)
    unset_parser.add_argument("--daily", action="store_true", help="remove the daily budget (default: both)")
    unset_parser.add_argument("--monthly", action="store_true", help="remove the monthly budget (default: both)")
    unset_parser.set_defaults(handler=budget_unset)
    list_parser = actions.add_parser("list", help="list the budgets")
    list_parser.add_argument("--json", action="store_true", help="print JSON")
    list_parser.set_defaults(handler=budget_list)
    apply_parser = actions.add_parser(
        "apply",
        help="set the budgets a JSON document lists, leaving the others (the gateway role runs it on deploy)",
        description=(
            'Set every budget of {"tiers": {NAME: {"daily": N, "monthly": N}}, "subjects": {SUB: {...}}} whose'
            ' value differs; budgets not listed stay. Prints {"changed": true|false, "set": [...]}.'
        ),
    )
    apply_parser.add_argument("--file", required=True, help="the JSON document, or - for stdin")
    apply_parser.set_defaults(handler=budget_apply)
