"""`llmfleet bench compare`: the ladder, the paths, the ratio and CPU arithmetic, the table and its refusals.

A run against real engines and peers is in docs/benchmarks.md ("Against the peers").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet.bench import compare, cpuuse
from llmfleet.bench.compare import Row
from llmfleet.bench.loadgen import Report
from llmfleet.cli import main
from llmfleet.errors import LlmfleetError


def test_the_ladder_is_parsed_in_order() -> None:
    assert compare.parse_rates("25,50,100,150") == [25.0, 50.0, 100.0, 150.0]
    assert compare.parse_rates(" 2.5 , 10 ") == [2.5, 10.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "'' is not a number"),
        ("25,,50", "'' is not a number"),
        ("25,fast", "'fast' is not a number"),
        ("0,25", "above 0"),
        ("-5", "above 0"),
        ("25,inf", "above 0"),
        ("25,nan", "above 0"),
        ("50,25", "from the lowest rate up"),
        ("25,25", "from the lowest rate up"),
    ],
)
def test_a_bad_ladder_is_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(LlmfleetError, match=message):
        compare.parse_rates(text)


def test_paths_default_to_direct_and_the_peers_and_add_the_gateway_with_its_url() -> None:
    assert compare.default_paths(None) == "direct,litellm,vllm-router"
    assert compare.default_paths("http://10.77.0.10:8080") == "direct,litellm,vllm-router,gateway"
    assert compare.parse_paths("vllm-router, direct", None) == ["vllm-router", "direct"]


@pytest.mark.parametrize(
    ("text", "gateway_url", "message"),
    [
        ("direct,nginx", None, "choose from direct, litellm, vllm-router, gateway"),
        (",", None, "choose from"),
        ("direct,direct", None, "named twice"),
        ("direct,gateway", None, "needs --gateway-url"),
    ],
)
def test_bad_paths_are_refused_clearly(text: str, gateway_url: str | None, message: str) -> None:
    with pytest.raises(LlmfleetError, match=message):
        compare.parse_paths(text, gateway_url)


def _row(path: str, rate: float, throughput: float, p50: float, p95: float, p99: float) -> Row:
    report = Report(label=path, url="http://127.0.0.1:1", mode="rate", load=rate, duration_s=10.0)
    report.throughput_rps, report.p50_ms, report.p95_ms, report.p99_ms = throughput, p50, p95, p99
    report.requests = int(rate * report.duration_s)
    report.ok = int(throughput * report.duration_s)
    return Row(path, rate, report, None, 0.5, 0.05, {}, 1.0, 2)


def test_each_row_is_set_against_direct_at_the_same_rate() -> None:
    rows = compare.with_ratios(
        [
            _row("direct", 25, 25.0, 50.0, 80.0, 90.0),
            _row("direct", 50, 40.0, 70.0, 300.0, 500.0),
            _row("litellm", 25, 24.5, 62.5, 100.0, 120.0),
            _row("litellm", 50, 30.0, 170.0, 900.0, 1500.0),
        ]
    )
    direct25, direct50, litellm25, litellm50 = rows
    assert (direct25.throughput_ratio, direct25.added_p50_ms) == (1.0, 0.0)
    assert (litellm25.throughput_ratio, litellm25.added_p50_ms, litellm25.added_p95_ms) == (0.98, 12.5, 20.0)
    # At 50 req/s against direct's 40 at 50, not its 25 at 25.
    assert (litellm50.throughput_ratio, litellm50.added_p50_ms, litellm50.added_p99_ms) == (0.75, 100.0, 1000.0)
    assert direct50.added_p95_ms == 0.0


def test_rows_without_direct_at_their_rate_have_no_ratio() -> None:
    rows = compare.with_ratios([_row("direct", 25, 0.0, 0.0, 0.0, 0.0), _row("litellm", 25, 20, 60, 90, 99)])
    rows += compare.with_ratios([_row("vllm-router", 50, 49.0, 55.0, 70.0, 80.0)])
    assert [(row.throughput_ratio, row.added_p50_ms) for row in rows[1:]] == [(None, None), (None, None)]


def _snapshot(processes: dict[tuple[int, int], tuple[str, float]]) -> cpuuse.Snapshot:
    return cpuuse.Snapshot(processes, busy_s=0.0, total_s=0.0, cores=2)


def test_a_peers_cpu_is_that_of_its_processes_only() -> None:
    before = _snapshot({(10, 1): ("other", 5.0), (11, 1): ("other", 1.0), (99, 1): ("other", 7.0)})
    after = _snapshot(
        {
            (10, 1): ("other", 5.6),  # the peer: 0.6 s
            (11, 1): ("other", 1.1),  # its child: 0.1 s
            (12, 9): ("other", 0.2),  # a child started in the window: all of its 0.2 s
            (99, 1): ("other", 9.0),  # someone else's process: not the peer's
        }
    )
    assert compare.group_cpu_s(before, after, {10, 11, 12}) == pytest.approx(0.9)
    assert compare.per_request_ms(0.9, 300) == 3.0
    assert compare.per_request_ms(0.9, 0) == 900.0  # nothing answered: per one request, not a division by zero


def test_the_table_shows_every_row_with_its_ratio_and_cpu() -> None:
    rows = compare.with_ratios(
        [_row("direct", 25, 25.0, 50.0, 80.0, 90.0), _row("vllm-router", 25, 24.0, 51.0, 85, 95)]
    )
    rows[1].path_cpu_ms_per_request = 0.74
    rows[1].report.errors = {"502": 2}
    lines = compare.table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| direct | 25 req/s |") and "| - | 0.50 |" in lines[2]
    assert "| 24.0 req/s | 0.96 |" in lines[3] and "| +1 ms | 502 x2 | 0.74 | 0.50 |" in lines[3]


def test_a_row_that_answered_nothing_shows_no_latency_and_no_cpu_per_answer() -> None:
    # As LiteLLM at 150 req/s on the lab: every request timed out, so there is no latency to show or to compare.
    rows = compare.with_ratios([_row("direct", 150, 150.0, 480.0, 1500.0, 2264.0), _row("litellm", 150, 0.0, 0, 0, 0)])
    rows[1].report.errors = {"timeout": 1500}
    rows[1].path_cpu_ms_per_request = 9700.0
    assert (rows[1].throughput_ratio, rows[1].added_p50_ms) == (0.0, None)
    line = compare.table(rows).splitlines()[3]
    assert line == "| litellm | 150 req/s | 0/1500 | 0.0 req/s | 0.00 | - | - | - | - | timeout x1500 | - | - |"


def test_a_streamed_table_adds_time_to_first_token_and_a_plain_one_does_not() -> None:
    rows = compare.with_ratios([_row("direct", 25, 25.0, 50.0, 80.0, 90.0), _row("gateway", 25, 25.0, 60, 90, 99)])
    assert "TTFT" not in compare.table(rows)
    rows[0].report.ttft_p50_ms, rows[0].report.ttft_p95_ms = 20.4, 31.0
    rows[1].report.ttft_p50_ms, rows[1].report.ttft_p95_ms = 28.0, 40.6
    lines = compare.table(rows).splitlines()
    assert lines[0].endswith("| TTFT p50 | TTFT p95 |")
    assert lines[1].count("|") == lines[0].count("|")
    assert lines[2].endswith("| 20 ms | 31 ms |") and lines[3].endswith("| 28 ms | 41 ms |")


def test_the_ladder_goes_on_past_its_rates_only_under_saturate_and_stops_at_saturation() -> None:
    offered: list[float] = []

    def keeps_up_to(limit: float) -> Callable[[float], Row]:
        def load(rate: float) -> Row:
            offered.append(rate)
            return _row("gateway", rate, min(rate, limit), 50, 80, 90)

        return load

    rows = compare.run_ladder(_args(saturate=0), [10, 20], keeps_up_to(1000), compare.saturated)
    assert [row.rate for row in rows] == [10, 20]
    # Half again each time: 30, 45, 67.5; saturated at 67.5 (60 answered of 67.5 offered), so no more.
    rows = compare.run_ladder(_args(saturate=5), [10, 20], keeps_up_to(60), compare.saturated)
    assert [row.rate for row in rows] == [10, 20, 30, 45, 67.5]
    assert [compare.saturated(row) for row in rows] == [False, False, False, False, True]
    # The extra rates stop at --saturate even before saturation.
    rows = compare.run_ladder(_args(saturate=2), [10, 20], keeps_up_to(1000), compare.saturated)
    assert [row.rate for row in rows] == [10, 20, 30, 45]


def test_errors_or_falling_behind_mark_a_rate_saturated() -> None:
    assert not compare.saturated(_row("direct", 100, 95.0, 50, 80, 90))
    assert compare.saturated(_row("direct", 100, 94.9, 50, 80, 90))
    failing = _row("direct", 100, 100.0, 50, 80, 90)
    failing.report.errors = {"timeout": 1}
    assert compare.saturated(failing)


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "engine_url": ["http://127.0.0.1:8001"],
        "rates": "10,25",
        "paths": "direct",
        "gateway_url": None,
        "token_file": None,
        "cpus": None,
        "litellm_workers": 1,
        "duration": 10.0,
        "warmup": 3.0,
        "model": "tiny",
        "endpoint": "chat",
        "max_tokens": 16,
        "stream": False,
        "saturate": 0,
        "workdir": "out/bench/compare",
        "out": "out/bench/compare.json",
        "json": False,
    }
    return argparse.Namespace(**{**values, **overrides})


def test_the_json_records_how_it_was_run_and_every_row(tmp_path: Path) -> None:
    rows = compare.with_ratios([_row("direct", 10, 10.0, 50, 60, 70), _row("litellm", 10, 9.9, 60, 80, 90)])
    document = compare.result(_args(paths="direct,litellm"), ["direct", "litellm"], rows, ["bench", "compare"])
    assert document["command"] == ["llmfleet", "bench", "compare"]
    assert document["versions"] == {"litellm": compare.peers.version(compare.peers.PEERS["litellm"])}
    assert document["rates"] == [10.0]
    assert [(row["path"], row["throughput_ratio"]) for row in document["rows"]] == [("direct", 1.0), ("litellm", 0.99)]
    assert document["rows"][1]["report"]["p50_ms"] == 60
    assert document["rows"][1]["load_generator_cpu_s"] == 0.05
    json.dumps(document)  # all of it serializable


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"engine_url": None}, "--engine-url"),
        ({"rates": "10,5"}, "lowest rate up"),
        ({"gateway_url": "http://127.0.0.1:1", "paths": "gateway"}, "needs --token-file"),
        ({"duration": 0.0}, "--duration must be above 0"),
        ({"litellm_workers": 0}, "--litellm-workers"),
        ({"saturate": -1}, "--saturate must be 0"),
        ({"cpus": "1-0"}, "runs backwards"),
    ],
)
def test_compare_refuses_bad_options_before_any_load(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(LlmfleetError, match=message):
        compare.run(_args(**overrides))


def test_bench_compare_is_a_subcommand_of_bench_and_bench_still_needs_its_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "compare", "--engine-url", "http://127.0.0.1:1", "--rates", "nope"]) == 1
    assert "'nope' is not a number" in capsys.readouterr().err
    assert main(["bench", "--rate", "1"]) == 1
    assert "give --url" in capsys.readouterr().err
