"""`llmfleet bench plot`: compare.json's figures, the three PNGs drawn from them, and the errors a user meets.

tests/unit/fixtures/bench-compare/compare.json is what `llmfleet bench compare`
wrote on a real loopback run (one vLLM-CPU engine; docs/benchmarks.md, Plots),
verbatim. The expected figures here are read from its rows with code of the
test's own, never copied in.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import struct
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from llmfleet.bench import cpuuse, plots
from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench-compare" / "compare.json"
DOCUMENT: dict[str, Any] = json.loads(FIXTURE.read_text())
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def parse(argv: list[str]) -> argparse.Namespace:
    """`llmfleet bench ARGV` on a parser of its own, with only plots.register's subcommand."""
    parser = argparse.ArgumentParser(prog="llmfleet bench")
    plots.register(parser.add_subparsers(dest="bench_command"))
    return parser.parse_args(argv)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header: the signature, then the IHDR chunk first."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def rows_of(path: str) -> list[dict[str, Any]]:
    return sorted((row for row in DOCUMENT["rows"] if row["path"] == path), key=lambda row: row["rate"])


def nan_as_none(values: Any) -> list[float | None]:
    return [None if math.isnan(value) else float(value) for value in values]


# --- the fixture is a real compare run ---------------------------------------------------


def test_the_fixture_is_a_compare_run_of_three_paths_at_three_rates() -> None:
    assert DOCUMENT["command"][:3] == ["llmfleet", "bench", "compare"]
    assert DOCUMENT["paths"] == ["direct", "litellm", "vllm-router"]
    assert DOCUMENT["rates"] == [2.0, 5.0, 10.0]
    assert len(DOCUMENT["rows"]) == 9
    assert all(row["report"]["ok"] > 0 for row in DOCUMENT["rows"])


# --- series: the JSON's figures, before any drawing ------------------------------------------


def test_series_holds_every_path_in_the_json_order() -> None:
    plotted = plots.series(DOCUMENT)
    assert [path.path for path in plotted.paths] == DOCUMENT["paths"]


@pytest.mark.parametrize("path", ["direct", "litellm", "vllm-router"])
def test_series_figures_equal_the_json_rows(path: str) -> None:
    series = next(item for item in plots.series(DOCUMENT).paths if item.path == path)
    rows = rows_of(path)
    assert series.rates == [row["rate"] for row in rows]
    for name in ("p50", "p95", "p99"):
        assert series.latency_ms[name] == [row["report"][f"{name}_ms"] for row in rows]
    assert series.throughput_rps == [row["report"]["throughput_rps"] for row in rows]
    assert series.cpu_ms[plots.PATH_PROCESSES] == [row["path_cpu_ms_per_request"] for row in rows]
    assert series.cpu_ms[cpuuse.LOAD_GENERATOR] == [row["load_generator_cpu_ms_per_request"] for row in rows]
    engines = [
        sum(value for part, value in row["cpu_ms_per_request_by_part"].items() if part.startswith("engine"))
        for row in rows
    ]
    assert series.cpu_ms[plots.ENGINES] == pytest.approx(engines, abs=0.006)


def test_direct_has_no_processes_of_its_own_and_the_peers_do() -> None:
    plotted = {series.path: series for series in plots.series(DOCUMENT).paths}
    assert plotted["direct"].cpu_ms[plots.PATH_PROCESSES] == [None, None, None]
    for peer in ("litellm", "vllm-router"):
        assert all(value is not None and value > 0 for value in plotted[peer].cpu_ms[plots.PATH_PROCESSES])


def test_the_engines_bars_count_only_the_engine_parts() -> None:
    assert set(plots.ENGINE_PARTS) == {"engine core", "engine model process", "engine API server"}


def test_rows_out_of_order_are_sorted_by_rate_and_a_rate_none_answered_has_no_latency() -> None:
    document = copy.deepcopy(DOCUMENT)
    document["rows"].reverse()
    silent = next(row for row in document["rows"] if row["path"] == "litellm" and row["rate"] == 10.0)
    silent["report"].update(ok=0, throughput_rps=0.0, p50_ms=0.0, p95_ms=0.0, p99_ms=0.0)
    litellm = next(series for series in plots.series(document).paths if series.path == "litellm")
    assert litellm.rates == [2.0, 5.0, 10.0]
    assert litellm.latency_ms["p50"][2] is None
    assert litellm.latency_ms["p50"][:2] == [row["report"]["p50_ms"] for row in rows_of("litellm")[:2]]
    assert litellm.throughput_rps[2] == 0.0


def test_the_subtitle_says_how_the_run_was_made() -> None:
    text = plots.series(DOCUMENT).subtitle
    assert f"{DOCUMENT['window']['duration_s']:g} s windows" in text
    assert f"{DOCUMENT['machine']['cores']} cores" in text
    assert DOCUMENT["window"]["stream"] is False
    assert "streamed" not in text
    streamed = copy.deepcopy(DOCUMENT)
    streamed["window"]["stream"] = True
    assert "streamed" in plots.series(streamed).subtitle


# --- the figures draw those series ------------------------------------------------------------


def test_the_latency_lines_are_the_series() -> None:
    plotted = plots.series(DOCUMENT)
    figure = plots.latency_figure(plotted)
    assert len(figure.axes) == 3
    for axes, name in zip(figure.axes, ("p50", "p95", "p99"), strict=True):
        assert axes.get_title() == name
        lines = {line.get_label(): line for line in axes.get_lines()}
        for series in plotted.paths:
            assert list(lines[series.path].get_xdata()) == series.rates
            assert nan_as_none(lines[series.path].get_ydata()) == series.latency_ms[name]


