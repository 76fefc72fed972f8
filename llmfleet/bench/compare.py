"""`llmfleet bench compare`: direct vLLM, the peers and our gateway on the same engines, at a ladder of loads.

    llmfleet bench compare --engine-url http://127.0.0.1:8001 --engine-url http://127.0.0.1:8002 \\
        --rates 25,50,100,150 --duration 30 --cpus 1

Paths, one after another in one command, against the same engines:
- direct: the load spread over the engines in turn (the limit);
- litellm: the LiteLLM proxy, pinned, in front of the engines;
- vllm-router: vLLM's router, pinned, round robin over the engines;
- gateway: our gateway, queue and workers at --gateway-url with the token
  in --token-file, when a gateway URL is given.
With --stream every path is asked for server-sent events, and each row adds
the time to first token (run the command with and without it for both).
With --saturate N each path goes on past the ladder, each rate half again the
last (the same steps for every path, so rows stay comparable), until it
saturates (SATURATED) or N more rates have run.
(llmfleet.bench.peers says how each peer is installed, configured and
confined to --cpus.)

Each path is loaded at every offered rate of --rates with the open loop of
`llmfleet bench` (llmfleet.bench.loadgen.measure: warm-up, measured window,
ramp-down); a peer is started before its first rate and stopped after its
last. Around each measured window CPU snapshots (llmfleet.bench.cpuuse) give
the CPU ms per answered request of the path's own processes (a peer's
process group; for the gateway the gateway, worker and Redis processes this
machine sees, which in the lab are all of them), of every part of the stack,
and of the load generator itself. Every row also holds its ratio against
direct at the same rate: throughput over direct's, and the latency it adds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from llmfleet.bench import cpuuse, loadgen, peers
from llmfleet.build.venvs import log_tail
from llmfleet.errors import LlmfleetError

DIRECT = "direct"
GATEWAY = "gateway"
PATHS = (DIRECT, peers.LITELLM, peers.VLLM_ROUTER, GATEWAY)
DEFAULT_RATES = "25,50,100,150"
# The gateway-side parts of the stack as cpuuse names them: what the gateway
# path adds between the load generator and the engines.
GATEWAY_PARTS = ("gateway", "worker", "redis")
# A path is saturated at a rate when it answers less than this share of it in
# the window, or fails any request.
SATURATED = 0.95
# --saturate: each rate past the ladder is the last one times this.
SATURATE_STEP = 1.5
RowT = TypeVar("RowT")


def parse_rates(text: str) -> list[float]:
    """The ladder: offered rates in req/s, comma-separated, each above 0, rising."""
    rates = []
    for item in text.split(","):
        item = item.strip()
        try:
            rate = float(item)
        except ValueError:
            raise LlmfleetError(f"--rates {text!r}: {item!r} is not a number of requests per second") from None
        if not math.isfinite(rate) or rate <= 0:
            raise LlmfleetError(f"--rates {text!r}: each rate must be a number above 0, not {item!r}")
        rates.append(rate)
    if any(later <= earlier for earlier, later in itertools.pairwise(rates)):
        raise LlmfleetError(f"--rates {text!r}: give the ladder from the lowest rate up, each once (e.g. 25,50,100)")
    return rates


def parse_paths(text: str, gateway_url: str | None) -> list[str]:
    """The paths to run, in the order given; gateway only with a --gateway-url."""
    paths = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [path for path in paths if path not in PATHS]
    if unknown or not paths:
        raise LlmfleetError(f"--paths {text!r}: choose from {', '.join(PATHS)}")
    if len(set(paths)) != len(paths):
        raise LlmfleetError(f"--paths {text!r}: a path is named twice")
    if GATEWAY in paths and not gateway_url:
        raise LlmfleetError("--paths gateway needs --gateway-url and --token-file (the lab's gateway)")
    return paths


def default_paths(gateway_url: str | None) -> str:
    return ",".join(path for path in PATHS if path != GATEWAY or gateway_url)


@dataclass
class Row:
    """One path at one offered rate."""

    path: str
    rate: float
    report: loadgen.Report
    # CPU ms per answer in the window: the path's own processes (None for
    # direct, which has none), the load generator, and every part of the stack.
    path_cpu_ms_per_request: float | None
    load_generator_cpu_ms_per_request: float
    load_generator_cpu_s: float
    cpu_ms_per_request_by_part: dict[str, float]
    cores_busy: float
    cores: int
    # Against direct at the same rate (None when direct was not run, or answered nothing).
    throughput_ratio: float | None = None
    added_p50_ms: float | None = None
    added_p95_ms: float | None = None
    added_p99_ms: float | None = None


def group_cpu_s(before: cpuuse.Snapshot, after: cpuuse.Snapshot, pids: set[int]) -> float:
    """CPU seconds the processes `pids` used between two snapshots (one new since `before` counts from its start)."""
    used = 0.0
    for key, (_part, cpu_s) in after.processes.items():
        if key[0] in pids:
            earlier = before.processes.get(key)
            used += cpu_s - (earlier[1] if earlier else 0.0)
    return used


def per_request_ms(seconds: float, answers: int) -> float:
    return round(1000 * seconds / max(answers, 1), 2)


def with_ratios(rows: list[Row]) -> list[Row]:
    """Fill each row's ratio against direct at the same rate; direct's own rows get 1.0 and +0 ms."""
    direct = {row.rate: row.report for row in rows if row.path == DIRECT}
    for row in rows:
        base = direct.get(row.rate)
        if base is None or base.throughput_rps <= 0:
            continue
        row.throughput_ratio = round(row.report.throughput_rps / base.throughput_rps, 3)
        if row.report.ok == 0:  # no answer, no latency: nothing was added to it
            continue
        row.added_p50_ms = round(row.report.p50_ms - base.p50_ms, 1)
        row.added_p95_ms = round(row.report.p95_ms - base.p95_ms, 1)
        row.added_p99_ms = round(row.report.p99_ms - base.p99_ms, 1)
    return rows


async def _snapshots(window_start: float, window_end: float) -> tuple[cpuuse.Snapshot, cpuuse.Snapshot]:
    await loadgen.sleep_until(window_start)
    before = cpuuse.snapshot()
    await loadgen.sleep_until(window_end)
    return before, cpuuse.snapshot()


async def measure_row(
    args: argparse.Namespace,
    path: str,
    rate: float,
    bases: list[str],
    headers: dict[str, str],
    own_pids: Callable[[], set[int]] | None,
) -> Row:
    """One open-loop run of loadgen.measure at `rate`, with CPU snapshots at its measured window's edges."""
    run_args = argparse.Namespace(**{**vars(args), "rate": rate, "concurrency": None, "cpu": False})
    # measure() starts its window `warmup` seconds after it is called, as these snapshots do.
    window_start = time.perf_counter() + args.warmup
    snapshots = asyncio.create_task(_snapshots(window_start, window_start + args.duration))
    report = await loadgen.measure(run_args, path, bases, headers)
    before, after = await snapshots
    used = cpuuse.usage(before, after)
    answers = report.answers_in_window
    by_part = used.per_request_ms(answers)
    generator_s = used.seconds_by_part.get(cpuuse.LOAD_GENERATOR, 0.0)
    if own_pids is not None:
        path_ms: float | None = per_request_ms(group_cpu_s(before, after, own_pids()), answers)
    elif path == GATEWAY:
        path_ms = per_request_ms(sum(used.seconds_by_part.get(part, 0.0) for part in GATEWAY_PARTS), answers)
    else:
        path_ms = None
    return Row(
        path=path,
        rate=rate,
        report=report,
        path_cpu_ms_per_request=path_ms,
        load_generator_cpu_ms_per_request=per_request_ms(generator_s, answers),
        load_generator_cpu_s=round(generator_s, 3),
        cpu_ms_per_request_by_part=by_part,
        cores_busy=used.cores_busy,
        cores=used.cores,
    )


