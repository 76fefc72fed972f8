"""`llmfleet bench plot`: PNG plots of what `llmfleet bench compare` wrote.

    llmfleet bench plot [--from out/bench/compare.json] [--out-dir out/bench/plots]

Three figures from compare.json (llmfleet.bench.compare.result), one line or
one set of bars per path, each against the offered rate of its row:
- compare-latency.png: p50, p95 and p99 (one panel each), of the requests
  answered; a rate whose requests were none answered leaves a gap;
- compare-throughput.png: answered requests per second, with the offered rate
  itself (y = x) as the line a path that keeps up sits on;
- compare-cpu.png: CPU ms per answered request, one panel per path, a group of
  bars per rate: the path's own processes (none for direct), the engines'
  processes on this machine, and the load generator, each bar with its figure.
A value axis whose figures span more than LOG_SPAN times is drawn on a log
scale (a ladder run to saturation: tens of ms to seconds), else a linear one.

Drawing is kept apart from reading: `series()` turns the JSON into the numbers
that are drawn, and tests check those against the JSON without drawing.
matplotlib comes from the `plots` extra (pinned in pyproject.toml and
constraints.txt; the dev extra includes it) and draws on its Agg canvas, so no
display is needed.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmfleet.bench import cpuuse
from llmfleet.errors import LlmfleetError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import Formatter

DEFAULT_SOURCE = "out/bench/compare.json"
DEFAULT_OUT_DIR = "out/bench/plots"
PERCENTILES = ("p50", "p95", "p99")
# The CPU bars of each rate, in drawing order.
PATH_PROCESSES = "path's processes"
ENGINES = "engines"
CPU_COMPONENTS = (PATH_PROCESSES, ENGINES, cpuuse.LOAD_GENERATOR)
# The parts cpuuse counts as the engines: their API servers, engine cores and model processes.
ENGINE_PARTS = tuple(name for name, _markers in cpuuse.PARTS if name.startswith("engine"))
# One colour per path in every figure; tab10's first four, in compare.PATHS order.
PATH_COLOURS = {"direct": "#1f77b4", "litellm": "#ff7f0e", "vllm-router": "#2ca02c", "gateway": "#d62728"}
OTHER_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
COMPONENT_COLOURS = {PATH_PROCESSES: "#4c72b0", ENGINES: "#8c8c8c", cpuuse.LOAD_GENERATOR: "#dd8452"}
MARKERS = ("o", "s", "^", "D", "v")
# A value axis whose largest figure is more than this many times its smallest is drawn on a log scale.
LOG_SPAN = 20.0
# Figure size in inches and resolution: the PNGs are WIDTH_IN * DPI by HEIGHT_IN * DPI pixels.
WIDTH_IN, HEIGHT_IN, DPI = 11.0, 4.2, 100
FILES = {"latency": "compare-latency.png", "throughput": "compare-throughput.png", "cpu": "compare-cpu.png"}


@dataclass(frozen=True)
class PathSeries:
    """One path's figures, one entry per offered rate, lowest rate first."""

    path: str
    rates: list[float]
    # Of the requests answered; None where none was (compare reports 0 ms then).
    latency_ms: dict[str, list[float | None]]
    throughput_rps: list[float]
    # CPU ms per answered request by component; None where the JSON has none (direct's own processes).
    cpu_ms: dict[str, list[float | None]]


@dataclass(frozen=True)
class Plotted:
    """What the figures are drawn from: the paths in the JSON's order, and how the run was made."""

    paths: list[PathSeries]
    subtitle: str


def _number(value: Any, where: str) -> float:
    # bool is an int to Python, and never a figure here.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LlmfleetError(f"{where} is {value!r}, not a number")
    return float(value)