def test_the_throughput_lines_are_the_series_beside_y_equals_x() -> None:
    plotted = plots.series(DOCUMENT)
    axes = plots.throughput_figure(plotted).axes[0]
    lines = {line.get_label(): line for line in axes.get_lines()}
    offered = lines["offered (y = x)"]
    assert list(offered.get_xdata()) == list(offered.get_ydata()) == [0.0, max(DOCUMENT["rates"])]
    for series in plotted.paths:
        assert list(lines[series.path].get_ydata()) == series.throughput_rps


def test_the_cpu_bars_are_the_series_one_panel_per_path() -> None:
    plotted = plots.series(DOCUMENT)
    figure = plots.cpu_figure(plotted)
    assert [axes.get_title() for axes in figure.axes] == [series.path for series in plotted.paths]
    for axes, series in zip(figure.axes, plotted.paths, strict=True):
        assert len(axes.containers) == len(plots.CPU_COMPONENTS)
        for bars, component in zip(axes.containers, plots.CPU_COMPONENTS, strict=True):
            assert bars.get_label() == component
            assert nan_as_none(patch.get_height() for patch in bars) == series.cpu_ms[component]


def test_a_value_axis_is_logarithmic_only_when_its_figures_span_more_than_twentyfold() -> None:
    plotted = plots.series(DOCUMENT)
    latencies = [row["report"][f"{name}_ms"] for row in DOCUMENT["rows"] for name in ("p50", "p95", "p99")]
    assert max(latencies) / min(latencies) <= plots.LOG_SPAN
    assert plots.latency_figure(plotted).axes[0].get_yscale() == "linear"
    # One slow row, as a lab ladder's top rung gives, and every latency panel turns to a log scale.
    document = copy.deepcopy(DOCUMENT)
    document["rows"][-1]["report"]["p99_ms"] = plots.LOG_SPAN * max(latencies)
    figure = plots.latency_figure(plots.series(document))
    assert [axes.get_yscale() for axes in figure.axes] == ["log", "log", "log"]
    assert figure.axes[0].get_ylabel() == "latency (ms), log scale"


# --- the command --------------------------------------------------------------------------------


def test_the_command_writes_three_pngs_and_prints_their_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "plots"
    args = parse(["plot", "--from", str(FIXTURE), "--out-dir", str(out_dir)])
    assert args.handler(args) == 0
    printed = capsys.readouterr().out.split()
    expected = [str(out_dir / name) for name in plots.FILES.values()]
    assert printed == expected
    for name in expected:
        path = Path(name)
        assert path.stat().st_size > 1000
        assert png_size(path) == (int(plots.WIDTH_IN * plots.DPI), int(plots.HEIGHT_IN * plots.DPI))


def test_the_defaults_are_compares_json_and_out_bench_plots() -> None:
    args = parse(["plot"])
    assert args.source == "out/bench/compare.json"
    assert args.out_dir == "out/bench/plots"


def test_a_missing_json_says_to_run_compare_and_exits_1(tmp_path: Path) -> None:
    args = parse(["plot", "--from", str(tmp_path / "absent.json"), "--out-dir", str(tmp_path / "plots")])
    with pytest.raises(LlmfleetError, match="does not exist: run `llmfleet bench compare` first") as raised:
        args.handler(args)
    assert raised.value.exit_code == 1
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not JSON"),
        ("[]", "has no 'rows'"),
        ('{"rows": []}', "holds no rows"),
        ('{"rows": [{"path": "direct"}]}', r"rows\[0\] has no 'rate'"),
    ],
)
def test_an_invalid_json_is_named_and_exits_1(tmp_path: Path, text: str, message: str) -> None:
    source = tmp_path / "compare.json"
    source.write_text(text)
    args = parse(["plot", "--from", str(source), "--out-dir", str(tmp_path / "plots")])
    with pytest.raises(LlmfleetError, match=message) as raised:
        args.handler(args)
    assert raised.value.exit_code == 1
    assert not (tmp_path / "plots").exists()


def test_a_figure_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    document = copy.deepcopy(DOCUMENT)
    next(row for row in document["rows"] if row["path"] == "vllm-router")["report"]["p95_ms"] = "fast"
    with pytest.raises(LlmfleetError, match=r"vllm-router at 2 req/s: p95_ms is 'fast', not a number"):
        plots.series(document, "compare.json")


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    args = parse(["plot", "--from", str(FIXTURE), "--out-dir", str(tmp_path / "plots")])
    with pytest.raises(LlmfleetError, match=r"needs matplotlib.*\.\[plots\]") as raised:
        args.handler(args)
    assert raised.value.exit_code == 1
    assert not (tmp_path / "plots").exists()


def test_matplotlib_is_pinned_once_in_effect_the_plots_extra_the_dev_extra_and_constraints_agree() -> None:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {
        line for line in (REPO_ROOT / "constraints.txt").read_text().splitlines() if line.startswith("matplotlib==")
    }
    assert extras["plots"] == list(pins)
    assert set(extras["plots"]) <= set(extras["dev"])
    # And the one installed here, which the PNGs under docs/img/benchmarks were drawn with, is that pin.
    assert pins == {f"matplotlib=={metadata.version('matplotlib')}"}
