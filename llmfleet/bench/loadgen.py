"""The load generator of `llmfleet bench`: load an OpenAI-compatible endpoint and report throughput and
latency percentiles. The command itself is llmfleet.bench.cli; this module is the library that it,
`bench compare`, the peers and the Locust file share, and imports no other bench module but cpuuse.

    llmfleet bench --url http://10.77.0.10:8080 --token-file T --rate 100 --duration 30
    llmfleet bench --url http://10.77.0.10:8080 --token-file T --concurrency 32 --peer-url http://10.77.0.41:8000

Two ways to load:
- --rate R (open loop): requests are due on a fixed schedule, R per second,
  whether or not earlier ones have finished. Latency counts from the moment a
  request was due, so a server that falls behind shows it in the percentiles
  instead of quietly slowing the generator down.
- --concurrency C (closed loop): C clients each send the next request as soon
  as the last one is answered: the throughput at saturation.

A run is one stretch of load at the same rate (or with the same clients)
throughout: --warmup seconds, then the measured window of --duration seconds,
then a ramp-down. In the open loop the schedule goes on after the window until
every request due in it has been answered or has failed; the closed loop's
clients send nothing after the window's end and wait for what they sent. So the
server is as loaded at the window's edges as in its middle. Of the window:
- requests, errors and the latency percentiles count the requests due (open
  loop) or sent (closed loop) inside it, however late they were answered;
- throughput counts the answers (status 200, a usable body) that arrived inside
  it, whichever request they belong to, per second of window; completion
  tokens per second likewise. A server that keeps up is reported at the
  offered rate whatever its latency; one that falls behind answers fewer in
  the window than were due, and shows it.

--peer-url runs the same load against a peer (the engines themselves, say;
repeat it and requests go to each in turn) straight after, on the same
machine, and reports the ratio of the two: the figure to judge a proxy's
overhead by. Targets (--target-rps,
--target-p95-ms) are reported as met or missed; the benchmark measures, it does
not fail on speed. It fails (exit 1) only when it could not measure at all.

--stream asks for server-sent events (`stream: true`, with the usage in the
last event) and adds the time to first token: from when the request was due
(or sent) to the first event that carries generated text, as p50/p95/p99.

--cpu adds where the CPU went during each measured window (snapshots at its
start and end): milliseconds per answer that arrived in it for each part of
the stack on this machine, and how many cores were busy (llmfleet.bench.cpuuse; the
lab's hosts are containers here, so it sees the whole lab).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from llmfleet.bench import commandstats, cpuuse, profile
from llmfleet.errors import LlmfleetError

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
PROMPT = "Write one line about the sea."
# A request not answered this long after it was sent counts as timed out. It
# also bounds the open loop's ramp-down, which waits for the window's requests.
REQUEST_TIMEOUT_S = 60.0
# Idle keep-alive connections older than this are closed, not reused: servers
# close theirs after a few seconds (uvicorn: 5 s), and a request sent as the
# server closes meets a reset.
IDLE_REUSE_S = 2.0
# In a stream, an event that carries generated text: a chat delta's or a
# completion's non-empty "content" or "text" (the first chat event holds only
# the role, with empty content).
GENERATED_TEXT = re.compile(rb'"(?:content|text)":\s*"[^"]')


@dataclass(frozen=True)
class Sample:
    due: float  # time.perf_counter() when it was due (open loop) or sent (closed loop)
    done: float  # time.perf_counter() when its answer, or its error, came
    outcome: str  # "ok", an HTTP status such as "429", or an error class such as "ConnectError"
    completion_tokens: int = 0
    first_token: float | None = None  # streams: time.perf_counter() of the first event with generated text

    @property
    def latency_s(self) -> float:
        return self.done - self.due


@dataclass
class Report:
    label: str
    url: str
    mode: str  # "rate" or "concurrency"
    load: float  # requests per second asked for, or clients
    duration_s: float  # the measured window's length
    # The requests due (rate) or sent (concurrency) in the window; the latency
    # percentiles and completion_tokens are of those of them answered (ok).
    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # Answers that arrived in the window, whichever request they belong to, and
    # per second of window: the throughput figures.
    answers_in_window: int = 0
    throughput_rps: float = 0.0
    completion_tokens: int = 0
    completion_tokens_per_s: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    # --stream only: time to first token of the answered requests, from when each was due (or sent).
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    # --cpu only: CPU ms per answer in the window by part of the stack, and the
    # average number of busy cores (of `cores`) over the measured window.
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)
    cores_busy: float | None = None
    cores: int | None = None
    # --profile: the profile.json written for this run (llmfleet.bench.profile).
    profile: str | None = None
    profile_errors: list[str] = field(default_factory=list)  # processes py-spy could not sample
    # --redis-url: each Redis command's calls and microseconds per answer (llmfleet.bench.commandstats).
    redis_commands_per_request: dict[str, dict[str, float]] = field(default_factory=dict)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100); 0.0 for no values."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(
    label: str, url: str, mode: str, load: float, samples: list[Sample], window_start: float, window_end: float
) -> Report:
    """The report of the window [window_start, window_end) (perf_counter seconds), from all of a run's samples.

    requests, ok, errors, completion_tokens and the latency percentiles count the
    requests due (or sent) in the window, however late they were answered.
    Throughput and completion tokens per second count the answers ("ok") that
    arrived in the window, whichever request they belong to (one due in the
    warm-up, say), divided by the window's length.
    """
    window_s = window_end - window_start
    measured = [sample for sample in samples if window_start <= sample.due < window_end]
    arrived = [sample for sample in samples if sample.outcome == "ok" and window_start <= sample.done < window_end]
    latencies = sorted(sample.latency_s * 1000 for sample in measured if sample.outcome == "ok")
    errors = Counter(sample.outcome for sample in measured if sample.outcome != "ok")
    firsts = sorted(
        (sample.first_token - sample.due) * 1000
        for sample in measured
        if sample.outcome == "ok" and sample.first_token is not None
    )
    return Report(
        label=label,
        url=url,
        mode=mode,
        load=load,
        duration_s=round(window_s, 3),
        requests=len(measured),
        ok=len(latencies),
        errors=dict(sorted(errors.items())),
        answers_in_window=len(arrived),
        throughput_rps=round(len(arrived) / window_s, 2),
        completion_tokens=sum(sample.completion_tokens for sample in measured),
        completion_tokens_per_s=round(sum(sample.completion_tokens for sample in arrived) / window_s, 1),
        p50_ms=round(percentile(latencies, 50), 1),
        p95_ms=round(percentile(latencies, 95), 1),
        p99_ms=round(percentile(latencies, 99), 1),
        max_ms=round(latencies[-1], 1) if latencies else 0.0,
        ttft_p50_ms=round(percentile(firsts, 50), 1) if firsts else None,
        ttft_p95_ms=round(percentile(firsts, 95), 1) if firsts else None,
        ttft_p99_ms=round(percentile(firsts, 99), 1) if firsts else None,
    )


Send = Callable[[float], Coroutine[Any, Any, Sample]]
# What open_loop's `send` returns for one due time: a sample, or a whole conversation's turns (bench multiturn).
Outcome = TypeVar("Outcome")


class Target:
    """One endpoint as a pool of keep-alive HTTP/1.1 connections, sending one fixed request.

    A minimal client on purpose: on the 2-core machine the benchmark shares with
    the stack, a general-purpose async HTTP client spends about a core at
    100 req/s, which the stack under test then lacks. The request's bytes are
    built once (a multi-turn conversation frames each turn's body with
    `framed`); a response needs only its status, its body (Content-Length or
    chunked) and whether the connection stays open; with `stream`, also when
    the first chunk with generated text arrived.
    """

    def __init__(
        self, url: str, body: bytes, headers: dict[str, str], max_connections: int, stream: bool = False
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise LlmfleetError(f"{url}: give an http:// URL (the benchmark speaks plain HTTP/1.1)")
        self.host, self.port = parts.hostname, parts.port or 80
        head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        self.head = "\r\n".join(head).encode()
        self.request = self.framed(body)
        self.idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []  # (since, ...), newest last
        self.slots = asyncio.Semaphore(max_connections)
        self.watch = GENERATED_TEXT if stream else None

    def framed(self, body: bytes) -> bytes:
        """The whole request, head and body, for `body`."""
        return self.head + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body

    async def post(self, request: bytes | None = None) -> tuple[int, bytes, float | None]:
        """(status, body, when the first generated text arrived: streams only, else None).

        request: a request framed by `framed` (a conversation's turn); the target's own one by default.
        """
        request = self.request if request is None else request
        async with self.slots:
            while self.idle:
                since, reader, writer = self.idle.pop()
                if time.monotonic() - since > IDLE_REUSE_S:
                    writer.close()
                    continue
                try:
                    return await self._exchange(reader, writer, request)
                except ClosedBeforeAnswer:
                    break  # the server closed it as we sent (its keep-alive timeout): a new one
            return await self._exchange(*await asyncio.open_connection(self.host, self.port), request)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> tuple[int, bytes, float | None]:
        try:
            writer.write(request)
            status, body, keep, first = await _read_response(reader, self.watch)
        except BaseException:
            writer.close()
            raise
        if keep:
            self.idle.append((time.monotonic(), reader, writer))
        else:
            writer.close()
        return status, body, first

    def close(self) -> None:
        for _since, _reader, writer in self.idle:
            writer.close()
        self.idle.clear()


class ClosedBeforeAnswer(ConnectionError):
    """The connection ended before a response's head: the server did not answer the request."""


async def _read_response(
    reader: asyncio.StreamReader, watch: re.Pattern[bytes] | None = None
) -> tuple[int, bytes, bool, float | None]:
    """(status, body, keep-alive, first) of one HTTP/1.1 response.

    first: time.perf_counter() when a chunk matching `watch` arrived, for the
    first time; None without a match or a watch. An event split across two
    chunks is seen when its second part arrives.
    """
    first = None
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        raise ClosedBeforeAnswer(f"connection closed after {len(error.partial)} bytes of a response head") from error
    except (ConnectionResetError, BrokenPipeError) as error:
        raise ClosedBeforeAnswer(f"connection reset before a response head ({error})") from error
    head = raw.decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    fields = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip().lower()
    if fields.get("transfer-encoding") == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size + 2))
            if watch is not None and first is None and watch.search(chunks[-1]):
                first = time.perf_counter()
        await reader.readuntil(b"\r\n")  # the empty trailer
        body = b"".join(chunk[:-2] for chunk in chunks)
    else:
        body = await reader.readexactly(int(fields.get("content-length", "0")))
        if watch is not None and watch.search(body):
            first = time.perf_counter()
    return status, body, fields.get("connection") != "close", first


