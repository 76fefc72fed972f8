"""`llmfleet bench --profile DIR`: where the gateway side's CPU goes, sampled by py-spy.

Over the measured window, py-spy samples every gateway and worker process on
this machine (found as `--cpu` finds them, llmfleet.bench.cpuuse) without
stopping them (--nonblocking), and writes for each:
- `<part>-<pid>.txt`: the collapsed stacks, one line per stack and its samples;
- `<part>-<pid>.png`: a flame graph of them (the `plots` extra's matplotlib);
and `profile.json`, each process's samples by layer and its busiest functions.

A sample's layer is the package of its innermost Python frame. py-spy sees only
Python frames, so time in C (uvloop's loop, a socket's send, the kernel's
loopback work that a send does for its receiver) shows on the Python line that
called it: the event loop's `run`, a stream's `write`. Those lines are the
"event loop and socket I/O" layer.

Only samples taken while the process holds the GIL count (--gil): a loop waiting
in epoll has released it, so idle time is left out. (py-spy's own idle
detection does not work across the lab's container PID namespaces: it counted
every sample as busy.) A thread that holds the GIL while it waits for a core
still counts: where every core is busy (the lab, whose CPU engines spin), a
send that wakes its reader often loses the core right there, so the I/O layer
reads high. With `--cpu`, each layer's share times the part's CPU ms per answer
is an estimate of its ms per answer, with that bias.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.bench import cpuuse
from llmfleet.errors import LlmfleetError

PROFILED_PARTS = ("gateway", "worker")
SAMPLES_PER_S = 100
TOP_FUNCTIONS = 15
# The innermost frame's top-level package or module names the layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("event loop and socket I/O", ("asyncio", "uvloop", "selectors.py", "socket.py", "ssl.py")),
    ("HTTP server and framework", ("uvicorn", "starlette", "fastapi", "pydantic", "pydantic_core", "h11", "httptools")),
    ("Redis client", ("redis",)),
    ("HTTP client to the engine", ("aiohttp", "yarl", "multidict")),
    ("JSON", ("json",)),
    ("metrics", ("prometheus_client",)),
    ("llmfleet", ("llmfleet",)),
)
OTHER = "other (stdlib, tokenizer, JWT, ...)"
# The flame graph's size in inches, resolution, and the narrowest frame drawn (a share of all samples).
FLAME_WIDTH_IN, FLAME_ROW_IN, FLAME_DPI, FLAME_MIN_SHARE = 16.0, 0.22, 100, 0.002
# One colour per layer, in LAYERS order; OTHER_COLOUR for the rest.
LAYER_COLOURS = ("#8c8c8c", "#4c72b0", "#c44e52", "#dd8452", "#937860", "#da8bc3", "#55a868")
OTHER_COLOUR = "#c7c7c7"


def top_package(frame: str) -> str:
    """The top-level package (or module file) of a py-spy frame, `function (path/file.py:line)`.

    py-spy gives paths from the import root (`redis/asyncio/connection.py`); a full path is cut there too.
    """
    path = frame.rpartition("(")[2].rpartition(":")[0]
    path = re.sub(r"^.*/(site-packages|dist-packages|python3\.\d+)/", "", path)
    return path.split("/", 1)[0]


def layer_of(frame: str) -> str:
    """The layer of a py-spy frame by its top-level package."""
    package = top_package(frame)
    for name, packages in LAYERS:
        if package in packages:
            return name
    return OTHER


@dataclass
class Profile:
    part: str
    pid: int
    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)
    error: str = ""  # why py-spy gave no samples (record)

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    def by_layer(self) -> dict[str, float]:
        """Each layer's share of the samples, by the innermost frame, largest first."""
        counts: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            counts[layer_of(stack[-1])] += count
        total = max(self.samples, 1)
        return {layer: round(count / total, 3) for layer, count in counts.most_common()}

    def top_functions(self, limit: int = TOP_FUNCTIONS) -> list[tuple[str, float]]:
        """The innermost frames with the most samples: where the busy time is spent."""
        counts: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            counts[stack[-1]] += count
        total = max(self.samples, 1)
        return [(frame, round(count / total, 3)) for frame, count in counts.most_common(limit)]

    def summary(self, cpu_ms: float | None) -> dict[str, Any]:
        if self.error:
            return {"part": self.part, "pid": self.pid, "samples": 0, "error": self.error}
        layers = self.by_layer()
        out: dict[str, Any] = {"part": self.part, "pid": self.pid, "samples": self.samples, "layers": layers}
        if cpu_ms is not None:
            out["layers_ms_per_request"] = {layer: round(share * cpu_ms, 3) for layer, share in layers.items()}
        out["top_functions"] = [{"frame": frame, "share": share} for frame, share in self.top_functions()]
        return out


