"""`llmfleet bench`: the command group of the benchmarks.

    llmfleet bench --url http://10.77.0.10:8080 --token-file T --rate 100 --duration 30
    llmfleet bench compare|multiturn|plot|locust|planner|usage ...

`llmfleet bench` itself loads one endpoint with llmfleet.bench.loadgen (whose docstring
says how a run is measured) and prints or writes its report; its subcommands are
registered by the modules that run them (compare, multiturn, plots, locustrun,
planner_accuracy, usagecost).
The command lives here, above the library it drives, so that the bench modules import
one way: this module imports them, and none of them imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmfleet.bench import (
    commandstats,
    compare,
    cpuuse,
    loadgen,
    locustrun,
    multiturn,
    planner_accuracy,
    plots,
    profile,
    usagecost,
)
from llmfleet.errors import LlmfleetError


def run(args: argparse.Namespace) -> int:
    if args.url is None:
        raise LlmfleetError("give --url (the endpoint to load), or run `llmfleet bench compare`")
    if (args.rate is None) == (args.concurrency is None):
        raise LlmfleetError("give one of --rate (requests per second) or --concurrency (clients)")
    if (args.rate is not None and args.rate <= 0) or (args.concurrency is not None and args.concurrency < 1):
        raise LlmfleetError("--rate must be above 0 and --concurrency at least 1")
    if args.duration <= 0:
        raise LlmfleetError("--duration must be above 0 seconds")
    if args.warmup < 0:
        raise LlmfleetError("--warmup must be 0 seconds or more")
    if args.cpu and not (cpuuse.PROC / "stat").is_file():
        raise LlmfleetError(f"--cpu reads {cpuuse.PROC}, which this machine lacks (Linux only); drop --cpu")
    headers = loadgen.read_token(args.token_file)
    if args.profile_pid and not args.profile:
        raise LlmfleetError("--profile-pid picks what --profile samples: give --profile DIR too")
    profiled: list[tuple[str, int]] = []
    if args.profile:  # the tools and the processes, before any load
        profile.require_tools()
        profiled = profile.profiled_processes(tuple(args.profile_pid or ()))
    side = loadgen.GatewaySide(
        args.profile,
        tuple(profiled),
        args.redis_url,
        loadgen.read_secret(args.redis_password_file, "--redis-password-file", "it holds no password"),
    )
    if side.redis_url:
        commandstats.read(side.redis_url, side.redis_password)  # unreachable or refused: say so before any load
    reports = [asyncio.run(loadgen.measure(args, args.label, [args.url], headers, side))]
    if args.peer_url:
        peer_headers = loadgen.bearer(loadgen.read_engine_key(args.peer_key_file, "--peer-key-file"))
        reports.append(asyncio.run(loadgen.measure(args, args.peer_label, args.peer_url, peer_headers)))
    result: dict[str, Any] = {"reports": [asdict(report) for report in reports]}
    main = reports[0]
    if args.rate is not None:
        result["target"] = {"rps": args.target_rps, "p95_ms": args.target_p95_ms}
        result["target_met"] = loadgen.verdict(main, args.target_rps, args.target_p95_ms)
    if len(reports) == 2 and reports[1].throughput_rps > 0:
        peer = reports[1]
        result["throughput_ratio"] = round(main.throughput_rps / peer.throughput_rps, 3)
        result["added_p50_ms"] = round(main.p50_ms - peer.p50_ms, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        for report in reports:
            print(loadgen.describe(report))
            if report.redis_commands_per_request:
                print(f"{'':8} {commandstats.describe(report.redis_commands_per_request)}")
            if report.profile:
                print(f"{'':8} profile of the gateway side: {report.profile}")
            for error in report.profile_errors:
                print(f"{'':8} WARNING: {error}")
        if "throughput_ratio" in result:
            print(
                f"{main.label} / {reports[1].label}: {result['throughput_ratio']:.2f} of the throughput,"
                f" {result['added_p50_ms']:+.0f} ms at p50"
            )
        if "target_met" in result:
            met = result["target_met"]
            print(
                f"target {args.target_rps:g} req/s, p95 < {args.target_p95_ms:g} ms, 0 errors: "
                + ", ".join(f"{name} {'met' if ok else 'missed'}" for name, ok in met.items())
            )
    if all(report.ok == 0 for report in reports):
        raise LlmfleetError("no request was answered: is the URL right, and the token valid? (see the errors above)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="load an OpenAI-compatible endpoint; report throughput and p50/p95/p99",
        description=(
            "Send completions to URL at a fixed rate (--rate, open loop) or from N back-to-back clients"
            " (--concurrency, closed loop) and report answered requests per second, latency percentiles and"
            " errors; with --peer-url, the same against a second endpoint and the ratio of the two."
        ),
    )
    # Required, but checked in run(): argparse would also demand it of `llmfleet bench compare`.
    parser.add_argument("--url", help="base URL, e.g. http://10.77.0.10:8080 (required)")
    parser.add_argument("--token-file", help="a file holding the bearer token for --url (not for --peer-url)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="open loop: requests started per second")
    load.add_argument("--concurrency", type=int, help="closed loop: clients sending back to back")
    parser.add_argument(
        "--duration",
        type=float,
        default=30.0,
        help="seconds of the measured window (default 30): latency and errors of the requests due or sent in it,"
        " throughput of the answers that arrive in it",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=3.0,
        help="seconds of the same load before the window, not measured (default 3)",
    )
    parser.add_argument("--model", default="tiny", help="served model name (default tiny)")
    parser.add_argument("--endpoint", choices=sorted(loadgen.PATHS), default="chat", help="API to call (default chat)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (default 16)")
    loadgen.add_stream_option(parser)
    parser.add_argument("--label", default="target", help="name for --url in the report (default target)")
    parser.add_argument(
        "--peer-url",
        action="append",
        help="also load this endpoint after --url and report the ratio; repeat it to spread over several in turn",
    )
    parser.add_argument(
        "--peer-key-file",
        help="a file holding the bearer token for --peer-url (the engines' API key, when they take one)",
    )
    parser.add_argument("--peer-label", default="peer", help="name for --peer-url in the report (default peer)")
    parser.add_argument("--target-rps", type=float, default=100.0, help="throughput target (default 100)")
    parser.add_argument("--target-p95-ms", type=float, default=800.0, help="p95 latency target (default 800)")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also report CPU ms per answer in the window by part of the stack on this machine, and busy cores",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="also sample every gateway and worker process on this machine with py-spy over the window of --url:"
        " collapsed stacks, a flame graph each and profile.json (CPU by layer) in DIR; with --cpu, ms per answer",
    )
    parser.add_argument(
        "--profile-pid",
        type=int,
        action="append",
        metavar="PID",
        help="sample only this gateway or worker process (repeat it); default: every one on this machine",
    )
    parser.add_argument(
        "--redis-url",
        help="also read INFO commandstats of this Redis (the queue's) at the window's edges of --url: each command's"
        " calls and microseconds per answer, e.g. redis://default@10.77.0.20:6379 as the redis role's admin",
    )
    parser.add_argument("--redis-password-file", help="a file holding the password for --redis-url")
    parser.add_argument("--out", help="also write the JSON result to this file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(handler=run)
    # `llmfleet bench compare`, `plot`, `locust`, `planner` and `usage` are subcommands of this one.
    commands = parser.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    compare.register(commands)
    multiturn.register(commands)
    plots.register(commands)
    locustrun.register(commands)
    planner_accuracy.register(commands)
    usagecost.register(commands)