def completion_tokens(body: bytes) -> int:
    """usage.completion_tokens of a JSON answer; raises ValueError, KeyError or TypeError on another body."""
    return int(json.loads(body)["usage"]["completion_tokens"])


def streamed_completion_tokens(body: bytes) -> int:
    """usage.completion_tokens of a stream's usage event (stream_options.include_usage); ValueError without one.

    A stream that reports an error event, or ends without its usage, is not an answer.
    """
    for line in reversed(body.splitlines()):
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        event = json.loads(line[5:])
        if "error" in event:
            raise ValueError(f"the stream ended with an error: {event['error']}")
        if event.get("usage"):
            return int(event["usage"]["completion_tokens"])
    raise ValueError("the stream holds no usage event")


async def exchange(target: Target, due: float, request: bytes | None = None) -> tuple[Sample, bytes]:
    """One request to target (its own, or `request`) and its answer, timed from `due`.

    (sample, body): the sample's outcome is "ok" for a 200, whose body the
    caller still has to judge (its tokens are not counted yet), or says what
    failed: "timeout", the error's class, or the HTTP status, with b"" for body.
    """
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            status, body, first = await target.post(request)
    except TimeoutError:
        return Sample(due, time.perf_counter(), "timeout"), b""
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as error:
        return Sample(due, time.perf_counter(), type(error).__name__), b""
    done = time.perf_counter()
    if status != 200:
        return Sample(due, done, str(status)), b""
    return Sample(due, done, "ok", 0, first), body


