"""The priority lanes' policy (llmfleet/serve/queue/lanes.py): depth cap headroom and fair turns of the take.

The take is simulated here on in-memory lanes, trying lanes as the TAKE
script does (fair turns first, then highest lane first); the script itself
runs against a real Redis in tests/integration/serve/queue/test_lanes_redis.py.
"""

from __future__ import annotations

from collections import Counter, deque

import pytest
from pydantic import ValidationError

from llmfleet.serve.queue.config import QueueSettings
from llmfleet.serve.queue.lanes import depth_caps, fair_turns


@pytest.mark.parametrize(
    ("max_depth", "lanes", "reserve", "caps"),
    [
        (10_000, 3, 0.1, (10_000, 9_000, 8_000)),
        (100, 3, 0.29, (100, 71, 42)),  # 0.29 x 100 is 28.999... in floating point
        (100, 3, 0.0, (100, 100, 100)),
        (3, 3, 0.1, (3, 3, 3)),  # a reserve under one entry rounds down to none
        (10, 1, 0.5, (10,)),
        (7, 2, 0.99, (7, 1)),
    ],
)
def test_each_lane_below_the_highest_leaves_its_reserve_free(
    max_depth: int, lanes: int, reserve: float, caps: tuple[int, ...]
) -> None:
    assert depth_caps(max_depth, lanes, reserve) == caps


def test_the_default_settings_keep_a_tenth_of_the_queue_per_lane_for_the_lanes_above() -> None:
    settings = QueueSettings()
    assert [settings.depth_cap(lane) for lane in ("high", "normal", "low")] == [10_000, 9_000, 8_000]


def test_the_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFLEET_QUEUE_LANE_RESERVE", "0.25")
    monkeypatch.setenv("LLMFLEET_QUEUE_LOWER_LANE_EVERY", "4")
    monkeypatch.setenv("LLMFLEET_QUEUE_MAX_DEPTH", "200")
    settings = QueueSettings()
    assert settings.lower_lane_every == 4
    assert [settings.depth_cap(lane) for lane in settings.lanes] == [200, 150, 100]


def test_a_reserve_that_leaves_the_lowest_lane_nothing_is_refused_with_the_limit() -> None:
    with pytest.raises(ValidationError) as error:
        QueueSettings(lanes=("a", "b", "c", "d", "e"), default_lane="a", lane_reserve=0.25)
    message = str(error.value)
    assert "LLMFLEET_QUEUE_LANE_RESERVE" in message and "below 0.25" in message
    QueueSettings(lanes=("a", "b", "c", "d", "e"), default_lane="a", lane_reserve=0.24)


@pytest.mark.parametrize(("name", "value"), [("lane_reserve", -0.1), ("lane_reserve", 1.0), ("lower_lane_every", 1)])
def test_out_of_range_values_are_refused(name: str, value: float) -> None:
    with pytest.raises(ValidationError, match=name):
        QueueSettings(**{name: value})


def test_every_nth_entry_is_a_fair_turn_rotating_over_the_lower_lanes() -> None:
    assert fair_turns(taken=0, want=9, every=10, lanes=3) == []
    assert fair_turns(taken=0, want=10, every=10, lanes=3) == [(1, 2)]
    assert fair_turns(taken=10, want=10, every=10, lanes=3) == [(2, 1)]
    assert fair_turns(taken=19, want=1, every=10, lanes=3) == [(2, 1)]
    assert fair_turns(taken=5, want=32, every=10, lanes=3) == [(1, 2), (2, 1), (1, 2)]
    assert fair_turns(taken=0, want=4, every=2, lanes=4) == [(1, 2, 3), (2, 3, 1)]
    assert fair_turns(taken=0, want=100, every=10, lanes=1) == []
    assert fair_turns(taken=0, want=0, every=10, lanes=3) == []


def take(queues: list[deque[str]], taken: int, want: int, every: int) -> list[tuple[int, str]]:
    """What the TAKE script does with these turns, on in-memory lanes (index 0 = highest)."""
    out: list[tuple[int, str]] = []
    for turn in fair_turns(taken, want, every, len(queues)):
        for index in turn:
            if queues[index]:
                out.append((index, queues[index].popleft()))
                break
    for index, queue in enumerate(queues):
        while queue and len(out) < want:
            out.append((index, queue.popleft()))
    return out


def run_takes(
    queues: list[deque[str]], every: int, batch: int, takes: int, refill: tuple[int, ...]
) -> list[tuple[int, str]]:
    """Take `batch` at a time, `takes` times, keeping the lanes in `refill` backlogged."""
    taken: list[tuple[int, str]] = []
    for _ in range(takes):
        for index in refill:
            while len(queues[index]) < 2 * batch:
                queues[index].append(f"lane{index}-filler")
        taken += take(queues, len(taken), batch, every)
    return taken


@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("refill", [(0,), (0, 1)])
def test_under_a_continuous_high_backlog_a_low_entry_is_taken_within_the_bound(
    batch: int, refill: tuple[int, ...]
) -> None:
    every, lanes = 10, 3
    queues: list[deque[str]] = [deque() for _ in range(lanes)]
    queues[2].append("the-low-one")
    taken = run_takes(queues, every, batch, takes=200, refill=refill)
    position = [item for _, item in taken].index("the-low-one") + 1
    # Its lane gets a fair turn in every every x (lanes - 1) entries; a batch may end past it.
    assert position <= every * (lanes - 1)


def test_with_every_lane_backlogged_each_lane_gets_its_share_and_high_the_rest() -> None:
    every = 10
    queues: list[deque[str]] = [deque() for _ in range(3)]
    taken = run_takes(queues, every, batch=1, takes=1000, refill=(0, 1, 2))
    by_lane = Counter(index for index, _ in taken)
    assert by_lane == {0: 900, 1: 50, 2: 50}


def test_with_only_the_high_lane_loaded_every_take_is_high() -> None:
    queues: list[deque[str]] = [deque() for _ in range(3)]
    taken = run_takes(queues, every=2, batch=4, takes=50, refill=(0,))
    assert {index for index, _ in taken} == {0} and len(taken) == 200
