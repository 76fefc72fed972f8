"""Prefix affinity: a consistent-hash ring with bounded loads (CHWBL) over a worker's engines.

vLLM keeps the KV blocks of prompts it has seen (automatic prefix caching): a
request whose prompt starts like an earlier one on the same engine skips that
part of the prefill. With N engines and least-outstanding balancing, a
conversation's next turn finds its prefix only about 1/N of the time. This
module sends every request with the same key to the same engine, and every
worker makes the same choice without talking to the others: the choice is a
pure function of the key, the engine URLs, and the worker's own loads.

The key (`request_key`):
1. `prompt_cache_key`, when the request has one: OpenAI's field for exactly
   this ("requests with the same key share a cache"), so an application can
   pin a conversation, or group requests it knows share a long prefix.
2. Otherwise the model and the request's leading text: the system part
   (`system` or `instructions`, where the API has one) and the messages up to
   and including the first user message (for a prompt: the prompt), as
   canonical JSON, of which the first `prefix_chars` characters count. Turn
   n + 1 of a conversation replays turn n and appends to it, so its leading
   messages, and its key, stay the same on every turn: the whole conversation
   lands where its cache is. A prompt (`/v1/completions`) grows as a whole;
   its turns share a key only once it is longer than `prefix_chars`: such
   clients should send `prompt_cache_key`.
   Characters, not tokens: the worker has no tokenizer, and characters are
   the same in every worker. `prefix_chars` bounds the hashing work; set it
   low to group requests by a shared system prompt alone.
The `user` field is not used: it names an end user, not a conversation (one
user's conversations rarely share more than the system prompt, which the
leading messages already group), and OpenAI moved cache routing from `user`
to `prompt_cache_key`.

The ring (`HashRing`): VNODES points per engine URL, placed by an unkeyed
BLAKE2b of "url#i", so each engine owns about 1/N of the key space in many
small arcs. A key goes to the first engine clockwise from its point. The ring
holds every configured engine; an engine that may not take the request
(drained, ejected, unhealthy, not serving the model, or excluded for a retry)
is skipped on the walk, which sends its keys to the next engine on the ring,
exactly as a ring without it would: adding or removing one engine moves
about 1/N of the keys and leaves the rest where their caches are.

The bound (`choose`): with n candidate engines holding T outstanding requests
(this worker's counts), an engine takes the request only if it would then
hold at most ceil((1 + epsilon) * (T + 1) / n); otherwise the request passes
to the next engine on the ring (Mirrokni, Thorup and Zadimoghaddam,
"Consistent Hashing with Bounded Loads", 2018). Some engine always passes the
test, so a hot key spills over instead of queueing behind one engine.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# Points per engine on the ring: the spread of an engine's share of keys is
# about 1/sqrt(VNODES) of it (9% at 128).
VNODES = 128


def _point(text: str) -> int:
    """A 64-bit position on the ring, the same in every process (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def _leading(payload: Mapping[str, Any]) -> Any:
    """The part of a request body that stays the same over a conversation's turns (see the module docstring)."""
    head: dict[str, Any] = {name: payload[name] for name in ("system", "instructions") if name in payload}
    turns = payload.get("messages", payload.get("input", payload.get("prompt")))
    if isinstance(turns, list) and all(isinstance(turn, Mapping) for turn in turns):
        leading = []
        for turn in turns:
            leading.append(turn)
            if turn.get("role") == "user":
                break
        head["turns"] = leading
    else:  # a prompt or input: text, or token ids
        head["turns"] = turns
    return head


def request_key(model: str, payload: Mapping[str, Any], prefix_chars: int) -> int:
    """The request's position on the ring: from prompt_cache_key if set, else from its leading text."""
    cache_key = payload.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return _point(f"{model}\x00key\x00{cache_key}")
    text = json.dumps(_leading(payload), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return _point(f"{model}\x00prefix\x00{text[:prefix_chars]}")


class HashRing:
    """A consistent-hash ring of engine URLs, VNODES points each."""

    def __init__(self, urls: Sequence[str], vnodes: int = VNODES) -> None:
        points = sorted((_point(f"{url}#{index}"), url) for url in urls for index in range(vnodes))
        self._positions = [position for position, _ in points]
        self._owners = [url for _, url in points]
        self.urls = frozenset(urls)

    def walk(self, key: int) -> Iterator[str]:
        """Every engine once, in ring order from the key's point clockwise."""
        if not self._owners:
            return
        start = bisect.bisect_left(self._positions, key)
        seen: set[str] = set()
        for step in range(len(self._owners)):
            url = self._owners[(start + step) % len(self._owners)]
            if url not in seen:
                seen.add(url)
                yield url
                if len(seen) == len(self.urls):
                    return


def load_bound(loads: Mapping[str, int], epsilon: float) -> int:
    """The most requests an engine may hold after taking this one: ceil((1 + epsilon) * (T + 1) / n)."""
    return math.ceil((1 + epsilon) * (sum(loads.values()) + 1) / len(loads))


def choose(ring: HashRing, key: int, loads: Mapping[str, int], epsilon: float) -> tuple[str, bool] | None:
    """The engine for key among `loads` (candidate URL -> outstanding), and whether it is the key's first choice.

    The first candidate on the ring from the key's point that stays within the
    bound; False when the bound passed over an engine before it. None without
    candidates. A candidate missing from the ring is never chosen.
    """
    if not loads:
        return None
    bound = load_bound(loads, epsilon)
    first = True
    for url in ring.walk(key):
        if url not in loads:
            continue
        if loads[url] + 1 <= bound:
            return url, first
        first = False
    return None  # unreachable while every candidate is on the ring: some load is at most the mean
