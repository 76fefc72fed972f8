"""prefix_affinity end to end: a conversation's turns, through gateway, queue and two workers, land on one of two
real vLLM engines, and that engine's prefix cache serves the later turns.

The engines are the session's vLLM and a second one started here from the same
tiny model (the costly part: one more vLLM start, about a minute on two cores).
The first turns go through one worker running `LLMFLEET_WORKER_POLICY=prefix_affinity`,
the last through a second worker that replaced it: they agree on the engine
without talking to each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.lab import vllm_cpu
from llmfleet.lab.vllm_cpu import VllmServer
from tests.integration.conftest import VLLM_KV_CACHE_GIB
from tests.integration.serve.gateway.gatewaystack import Service, Stack, metric_value, running_stack, wait_for
from tests.tools import free_loopback_port

pytestmark = pytest.mark.vllm

TURNS = 4
# Long enough to fill several KV blocks of the engine, short enough that four turns stay in the tiny model's context.
SYSTEM = " ".join(
    f"Rule {index}: answer the operator of the llmfleet cluster briefly and name the playbook to run."
    for index in range(1, 16)
)


def engine_counter(url: str, name: str) -> float:
    """The sum of a counter over all its label sets in a vLLM engine's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}{{") or line.startswith(f"{name} "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_picks(worker: Service, urls: list[str]) -> dict[str, float]:
    """A worker's prefix_affinity choices of each engine so far."""
    text = worker.metrics()
    return {
        url: metric_value(text, "llmfleet_engine_picks_total", engine=url, policy="prefix_affinity") for url in urls
    }


def counted(worker: Service, urls: list[str], choices: int) -> dict[str, float] | None:
    """The worker's choices once it has counted `choices` of them."""
    picks = engine_picks(worker, urls)
    return picks if sum(picks.values()) == choices else None


def wait_admitted(worker: Service, urls: list[str]) -> None:
    wait_for(
        lambda: all(metric_value(worker.metrics(), "llmfleet_engine_up", engine=url) == 1 for url in urls),
        60,
        f"{worker.name} to admit both engines",
    )


@pytest.fixture(scope="module")
def second_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A second vLLM serving the tiny model as "tiny", as the session's does; stopped after the module."""
    server = vllm_cpu.start_server(
        tiny_model,
        port=free_loopback_port(),
        kv_cache_gib=VLLM_KV_CACHE_GIB,
        log_path=tmp_path_factory.mktemp("vllm-second") / "server.log",
        venv=vllm_cpu.ensure_venv(),
        served_model_name="tiny",
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def affinity_stack(
    vllm_server: VllmServer, second_engine: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Redis, a gateway and one prefix_affinity worker calling both engines."""
    engines = [vllm_server.url, second_engine.url]
    with running_stack(
        tmp_path_factory.mktemp("affinity-stack"), vllm_server, engines=engines, worker={"policy": "prefix_affinity"}
    ) as stack:
        wait_admitted(stack.workers[0], engines)
        yield stack


def test_a_conversation_stays_on_one_engine_and_hits_its_prefix_cache(
    affinity_stack: Stack, vllm_server: VllmServer, second_engine: VllmServer
) -> None:
    """Turns 1-2 go through the first worker, turns 3-4 through a second one started in its place."""
    urls = [vllm_server.url, second_engine.url]
    hits_before = {url: engine_counter(url, "vllm:prefix_cache_hits_total") for url in urls}
    prompts_before = {url: engine_counter(url, "vllm:prompt_tokens_total") for url in urls}
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]

    def talk(turns: range) -> None:
        with affinity_stack.client() as client:
            for turn in turns:
                messages.append({"role": "user", "content": f"Question {turn}: which playbook restarts the engines?"})
                response = client.post(
                    "/v1/chat/completions",
                    json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0},
                    headers=affinity_stack.auth(),
                )
                assert response.status_code == 200, response.text
                messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})

    first = affinity_stack.workers[0]
    talk(range(1, 3))
    first_picks = wait_for(lambda: counted(first, urls, 2), 10, f"{first.name} to count two choices")
    second = affinity_stack.start_worker(urls, policy="prefix_affinity")
    wait_admitted(second, urls)
    assert first.stop() == 0
    talk(range(3, TURNS + 1))
    second_picks = wait_for(lambda: counted(second, urls, TURNS - 2), 10, f"{second.name} to count its choices")
    homes = {url for picks in (first_picks, second_picks) for url, count in picks.items() if count}
    assert len(homes) == 1, f"{first.name} chose {first_picks}, {second.name} chose {second_picks}"
    home = homes.pop()
    other = next(url for url in urls if url != home)
    # The engines agree: only home read a prompt, and its prefix cache served the later turns.
    wait_for(
        lambda: engine_counter(home, "vllm:prefix_cache_hits_total") > hits_before[home],
        10,
        f"{home}'s vllm:prefix_cache_hits_total to rise",
    )
    assert engine_counter(home, "vllm:prompt_tokens_total") > prompts_before[home]
    assert engine_counter(other, "vllm:prompt_tokens_total") == prompts_before[other]
