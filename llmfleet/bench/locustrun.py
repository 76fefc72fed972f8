"""`llmfleet bench locust`: the same requests as `llmfleet bench`, sent by Locust, pinned, from its own venv.

    llmfleet bench locust --url http://10.77.0.10:8080 --token-file T --concurrency 32 --duration 30

Locust comes from requirements/locust.lock.txt, installed into a cached venv by
the helper that installs the peers (llmfleet.bench.peers.ensure_peer_venv:
named by the lock's hash, refused unless its `pip freeze` equals the lock).
It runs headless with llmfleet/bench/locustfile.py, which builds its request
with llmfleet.bench.loadgen (that file says how its load differs from bench's
open loop). The token reaches it as a file named in $LLMFLEET_BENCH_TOKEN_FILE,
never on a command line. Locust writes its final stats as JSON to --out, a
line of them is printed, and the exit code is Locust's (1 when any request
failed).

This module runs Locust as a separate program and only names the locust file's
path: the package never imports it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from llmfleet.bench import loadgen, peers
from llmfleet.errors import LlmfleetError

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
# Locust is no peer (it serves nothing, so it has no health path); its venv is built as theirs are.
LOCUST = peers.PeerSpec("locust", peers.REQUIREMENTS / "locust.lock.txt", "the Locust venv", "locust", "")
# The locust file reads the token file's path from this; spelled here too, as the package must not import that file.
TOKEN_FILE_ENV = "LLMFLEET_BENCH_TOKEN_FILE"  # noqa: S105 (the name of a variable holding a path)


def users_for(args: argparse.Namespace) -> int:
    """Locust users: --concurrency's clients, or for --rate enough that each may take 2 s per request."""
    if args.concurrency is not None:
        return int(args.concurrency)
    return int(args.users or max(16, math.ceil(args.rate * 2)))


def command(venv: Path, args: argparse.Namespace) -> list[str]:
    """Locust's command line: headless, every user started at once, for --duration seconds."""
    users = users_for(args)
    return [
        str(venv / "bin" / "locust"),
        "-f", str(LOCUSTFILE),
        "--headless",
        "--host", args.url.rstrip("/"),
        "--users", str(users),
        "--spawn-rate", str(users),
        "--run-time", f"{math.ceil(args.duration)}s",
        # Requests still in flight at the end get this long to finish (they are counted).
        "--stop-timeout", str(math.ceil(loadgen.REQUEST_TIMEOUT_S)),
        "--only-summary",
        # Written once the run is over. (Its --csv files are rewritten every second while it
        # runs and not at the end, so they can miss the last second's requests.)
        "--json-file", str(stats_prefix(args.out)),  # Locust adds .json
        "--bench-model", args.model,
        "--bench-endpoint", args.endpoint,
        "--bench-max-tokens", str(args.max_tokens),
        "--bench-rate", f"{args.rate or 0:g}",
    ]  # fmt: skip


def stats_prefix(out: str) -> Path:
    """What to give Locust's --json-file for stats at `out`: it adds ".json" itself."""
    path = Path(out)
    if path.suffix != ".json":
        raise LlmfleetError(f"--out {out}: give a path ending in .json (Locust writes its stats as JSON)")
    return path.with_suffix("")


def summarize(entries: list[dict[str, Any]]) -> str:
    """One line from Locust's JSON stats (one entry per request name): counts, req/s and latency percentiles.

    The percentiles are of Locust's response-time histogram (it rounds times
    above 100 ms to two significant digits), counted from each request's send.
    """
    requests = sum(int(entry["num_requests"]) for entry in entries)
    failures = sum(int(entry["num_failures"]) for entry in entries)
    times = sorted(
        float(ms) for entry in entries for ms, count in entry["response_times"].items() for _ in range(int(count))
    )
    starts = [float(entry["start_time"]) for entry in entries if entry["num_requests"]]
    ends = [float(entry["last_request_timestamp"]) for entry in entries if entry["num_requests"]]
    elapsed = max(ends) - min(starts) if starts else 0.0
    throughput = requests / elapsed if elapsed > 0 else 0.0
    p50, p95, p99 = (loadgen.percentile(times, q) for q in (50, 95, 99))
    return (
        f"{requests} requests, {failures} failed, {throughput:.1f} req/s;"
        f" p50 {p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms (from each send)"
    )


def environment(token_file: str | None) -> dict[str, str]:
    """Locust's environment: the peers' (nothing leaves the machine for loopback) and the token file's path."""
    env = {**os.environ, **peers.PEER_ENV}
    env.pop(TOKEN_FILE_ENV, None)
    if token_file is not None:
        env[TOKEN_FILE_ENV] = str(Path(token_file).resolve())
    return env


def run(args: argparse.Namespace) -> int:
    if args.url is None:
        raise LlmfleetError("give --url (the endpoint to load)")
    if (args.rate is None) == (args.concurrency is None):
        raise LlmfleetError("give one of --rate (requests per second) or --concurrency (users back to back)")
    if (args.rate is not None and args.rate <= 0) or (args.concurrency is not None and args.concurrency < 1):
        raise LlmfleetError("--rate must be above 0 and --concurrency at least 1")
    if args.users is not None and (args.rate is None or args.users < 1):
        raise LlmfleetError("--users goes with --rate (the users the rate is spread over), and is at least 1")
    if args.duration <= 0:
        raise LlmfleetError("--duration must be above 0 seconds")
    stats_file = Path(args.out)
    stats_prefix(args.out)
    loadgen.read_token(args.token_file)  # refuse a missing or empty token file before building anything
    venv = peers.ensure_peer_venv(LOCUST)
    stats_file.parent.mkdir(parents=True, exist_ok=True)
    stats_file.unlink(missing_ok=True)  # so a run that writes none is not read from an earlier one's
    line = command(venv, args)
    print("locust:", " ".join(line), flush=True)
    returncode = subprocess.call(line, env=environment(args.token_file))
    if not stats_file.is_file():
        raise LlmfleetError(f"Locust exited with {returncode} and wrote no stats to {stats_file} (see its output)")
    print(f"locust: {summarize(json.loads(stats_file.read_text()))}; stats in {stats_file}", flush=True)
    return returncode


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "locust",
        help="the same requests as `llmfleet bench`, sent by Locust (pinned, from its own venv)",
        description=(
            "Run Locust headless with llmfleet/bench/locustfile.py against URL: the request `llmfleet bench`"
            " sends, from --concurrency users back to back or from users pacing themselves to --rate in all."
            " Locust writes its final stats as JSON to --out; exit 1 when any request failed."
        ),
    )
    parser.add_argument("--url", help="base URL, e.g. http://10.77.0.10:8080 (required)")
    parser.add_argument("--token-file", help="a file holding the bearer token for --url")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="requests per second in all, each user pacing itself to its share")
    load.add_argument("--concurrency", type=int, help="users sending back to back")
    parser.add_argument(
        "--users", type=int, help="with --rate: the users it is spread over (default: twice the rate, at least 16)"
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    parser.add_argument("--model", default="tiny", help="served model name (default tiny)")
    parser.add_argument("--endpoint", choices=sorted(loadgen.PATHS), default="chat", help="API to call (default chat)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (default 16)")
    parser.add_argument(
        "--out",
        default="out/bench/locust.json",
        help="Locust's final stats, as it writes them with --json-file (default out/bench/locust.json)",
    )
    parser.set_defaults(handler=run)
