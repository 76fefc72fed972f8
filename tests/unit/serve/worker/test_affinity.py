"""Prefix affinity: the ring, its key, its load bound, and EnginePool.pick choosing by each model's policy.

The pool's engines here are set up by hand (admitted, serving "tiny"): no
engine is called, only the choice is under test.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from typing import Any, get_args

import pytest
import yaml
from pydantic import ValidationError

from llmfleet.paths import REPO_ROOT
from llmfleet.serve.worker import affinity
from llmfleet.serve.worker.config import Policy, WorkerSettings
from llmfleet.serve.worker.metrics import WorkerMetrics
from llmfleet.serve.worker.pool import EnginePool

URLS = [f"http://10.0.0.{index}:8000" for index in range(1, 11)]
SYSTEM = {"role": "system", "content": "You are a terse assistant for the llmfleet operators."}
KEYS = range(20_000)


def conversation(opening: str, turns: int) -> list[dict[str, str]]:
    """The messages of a chat's turn `turns`: system, the opening question, then the replayed answers and questions."""
    messages = [SYSTEM, {"role": "user", "content": opening}]
    for turn in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {turn}"}, {"role": "user", "content": f"more {turn}"}]
    return messages


def owners(ring: affinity.HashRing, urls: list[str]) -> dict[int, str]:
    """Where each of KEYS goes with no load: the first of urls on the ring."""
    loads = dict.fromkeys(urls, 0)
    where = {}
    for key in KEYS:
        point = affinity._point(f"key {key}")
        found = affinity.choose(ring, point, loads, 0.25)
        assert found is not None
        where[key] = found[0]
    return where


def pool(urls: list[str], **options: Any) -> EnginePool:
    engines = EnginePool(tuple(urls), None, WorkerMetrics(), **options)  # type: ignore[arg-type]  # never called
    for engine in engines.engines:
        engine.healthy = engine.checked = True
        engine.models = {"tiny": 2048}
    return engines


def chosen(
    engines: EnginePool, payload: dict[str, Any], exclude: frozenset[str] = frozenset(), model: str = "tiny"
) -> str:
    engine = engines.pick(model, exclude, payload)
    assert engine is not None
    return engine.url


def chat(opening: str, turns: int = 1, **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": conversation(opening, turns), **fields}


def picks(metrics: WorkerMetrics) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["engine"], sample.labels["policy"]): sample.value
        for metric in metrics.engine_picks.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


# -- the key ----------------------------------------------------------------------


def test_every_turn_of_a_conversation_has_the_same_key() -> None:
    keys = {affinity.request_key("tiny", chat("How do I drain an engine?", turns), 8192) for turns in range(1, 6)}
    assert len(keys) == 1


def test_conversations_models_and_cache_keys_tell_requests_apart() -> None:
    first = affinity.request_key("tiny", chat("How do I drain an engine?"), 8192)
    assert affinity.request_key("tiny", chat("How do I add a worker?"), 8192) != first
    assert affinity.request_key("other", chat("How do I drain an engine?"), 8192) != first
    pinned = affinity.request_key("tiny", chat("How do I drain an engine?", prompt_cache_key="conv-7"), 8192)
    assert pinned != first
    # prompt_cache_key decides alone: other messages, same key.
    assert affinity.request_key("tiny", chat("Something else", 3, prompt_cache_key="conv-7"), 8192) == pinned
    # user is not a key: it changes nothing.
    assert affinity.request_key("tiny", chat("How do I drain an engine?", user="alice"), 8192) == first


def test_prefix_chars_limits_what_is_hashed() -> None:
    long_system = {"role": "system", "content": "x" * 500}
    one = {"messages": [long_system, {"role": "user", "content": "first question"}]}
    two = {"messages": [long_system, {"role": "user", "content": "second question"}]}
    assert affinity.request_key("tiny", one, 100) == affinity.request_key("tiny", two, 100)
    assert affinity.request_key("tiny", one, 8192) != affinity.request_key("tiny", two, 8192)


@pytest.mark.parametrize(
    ("one", "two"),
    [
        ({"prompt": "Once upon a time" * 20 + " the end"}, {"prompt": "Once upon a time" * 20 + " and more"}),
        (  # the Responses API's shape: instructions, then input items
            {"instructions": "Be brief.", "input": [{"role": "user", "content": "hi"}]},
            {
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "and?"},
                ],
            },
        ),
        (  # the Messages API's shape: system apart from the messages
            {"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]},
            {
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
            },
        ),
    ],
)
def test_other_request_shapes_keep_their_leading_text(one: dict[str, Any], two: dict[str, Any]) -> None:
    assert affinity.request_key("tiny", one, 64) == affinity.request_key("tiny", two, 64)