def sender(targets: list[Target]) -> Send:
    """A coroutine function that sends one request (to the targets in turn): its sample, from `due` (perf_counter)."""
    turn = itertools.cycle(targets)

    async def send(due: float) -> Sample:
        target = next(turn)
        sample, body = await exchange(target, due)
        if sample.outcome != "ok":
            return sample
        try:
            tokens = streamed_completion_tokens(body) if target.watch is not None else completion_tokens(body)
        except (ValueError, KeyError, TypeError):
            return Sample(due, sample.done, "bad-body")
        return Sample(due, sample.done, "ok", tokens, sample.first_token)

    return send


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.perf_counter()))


async def open_loop(
    send: Callable[[float], Coroutine[Any, Any, Outcome]], rate: float, window_start: float, window_end: float
) -> list[Outcome]:
    """Requests due every 1/rate s from now (the warm-up) through the window, and on until each one due in it is done.

    The schedule counts from the window's start, so the window holds
    ceil(rate * duration) requests and the warm-up round(rate * warm-up).
    Returns every request's sample, the warm-up's and ramp-down's included
    (bench multiturn's `send` starts a conversation, and gets its turns).
    """
    tasks: list[asyncio.Task[Outcome]] = []
    unfinished: set[asyncio.Task[Outcome]] = set()  # of the requests due in the window
    for step in itertools.count(-round((window_start - time.perf_counter()) * rate)):
        due = window_start + step / rate
        await sleep_until(due)
        if due >= window_end and not unfinished:
            break
        task = asyncio.create_task(send(due))
        tasks.append(task)
        if window_start <= due < window_end:
            unfinished.add(task)
            task.add_done_callback(unfinished.discard)
    return list(await asyncio.gather(*tasks))


