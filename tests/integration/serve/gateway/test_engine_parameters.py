"""Every parameter the gateway passes works on the real engine; length admission agrees with it; poison requests.

- Each parameter set is checked by the gateway's schema, sent straight to the
  real vLLM as the gateway would send it, and through the whole stack: both
  answer 200 and the engine is still healthy after it (in the lab a request
  with logprobs killed the engine core: see files/images/vllm-cpu/Dockerfile).
- The gateway's context rule is the engine's: the longest prompt the gateway
  admits is served by the engine, and the shortest it refuses the engine
  refuses too.
- A request that kills the engines serving it is dead-lettered after the
  second death, with a clear error, and the remaining engine keeps serving
  (faultengine.py, a labelled FAULT INJECTOR, plays the crashing engine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from llmfleet.lab.vllm_cpu import VllmServer
from llmfleet.paths import REPO_ROOT
from llmfleet.serve.gateway.schemas import ChatCompletionRequest, CompletionRequest
from llmfleet.serve.gateway.validation import load_template
from tests.integration.serve.gateway.gatewaystack import PREFIX, Stack, http_status, wait_for
from tests.tools import free_loopback_port

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        # An enum keeps the constrained arguments short, whatever a model with random weights prefers.
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
MAX_MODEL_LEN = 2048  # the tiny model's, as the test engine serves it

CHAT_PARAMETERS: dict[str, dict[str, Any]] = {
    "logprobs": {"logprobs": True, "top_logprobs": 2},
    "logprobs_false": {"logprobs": False},
    "n": {"n": 2, "seed": 3},
    "sampling": {"temperature": 0.7, "top_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    "stop": {"stop": ["\n", "fox"], "user": "alice"},
    "prompt_cache_key": {"prompt_cache_key": "conversation-7"},  # the workers' prefix_affinity key
    "logit_bias": {"logit_bias": {"5": -100, "6": 10}},
    "tools_auto": {"tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False},
    "tools_named": {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "tools_required": {"tools": [TOOL], "tool_choice": "required"},
    "tool_result": {
        "messages": [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        ],
        "tools": [TOOL],
    },
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": {"type": "object", "properties": {"sky": {"type": "string"}}}},
        }
    },
    "vllm_extras": {"ignore_eos": True, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 2},
    "vllm_tokens": {"stop_token_ids": [2], "include_stop_str_in_output": True, "skip_special_tokens": False},
    "structured_outputs": {"structured_outputs": {"choice": ["sunny", "rainy"]}},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "template_kwargs": {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}},
}
COMPLETION_PARAMETERS: dict[str, dict[str, Any]] = {
    "echo_logprobs": {"echo": True, "logprobs": 2},
    "n_seed": {"n": 2, "seed": 5, "best_of": 1},
    "bad_words": {"bad_words": ["fox"], "spaces_between_special_tokens": False},
    "allowed_token_ids": {"allowed_token_ids": [10, 11, 12]},
    "prompt_cache_key": {"prompt_cache_key": "conversation-7"},
}


def engine_payload(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    payload = model.model_validate(body).engine_payload()
    payload.setdefault("max_tokens", body.get("max_tokens"))
    return payload


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("chat", value) for value in CHAT_PARAMETERS.values()]
    + [("completion", value) for value in COMPLETION_PARAMETERS.values()],
    ids=[f"chat-{name}" for name in CHAT_PARAMETERS] + [f"completion-{name}" for name in COMPLETION_PARAMETERS],
)
def test_each_passed_parameter_works_on_the_real_engine(
    stack: Stack, vllm_server: VllmServer, kind: str, extra: dict[str, Any]
) -> None:
    base: dict[str, Any] = {"model": "tiny", "max_tokens": 6}
    base.update({"messages": USER} if kind == "chat" else {"prompt": "The quick brown fox"})
    body = {**base, **extra}
    path = CHAT if kind == "chat" else COMPLETIONS
    direct = httpx.post(f"{vllm_server.url}{path}", json=engine_payload(kind, body), timeout=120, trust_env=False)
    assert direct.status_code == 200, direct.text
    assert http_status(f"{vllm_server.url}/health") == 200, "the engine died serving it"
    with stack.client() as client:
        response = client.post(path, json=body, headers=stack.auth())
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == int(body.get("n") or 1)
    if body.get("logprobs"):
        assert all(choice["logprobs"] for choice in choices)


def test_streamed_logprobs_and_tool_calls_arrive(stack: Stack) -> None:
    body = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 200,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 1,
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    with stack.client() as client, client.stream("POST", CHAT, json=body, headers=stack.auth()) as response:
        assert response.status_code == 200
        chunks = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
    assert chunks[-1] == "[DONE]"
    deltas = [choice["delta"] for chunk in chunks[:-1] for choice in json.loads(chunk)["choices"]]
    names = [call["function"].get("name") for delta in deltas for call in delta.get("tool_calls") or []]
    assert "get_weather" in names


# -- the context rule agrees with the engine's ------------------------------------------


def _chat_tokens(tokenizer: Tokenizer, stack: Stack, content: str) -> int:
    template = load_template("tiny", stack.vllm.model_dir)
    assert template is not None
    rendered = template.render([{"role": "user", "content": content}], None)
    return len(tokenizer.encode(rendered, add_special_tokens=False).ids)


def _chat_of(tokenizer: Tokenizer, stack: Stack, tokens: int) -> str:
    """A user message whose chat prompt is exactly `tokens` tokens (a unit that adds one token each time)."""
    for unit in ("\n", " 0", "0 ", "!"):
        base = _chat_tokens(tokenizer, stack, unit)
        if _chat_tokens(tokenizer, stack, unit * 5) == base + 4:
            content = unit * (tokens - base + 1)
            if _chat_tokens(tokenizer, stack, content) == tokens:
                return content
    pytest.fail(f"no one-token unit found to build a {tokens}-token chat")


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_the_longest_admitted_prompt_is_served_and_the_shortest_refused_is_refused_by_the_engine(
    stack: Stack, vllm_server: VllmServer, kind: str
) -> None:
    tokenizer = Tokenizer.from_file(str(stack.vllm.model_dir / "tokenizer.json"))
    path = CHAT if kind == "chat" else COMPLETIONS

    def body(tokens: int) -> dict[str, Any]:
        if kind == "chat":
            content = _chat_of(tokenizer, stack, tokens)
            return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 16}
        return {"model": "tiny", "prompt": [5] * tokens, "max_tokens": 16}

    longest, shortest = body(MAX_MODEL_LEN - 1), body(MAX_MODEL_LEN)
    with stack.client(timeout_s=300) as client:
        admitted = client.post(path, json=longest, headers=stack.auth())
        assert admitted.status_code == 200, admitted.text
        usage = admitted.json()["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (MAX_MODEL_LEN - 1, 1)
        refused = client.post(path, json=shortest, headers=stack.auth())
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    engine = httpx.post(f"{vllm_server.url}{path}", json=shortest, timeout=120, trust_env=False)
    assert engine.status_code == 400, engine.text
    served = httpx.post(f"{vllm_server.url}{path}", json=longest, timeout=300, trust_env=False)
    assert served.status_code == 200, served.text


# -- poison requests ------------------------------------------------------------------------

MARKER = "LLMFLEET-FAULT-INJECTOR-KILL"


@pytest.fixture
def fault_engines(vllm_server: VllmServer) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """Three FAULT INJECTOR engines (faultengine.py) in front of the real vLLM: (url, process) each."""
    engines = []
    try:
        for _ in range(3):
            port = free_loopback_port()
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.serve.gateway.faultengine",
                    str(port),
                    vllm_server.url,
                    MARKER,
                ],
                cwd=REPO_ROOT,
                start_new_session=True,
            )
            url = f"http://127.0.0.1:{port}"
            engines.append((url, process))
            wait_for(lambda url=url: http_status(f"{url}/health") == 200, 30, f"the fault injector at {url}")
        yield engines
    finally:
        for _url, process in engines:
            if process.poll() is None:
                process.kill()
            process.wait()


def test_a_request_that_kills_engines_is_dead_lettered_after_the_second_and_the_rest_keep_serving(
    stack: Stack, fault_engines: list[tuple[str, subprocess.Popen[bytes]]]
) -> None:
    for worker in stack.live_workers():
        assert worker.stop() == 0
    worker = stack.start_worker(engines=[url for url, _ in fault_engines], retries="3")
    stack.wait_gateway_ready()
    try:
        with stack.client() as client:
            poison = client.post(
                COMPLETIONS, json={"model": "tiny", "prompt": f"{MARKER} hello", "max_tokens": 4}, headers=stack.auth()
            )
            assert poison.status_code == 422, poison.text
            error = poison.json()["error"]
            assert error["code"] == "poison_request" and "2 engines died" in error["message"]
            request_id = poison.headers["x-request-id"]
            dead = [url for url, process in fault_engines if process.poll() is not None]
            assert len(dead) == 2, "the request was not stopped after the second engine died"
            with stack.redis.client() as queue:
                letters = queue.xrange(f"{PREFIX}:dlq")
                assert any(fields["id"] == request_id for _entry, fields in letters)
                assert queue.hget(f"{PREFIX}:job:{request_id}", "engine_deaths") == "2"
            # The engine left serves everyone else.
            for _ in range(3):
                answer = client.post(
                    COMPLETIONS, json={"model": "tiny", "prompt": "Hello", "max_tokens": 4}, headers=stack.auth()
                )
                assert answer.status_code == 200, answer.text
        assert [process.poll() is None for _url, process in fault_engines].count(True) == 1
    finally:
        assert worker.stop() == 0
        stack.ensure_one_worker()


def test_redis_is_left_clean_of_poison_counts_for_normal_requests(stack: Stack) -> None:
    with stack.client() as client:
        answer = client.post(COMPLETIONS, json={"model": "tiny", "prompt": "Hi", "max_tokens": 2}, headers=stack.auth())
    assert answer.status_code == 200
    with stack.redis.client() as queue:
        assert queue.hget(f"{PREFIX}:job:{answer.headers['x-request-id']}", "engine_deaths") is None
