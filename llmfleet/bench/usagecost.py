"""`llmfleet bench usage`: what the usage records cost per request, on the queue's path with a real Redis.

Every request takes the queue's whole way through the real scripts: ADMIT (the
gateway's producer), TAKE, BEGIN and DELIVER (the worker's consumer), with an
answer that carries usage, as a worker delivers it. The two arms differ only
in the consumer: the worker's, which records usage with the answer and
charges the spend counters the token budgets read (in DELIVER, no round trip
of its own: llmfleet/serve/queue/usage.py), and the baseline,
`Consumer(record_usage=False)`, which does neither. ADMIT's budget
check runs in both: it is not switched off anywhere, so it is no part of the
difference. The rounds alternate between the arms, so that drift (Redis's AOF,
caches, whatever else the machine runs) falls on both alike.

CPU is read on both sides of the connection: this process's own time
(time.process_time: the Python of gateway and worker, here in one process) and
redis-server's (INFO cpu), and Redis's time inside the scripts (INFO
commandstats). The figure is what the records add to the whole path's CPU
per request: the median of the differences within pairs of neighbouring
rounds, with its quartiles, against issue 31's bound of 0.1 ms. It is broken
down into the parts that can be measured on their own: the extra time inside
the scripts, measured by Redis per command, and building DELIVER's arguments
in Python (python_cost: both arms pass the same arguments, zeros for the
baseline, so that is the only Python that differs). What the parts leave is
Redis feeding the records' writes to its AOF after the script, and noise: the
whole path's CPU per request moves by about a tenth from round to round on a
shared 2-core machine. No engine runs: an engine's work is the same in both
arms, and would only add noise to a difference this small.

This module makes the figures and the command; usagerun.py measures, against
a redis-server of its own on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmfleet.errors import LlmfleetError

# The bound on what the records may add per request.
TARGET_MS = 0.1


@dataclass(frozen=True)
class Round:
    arm: str  # "records" (the worker's consumer) or "baseline" (record_usage=False)
    requests: int
    client_cpu_s: float  # this process: producer and consumer
    redis_cpu_s: float  # redis-server, from INFO cpu
    scripts_s: float  # redis-server's time inside the scripts (INFO commandstats, EVALSHA's usec)

    @property
    def ms_per_request(self) -> float:
        return 1000 * (self.client_cpu_s + self.redis_cpu_s) / self.requests

    @property
    def scripts_ms_per_request(self) -> float:
        return 1000 * self.scripts_s / self.requests


@dataclass(frozen=True)
class Summary:
    records_ms: float  # median CPU ms per request of the whole path (this process and redis-server), with records
    baseline_ms: float  # the same without them
    records_scripts_ms: float  # median ms per request inside the four scripts, with records
    baseline_scripts_ms: float
    scripts_cost_ms: float  # the median of the pairs' differences of script time (records - baseline)
    scripts_cost_quartiles_ms: tuple[float, float]  # the noise around it
    python_cost_ms: float  # what the records add to the worker's Python (python_cost)
    # What the target is read against: the median of the pairs' differences of the whole path's CPU.
    cost_ms: float
    cost_quartiles_ms: tuple[float, float]


def summarize(rounds: Sequence[Round], python_cost_ms: float) -> Summary:
    """Each arm's medians, and the records' cost as median differences within pairs of neighbouring rounds.

    Medians: a round disturbed by something else on the machine moves no figure. Pairs: the path slows as Redis
    fills up over the run, which a difference of neighbours cancels and a difference of the arms' medians
    would not.
    """
    records = [r for r in rounds if r.arm == "records"]
    baseline = [r for r in rounds if r.arm == "baseline"]
    if not records or len(records) != len(baseline):
        raise LlmfleetError(f"the arms need as many rounds each, at least one: {len(records)} and {len(baseline)}")
    pairs = list(zip(records, baseline, strict=True))
    scripts_cost, scripts_quartiles = _median_and_quartiles(
        [a.scripts_ms_per_request - b.scripts_ms_per_request for a, b in pairs]
    )
    cost, cost_quartiles = _median_and_quartiles([a.ms_per_request - b.ms_per_request for a, b in pairs])
    return Summary(
        records_ms=statistics.median(r.ms_per_request for r in records),
        baseline_ms=statistics.median(r.ms_per_request for r in baseline),
        records_scripts_ms=statistics.median(r.scripts_ms_per_request for r in records),
        baseline_scripts_ms=statistics.median(r.scripts_ms_per_request for r in baseline),
        scripts_cost_ms=scripts_cost,
        scripts_cost_quartiles_ms=scripts_quartiles,
        python_cost_ms=python_cost_ms,
        cost_ms=cost,
        cost_quartiles_ms=cost_quartiles,
    )


def _median_and_quartiles(values: list[float]) -> tuple[float, tuple[float, float]]:
    if len(values) == 1:
        return values[0], (values[0], values[0])
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return median, (low, high)


def table(summary: Summary) -> str:
    verdict = "met" if summary.cost_ms < TARGET_MS else "missed"
    low, high = summary.scripts_cost_quartiles_ms
    path_low, path_high = summary.cost_quartiles_ms
    return "\n".join(
        [
            "| arm | whole path, CPU ms/request | inside the scripts, ms/request |",
            "|---|---|---|",
            f"| usage records (the worker's) | {summary.records_ms:.4f} | {summary.records_scripts_ms:.4f} |",
            f"| no records (baseline) | {summary.baseline_ms:.4f} | {summary.baseline_scripts_ms:.4f} |",
            "",
            f"The records add {summary.cost_ms * 1000:+.1f} us of CPU a request to the whole path (the median of"
            f" the pairs of rounds; quartiles {path_low * 1000:+.1f} to {path_high * 1000:+.1f} us); target under"
            f" {TARGET_MS * 1000:g} us: {verdict}.",
            f"Measured apart: {summary.scripts_cost_ms * 1000:.1f} us inside Redis's scripts"
            f" (quartiles {low * 1000:.1f} to {high * 1000:.1f} us) and {summary.python_cost_ms * 1000:.1f} us"
            " building DELIVER's arguments; the rest is Redis feeding the records' writes to its AOF, and the noise"
            " of a shared machine.",
        ]
    )


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.requests < 100:
        raise LlmfleetError("give --rounds of at least 1 pair and --requests of at least 100 a round")
    # Here, not at the top: it imports redis, which `llmfleet --help` must not need (test_cli_imports.py).
    from llmfleet.bench import usagerun

    readings, python_ms = asyncio.run(usagerun.run(args.rounds, args.requests))
    rounds = [Round(*reading) for reading in readings]
    summary = summarize(rounds, python_ms)
    document: dict[str, Any] = {
        "rounds": [
            asdict(r) | {"ms_per_request": r.ms_per_request, "scripts_ms_per_request": r.scripts_ms_per_request}
            for r in rounds
        ],
        **asdict(summary),
        "target_ms": TARGET_MS,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(table(summary))
    print(f"usage: written to {out}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "usage",
        help="what the usage records cost per request on the queue's path, against a real redis-server",
        description=(
            "Start redis-server on loopback, send requests through the real ADMIT, TAKE, BEGIN and DELIVER with"
            " and without the usage records, in alternating rounds, and report the CPU milliseconds per request"
            " of each (this process and redis-server) and their difference."
        ),
    )
    parser.add_argument("--rounds", type=int, default=24, help="pairs of rounds, one of each arm (default 24)")
    parser.add_argument("--requests", type=int, default=500, help="requests a round (default 500)")
    parser.add_argument("--out", default="out/bench/usage.json", help="the JSON result (default out/bench/usage.json)")
    parser.set_defaults(handler=run)
