"""`llmfleet bench --profile` and `--redis-url`: py-spy's stacks by layer, the flame graph's boxes, Redis's costs.

The sampling itself runs against the real stack in
tests/integration/serve/gateway/test_bench.py; here the arithmetic on what it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from llmfleet.bench import cli, commandstats, profile
from llmfleet.bench.profile import OTHER, Profile, flame_rows, layer_of, parse_collapsed
from llmfleet.errors import LlmfleetError

LOOP = "run (asyncio/runners.py:118)"
HANDLER = "chat_completions (llmfleet/serve/gateway/routes/chat.py:26)"
REDIS_WRITE = "_send_packed_command (redis/asyncio/connection.py:1168)"
WRITE = "writelines (asyncio/streams.py:346)"
ROUTE = "app (fastapi/routing.py:152)"
COLLAPSED = f"""\
{LOOP} 50
{LOOP};{ROUTE};{HANDLER} 20
{LOOP};{ROUTE};{HANDLER};{REDIS_WRITE};{WRITE} 20
{LOOP};{REDIS_WRITE} 10
not a sample line
"""


@pytest.mark.parametrize(
    ("frame", "layer"),
    [
        (LOOP, "event loop and socket I/O"),
        (WRITE, "event loop and socket I/O"),
        ("send (uvicorn/protocols/http/httptools_impl.py:524)", "HTTP server and framework"),
        ("validate_python (pydantic/type_adapter.py:410)", "HTTP server and framework"),
        (REDIS_WRITE, "Redis client"),
        ("_writelines (aiohttp/http_writer.py:116)", "HTTP client to the engine"),
        ("raw_decode (json/decoder.py:353)", "JSON"),
        ("inc (prometheus_client/values.py:28)", "metrics"),
        ("utc_day (llmfleet/serve/queue/usage.py:50)", "llmfleet"),
        ("uuid4 (uuid.py:723)", OTHER),
        ("<module> (<frozen runpy>:88)", OTHER),
        # A full path is cut at the import root.
        ("get (/opt/llmfleet/lib/python3.11/site-packages/redis/commands/core.py:10)", "Redis client"),
        ("run (/usr/lib/python3.11/asyncio/runners.py:118)", "event loop and socket I/O"),
    ],
)
def test_each_frame_is_put_in_its_layer_by_its_file(frame: str, layer: str) -> None:
    assert layer_of(frame) == layer


def test_the_collapsed_stacks_give_each_layer_its_share_of_the_innermost_frames() -> None:
    stacks = parse_collapsed(COLLAPSED)
    assert sum(stacks.values()) == 100  # the line that is no sample is left out
    sampled = Profile("gateway", 7, stacks)
    assert sampled.by_layer() == {"event loop and socket I/O": 0.7, "llmfleet": 0.2, "Redis client": 0.1}
    assert sampled.top_functions(1) == [(LOOP, 0.5)]
    assert sorted(sampled.top_functions(3)[1:]) == [(HANDLER, 0.2), (WRITE, 0.2)]
    summary = sampled.summary(cpu_ms=2.0)
    assert summary["layers_ms_per_request"] == {"event loop and socket I/O": 1.4, "llmfleet": 0.4, "Redis client": 0.2}
    assert "layers_ms_per_request" not in sampled.summary(cpu_ms=None)


def test_the_flame_graph_merges_stacks_by_their_callers_and_drops_the_narrowest() -> None:
    boxes = {(depth, frame): (round(start, 3), round(width, 3)) for depth, start, width, frame in
             flame_rows(parse_collapsed(COLLAPSED))}  # fmt: skip
    assert boxes[(0, LOOP)] == (0.0, 1.0)
    # Callees side by side in name order: the loop's direct Redis write, then the route. The handler's 40 samples
    # are one box under the route's, its Redis write one under it.
    assert boxes[(1, REDIS_WRITE)] == (0.0, 0.1)
    assert boxes[(1, ROUTE)] == (0.1, 0.4)
    assert boxes[(2, HANDLER)] == (0.1, 0.4)
    assert boxes[(4, WRITE)] == (0.1, 0.2)
    narrow = {(LOOP, "rare (x.py:1)"): 1, (LOOP,): 999}
    assert [frame for _d, _s, _w, frame in flame_rows(Counter(narrow))] == [LOOP]
    assert flame_rows(Counter()) == []


def test_redis_costs_are_the_difference_per_answer_most_called_first() -> None:
    before = {"evalsha": (100, 10_000), "xreadgroup": (50, 500), "get": (3, 3)}
    after = {"evalsha": (400, 70_000), "xreadgroup": (950, 4_000), "get": (3, 3), "hset": (200, 400)}
    costs = commandstats.per_request(before, after, answers=100)
    assert list(costs) == ["xreadgroup", "evalsha", "hset"]  # get did not run in the window
    assert costs["evalsha"] == commandstats.CommandCost(calls=3.0, usec=600.0)
    line = commandstats.describe(commandstats.as_json(costs))
    assert line.startswith("Redis commands per answer: 14.0 (3.0 script calls); xreadgroup 9, evalsha 3, hset 2")


def test_an_unreachable_redis_is_refused_with_the_url(tmp_path: Path) -> None:
    with pytest.raises(LlmfleetError, match=r"--redis-url redis://127\.0\.0\.1:1/0: cannot read INFO"):
        commandstats.read("redis://127.0.0.1:1/0", "")


def test_profile_without_py_spy_is_refused_before_any_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda *_args, **_kwargs: None)
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    # Port 1 answers nothing: were the load sent, the error would be a different one.
    args = parser.parse_args(
        ["bench", "--url", "http://127.0.0.1:1", "--rate", "1", "--profile", str(tmp_path / "profile")]
    )
    with pytest.raises(LlmfleetError, match=r"--profile needs py-spy"):
        args.handler(args)
    assert not (tmp_path / "profile").exists()


def test_py_spy_is_found_beside_this_python() -> None:
    # The dev extra installs it into the venv, whose bin need not be on PATH.
    assert Path(profile.py_spy()).name == "py-spy"


def test_a_process_py_spy_cannot_sample_is_reported_and_the_others_kept(tmp_path: Path) -> None:
    # No process has this pid: py-spy fails on it, as it does on one that exits or that it crashes on.
    [failed] = asyncio.run(profile.record(tmp_path, 1, [("worker", 2**22 + 12345)]))
    assert failed.samples == 0 and failed.error.startswith(f"py-spy could not sample the worker (pid {2**22 + 12345})")
    sampled = Profile("gateway", 7, parse_collapsed(COLLAPSED))
    document = json.loads(profile.write(tmp_path, [sampled, failed], {"gateway": 2.0, "worker": 1.0}, "x").read_text())
    assert [process.get("error", "") for process in document["processes"]] == ["", failed.error]
    assert document["processes"][0]["layers_ms_per_request"]["llmfleet"] == 0.4
    assert sorted(path.name for path in tmp_path.glob("*.png")) == ["gateway-7.png"]


def test_profile_pids_that_are_no_gateway_or_worker_are_refused() -> None:
    with pytest.raises(LlmfleetError, match=r"--profile found 0 gateway or worker processes among pids \[1\]"):
        profile.profiled_processes((1,))