async def closed_loop(send: Send, concurrency: int, stop: float) -> list[Sample]:
    """`concurrency` clients back to back from now (warm-up, then the window) until `stop`; each waits for its last."""
    samples: list[Sample] = []

    async def client() -> None:
        while (sent := time.perf_counter()) < stop:
            samples.append(await send(sent))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples


async def cpu_use(window_start: float, window_end: float) -> cpuuse.Usage:
    """CPU use between snapshots taken at the window's start and end, under load (each reads /proc for a few ms)."""
    await sleep_until(window_start)
    before = cpuuse.snapshot()
    await sleep_until(window_end)
    return cpuuse.usage(before, cpuuse.snapshot())


async def profile_window(
    out_dir: Path, processes: tuple[tuple[str, int], ...], window_start: float, window_end: float
) -> list[profile.Profile]:
    """py-spy's samples of the gateway side over the window (llmfleet.bench.profile)."""
    await sleep_until(window_start)
    return await profile.record(out_dir, window_end - window_start, list(processes))


def request_body(model: str, endpoint: str, max_tokens: int, stream: bool = False) -> bytes:
    """The one request every run sends, as bytes (llmfleet/bench/locustfile.py sends the same)."""
    payload: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "ignore_eos": True}
    if endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        payload["prompt"] = PROMPT
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    return json.dumps(payload).encode()


@dataclass(frozen=True)
class GatewaySide:
    """What `llmfleet bench` may also read of the gateway side over the window of --url."""

    profile_dir: str | None = None  # py-spy's samples (llmfleet.bench.profile)
    profiled: tuple[tuple[str, int], ...] = ()  # (part, pid) of each process to sample (profile.profiled_processes)
    redis_url: str | None = None  # INFO commandstats (llmfleet.bench.commandstats)
    redis_password: str = ""


