"""Two models, engines for each: a worker takes only jobs for a model one of its engines serves.

Two real vLLM-CPU servers serve the project's tiny model under two names, and
each of two workers has one of them. Jobs for a model whose worker is away
stay queued, in their place, instead of being taken by the other worker and
answered 503 ("no healthy engine serves model").
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from llmfleet.lab import vllm_cpu
from llmfleet.lab.vllm_cpu import VllmServer
from tests.integration.conftest import VLLM_KV_CACHE_GIB
from tests.integration.serve.gateway.gatewaystack import PREFIX, Stack, metric_value, running_stack, wait_for
from tests.tools import free_loopback_port

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
OTHER = "tiny-2"


@pytest.fixture(scope="module")
def other_engine(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A second real engine: the same tiny model, served as "tiny-2"."""
    server = vllm_cpu.start_server(
        vllm_server.model_dir,
        port=free_loopback_port(),
        kv_cache_gib=VLLM_KV_CACHE_GIB,
        log_path=tmp_path_factory.mktemp("vllm-other") / "server.log",
        venv=vllm_cpu.ensure_venv(),
        served_model_name=OTHER,
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def two_models(
    vllm_server: VllmServer, other_engine: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """worker-1 has the "tiny" engine only, worker-2 the "tiny-2" engine only."""
    models = {"tiny": str(vllm_server.model_dir), OTHER: str(other_engine.model_dir)}
    with running_stack(
        tmp_path_factory.mktemp("two-models"),
        vllm_server,
        engines=[vllm_server.url],
        LLMFLEET_GATEWAY_MODELS=json.dumps(models),
        # A stopped worker's engines stay in the registry this long: the test admits while it is stopped.
        LLMFLEET_QUEUE_ENGINE_STALE_S="60",
    ) as stack:
        stack.start_worker([other_engine.url])
        with stack.client() as client:
            wait_for(
                lambda: client.post(CHAT, json=chat(OTHER), headers=stack.auth()).status_code == 200,
                60,
                f"the gateway to serve {OTHER}",
                interval_s=0.5,
            )
        yield stack


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def errors(worker_metrics: str, reason: str) -> float:
    return metric_value(worker_metrics, "llmfleet_worker_errors_total", reason=reason)


def served(worker_metrics: str, model: str) -> float:
    return metric_value(worker_metrics, "llmfleet_engine_seconds_count", model=model)


def test_each_worker_runs_only_the_model_its_engine_serves(two_models: Stack) -> None:
    first, second = two_models.workers
    before = {model: (served(first.metrics(), model), served(second.metrics(), model)) for model in ("tiny", OTHER)}
    with two_models.client() as client, ThreadPoolExecutor(8) as pool:
        models = ["tiny", OTHER] * 8
        responses = list(pool.map(lambda m: client.post(CHAT, json=chat(m), headers=two_models.auth()), models))
    assert [r.status_code for r in responses] == [200] * len(models), [r.text for r in responses if r.is_error]
    assert [r.json()["model"] for r in responses] == models
    after = {model: (served(first.metrics(), model), served(second.metrics(), model)) for model in ("tiny", OTHER)}
    # worker-1 ran the 8 "tiny" requests and no "tiny-2" one; worker-2 the other way round.
    assert after["tiny"][0] - before["tiny"][0] == 8 and after["tiny"][1] == before["tiny"][1]
    assert after[OTHER][1] - before[OTHER][1] == 8 and after[OTHER][0] == before[OTHER][0]
    assert errors(first.metrics(), "no_engine") == 0 and errors(second.metrics(), "no_engine") == 0


def test_a_models_jobs_wait_queued_for_a_worker_that_can_run_them(two_models: Stack) -> None:
    first, second = two_models.workers
    stream = f"{PREFIX}:q:{OTHER}:normal"
    second.signal(signal.SIGSTOP)  # its report stays fresh for ENGINE_STALE_S: the gateway still admits tiny-2
    try:
        with two_models.client() as client:
            tasks = []
            for _ in range(3):
                response = client.post(CHAT, json=chat(OTHER), headers={**two_models.auth(), "Prefer": "respond-async"})
                assert response.status_code == 202, response.text
                tasks.append(response.json())
            # A "tiny" request queued after them is answered by worker-1, which so passed them by.
            assert client.post(CHAT, json=chat("tiny"), headers=two_models.auth()).status_code == 200
            with two_models.redis.client() as admin:
                assert admin.xlen(stream) == 3
                states = [admin.hget(f"{PREFIX}:job:{task['id']}", "state") for task in tasks]
            assert states == ["queued"] * 3
            assert errors(first.metrics(), "no_engine") == 0
    finally:
        second.signal(signal.SIGCONT)
    with two_models.client() as client:

        def finished(task: dict[str, Any]) -> dict[str, Any] | None:
            status: dict[str, Any] = client.get(task["url"], headers=two_models.auth()).json()
            return status if status["status"] in ("completed", "failed") else None

        results = [wait_for(lambda t=task: finished(t), 60, "a tiny-2 task", interval_s=0.2) for task in tasks]
    assert [(r["status"], r["http_status"], r["result"]["model"]) for r in results] == [("completed", 200, OTHER)] * 3


def test_the_worker_reports_each_models_queue(two_models: Stack) -> None:
    first, second = two_models.workers
    # Each worker reports the lanes of the models it has followed, labelled by model. A worker follows a model
    # once its engine is admitted and reports at its next report, so this test, run first, waits for that.
    wait_for(lambda: 'llmfleet_queue_depth{lane="normal",model="tiny"}' in first.metrics(), 30,
             "worker-1 to report the tiny queue", interval_s=0.5)
    wait_for(lambda: f'llmfleet_queue_depth{{lane="normal",model="{OTHER}"}}' in second.metrics(), 30,
             f"worker-2 to report the {OTHER} queue", interval_s=0.5)
    assert f'model="{OTHER}"' not in "\n".join(
        line for line in first.metrics().splitlines() if line.startswith("llmfleet_queue_depth")
    )
