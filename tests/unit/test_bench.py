"""`llmfleet bench`: the arithmetic of its report and its refusals (its load runs in tests/integration)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from llmfleet import cpuuse
from llmfleet.bench import Sample, _read_response, closed_loop, describe, open_loop, percentile, summarize, verdict
from llmfleet.cli import main


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0


def test_summary_counts_answers_only_and_names_each_error() -> None:
    samples = [Sample(0.010 * n, "ok", 16) for n in range(1, 9)] + [Sample(0.5, "429"), Sample(1.0, "ConnectError")]
    report = summarize("gateway", "http://127.0.0.1:1", "rate", 10, samples, elapsed_s=2.0)
    assert (report.requests, report.ok) == (10, 8)
    assert report.errors == {"429": 1, "ConnectError": 1}
    assert report.throughput_rps == 4.0
    assert report.completion_tokens_per_s == 64.0
    assert (report.p50_ms, report.max_ms) == (40.0, 80.0)


def test_verdict_names_what_missed() -> None:
    samples = [Sample(0.9, "ok", 16)] * 99 + [Sample(0.1, "500")]
    report = summarize("gateway", "u", "rate", 100, samples, elapsed_s=1.0)
    assert verdict(report, target_rps=100, target_p95_ms=800) == {"throughput": True, "p95": False, "errors": False}


def test_open_loop_starts_rate_times_duration_requests_on_schedule() -> None:
    due_times: list[float] = []

    async def send(due: float) -> Sample:
        due_times.append(due)
        return Sample(0.0, "ok")

    samples, _elapsed = asyncio.run(open_loop(send, rate=200, duration_s=0.1))
    assert len(samples) == 20
    gaps = {round(b - a, 6) for a, b in itertools.pairwise(due_times)}
    assert gaps == {0.005}, "requests are due every 1/rate seconds, whatever the answers do"


def test_closed_loop_keeps_every_client_busy_until_the_end() -> None:
    in_flight = 0
    most = 0

    async def send(due: float) -> Sample:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return Sample(0.001, "ok")

    samples, _elapsed = asyncio.run(closed_loop(send, concurrency=4, duration_s=0.05))
    assert most == 4
    assert len(samples) >= 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:1"], "give one of --rate"),
        (["--url", "http://127.0.0.1:1", "--rate", "0"], "--rate must be above 0"),
        (["--url", "http://127.0.0.1:1", "--concurrency", "2", "--duration", "0"], "--duration must be above 0"),
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


def _parse(raw: bytes) -> tuple[int, bytes, bool]:
    async def parse() -> tuple[int, bytes, bool]:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await _read_response(reader)

    return asyncio.run(parse())


def test_responses_are_read_by_length_or_in_chunks() -> None:
    plain = b'HTTP/1.1 200 OK\r\ncontent-length: 9\r\ncontent-type: application/json\r\n\r\n{"a": 1}\n'
    assert _parse(plain) == (200, b'{"a": 1}\n', True)
    chunked = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    chunked += b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\n\r\n"
    assert _parse(chunked) == (429, b"abcdefg", False)


def test_the_cpu_line_appears_only_with_cpu_figures() -> None:
    report = summarize("gateway", "u", "rate", 100, [Sample(0.2, "ok", 16)] * 10, elapsed_s=0.1)
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
