"""`llmfleet bench`: its load schedules and report arithmetic against fake servers, and its refusals.

Its load against the real stack runs in tests/integration.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet.bench import cpuuse, loadgen
from llmfleet.bench.loadgen import (
    ClosedBeforeAnswer,
    Sample,
    Send,
    Target,
    _read_response,
    closed_loop,
    cpu_use,
    describe,
    open_loop,
    percentile,
    summarize,
    verdict,
)
from llmfleet.cli import main
from llmfleet.errors import LlmfleetError


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0


def test_latency_counts_requests_due_in_the_window_and_throughput_the_answers_arriving_in_it() -> None:
    samples = [
        Sample(9.0, 9.5, "ok", 16),  # due and answered in the warm-up: nowhere
        Sample(9.5, 10.5, "ok", 16),  # due in the warm-up, answered in the window: throughput only
        Sample(10.0, 10.1, "ok", 16),
        Sample(11.0, 11.3, "ok", 16),
        Sample(11.5, 12.5, "ok", 16),  # due in the window, answered after it: latency only
        Sample(11.8, 11.9, "429"),
        Sample(11.9, 12.0, "ConnectError"),
        Sample(12.0, 12.1, "ok", 16),  # due at the window's end: ramp-down, nowhere
    ]
    report = summarize("gateway", "http://127.0.0.1:1", "rate", 2, samples, window_start=10.0, window_end=12.0)
    assert (report.duration_s, report.requests, report.ok) == (2.0, 5, 3)
    assert report.errors == {"429": 1, "ConnectError": 1}
    assert (report.p50_ms, report.max_ms) == (300.0, 1000.0)
    assert report.completion_tokens == 48
    assert (report.answers_in_window, report.throughput_rps, report.completion_tokens_per_s) == (3, 1.5, 24.0)


def _steady(rate: float, latency_s: float, first: float, last: float) -> list[Sample]:
    """Samples of a server answering every request `latency_s` after it was due, due every 1/rate from first to last."""
    steps = range(round(first * rate), round(last * rate))
    return [Sample(step / rate, step / rate + latency_s, "ok", 16) for step in steps]


def test_verdict_names_what_missed() -> None:
    # 100 req/s kept up with, answered 905 ms after each is due; one request due in the window fails.
    samples = [s if s.due != 0.5 else Sample(0.5, 0.6, "500") for s in _steady(100, 0.905, -1.0, 2.0)]
    report = summarize("gateway", "u", "rate", 100, samples, window_start=0.0, window_end=1.0)
    assert report.throughput_rps == 100.0
    assert verdict(report, target_rps=100, target_p95_ms=800) == {"throughput": True, "p95": False, "errors": False}


def _open_loop(send: Send, rate: float, warmup_s: float, duration_s: float) -> tuple[list[Sample], float, float]:
    async def load() -> tuple[list[Sample], float, float]:
        window_start = time.perf_counter() + warmup_s
        window_end = window_start + duration_s
        return await open_loop(send, rate, window_start, window_end), window_start, window_end

    return asyncio.run(load())


def _fake_server(latency_of: Callable[[int], float]) -> Send:
    """A send whose n-th request (from 0) is answered after latency_of(n) seconds."""
    counter = itertools.count()

    async def send(due: float) -> Sample:
        await asyncio.sleep(latency_of(next(counter)))
        return Sample(due, time.perf_counter(), "ok", 16)

    return send


def test_open_loop_keeps_its_rate_from_the_warm_up_through_the_window() -> None:
    samples, window_start, window_end = _open_loop(_fake_server(lambda _n: 0.0), rate=200, warmup_s=0.1, duration_s=0.1)
    due_times = sorted(sample.due for sample in samples)
    gaps = {round(b - a, 6) for a, b in itertools.pairwise(due_times)}
    assert gaps == {0.005}, "requests are due every 1/rate seconds, whatever the answers do"
    assert 19 <= sum(due < window_start for due in due_times) <= 21, "the warm-up runs at the window's rate"
    assert sum(window_start <= due < window_end for due in due_times) == 20


def test_a_server_that_keeps_up_is_reported_at_the_offered_rate_whatever_its_latency() -> None:
    samples, window_start, window_end = _open_loop(_fake_server(lambda _n: 0.1), rate=200, warmup_s=0.1, duration_s=0.3)
    report = summarize("fake", "u", "rate", 200, samples, window_start, window_end)
    assert report.ok == report.requests == 60
    assert report.p50_ms >= 100
    # Counted from the first start to the last answer it would be 60 / 0.4 s = 150 req/s. The slack
    # allows a 25 ms stall of a loaded machine at the window's edge.
    assert report.throughput_rps == pytest.approx(200, abs=25)
    assert report.completion_tokens_per_s == pytest.approx(200 * 16, abs=400)
    assert any(sample.due >= window_end for sample in samples), "the load goes on while the window's are answered"


def test_a_server_that_falls_behind_is_reported_below_the_offered_rate() -> None:
    # Each request waits 5 ms longer than the one before: answers come every 5 + 5 ms, 100 a second. A send
    # never leaves before it is due, so request n is answered 10 n ms after the first is due at the earliest, and
    # however a loaded machine delays the sends, at most the 25 answers due before the window's end (250 ms) land
    # in it: 125 a second. (With 2 ms, a loaded test run let 34 land in the window: 170 a second.)
    samples, window_start, window_end = _open_loop(
        _fake_server(lambda n: 0.005 * n), rate=200, warmup_s=0.05, duration_s=0.2
    )
    report = summarize("fake", "u", "rate", 200, samples, window_start, window_end)
    assert report.ok == report.requests == 40, "every request due in the window is waited for"
    assert report.throughput_rps < 200 * 0.8
    assert not verdict(report, target_rps=200, target_p95_ms=1000)["throughput"]


def test_closed_loop_keeps_every_client_busy_until_the_window_ends() -> None:
    in_flight = 0
    most = 0

    async def send(due: float) -> Sample:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return Sample(due, time.perf_counter(), "ok")

    async def load() -> tuple[list[Sample], float, float]:
        window_start = time.perf_counter() + 0.05
        window_end = window_start + 0.1
        return await closed_loop(send, 4, window_end), window_start, window_end

    samples, window_start, window_end = asyncio.run(load())
    assert most == 4
    assert any(sample.due < window_start for sample in samples), "the clients warm up first"
    assert all(sample.due < window_end for sample in samples), "no request is sent after the window"
    report = summarize("fake", "u", "concurrency", 4, samples, window_start, window_end)
    assert report.ok == report.requests > 0
    # 4 clients, 10 ms (or a little more) a request: at most 400 answers a second.
    assert 0 < report.throughput_rps <= 400 * 1.1


def test_cpu_snapshots_are_taken_at_the_window_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[float] = []

    def snapshot() -> cpuuse.Snapshot:
        taken.append(time.perf_counter())
        return cpuuse.Snapshot({}, busy_s=0.0, total_s=taken[-1], cores=2)

    monkeypatch.setattr(cpuuse, "snapshot", snapshot)

    async def window() -> tuple[float, float]:
        window_start = time.perf_counter() + 0.05
        window_end = window_start + 0.1
        await cpu_use(window_start, window_end)
        return window_start, window_end

    window_start, window_end = asyncio.run(window())
    # Each snapshot at its edge, not before it (up to the event loop's clock granularity), and the first inside the
    # window: how late a snapshot comes depends on how busy the machine is (scripts/test.sh builds images beside the
    # unit stage), so lateness is bounded by the order of the edges, not by a number of milliseconds.
    early = 0.005
    assert window_start - early <= taken[0] < window_end
    assert window_end - early <= taken[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:1"], "give one of --rate"),
        (["--url", "http://127.0.0.1:1", "--rate", "0"], "--rate must be above 0"),
        (["--url", "http://127.0.0.1:1", "--concurrency", "2", "--duration", "0"], "--duration must be above 0"),
        (["--url", "http://127.0.0.1:1", "--rate", "1", "--warmup", "-1"], "--warmup must be 0 seconds or more"),
        (["--url", "http://127.0.0.1:1", "--rate", "1", "--token-file", "/nonexistent/t"], "cannot read"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args]) == 1
    assert message in capsys.readouterr().err


def test_nothing_answered_is_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 on loopback: nothing listens, every connection is refused.
    args = ["bench", "--url", "http://127.0.0.1:1", "--concurrency", "1", "--duration", "0.2", "--warmup", "0"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "ConnectionRefusedError" in captured.out
    assert "no request was answered" in captured.err


def _parse(raw: bytes, watch: re.Pattern[bytes] | None = None) -> tuple[int, bytes, bool, float | None]:
    async def parse() -> tuple[int, bytes, bool, float | None]:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await _read_response(reader, watch)

    return asyncio.run(parse())


def test_responses_are_read_by_length_or_in_chunks() -> None:
    plain = b'HTTP/1.1 200 OK\r\ncontent-length: 9\r\ncontent-type: application/json\r\n\r\n{"a": 1}\n'
    assert _parse(plain) == (200, b'{"a": 1}\n', True, None)
    chunked = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    chunked += b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\n\r\n"
    assert _parse(chunked) == (429, b"abcdefg", False, None)


ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


async def _serve(answers_per_connection: int) -> tuple[asyncio.Server, list[int]]:
    """A loopback server that answers this many requests on a connection, then drops the next one.

    It resets the connection (SO_LINGER 0) as the next request arrives, as when a
    request meets a server's keep-alive timeout. Returns the server and a list
    that counts the connections it accepted.
    """
    accepted: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            for _ in range(answers_per_connection):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(ANSWER)
            await reader.read(1)  # the next request has arrived
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), accepted


def test_a_kept_connection_the_server_closed_is_replaced_not_counted_as_an_error() -> None:
    async def main() -> tuple[list[tuple[int, bytes]], int]:
        server, accepted = await _serve(answers_per_connection=1)
        port = server.sockets[0].getsockname()[1]
        target = Target(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}", {}, max_connections=1)
        async with server:
            answers = [await target.post() for _ in range(3)]
        target.close()
        return answers, len(accepted)

    answers, connections = asyncio.run(main())
    assert answers == [(200, b"{}", None)] * 3
    assert connections == 3


def test_a_new_connection_closed_before_an_answer_is_an_error() -> None:
    async def main() -> None:
        server, _accepted = await _serve(answers_per_connection=0)
        port = server.sockets[0].getsockname()[1]
        target = Target(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}", {}, max_connections=1)
        async with server:
            with pytest.raises(ClosedBeforeAnswer):
                await target.post()

    asyncio.run(main())


def test_idle_connections_past_their_age_are_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> int:
        server, accepted = await _serve(answers_per_connection=5)
        port = server.sockets[0].getsockname()[1]
        target = Target(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}", {}, max_connections=1)
        async with server:
            await target.post()
            await target.post()  # reused: still young
            monkeypatch.setattr("llmfleet.bench.loadgen.IDLE_REUSE_S", 0.0)
            await asyncio.sleep(0.01)
            await target.post()  # the kept one is too old: a new connection
        target.close()
        return len(accepted)

    assert asyncio.run(main()) == 2


def test_the_cpu_line_appears_only_with_cpu_figures() -> None:
    report = summarize("gateway", "u", "rate", 100, _steady(100, 0.2, -1.0, 1.0), window_start=0.0, window_end=0.1)
    assert "\n" not in describe(report)
    report.cpu_ms_per_request = {"gateway": 1.61, "engine core": 10.04}
    report.cores_busy, report.cores = 1.93, 2
    cpu_line = describe(report).splitlines()[1].strip()
    assert cpu_line == "CPU ms per answered request: gateway 1.6, engine core 10.0; 1.93 of 2 cores busy"


def test_cpu_without_proc_is_refused_before_any_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cpuuse, "PROC", tmp_path / "no-proc")
    # Port 1 on loopback: a load run would report ConnectionRefusedError; none starts.
    args = ["bench", "--url", "http://127.0.0.1:1", "--concurrency", "1", "--duration", "0.2", "--cpu"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "--cpu reads" in captured.err and "drop --cpu" in captured.err
    assert "ConnectionRefusedError" not in captured.out


# --- streams: --stream --------------------------------------------------------------------

ROLE_EVENT = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TEXT_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" sea"}}]}\n\n'
USAGE_EVENT = b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n'
DONE_EVENT = b"data: [DONE]\n\n"


def _chunked(*chunks: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"


def test_the_first_token_is_the_first_event_with_generated_text_not_the_role() -> None:
    # The role event alone is no token; without a watch nothing is timed.
    raw = _chunked(ROLE_EVENT, TEXT_EVENT, USAGE_EVENT, DONE_EVENT)
    before = time.perf_counter()
    status, body, keep, first = _parse(raw, loadgen.GENERATED_TEXT)
    assert (status, keep) == (200, True)
    assert first is not None and first >= before
    assert body == ROLE_EVENT + TEXT_EVENT + USAGE_EVENT + DONE_EVENT
    assert _parse(raw)[3] is None
    assert _parse(_chunked(ROLE_EVENT, USAGE_EVENT, DONE_EVENT), loadgen.GENERATED_TEXT)[3] is None


def test_a_streams_tokens_come_from_its_usage_event() -> None:
    assert loadgen.streamed_completion_tokens(ROLE_EVENT + TEXT_EVENT + USAGE_EVENT + DONE_EVENT) == 2
    with pytest.raises(ValueError, match="no usage event"):
        loadgen.streamed_completion_tokens(ROLE_EVENT + TEXT_EVENT + DONE_EVENT)
    failed = b'data: {"error":{"message":"engine failed","code":500}}\n\n'
    with pytest.raises(ValueError, match="ended with an error"):
        loadgen.streamed_completion_tokens(ROLE_EVENT + TEXT_EVENT + failed + DONE_EVENT)


def test_stream_asks_for_events_with_the_usage_and_leaves_the_plain_body_alone() -> None:
    plain = json.loads(loadgen.request_body("tiny", "chat", 8))
    streamed = json.loads(loadgen.request_body("tiny", "chat", 8, stream=True))
    assert "stream" not in plain
    assert streamed == {**plain, "stream": True, "stream_options": {"include_usage": True}}


async def _serve_stream(events: list[bytes], pause_s: float) -> asyncio.Server:
    """A loopback server that answers every request with these events as chunks, pause_s apart."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                for event in events:
                    await asyncio.sleep(pause_s)
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_a_streamed_run_reports_time_to_first_token_below_the_latency() -> None:
    async def main() -> list[loadgen.Sample]:
        server = await _serve_stream([ROLE_EVENT, TEXT_EVENT, TEXT_EVENT, USAGE_EVENT, DONE_EVENT], pause_s=0.02)
        port = server.sockets[0].getsockname()[1]
        body = loadgen.request_body("tiny", "chat", 2, stream=True)
        target = Target(f"http://127.0.0.1:{port}/v1/chat/completions", body, {}, 2, stream=True)
        async with server:
            send = loadgen.sender([target])
            samples = [await send(time.perf_counter()) for _ in range(4)]
        target.close()
        return samples

    samples = asyncio.run(main())
    assert [sample.outcome for sample in samples] == ["ok"] * 4
    assert all(sample.completion_tokens == 2 for sample in samples)
    # The text is the second of five events 20 ms apart: it comes well before the end.
    assert all(s.first_token is not None and s.due < s.first_token < s.done - 0.03 for s in samples)
    start, end = samples[0].due, samples[-1].done + 1
    report = loadgen.summarize("x", "u", "rate", 1.0, samples, start, end)
    assert report.ttft_p50_ms is not None and report.ttft_p99_ms is not None
    assert 0 < report.ttft_p50_ms <= report.ttft_p99_ms < report.p50_ms
    assert "time to first token: p50" in loadgen.describe(report)
    assert loadgen.summarize("x", "u", "rate", 1.0, [], start, end).ttft_p50_ms is None


def test_secret_files_give_a_header_or_the_key_and_an_empty_one_says_what_to_do(tmp_path: Path) -> None:
    token, key, empty = tmp_path / "token", tmp_path / "key", tmp_path / "empty"
    token.write_text("eyJ.token\n")
    key.write_text("engine-key-0123456789\n")
    empty.write_text("\n")
    assert loadgen.read_token(str(token)) == {"Authorization": "Bearer eyJ.token"}
    assert loadgen.read_engine_key(str(key), "--engine-key-file") == "engine-key-0123456789"
    # No file given: no header and no key (engines that take none).
    assert loadgen.read_token(None) == {} and loadgen.read_engine_key(None, "--peer-key-file") == ""
    assert loadgen.bearer("") == {}
    with pytest.raises(LlmfleetError, match=r"--token-file: .*empty; mint one with `llmfleet token"):
        loadgen.read_token(str(empty))
    with pytest.raises(LlmfleetError, match=r"--peer-key-file: .*empty; it holds no key"):
        loadgen.read_engine_key(str(empty), "--peer-key-file")
    with pytest.raises(LlmfleetError, match=r"--engine-key-file: cannot read .*missing"):
        loadgen.read_engine_key(str(tmp_path / "missing"), "--engine-key-file")