async def measure(
    args: argparse.Namespace, label: str, bases: list[str], headers: dict[str, str], side: GatewaySide | None = None
) -> Report:
    """One load run against `bases` (taken in turn): warm-up, measured window, ramp-down; the window's report."""
    side = side or GatewaySide()
    stream = bool(getattr(args, "stream", False))
    body = request_body(args.model, args.endpoint, args.max_tokens, stream)
    connections = args.concurrency or max(64, math.ceil(args.rate * 2))
    per_target = math.ceil(connections / len(bases))
    url_path = PATHS[args.endpoint]
    targets = [Target(base.rstrip("/") + url_path, body, headers, per_target, stream) for base in bases]
    send = sender(targets)
    shown = " ".join(bases)
    window_start = time.perf_counter() + args.warmup
    window_end = window_start + args.duration
    try:
        async with asyncio.TaskGroup() as group:
            cpu = group.create_task(cpu_use(window_start, window_end)) if args.cpu else None
            sampled = (
                group.create_task(profile_window(Path(side.profile_dir), side.profiled, window_start, window_end))
                if side.profile_dir
                else None
            )
            redis_readings = (
                group.create_task(commandstats.window(side.redis_url, side.redis_password, window_start, window_end))
                if side.redis_url
                else None
            )
            if args.rate:
                samples = await open_loop(send, args.rate, window_start, window_end)
            else:
                samples = await closed_loop(send, args.concurrency, window_end)
    finally:
        for target in targets:
            target.close()
    mode, load = ("rate", args.rate) if args.rate else ("concurrency", args.concurrency)
    report = summarize(label, shown, mode, load, samples, window_start, window_end)
    if cpu is not None:
        used = cpu.result()
        report.cpu_ms_per_request = used.per_request_ms(report.answers_in_window)
        report.cores_busy, report.cores = used.cores_busy, used.cores
    if sampled is not None and side.profile_dir is not None:
        profiles = sampled.result()
        report.profile = str(profile.write(Path(side.profile_dir), profiles, report.cpu_ms_per_request, label))
        report.profile_errors = [found.error for found in profiles if found.error]
    if redis_readings is not None:
        costs = commandstats.per_request(*redis_readings.result(), report.answers_in_window)
        report.redis_commands_per_request = commandstats.as_json(costs)
    return report


def read_secret(path: str | None, option: str, empty_hint: str) -> str:
    """One secret from a file (a file, so it is never on a command line); "" without a path."""
    if path is None:
        return ""
    try:
        secret = Path(path).read_text().strip()
    except OSError as error:
        raise LlmfleetError(f"{option}: cannot read {path}: {error.strerror}") from None
    if not secret:
        raise LlmfleetError(f"{option}: {path} is empty; {empty_hint}")
    return secret


def bearer(secret: str) -> dict[str, str]:
    """The Authorization header that carries a token or an engine's API key; none for ""."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def read_token(path: str | None) -> dict[str, str]:
    """The gateway's Authorization header from --token-file."""
    return bearer(read_secret(path, "--token-file", "mint one with `llmfleet token --sub NAME ...`"))


def read_engine_key(path: str | None, option: str) -> str:
    """The engines' API key from a file (--peer-key-file, --engine-key-file); "" without a path."""
    return read_secret(path, option, "it holds no key")


def verdict(report: Report, target_rps: float, target_p95_ms: float) -> dict[str, bool]:
    return {
        # Answers are counted whole, and those near the window's edges fall in or out of it by
        # a little jitter: 1% of slack, so a server that keeps up exactly is not reported short.
        "throughput": report.throughput_rps >= target_rps * 0.99,
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
    if report.ttft_p50_ms is not None:
        text += (
            f"\n{'':8} time to first token: p50 {report.ttft_p50_ms:.0f} ms, p95 {report.ttft_p95_ms:.0f} ms,"
            f" p99 {report.ttft_p99_ms:.0f} ms"
        )
    if report.cores_busy is not None:
        parts = ", ".join(f"{part} {ms:.1f}" for part, ms in report.cpu_ms_per_request.items())
        text += f"\n{'':8} CPU ms per answered request: {parts}; {report.cores_busy:.2f} of {report.cores} cores busy"
    return text


def add_stream_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stream",
        action="store_true",
        help="ask for server-sent events (usage in the last one) and also report the time to first token",
    )
