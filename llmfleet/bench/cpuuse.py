"""CPU time by part of the stack, read from /proc: where a benchmark's CPU went.

`llmfleet bench --cpu` takes a snapshot before and after its measured window
and reports CPU milliseconds per answered request for each part (gateway,
workers, Redis, the engines' API servers and engine cores, Docker, the load
generator itself) and how busy the machine's cores were.

It sees the processes of this machine's kernel only. That is the whole stack
in the lab, whose hosts are containers here; against remote hosts it shows
only the load generator's side. A process that starts and ends inside the
window (a container's healthcheck, say) is not seen; the machine-wide figure
from /proc/stat still counts it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Parts of the stack in report order, each with what its command line holds
# (any of the markers). The first part that matches names the process.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gateway", ("llmfleet gateway serve", "-m llmfleet.serve.gateway")),
    ("worker", ("llmfleet worker run", "-m llmfleet.serve.worker")),
    ("redis", ("redis-server",)),
    # vLLM renames its child processes (setproctitle), so these are whole titles.
    ("engine core", ("VLLM::EngineCore",)),
    ("engine model process", ("VLLM::Worker",)),
    ("engine API server", ("vllm.entrypoints", "vllm serve")),
    # The peers `llmfleet bench compare` starts from their venvs (llmfleet.bench.peers).
    ("LiteLLM proxy", ("bin/litellm ",)),
    ("vllm-router", ("vllm::router", "bin/vllm-router ")),  # it retitles itself once started
    ("docker", ("dockerd", "containerd", "docker-proxy", "runc")),
)
LOAD_GENERATOR = "load generator"
OTHER = "other"


def part_of(command: str) -> str:
    for name, markers in PARTS:
        if any(marker in command for marker in markers):
            return name
    return OTHER


@dataclass(frozen=True)
class Snapshot:
    # (pid, start time in ticks) -> (part, CPU seconds so far); the start time
    # tells a reused pid from the process that had it before.
    processes: Mapping[tuple[int, int], tuple[str, float]]
    busy_s: float  # all cores, from /proc/stat: time not idle
    total_s: float
    cores: int  # the cpuN lines of /proc/stat: total_s is summed over these


def _process(pid_dir: Path, own_pid: int) -> tuple[tuple[int, int], tuple[str, float]] | None:
    try:
        stat = (pid_dir / "stat").read_text()
        raw = (pid_dir / "cmdline").read_bytes()
    except OSError:  # gone since the directory was listed, or not ours to read
        return None
    name_end = stat.rfind(")")
    fields = stat[name_end + 2 :].split()
    # After the name: state is field 3 of proc(5), utime 14, stime 15, starttime 22.
    utime, stime, start = int(fields[11]), int(fields[12]), int(fields[19])
    pid = int(pid_dir.name)
    command = raw.replace(b"\0", b" ").decode(errors="replace").strip() or stat[stat.find("(") + 1 : name_end]
    part = LOAD_GENERATOR if pid == own_pid else part_of(command)
    return (pid, start), (part, (utime + stime) / CLOCK_TICKS)


def _cores_time(proc: Path) -> tuple[float, float, int]:
    """(busy, total) seconds over all cores since boot, from the first line of /proc/stat, and the cores."""
    lines = (proc / "stat").read_text().splitlines()
    values = [int(value) for value in lines[0].split()[1:]]
    idle = values[3] + values[4]  # idle and iowait
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal; guest is inside user
    cores = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS, cores


def snapshot(proc: Path = PROC, own_pid: int | None = None) -> Snapshot:
    own = os.getpid() if own_pid is None else own_pid
    processes = dict(
        found for pid_dir in proc.iterdir() if pid_dir.name.isdigit() and (found := _process(pid_dir, own)) is not None
    )
    busy, total, cores = _cores_time(proc)
    return Snapshot(processes, busy, total, cores)


@dataclass(frozen=True)
class Usage:
    seconds_by_part: dict[str, float]
    cores_busy: float  # average number of cores not idle over the window
    cores: int

    def per_request_ms(self, requests: int) -> dict[str, float]:
        return {part: round(1000 * seconds / max(requests, 1), 2) for part, seconds in self.seconds_by_part.items()}


def usage(before: Snapshot, after: Snapshot) -> Usage:
    """CPU seconds each part used between two snapshots; a process new since `before` counts from its start."""
    seconds: dict[str, float] = {}
    for key, (part, cpu_s) in after.processes.items():
        earlier = before.processes.get(key)
        used = cpu_s - (earlier[1] if earlier else 0.0)
        if used > 0:
            seconds[part] = seconds.get(part, 0.0) + used
    order = [name for name, _ in PARTS] + [LOAD_GENERATOR, OTHER]
    ordered = {part: round(seconds[part], 3) for part in order if part in seconds}
    span = (after.total_s - before.total_s) / after.cores
    busy = (after.busy_s - before.busy_s) / span if span > 0 else 0.0
    return Usage(ordered, round(busy, 2), after.cores)