def saturated(row: Row) -> bool:
    """Whether the path fell behind at this row's rate: too few answers in the window, or any error."""
    return row.report.throughput_rps < SATURATED * row.rate or bool(row.report.errors)


def ladder(
    rates: list[float], extra: int, rows: Sequence[RowT], is_saturated: Callable[[RowT], bool]
) -> list[float] | None:
    """The rates left to run after `rows`: the ladder's, then up to `extra` more until saturated; None when done."""
    if len(rows) < len(rates):
        return rates[len(rows) :]
    if len(rows) >= len(rates) + extra or (rows and is_saturated(rows[-1])):
        return None
    return [round(rates[-1] * SATURATE_STEP ** (len(rows) - len(rates) + 1), 1)]


def run_ladder(
    args: argparse.Namespace,
    rates: list[float],
    load: Callable[[float], RowT],
    is_saturated: Callable[[RowT], bool],
) -> list[RowT]:
    """`load` at each rate of the ladder, then past it to saturation under --saturate (bench multiturn's rows too)."""
    rows: list[RowT] = []
    while (left := ladder(rates, args.saturate, rows, is_saturated)) is not None:
        rows.append(load(left[0]))
    return rows


def run_path(args: argparse.Namespace, path: str, rates: list[float], workdir: Path) -> list[Row]:
    """Every rate of the ladder through one path; a peer is started first and stopped after its last rate."""
    engines = [url.rstrip("/") for url in args.engine_url]
    engine_key = loadgen.read_engine_key(args.engine_key_file, "--engine-key-file")
    engine_auth = loadgen.bearer(engine_key)
    if path == DIRECT:
        return run_ladder(
            args, rates, lambda rate: asyncio.run(measure_row(args, path, rate, engines, engine_auth, None)), saturated
        )
    if path == GATEWAY:
        headers = loadgen.read_token(args.token_file)
        return run_ladder(
            args,
            rates,
            lambda rate: asyncio.run(measure_row(args, path, rate, [args.gateway_url], headers, None)),
            saturated,
        )
    peer = peers.start_peer(
        path,
        engines,
        args.model,
        workdir,
        cpus=args.cpus,
        litellm_workers=args.litellm_workers,
        engine_key=engine_key,
    )
    try:
        print(f"compare: {path} up at {peer.url} after {peer.startup_s:.1f} s (pid {peer.pid})", flush=True)

        def load(rate: float) -> Row:
            row = asyncio.run(measure_row(args, path, rate, [peer.url], peer.headers, peer.pids))
            if peer.process.poll() is not None:
                raise LlmfleetError(
                    f"{path} exited with code {peer.process.returncode} during the run at {rate:g} req/s;"
                    f" log {peer.log_path}:\n{log_tail(peer.log_path)}"
                )
            return row

        return run_ladder(args, rates, load, saturated)
    finally:
        peer.stop()