def test_keys_and_ring_are_the_same_in_another_process() -> None:
    """No per-process salt (Python's hash()): every worker maps a key to the same engine."""
    here = affinity.request_key("tiny", chat("hello"), 8192)
    ring = affinity.HashRing(URLS)
    code = (
        "import json, sys\n"
        "from llmfleet.serve.worker import affinity\n"
        "urls, payload = json.loads(sys.argv[1])\n"
        "key = affinity.request_key('tiny', payload, 8192)\n"
        "print(key, next(affinity.HashRing(urls[::-1]).walk(key)))\n"
    )
    argument = json.dumps([URLS, chat("hello")])
    output = subprocess.run(
        [sys.executable, "-c", code, argument],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert output == [str(here), next(ring.walk(here))]


# -- the ring ---------------------------------------------------------------------


def test_the_same_key_always_picks_the_same_engine() -> None:
    engines = pool(URLS[:4], policy="prefix_affinity")
    payload = chat("How do I drain an engine?")
    first = {chosen(engines, payload) for _ in range(50)}
    assert len(first) == 1
    # ... and a conversation's later turns too, though least_outstanding would spread them.
    later = {chosen(engines, chat("How do I drain an engine?", turns)) for turns in range(2, 8)}
    assert later == first


def test_keys_spread_over_the_engines() -> None:
    ring = affinity.HashRing(URLS)
    shares = Counter(owners(ring, URLS).values())
    expected = len(KEYS) / len(URLS)
    assert set(shares) == set(URLS)
    assert all(abs(count - expected) < 0.35 * expected for count in shares.values()), shares


def test_removing_an_engine_moves_only_its_keys() -> None:
    ring = affinity.HashRing(URLS)
    before = owners(ring, URLS)
    gone = URLS[3]
    after = owners(ring, [url for url in URLS if url != gone])  # skipped on the walk, as a drained engine is
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == gone}
    assert 0.5 / len(URLS) < len(moved) / len(KEYS) < 1.5 / len(URLS)
    rebuilt = affinity.HashRing([url for url in URLS if url != gone])
    assert owners(rebuilt, [url for url in URLS if url != gone]) == after  # the same as a ring built without it


def test_adding_an_engine_moves_about_one_in_n_keys_all_to_it() -> None:
    before = owners(affinity.HashRing(URLS), URLS)
    grown = [*URLS, "http://10.0.0.11:8000"]
    after = owners(affinity.HashRing(grown), grown)
    moved = {key for key in KEYS if before[key] != after[key]}
    assert {after[key] for key in moved} == {grown[-1]}
    assert 0.5 / len(grown) < len(moved) / len(KEYS) < 1.5 / len(grown)


# -- the bound --------------------------------------------------------------------


def test_the_bound_passes_an_engine_over_one_plus_epsilon_times_the_mean_to_the_next() -> None:
    ring = affinity.HashRing(URLS[:4])
    key = affinity.request_key("tiny", chat("hot"), 8192)
    home, second = list(ring.walk(key))[:2]
    loads = dict.fromkeys(URLS[:4], 2)
    # 8 open, one more: the mean after it is 9/4, the bound ceil(1.25 * 9 / 4) = 3. Home at 2 takes it.
    assert affinity.choose(ring, key, loads, 0.25) == (home, True)
    loads[home] = 3  # 9 open: the bound is ceil(1.25 * 10 / 4) = 4, and home would hold 4: still takes it
    assert affinity.choose(ring, key, loads, 0.25) == (home, True)
    loads[home] = 4  # 10 open: the bound is ceil(1.25 * 11 / 4) = 4: home would hold 5, so the next one takes it
    assert affinity.load_bound(loads, 0.25) == 4
    assert affinity.choose(ring, key, loads, 0.25) == (second, False)
    assert affinity.choose(ring, key, loads, 1.0) == (home, True)  # a looser bound: home again