def parse_collapsed(text: str) -> Counter[tuple[str, ...]]:
    """py-spy's raw format: `frame;frame;...;frame COUNT` per line, outermost frame first."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            # --threads is off, so the first frame is the outermost Python frame.
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def py_spy() -> str:
    """The py-spy binary: on PATH, or beside this Python (the venv's bin)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise LlmfleetError(
            "--profile needs py-spy: scripts/bootstrap.sh installs it with the dev extra, or"
            " `pip install --constraint constraints.txt '.[profile]'`"
        )
    return found


def require_tools() -> None:
    """LlmfleetError, before any load, when py-spy or matplotlib (the flame graphs) is missing."""
    py_spy()
    try:
        import matplotlib  # noqa: F401  # the package alone, so a missing one fails here, by name
    except ImportError:
        raise LlmfleetError(
            "--profile draws its flame graphs with matplotlib, which this Python lacks:"
            " `pip install --constraint constraints.txt '.[profile]'`"
        ) from None


def profiled_processes(pids: tuple[int, ...] = (), parts: tuple[str, ...] = PROFILED_PARTS) -> list[tuple[str, int]]:
    """(part, pid) of every process of these parts on this machine (only those pids, if given), by part then pid.

    Refused when there are none, or when a pid asked for is not one of them: before any load.
    """
    found = {
        (part, pid)
        for (pid, _start), (part, _cpu) in cpuuse.snapshot().processes.items()
        if part in parts and (not pids or pid in pids)
    }
    if not found or (pids and len(found) < len(set(pids))):
        chosen = f" among pids {sorted(set(pids))}" if pids else ""
        raise LlmfleetError(
            f"--profile found {len(found)} gateway or worker processes{chosen} on this machine: run it where"
            " the gateway side runs (in the lab, on the machine that holds its containers)"
        )
    return sorted(found, key=lambda item: (parts.index(item[0]), item[1]))