def _cell(value: float | None, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _added_ms(value: float | None) -> str:
    # Rounded to whole ms first, so -0.4 ms reads +0, not -0.
    return "-" if value is None else f"{round(value):+d} ms"


def table(rows: Sequence[Row]) -> str:
    """The printed table: a Markdown table, so it can go into docs/benchmarks.md as it is."""
    streamed = any(row.report.ttft_p50_ms is not None for row in rows)
    lines = [
        "| path | offered | answered | throughput | vs direct | p50 | p95 | p99 | added p50 | errors"
        " | path CPU ms/req | load generator CPU ms/req |" + (" TTFT p50 | TTFT p95 |" if streamed else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if streamed else ""),
    ]
    for row in rows:
        report = row.report
        errors = ", ".join(f"{kind} x{count}" for kind, count in report.errors.items()) or "0"
        # A row with no answer has no latency and no CPU per answer: its cells say "-", not 0 ms.
        answered = report.ok > 0
        latency = [f"{value:.0f} ms" if answered else "-" for value in (report.p50_ms, report.p95_ms, report.p99_ms)]
        path_cpu = row.path_cpu_ms_per_request if answered else None
        generator_cpu = row.load_generator_cpu_ms_per_request if answered else None
        lines.append(
            f"| {row.path} | {row.rate:g} req/s | {report.ok}/{report.requests} | {report.throughput_rps:.1f} req/s"
            f" | {_cell(row.throughput_ratio, '.2f')} | {' | '.join(latency)}"
            f" | {_added_ms(row.added_p50_ms)} | {errors}"
            f" | {_cell(path_cpu, '.2f')} | {_cell(generator_cpu, '.2f')} |"
            + (f" {_cell(report.ttft_p50_ms, '.0f')} ms | {_cell(report.ttft_p95_ms, '.0f')} ms |" if streamed else "")
        )
    return "\n".join(lines)


def result(args: argparse.Namespace, paths: list[str], rows: list[Row], argv: Sequence[str]) -> dict[str, Any]:
    """The JSON document: how it was run, on what, and one entry per path and rate."""
    return {
        "command": ["llmfleet", *argv],
        "machine": {
            "cores": rows[0].cores if rows else None,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "peer_cpus": args.cpus,
        },
        "engines": list(args.engine_url),
        "versions": {name: peers.version(peers.PEERS[name]) for name in paths if name in peers.PEERS},
        "paths": paths,
        "rates": sorted({row.rate for row in rows}),
        "window": {
            "warmup_s": args.warmup,
            "duration_s": args.duration,
            "max_tokens": args.max_tokens,
            "stream": args.stream,
        },
        "saturated_share": SATURATED,
        "saturate": args.saturate,
        "rows": [{**asdict(row), "report": asdict(row.report), "saturated": saturated(row)} for row in rows],
    }


def run(args: argparse.Namespace) -> int:
    rates = parse_rates(args.rates)
    paths = parse_paths(args.paths or default_paths(args.gateway_url), args.gateway_url)
    if not args.engine_url:
        raise LlmfleetError("give the engines with --engine-url (repeat it for each)")
    if args.gateway_url and not args.token_file:
        raise LlmfleetError("--gateway-url needs --token-file: the gateway answers nothing without a token")
    if args.duration <= 0 or args.warmup < 0:
        raise LlmfleetError("--duration must be above 0 seconds and --warmup 0 or more")
    if args.litellm_workers < 1:
        raise LlmfleetError("--litellm-workers must be at least 1")
    if args.saturate < 0:
        raise LlmfleetError("--saturate must be 0 (the ladder only) or more rates past it")
    if args.cpus is not None:
        peers.parse_cpus(args.cpus)
    if not (cpuuse.PROC / "stat").is_file():
        raise LlmfleetError(f"bench compare reads {cpuuse.PROC} for CPU figures, which this machine lacks (Linux only)")
    for path in paths:  # build the peers' venvs before any load, so a failed build costs no run
        if path in peers.PEERS:
            peers.ensure_peer_venv(peers.PEERS[path])
    workdir = Path(args.workdir)
    rows: list[Row] = []
    for path in paths:
        print(f"compare: {path} at {', '.join(f'{rate:g}' for rate in rates)} req/s", flush=True)
        rows.extend(run_path(args, path, rates, workdir))
    with_ratios(rows)
    document = result(args, paths, rows, sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        print(table(rows))
        print(f"compare: written to {out}")
    if all(row.report.ok == 0 for row in rows):
        raise LlmfleetError("no request was answered on any path: are the engines up? (see the errors above)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="direct vLLM, the LiteLLM proxy, vllm-router and our gateway on the same engines, at a ladder of rates",
        description=(
            "Load each path (direct to the engines, the LiteLLM proxy and vllm-router started here in front of"
            " them, and our gateway with --gateway-url) at each offered rate of --rates, open loop, one after"
            " another; report throughput, p50/p95/p99, errors, CPU ms per request of the path's own processes and"
            " of the load generator, and each row's ratio against direct at the same rate."
        ),
    )
    parser.add_argument(
        "--engine-url", action="append", help="an engine's base URL, e.g. http://127.0.0.1:8001; repeat for each"
    )
    parser.add_argument(
        "--rates", default=DEFAULT_RATES, help=f"offered req/s, comma-separated, rising (default {DEFAULT_RATES})"
    )
    parser.add_argument(
        "--paths",
        help=f"paths to run, comma-separated, in order, from {', '.join(PATHS)}"
        " (default: all but gateway, and gateway too with --gateway-url)",
    )
    parser.add_argument("--gateway-url", help="our gateway's base URL (the lab's), for the gateway path")
    parser.add_argument("--token-file", help="a file holding the bearer token for --gateway-url")
    parser.add_argument(
        "--engine-key-file",
        help="a file holding the engines' API key (vLLM's --api-key), for the direct path and the peers",
    )
    parser.add_argument(
        "--cpus",
        help="run each peer under `taskset -c CPUS` (e.g. 1 or 0-1): the cores the gateway side gets (default: all)",
    )
    parser.add_argument(
        "--litellm-workers", type=int, default=1, help="LiteLLM's uvicorn workers (default 1, as its docs advise)"
    )
    parser.add_argument(
        "--saturate",
        type=int,
        default=0,
        help=f"after the ladder, up to this many more rates, each {SATURATE_STEP:g} x the last, until the path"
        f" answers under {SATURATED:.0%}% of the offered rate or fails a request (default 0: the ladder only)",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of each measured window (default 30)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window (default 3)")
    parser.add_argument("--model", default="tiny", help="served model name (default tiny)")
    parser.add_argument("--endpoint", choices=sorted(loadgen.PATHS), default="chat", help="API to call (default chat)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (default 16)")
    loadgen.add_stream_option(parser)
    parser.add_argument(
        "--workdir", default="out/bench/compare", help="the peers' logs and configs (default out/bench/compare)"
    )
    parser.add_argument(
        "--out", default="out/bench/compare.json", help="the JSON result (default out/bench/compare.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.set_defaults(handler=run)