def test_a_hot_key_spreads_over_the_engines_within_the_bound() -> None:
    engines = pool(URLS[:4], policy="prefix_affinity", affinity_epsilon=0.25)
    payload = chat("the one question everybody asks")
    home = engines.pick("tiny", payload=payload)
    assert home is not None
    held = Counter[str]()
    opened = []
    for _ in range(40):  # all held open: each pick sees the others' load
        engine = engines.pick("tiny", payload=payload)
        assert engine is not None
        context = engines.using(engine)
        context.__enter__()
        opened.append(context)
        held[engine.url] += 1
        assert held[engine.url] <= math.ceil(1.25 * sum(held.values()) / 4)
    assert set(held) == set(URLS[:4])
    assert held.most_common(1)[0][0] == home.url
    spills = [sample.value for metric in engines.metrics.affinity_spills.collect() for sample in metric.samples]
    assert spills[0] > 0
    for context in opened:
        context.__exit__(None, None, None)
    assert engines.pick("tiny", payload=payload) == home  # loads back to 0: home again


# -- the pool: drains, ejections, retries, policies ----------------------------------


def test_a_drained_or_ejected_engine_receives_nothing_and_the_others_keep_their_keys() -> None:
    engines = pool(URLS[:5], policy="prefix_affinity")
    payloads = [chat(f"question {index}") for index in range(400)]
    before = [chosen(engines, payload) for payload in payloads]
    drained, ejected = URLS[1], URLS[2]
    engines.set_drained({drained})
    engines.failed(engines.engines[2], "engine_5xx")
    engines.failed(engines.engines[2], "engine_5xx")  # eject_after=2
    after = [chosen(engines, payload) for payload in payloads]
    assert drained not in after and ejected not in after
    assert drained in before and ejected in before
    assert all(b == a for b, a in zip(before, after, strict=True) if b not in (drained, ejected))


def test_exclude_sends_a_retry_to_the_next_engine_on_the_ring() -> None:
    engines = pool(URLS[:4], policy="prefix_affinity")
    payload = chat("retry me")
    key = affinity.request_key("tiny", payload, engines.affinity_prefix_chars)
    ring_order = list(engines.ring.walk(key))
    assert chosen(engines, payload) == ring_order[0]
    assert chosen(engines, payload, frozenset(ring_order[:1])) == ring_order[1]
    assert chosen(engines, payload, frozenset(ring_order[:3])) == ring_order[3]
    # Every engine failed it: one is still tried rather than none.
    assert engines.pick("tiny", frozenset(URLS[:4]), payload) is not None


def test_each_model_has_its_policy_and_the_metric_says_which_chose() -> None:
    engines = pool(URLS[:3], model_policies={"tiny": "prefix_affinity"})
    for engine in engines.engines:
        engine.models["plain"] = 2048
    payload = chat("same question")
    tiny = {chosen(engines, payload) for _ in range(6)}
    plain = [chosen(engines, {**payload, "model": "plain"}, model="plain") for _ in range(6)]
    assert len(tiny) == 1
    assert set(plain) == set(URLS[:3])  # least outstanding: ties in turn
    counted = picks(engines.metrics)
    assert counted[(tiny.pop(), "prefix_affinity")] == 6
    assert sum(value for (_, policy), value in counted.items() if policy == "least_outstanding") == 6
    assert {policy for _, policy in counted} == {"prefix_affinity", "least_outstanding"}


def test_worker_settings_take_the_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFLEET_WORKER_ENGINES", '["http://127.0.0.1:8000"]')
    monkeypatch.setenv("LLMFLEET_WORKER_MODEL_POLICIES", '{"tiny": "prefix_affinity"}')
    monkeypatch.setenv("LLMFLEET_WORKER_AFFINITY_EPSILON", "0.5")
    settings = WorkerSettings()  # type: ignore[call-arg]
    assert settings.policy == "least_outstanding"
    assert settings.model_policies == {"tiny": "prefix_affinity"}
    assert settings.affinity_epsilon == 0.5
    monkeypatch.setenv("LLMFLEET_WORKER_MODEL_POLICIES", '{"tiny": "cache_aware"}')
    with pytest.raises(ValidationError, match="least_outstanding"):
        WorkerSettings()  # type: ignore[call-arg]
    monkeypatch.setenv("LLMFLEET_WORKER_MODEL_POLICIES", "{}")
    monkeypatch.setenv("LLMFLEET_WORKER_AFFINITY_EPSILON", "0")
    with pytest.raises(ValidationError, match="greater than 0"):
        WorkerSettings()  # type: ignore[call-arg]


def test_the_worker_role_offers_exactly_the_services_policies() -> None:
    """The role's preflight and argument_specs list the policies the service knows, no more, no fewer."""
    role = REPO_ROOT / "roles" / "worker"
    offered = yaml.safe_load((role / "vars" / "main.yml").read_text())["__worker_policies"]
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert offered == list(get_args(Policy))
    assert specs["worker_policy"]["choices"] == list(get_args(Policy))
