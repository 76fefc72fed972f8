"""Delivered answers are not kept: sync load past a noeviction Redis's memory limit under the old retention still works.

Its own stack: a real redis-server with a small maxmemory and
maxmemory-policy noeviction, the real gateway and worker processes, and a
STAND-IN engine (BigAnswerEngine) that answers every chat request at once with
a large body, so that the load is cheap to make and its answers weigh a lot.
The gateway's tokenizer is the session's real tiny model.

Each answer is stored twice while it is fresh: as the result key and as the
final event on the gateway's reply stream (whose read entries are kept 30 s,
producer.KEEP_READ_MS). With results kept LLMFLEET_QUEUE_RESULT_TTL_S whatever
the mode, the load below needs about twice its answers' size; with a
delivered answer kept only LLMFLEET_QUEUE_DELIVERED_GRACE_S, about once. The
limit is set between the two.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llmfleet.lab.vllm_cpu import VllmServer
from tests.integration.serve.gateway.gatewaystack import (
    PREFIX,
    RedisServer,
    Stack,
    StubEngine,
    running_stack,
    serving,
    wait_for,
)

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
ANSWER_BYTES = 48 * 1024
REQUESTS = 240
RATE_PER_S = 20.0
GRACE_S = 1


class BigAnswerEngine(StubEngine):
    """A STAND-IN engine: healthy to probes (StubEngine's GETs), a 200 chat completion of ANSWER_BYTES to every POST."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.hits[self.path] += 1
        message = {"role": "assistant", "content": "x" * ANSWER_BYTES}
        body = {
            "id": "stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "tiny",
            "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13},
        }
        self._reply(200, body)


@pytest.fixture(scope="module")
def small_stack(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    hits: Counter[str] = Counter()
    with (
        serving(BigAnswerEngine, hits=hits) as engine_url,
        running_stack(
            tmp_path_factory.mktemp("retention-stack"),
            vllm_server,
            engines=[engine_url],
            worker={"concurrency": "32"},
            LLMFLEET_QUEUE_REQUEST_TIMEOUT_S="30",
            LLMFLEET_QUEUE_QUEUE_TIMEOUT_S="30",
            LLMFLEET_QUEUE_DELIVERED_GRACE_S=str(GRACE_S),
        ) as stack,
    ):
        yield stack


def chat(content: str = "Say something") -> dict[str, object]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 8}


def used_memory(redis_server: RedisServer) -> int:
    with redis_server.client() as client:
        return int(client.info("memory")["used_memory"])


def stored_results(redis_server: RedisServer) -> int:
    with redis_server.client() as client:
        return sum(1 for _ in client.scan_iter(f"{PREFIX}:result:*", count=1000))


def test_sync_load_past_the_old_retentions_memory_needs_is_still_admitted(small_stack: Stack) -> None:
    redis_server = small_stack.redis
    # The load's answers, once over (ANSWER_BYTES each): the reply stream holds them all for 30 s in either case.
    answers = REQUESTS * ANSWER_BYTES
    baseline = used_memory(redis_server)
    limit = baseline + int(answers * 1.6)
    with redis_server.client() as client:
        client.config_set("maxmemory", limit)
        client.config_set("maxmemory-policy", "noeviction")
    headers = small_stack.auth("loader")
    statuses: Counter[int] = Counter()
    peak = baseline

    def one(index: int, start: float) -> int:
        time.sleep(max(start + index / RATE_PER_S - time.monotonic(), 0.0))
        try:
            with httpx.Client(base_url=small_stack.url, timeout=20, trust_env=False) as client:
                response = client.post(CHAT, json=chat(f"request {index}"), headers=headers)
        except httpx.TimeoutException:
            return 0  # no answer in 20 s: a worker that cannot store its result retries until the deadline
        if response.status_code == 200:
            assert len(response.json()["choices"][0]["message"]["content"]) == ANSWER_BYTES
        return response.status_code

    try:
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=16) as pool:
            futures = [pool.submit(one, index, start) for index in range(REQUESTS)]
            while not all(future.done() for future in futures):
                peak = max(peak, used_memory(redis_server))
                time.sleep(0.1)
            statuses.update(future.result() for future in futures)
        assert statuses == Counter({200: REQUESTS}), (
            f"statuses {dict(statuses)} (0: no answer in 20 s); used_memory peaked at {peak} of maxmemory {limit}"
            f"\n{small_stack.logs()}"
        )
        assert peak < limit
        # The delivered answers' stored copies go within the grace (and the next trim): nothing accumulates.
        wait_for(lambda: stored_results(redis_server) == 0, GRACE_S + 10, "the delivered results to expire")
    finally:
        with redis_server.client() as client:
            client.config_set("maxmemory", 0)


def test_a_keyed_answer_and_a_task_keep_their_retention(small_stack: Stack) -> None:
    redis_server = small_stack.redis
    key = uuid.uuid4().hex
    with small_stack.client() as client:
        keyed = client.post(CHAT, json=chat("keyed"), headers={**small_stack.auth(), "Idempotency-Key": key})
        assert keyed.status_code == 200, keyed.text
        plain = client.post(CHAT, json=chat("plain"), headers=small_stack.auth())
        assert plain.status_code == 200, plain.text
        task = client.post(CHAT, json=chat("task"), headers={**small_stack.auth(), "Prefer": "respond-async"})
        assert task.status_code == 202, task.text
        task_id = task.json()["id"]
        wait_for(
            lambda: client.get(f"/v1/tasks/{task_id}", headers=small_stack.auth()).json()["status"] == "completed",
            30,
            "the task to complete",
        )
    keyed_id, plain_id = keyed.json()["id"].split("-", 1)[1], plain.json()["id"].split("-", 1)[1]
    # The plain answer's copy goes after the grace; the keyed one and the task stay past it.
    with redis_server.client() as client:
        wait_for(lambda: not client.exists(f"{PREFIX}:result:{plain_id}"), GRACE_S + 10, "the plain answer to expire")
        for request_id in (keyed_id, task_id):
            ttl = client.ttl(f"{PREFIX}:result:{request_id}")
            assert ttl > 600, (request_id, ttl)
            assert json.loads(client.get(f"{PREFIX}:result:{request_id}"))["status"] == 200
