"""Priority lanes: how much of the depth cap each lane may fill, and which takes go to lower lanes.

Strict priority alone lets low-priority load hurt high-priority requests
twice: a flood of low requests fills the depth cap, so a high request gets a
503; and a steady stream of high requests keeps a worker from ever taking a
low one. Two rules stop both, at no extra Redis round trip:

- Admission, reserved headroom: the highest lane may fill the queue up to
  max_depth (all lanes counted); each lane below it stops lane_reserve x
  max_depth earlier than the lane above. A flood of the lowest lane fills
  only its share, and the lanes above it are still admitted.
- Take, fair turns: a worker takes from the highest lane that has work,
  except that every lower_lane_every-th entry it takes comes from a lower
  lane that has work. The turns rotate over the lower lanes, so while every
  lane has a backlog each lower lane gets at least one entry in every
  lower_lane_every x (lanes - 1) entries a worker takes.

Both are pure functions here; ADMIT and TAKE (scripts.py) apply their results.
"""

from __future__ import annotations

import math


def depth_caps(max_depth: int, lanes: int, reserve: float) -> tuple[int, ...]:
    """Per lane (highest first): the depth of all lanes together at which that lane is refused.

    Lane i (0 = highest) stops floor(i x reserve x max_depth) short of max_depth.
    """
    # round(): 0.29 x 100 is 28.999... in floating point; the reserve means 29. QueueSettings keeps
    # reserve x (lanes - 1) below 1, so every lane has room; max() only guards that rounding.
    return tuple(max(1, max_depth - math.floor(round(max_depth * reserve * index, 6))) for index in range(lanes))


def fair_turns(taken: int, want: int, every: int, lanes: int) -> list[tuple[int, ...]]:
    """The fair turns among the next `want` entries a worker takes, having taken `taken` so far.

    Entries are numbered from 1 per worker; entry number k x every is fair turn
    k. Each turn is the lower lanes (0-based indexes, 1 = the lane below the
    highest) in the order to try: turn k starts at lower lane (k - 1) mod
    (lanes - 1) and goes down, wrapping. A turn takes one entry from the first
    of them with work; when none has any, the entry comes from the highest lane.
    """
    if lanes < 2 or want <= 0:
        return []
    lower = lanes - 1
    return [
        tuple(1 + (turn - 1 + step) % lower for step in range(lower))
        for turn in range(taken // every + 1, (taken + want) // every + 1)
    ]