async def record(out_dir: Path, duration_s: float, processes: list[tuple[str, int]]) -> list[Profile]:
    """Sample these (part, pid) processes for duration_s from now; their profiles.

    A process py-spy fails on (it exited, or py-spy itself crashed) gets a profile with no samples and the error,
    and the others are kept: one lost profile does not cost the run.
    """
    binary = py_spy()
    out_dir.mkdir(parents=True, exist_ok=True)
    duration = max(math.ceil(duration_s), 1)
    running = []
    for part, pid in processes:
        path = out_dir / f"{part}-{pid}.txt"
        command = [
            binary, "record", "--pid", str(pid), "--duration", str(duration), "--rate", str(SAMPLES_PER_S),
            "--nonblocking", "--gil", "--format", "raw", "--output", str(path),
        ]  # fmt: skip
        running.append((part, pid, path, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    profiles = []
    for part, pid, path, process in running:
        _out, err = await asyncio.to_thread(process.communicate)
        if process.returncode == 0 and path.is_file():
            profiles.append(Profile(part, pid, parse_collapsed(path.read_text())))
            continue
        message = err.decode(errors="replace").strip()[-300:] or f"py-spy exited with {process.returncode}"
        profiles.append(Profile(part, pid, error=f"py-spy could not sample the {part} (pid {pid}): {message}"))
    return profiles


Box = tuple[int, float, float, str]  # depth, start, width, frame


def flame_rows(stacks: Counter[tuple[str, ...]], min_share: float = FLAME_MIN_SHARE) -> list[Box]:
    """The flame graph's boxes: (depth, start, width, frame), widths as shares of all samples, callers first.

    Stacks are merged by their common callers, as a flame graph does; boxes narrower than min_share are left out.
    """
    total = sum(stacks.values())
    if total == 0:
        return []
    boxes: list[Box] = []

    def place(prefix: tuple[str, ...], items: list[tuple[tuple[str, ...], int]], start: float) -> None:
        depth = len(prefix)
        children: dict[str, list[tuple[tuple[str, ...], int]]] = {}
        for stack, count in items:
            if len(stack) > depth:
                children.setdefault(stack[depth], []).append((stack, count))
        offset = start
        for frame in sorted(children):
            group = children[frame]
            width = sum(count for _stack, count in group) / total
            if width >= min_share:
                boxes.append((depth, offset, width, frame))
                place((*prefix, frame), group, offset)
            offset += width

    place((), sorted(stacks.items()), 0.0)
    return boxes


def draw_flame(profile: Profile, path: Path, title: str) -> None:
    """A flame graph PNG: callers at the bottom, each box as wide as its share of the samples."""
    from matplotlib.figure import Figure  # the plots extra; only drawing needs it

    boxes = flame_rows(profile.stacks)
    depth = max((box[0] for box in boxes), default=0) + 1
    figure = Figure(figsize=(FLAME_WIDTH_IN, max(depth * FLAME_ROW_IN + 0.8, 2.0)), dpi=FLAME_DPI)
    axes = figure.add_axes((0.01, 0.02, 0.98, 0.92))
    colours = {name: colour for (name, _markers), colour in zip(LAYERS, LAYER_COLOURS, strict=True)}
    for row, start, width, frame in boxes:
        axes.barh(row, width, left=start, height=0.95, color=colours.get(layer_of(frame), OTHER_COLOUR),
                  edgecolor="white", linewidth=0.3)  # fmt: skip
        label = frame.split(" (", 1)[0]
        if width > 0.02:
            axes.text(start + 0.002, row, label[: int(width * 180)], va="center", ha="left", fontsize=6, clip_on=True)
    axes.set_xlim(0, 1)
    axes.set_ylim(-0.5, depth - 0.5)
    axes.set_axis_off()
    axes.set_title(title, fontsize=9)
    handles = [
        axes.barh(-10, 0, color=colour, label=name) for name, colour in (*colours.items(), (OTHER, OTHER_COLOUR))
    ]
    axes.legend(handles=handles, loc="upper right", fontsize=7, frameon=False)
    figure.savefig(path)


def write(out_dir: Path, profiles: list[Profile], cpu_ms_per_request: dict[str, float], label: str) -> Path:
    """profile.json and a flame graph per process in out_dir; the JSON's path.

    A part's CPU ms per answer (from --cpu) is shared among its processes by their samples.
    """
    samples_by_part = Counter[str]()
    for profile in profiles:
        samples_by_part[profile.part] += profile.samples
    summaries = []
    for profile in profiles:
        part_ms = cpu_ms_per_request.get(profile.part)
        cpu_ms = part_ms * profile.samples / samples_by_part[profile.part] if part_ms and profile.samples else None
        summaries.append(profile.summary(cpu_ms))
        if profile.error:
            continue
        title = f"{label}: {profile.part} (pid {profile.pid}), {profile.samples} samples at {SAMPLES_PER_S}/s"
        draw_flame(profile, out_dir / f"{profile.part}-{profile.pid}.png", title)
    path = out_dir / "profile.json"
    document = {"label": label, "samples_per_s": SAMPLES_PER_S, "processes": summaries}
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
