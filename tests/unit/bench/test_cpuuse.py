"""llmfleet.cpuuse: naming processes by part of the stack and the CPU arithmetic (`llmfleet bench --cpu`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llmfleet.bench import cpuuse
from llmfleet.bench.cpuuse import Snapshot, part_of, snapshot, usage

TICKS = cpuuse.CLOCK_TICKS


@pytest.mark.parametrize(
    ("command", "part"),
    [
        ("/opt/llmfleet/bin/python3 /opt/llmfleet/bin/llmfleet gateway serve", "gateway"),
        ("/usr/bin/python3 -m llmfleet.serve.worker", "worker"),
        ("/usr/bin/redis-server 10.77.0.20:6379", "redis"),
        ("/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model /models/tiny", "engine API server"),
        ("VLLM::EngineCore", "engine core"),
        ("VLLM::Worker", "engine model process"),
        ("/usr/bin/containerd-shim-runc-v2 -namespace moby -id 4f2e", "docker"),
        ("/root/.cache/llmfleet/venvs/litellm-1a2b/bin/python /root/.cache/llmfleet/venvs/litellm-1a2b/bin/litellm"
         " --config out/bench/compare/litellm.yaml --host 127.0.0.1", "LiteLLM proxy"),
        ("/root/.cache/llmfleet/venvs/router-3c4d/bin/python /root/.cache/llmfleet/venvs/router-3c4d/bin/vllm-router"
         " --host 127.0.0.1 --port 41234 --worker-urls http://127.0.0.1:8000", "vllm-router"),
        ("vllm::router", "vllm-router"),
        ("/usr/sbin/sshd -D", "other"),
    ],
)
def test_each_process_is_named_by_its_command_line(command: str, part: str) -> None:
    assert part_of(command) == part


def _write_process(proc: Path, pid: int, command: bytes, utime: int, stime: int, start: int, name: str = "x") -> None:
    directory = proc / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    # proc(5): pid (comm) state ppid ... utime(14) stime(15) ... starttime(22); a comm may hold ") ".
    fields = ["S", "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 6 + [str(start)] + ["0"] * 30
    (directory / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")
    (directory / "cmdline").write_bytes(command)


def _write_cores(proc: Path, user: int, idle: int) -> None:
    (proc / "stat").write_text(f"cpu  {user} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\nintr 0\n")


def test_a_fake_proc_tree_is_read_per_process_and_for_the_cores(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _write_process(proc, 10, b"redis-server\x00127.0.0.1:6379\x00", utime=3 * TICKS, stime=TICKS, start=500)
    _write_process(proc, 11, b"", utime=TICKS, stime=0, start=600, name="kworker/u8:1) odd")
    _write_process(proc, 12, b"python3\x00-m\x00llmfleet\x00bench\x00", utime=TICKS, stime=0, start=700)
    (proc / "self").mkdir()  # not a pid: skipped
    _write_cores(proc, user=300 * TICKS, idle=100 * TICKS)

    taken = snapshot(proc, own_pid=12)

    assert taken.processes == {
        (10, 500): ("redis", 4.0),
        (11, 600): ("other", 1.0),  # a kernel thread: no command line, named by its comm, which holds ") "
        (12, 700): ("load generator", 1.0),
    }
    assert (taken.busy_s, taken.total_s, taken.cores) == (300.0, 400.0, 1)


def test_usage_counts_new_processes_from_their_start_and_a_reused_pid_as_new() -> None:
    before = Snapshot({(10, 500): ("redis", 4.0), (20, 900): ("worker", 50.0)}, busy_s=100.0, total_s=200.0, cores=2)
    after = Snapshot(
        {
            (10, 500): ("redis", 5.5),  # 1.5 s during the window
            (20, 950): ("worker", 2.0),  # pid 20 reused by a new worker: all 2 s are new
            (30, 960): ("engine core", 6.0),
            (31, 970): ("gateway", 0.0),  # no CPU: not listed
        },
        busy_s=118.0,
        total_s=220.0,
        cores=2,
    )

    used = usage(before, after)

    assert used.seconds_by_part == {"worker": 2.0, "redis": 1.5, "engine core": 6.0}
    assert list(used.seconds_by_part) == ["worker", "redis", "engine core"], "in the report's fixed order"
    assert used.cores_busy == 1.8  # 18 busy seconds over a 10 s window of 2 cores
    assert used.per_request_ms(100) == {"worker": 20.0, "redis": 15.0, "engine core": 60.0}
    assert used.per_request_ms(0) == {"worker": 2000.0, "redis": 1500.0, "engine core": 6000.0}, "never / 0"


def test_the_real_proc_shows_this_process_working_as_the_load_generator() -> None:
    before = snapshot()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # burn 0.2 s of CPU in this process
        pass
    used = usage(before, snapshot())

    own = [part for (pid, _start), (part, _cpu) in before.processes.items() if pid == os.getpid()]
    assert own == ["load generator"]
    assert used.seconds_by_part["load generator"] >= 0.15
    assert 0 < used.cores_busy <= used.cores == os.cpu_count()