def _field(mapping: Any, key: str, where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise LlmfleetError(f"{where} has no {key!r}")
    return mapping[key]


def _engines_ms(by_part: Any, where: str) -> float:
    if not isinstance(by_part, dict):
        raise LlmfleetError(f"{where}.cpu_ms_per_request_by_part is {by_part!r}, not a mapping")
    return round(
        sum(_number(by_part.get(part, 0.0), f"{where}.cpu_ms_per_request_by_part") for part in ENGINE_PARTS), 2
    )


def series(document: Any, source: str = "compare.json") -> Plotted:
    """The figures to draw, from compare.json's document; LlmfleetError naming what is wrong with it."""
    rows = _field(document, "rows", source)
    if not isinstance(rows, list) or not rows:
        raise LlmfleetError(f"{source} holds no rows: did `llmfleet bench compare` run any path?")
    by_path: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for index, row in enumerate(rows):
        where = f"{source} rows[{index}]"
        path = _field(row, "path", where)
        if not isinstance(path, str):
            raise LlmfleetError(f"{where}.path is {path!r}, not a name")
        rate = _number(_field(row, "rate", where), f"{where}.rate")
        by_path.setdefault(path, []).append((rate, row))
    named = document.get("paths")
    order = [path for path in named if path in by_path] if isinstance(named, list) else []
    order += [path for path in by_path if path not in order]
    paths = []
    for path in order:
        entries = sorted(by_path[path], key=lambda entry: entry[0])
        rates = [rate for rate, _row in entries]
        if len(set(rates)) != len(rates):
            raise LlmfleetError(f"{source}: {path} has more than one row at the same rate")
        latency: dict[str, list[float | None]] = {name: [] for name in PERCENTILES}
        throughput: list[float] = []
        cpu: dict[str, list[float | None]] = {name: [] for name in CPU_COMPONENTS}
        for rate, row in entries:
            where = f"{source} {path} at {rate:g} req/s"
            report = _field(row, "report", where)
            answered = _number(_field(report, "ok", where), f"{where}: ok")
            for name in PERCENTILES:
                value = _number(_field(report, f"{name}_ms", where), f"{where}: {name}_ms")
                latency[name].append(value if answered > 0 else None)
            throughput.append(_number(_field(report, "throughput_rps", where), f"{where}: throughput_rps"))
            own = _field(row, "path_cpu_ms_per_request", where)
            cpu[PATH_PROCESSES].append(None if own is None else _number(own, f"{where}: path_cpu_ms_per_request"))
            cpu[ENGINES].append(_engines_ms(_field(row, "cpu_ms_per_request_by_part", where), where))
            generator = _field(row, "load_generator_cpu_ms_per_request", where)
            cpu[cpuuse.LOAD_GENERATOR].append(_number(generator, f"{where}: load_generator_cpu_ms_per_request"))
        paths.append(PathSeries(path, rates, latency, throughput, cpu))
    return Plotted(paths, subtitle(document))


def subtitle(document: dict[str, Any]) -> str:
    """How the run was made, as far as the JSON says: window, streaming, cores, peers' cores, engines."""
    parts = []
    window = document.get("window")
    if isinstance(window, dict) and isinstance(window.get("duration_s"), int | float):
        parts.append(f"{window['duration_s']:g} s windows")
        if isinstance(window.get("max_tokens"), int):
            parts.append(f"{window['max_tokens']} tokens an answer")
        if window.get("stream") is True:
            parts.append("streamed")
    machine = document.get("machine")
    if isinstance(machine, dict):
        if isinstance(machine.get("cores"), int):
            parts.append(f"{machine['cores']} cores")
        if machine.get("peer_cpus"):
            parts.append(f"peers on cores {machine['peer_cpus']}")
    engines = document.get("engines")
    if isinstance(engines, list) and engines:
        parts.append(f"{len(engines)} engine{'s' if len(engines) > 1 else ''}")
    return "llmfleet bench compare" + (f": {', '.join(parts)}" if parts else "")


def read(source: Path) -> Plotted:
    """compare.json's figures, or an LlmfleetError that says what to do."""
    try:
        text = source.read_text()
    except FileNotFoundError:
        raise LlmfleetError(
            f"{source} does not exist: run `llmfleet bench compare` first (it writes {DEFAULT_SOURCE}),"
            " or name its JSON with --from"
        ) from None
    except OSError as error:
        raise LlmfleetError(f"cannot read {source}: {error.strerror}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise LlmfleetError(f"{source} is not JSON ({error}): give the file `llmfleet bench compare` wrote") from None
    return series(document, str(source))


def _colour(path: str, index: int) -> str:
    return PATH_COLOURS.get(path, OTHER_COLOURS[index % len(OTHER_COLOURS)])


def _gaps(values: list[float | None]) -> list[float]:
    # NaN leaves a gap in a line and no bar: a figure the JSON does not have is not drawn as 0.
    return [math.nan if value is None else value for value in values]


def require_matplotlib() -> None:
    """LlmfleetError, saying how to install it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401  # the package alone, so a missing one fails here, by name
    except ImportError:
        raise LlmfleetError(
            "llmfleet bench plot needs matplotlib, which this Python lacks: install the plots extra"
            " (pip install --constraint constraints.txt -e '.[plots]'; scripts/bootstrap.sh's '.[dev]' includes it)"
        ) from None


def _new_figure(title: str, plotted: Plotted, columns: int) -> Figure:
    require_matplotlib()
    # The Agg canvas, set on the figure itself: no pyplot, no display, no global backend to choose.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(f"{title}\n{plotted.subtitle}", fontsize=11)
    figure.subplots(1, columns, sharey=True, squeeze=False)
    return figure


def _style(index: int) -> dict[str, Any]:
    # Lines that coincide (every path keeping up, say) stay visible: open markers, of other shapes and smaller
    # for later paths, so one path's points do not hide another's.
    return {
        "marker": MARKERS[index % len(MARKERS)],
        "markersize": max(10.0 - 2.0 * index, 4.0),
        "fillstyle": "none",
        "markeredgewidth": 1.5,
    }


def _value_axis(axes: Axes, values: list[float | None], label: str) -> None:
    """A log scale when the values span more than LOG_SPAN (lab ladders: 50 ms to seconds), else a linear one."""
    present = [value for value in values if value is not None and value > 0]
    log = bool(present) and max(present) / min(present) > LOG_SPAN
    if log:
        axes.set_yscale("log")
        # Plain numbers on the ticks (50, 100, 2000), not powers of ten.
        axes.yaxis.set_major_formatter(_plain_ticks())
    axes.set_ylabel(f"{label}, log scale" if log else label)


def _plain_ticks() -> Formatter:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _position: f"{value:g}")


def _legend(figure: Figure) -> None:
    # Beside the panels, not on one: it would hide a point or a bar's figure.
    handles, labels = figure.axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right upper")


def latency_figure(plotted: Plotted) -> Figure:
    """p50, p95 and p99 against the offered rate: one panel each, a line per path."""
    figure = _new_figure("Latency against offered load", plotted, len(PERCENTILES))
    for axes, name in zip(figure.axes, PERCENTILES, strict=True):
        for index, path in enumerate(plotted.paths):
            axes.plot(
                path.rates,
                _gaps(path.latency_ms[name]),
                label=path.path,
                color=_colour(path.path, index),
                **_style(index),
            )
        axes.set_title(name)
        axes.set_xlabel("offered rate (req/s)")
        axes.grid(True, which="both", alpha=0.3)
    # The panels share their y axis: one scale, from every path and percentile.
    every = [value for path in plotted.paths for name in PERCENTILES for value in path.latency_ms[name]]
    _value_axis(figure.axes[0], every, "latency (ms)")
    _legend(figure)
    return figure


def throughput_figure(plotted: Plotted) -> Figure:
    """Answered req/s against the offered rate, a line per path, and y = x."""
    figure = _new_figure("Throughput against offered load", plotted, 1)
    axes = figure.axes[0]
    offered = sorted({rate for path in plotted.paths for rate in path.rates})
    axes.plot([0.0, offered[-1]], [0.0, offered[-1]], linestyle="--", color="#555555", label="offered (y = x)")
    for index, path in enumerate(plotted.paths):
        axes.plot(path.rates, path.throughput_rps, label=path.path, color=_colour(path.path, index), **_style(index))
    axes.set_xlabel("offered rate (req/s)")
    axes.set_ylabel("throughput: answered req/s")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend()
    return figure


def cpu_figure(plotted: Plotted) -> Figure:
    """CPU ms per answered request: a panel per path, a group of bars per rate, a bar per component, each labelled."""
    figure = _new_figure("CPU ms per answered request by component", plotted, len(plotted.paths))
    width = 0.8 / len(CPU_COMPONENTS)
    for axes, path in zip(figure.axes, plotted.paths, strict=True):
        positions = range(len(path.rates))
        for offset, component in enumerate(CPU_COMPONENTS):
            bars = axes.bar(
                [position + (offset - (len(CPU_COMPONENTS) - 1) / 2) * width for position in positions],
                _gaps(path.cpu_ms[component]),
                width,
                label=component,
                color=COMPONENT_COLOURS[component],
            )
            # The figure on each bar: beside the engines' hundreds of ms, a proxy's 1 ms is hard to read off an axis.
            axes.bar_label(bars, fmt=lambda value: "" if math.isnan(value) else f"{value:.3g}", fontsize=7)
        axes.set_xticks(list(positions), [f"{rate:g}" for rate in path.rates])
        axes.set_title(path.path)
        axes.set_xlabel("offered rate (req/s)")
        axes.grid(True, axis="y", alpha=0.3)
    every = [value for path in plotted.paths for component in CPU_COMPONENTS for value in path.cpu_ms[component]]
    _value_axis(figure.axes[0], every, "CPU ms per answered request")
    _legend(figure)
    return figure


def write(plotted: Plotted, out_dir: Path) -> list[Path]:
    """The three PNGs under out_dir (created when missing), in FILES order."""
    require_matplotlib()
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = {"latency": latency_figure, "throughput": throughput_figure, "cpu": cpu_figure}
    written = []
    for name, draw in drawn.items():
        path = out_dir / FILES[name]
        draw(plotted).savefig(path, format="png")
        written.append(path)
    return written


def run(args: argparse.Namespace) -> int:
    plotted = read(Path(args.source))
    for path in write(plotted, Path(args.out_dir)):
        print(path)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="PNG plots of `llmfleet bench compare`'s JSON: latency, throughput and CPU against offered load",
        description=(
            "Read the JSON `llmfleet bench compare` wrote and draw three PNGs into --out-dir: p50/p95/p99"
            " against the offered rate for each path, throughput against the offered rate with the y = x line,"
            " and CPU ms per answered request by component (the path's processes, the engines, the load"
            " generator) for each path and rate; print their paths. Needs matplotlib (the plots extra)."
        ),
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        default=DEFAULT_SOURCE,
        help=f"the compare JSON (default {DEFAULT_SOURCE})",
    )
    parser.add_argument(
        "--out-dir",
        metavar="DIR",
        default=DEFAULT_OUT_DIR,
        help=f"where the PNGs go, created if missing (default {DEFAULT_OUT_DIR})",
    )
    parser.set_defaults(handler=run)
