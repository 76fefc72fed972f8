"""`llmfleet bench`: load an OpenAI-compatible endpoint and report throughput and latency percentiles.

    llmfleet bench --url http://10.77.0.10:8080 --token-file T --rate 100 --duration 30
    llmfleet bench --url http://10.77.0.10:8080 --token-file T --concurrency 32 --peer-url http://10.77.0.41:8000

Two ways to load:
- --rate R (open loop): requests start on a fixed schedule, R per second,
  whether or not earlier ones have finished. Latency counts from the moment a
  request was due, so a server that falls behind shows it in the percentiles
  instead of quietly slowing the generator down.
- --concurrency C (closed loop): C clients each send the next request as soon
  as the last one is answered: the throughput at saturation.

--peer-url runs the same load against a peer (the engines themselves, say;
repeat it and requests go to each in turn) straight after, on the same
machine, and reports the ratio of the two: the figure to judge a proxy's
overhead by. Targets (--target-rps,
--target-p95-ms) are reported as met or missed; the benchmark measures, it does
not fail on speed. It fails (exit 1) only when it could not measure at all.

--cpu adds where the CPU went during each measured window: milliseconds per
answered request for each part of the stack on this machine, and how many
cores were busy (llmfleet.cpuuse; the lab's hosts are containers here, so it
sees the whole lab).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmfleet import cpuuse
from llmfleet.errors import LlmfleetError

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
PROMPT = "Write one line about the sea."
# Requests still running this long after the load ends count as timed out.
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Sample:
    latency_s: float
    outcome: str  # "ok", an HTTP status such as "429", or an error class such as "ConnectError"
    completion_tokens: int = 0


@dataclass
class Report:
    label: str
    url: str
    mode: str  # "rate" or "concurrency"
    load: float  # requests per second asked for, or clients
    duration_s: float
    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    throughput_rps: float = 0.0
    completion_tokens: int = 0
    completion_tokens_per_s: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    # --cpu only: CPU ms per answered request by part of the stack, and the
    # average number of busy cores (of `cores`) over the measured window.
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)
    cores_busy: float | None = None
    cores: int | None = None


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100); 0.0 for no values."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(label: str, url: str, mode: str, load: float, samples: list[Sample], elapsed_s: float) -> Report:
    """Throughput counts answered requests only, over the time from the first start to the last answer."""
    latencies = sorted(sample.latency_s * 1000 for sample in samples if sample.outcome == "ok")
    errors = Counter(sample.outcome for sample in samples if sample.outcome != "ok")
    elapsed_s = max(elapsed_s, 1e-9)
    tokens = sum(sample.completion_tokens for sample in samples)
    return Report(
        label=label,
        url=url,
        mode=mode,
        load=load,
        duration_s=round(elapsed_s, 3),
        requests=len(samples),
        ok=len(latencies),
        errors=dict(sorted(errors.items())),
        throughput_rps=round(len(latencies) / elapsed_s, 2),
        completion_tokens=tokens,
        completion_tokens_per_s=round(tokens / elapsed_s, 1),
        p50_ms=round(percentile(latencies, 50), 1),
        p95_ms=round(percentile(latencies, 95), 1),
        p99_ms=round(percentile(latencies, 99), 1),
        max_ms=round(latencies[-1], 1) if latencies else 0.0,
    )


Send = Callable[[float], Coroutine[Any, Any, Sample]]


class Target:
    """One endpoint as a pool of keep-alive HTTP/1.1 connections, sending one fixed request.

    A minimal client on purpose: on the 2-core machine the benchmark shares with
    the stack, a general-purpose async HTTP client spends about a core at
    100 req/s, which the stack under test then lacks. The request's bytes are
    built once; a response needs only its status, its body (Content-Length or
    chunked) and whether the connection stays open.
    """

    def __init__(self, url: str, body: bytes, headers: dict[str, str], max_connections: int) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise LlmfleetError(f"{url}: give an http:// URL (the benchmark speaks plain HTTP/1.1)")
        self.host, self.port = parts.hostname, parts.port or 80
        head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        self.request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(max_connections)

    async def post(self) -> tuple[int, bytes]:
        async with self.slots:
            if self.idle:
                try:
                    return await self._exchange(*self.idle.pop())
                except asyncio.IncompleteReadError as error:
                    if error.partial:
                        raise
                    # The server closed the idle connection (its keep-alive timeout): a new one.
            return await self._exchange(*await asyncio.open_connection(self.host, self.port))

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bytes]:
        try:
            writer.write(self.request)
            status, body, keep = await _read_response(reader)
        except BaseException:
            writer.close()
            raise
        if keep:
            self.idle.append((reader, writer))
        else:
            writer.close()
        return status, body

    def close(self) -> None:
        for _reader, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, keep-alive) of one HTTP/1.1 response."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    fields = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip().lower()
    if fields.get("transfer-encoding") == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size + 2))
        await reader.readuntil(b"\r\n")  # the empty trailer
        body = b"".join(chunk[:-2] for chunk in chunks)
    else:
        body = await reader.readexactly(int(fields.get("content-length", "0")))
    return status, body, fields.get("connection") != "close"


def sender(targets: list[Target]) -> Send:
    """A coroutine function that sends one request (to the targets in turn) and times it from `due` (perf_counter)."""
    turn = itertools.cycle(targets)

    async def send(due: float) -> Sample:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, body = await next(turn).post()
        except TimeoutError:
            return Sample(time.perf_counter() - due, "timeout")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as error:
            return Sample(time.perf_counter() - due, type(error).__name__)
        latency_s = time.perf_counter() - due
        if status != 200:
            return Sample(latency_s, str(status))
        try:
            tokens = int(json.loads(body)["usage"]["completion_tokens"])
        except (ValueError, KeyError, TypeError):
            return Sample(latency_s, "bad-body")
        return Sample(latency_s, "ok", tokens)

    return send


async def open_loop(send: Send, rate: float, duration_s: float) -> tuple[list[Sample], float]:
    """Start round(rate * duration_s) requests on a fixed schedule; (samples, seconds to the last answer)."""
    start = time.perf_counter()
    tasks = []
    for index in range(max(1, round(rate * duration_s))):
        due = start + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(due)))
    samples = list(await asyncio.gather(*tasks))
    return samples, time.perf_counter() - start


async def closed_loop(send: Send, concurrency: int, duration_s: float) -> tuple[list[Sample], float]:
    """`concurrency` clients back to back until duration_s has passed; (samples, seconds to the last answer)."""
    start = time.perf_counter()
    stop = start + duration_s
    samples: list[Sample] = []

    async def client() -> None:
        while time.perf_counter() < stop:
            samples.append(await send(time.perf_counter()))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples, time.perf_counter() - start


async def measure(args: argparse.Namespace, label: str, bases: list[str], headers: dict[str, str]) -> Report:
    """One load run against `bases` (taken in turn); the report for it."""
    payload: dict[str, Any] = {"model": args.model, "max_tokens": args.max_tokens, "ignore_eos": True}
    if args.endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        payload["prompt"] = PROMPT
    body = json.dumps(payload).encode()
    connections = args.concurrency or max(64, math.ceil(args.rate * 2))
    per_target = math.ceil(connections / len(bases))
    targets = [Target(base.rstrip("/") + PATHS[args.endpoint], body, headers, per_target) for base in bases]
    send = sender(targets)
    shown = " ".join(bases)
    try:
        if args.warmup > 0:  # connections opened, caches warm; not counted
            await closed_loop(send, min(connections, 8), args.warmup)
        before = cpuuse.snapshot() if args.cpu else None
        if args.rate:
            samples, elapsed_s = await open_loop(send, args.rate, args.duration)
            report = summarize(label, shown, "rate", args.rate, samples, elapsed_s)
        else:
            samples, elapsed_s = await closed_loop(send, args.concurrency, args.duration)
            report = summarize(label, shown, "concurrency", args.concurrency, samples, elapsed_s)
        if before is not None:
            used = cpuuse.usage(before, cpuuse.snapshot())
            report.cpu_ms_per_request = used.per_request_ms(report.ok)
            report.cores_busy, report.cores = used.cores_busy, used.cores
        return report
    finally:
        for target in targets:
            target.close()


def read_token(path: str | None) -> dict[str, str]:
    """The Authorization header from a token file (a file, so the token is never on a command line)."""
    if path is None:
        return {}
    try:
        token = Path(path).read_text().strip()
    except OSError as error:
        raise LlmfleetError(f"--token-file: cannot read {path}: {error.strerror}") from None
    if not token:
        raise LlmfleetError(f"--token-file: {path} is empty; mint one with `llmfleet token --sub NAME ...`")
    return {"Authorization": f"Bearer {token}"}


def verdict(report: Report, target_rps: float, target_p95_ms: float) -> dict[str, bool]:
    return {
        "throughput": report.throughput_rps >= target_rps * 0.99,  # a 30 s window ends on a partial second
        "p95": report.ok > 0 and report.p95_ms < target_p95_ms,
        "errors": not report.errors,
    }


def describe(report: Report) -> str:
    load = f"{report.load:g} req/s offered" if report.mode == "rate" else f"{report.load:g} clients"
    errors = ", ".join(f"{name} x{count}" for name, count in report.errors.items()) or "none"
    text = (
        f"{report.label:8} {load}, {report.duration_s:.1f} s: {report.ok}/{report.requests} answered,"
        f" {report.throughput_rps:.1f} req/s, {report.completion_tokens_per_s:.0f} tokens/s;"
        f" p50 {report.p50_ms:.0f} ms, p95 {report.p95_ms:.0f} ms, p99 {report.p99_ms:.0f} ms,"
        f" max {report.max_ms:.0f} ms; errors: {errors}"
    )
    if report.cores_busy is not None:
        parts = ", ".join(f"{part} {ms:.1f}" for part, ms in report.cpu_ms_per_request.items())
        text += f"\n{'':8} CPU ms per answered request: {parts}; {report.cores_busy:.2f} of {report.cores} cores busy"
    return text


def run(args: argparse.Namespace) -> int:
    if (args.rate is None) == (args.concurrency is None):
        raise LlmfleetError("give one of --rate (requests per second) or --concurrency (clients)")
    if (args.rate is not None and args.rate <= 0) or (args.concurrency is not None and args.concurrency < 1):
        raise LlmfleetError("--rate must be above 0 and --concurrency at least 1")
    if args.duration <= 0:
        raise LlmfleetError("--duration must be above 0 seconds")
    if args.cpu and not (cpuuse.PROC / "stat").is_file():
        raise LlmfleetError(f"--cpu reads {cpuuse.PROC}, which this machine lacks (Linux only); drop --cpu")
    headers = read_token(args.token_file)
    reports = [asyncio.run(measure(args, args.label, [args.url], headers))]
    if args.peer_url:
        reports.append(asyncio.run(measure(args, args.peer_label, args.peer_url, read_token(None))))
    result: dict[str, Any] = {"reports": [asdict(report) for report in reports]}
    main = reports[0]
    if args.rate is not None:
        result["target"] = {"rps": args.target_rps, "p95_ms": args.target_p95_ms}
        result["target_met"] = verdict(main, args.target_rps, args.target_p95_ms)
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
            print(describe(report))
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
    parser.add_argument("--url", required=True, help="base URL, e.g. http://10.77.0.10:8080")
    parser.add_argument("--token-file", help="a file holding the bearer token for --url (not for --peer-url)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="open loop: requests started per second")
    load.add_argument("--concurrency", type=int, help="closed loop: clients sending back to back")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of measured load (default 30)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of unmeasured load first (default 3)")
    parser.add_argument("--model", default="tiny", help="served model name (default tiny)")
    parser.add_argument("--endpoint", choices=sorted(PATHS), default="chat", help="API to call (default chat)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (default 16)")
    parser.add_argument("--label", default="target", help="name for --url in the report (default target)")
    parser.add_argument(
        "--peer-url",
        action="append",
        help="also load this endpoint after --url and report the ratio; repeat it to spread over several in turn",
    )
    parser.add_argument("--peer-label", default="peer", help="name for --peer-url in the report (default peer)")
    parser.add_argument("--target-rps", type=float, default=100.0, help="throughput target (default 100)")
    parser.add_argument("--target-p95-ms", type=float, default=800.0, help="p95 latency target (default 800)")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also report CPU ms per answered request by part of the stack on this machine, and busy cores",
    )
    parser.add_argument("--out", help="also write the JSON result to this file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(handler=run)
