"""Request bodies: what real OpenAI clients send is accepted, passed, ignored or refused by name."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llmfleet.serve.gateway.middleware import RequestId, request_id
from llmfleet.serve.gateway.schemas import ChatCompletionRequest, CompletionRequest

USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": None, "parameters": {"type": "object"}}}]
# An assistant message as the openai SDK returns it and clients send it back (model_dump of the response).
SDK_ASSISTANT = {
    "role": "assistant",
    "content": None,
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "tool_calls": [CALL],
    "reasoning_content": None,
}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "tiny", "messages": [USER], **fields})


def refusal(model: type[ChatCompletionRequest | CompletionRequest], body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as error:
        model.model_validate(body)
    return "; ".join(".".join(str(part) for part in item["loc"]) + ": " + item["msg"] for item in error.value.errors())


def test_a_multi_turn_conversation_with_echoed_sdk_messages_and_tool_results_is_accepted() -> None:
    request = chat(
        messages=[USER, SDK_ASSISTANT, {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}],
        tools=TOOLS,
        tool_choice="auto",
    )
    messages = request.engine_payload()["messages"]
    # Response-only fields and nulls are dropped; the calls and the tool's id go to the engine.
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"logprobs": False}, {"logprobs": False}),
        ({"logprobs": True, "top_logprobs": 2}, {"logprobs": True, "top_logprobs": 2}),
        ({"n": 2, "seed": 7}, {"n": 2, "seed": 7}),
        ({"stop": ["\n", "END"], "presence_penalty": 0.5, "frequency_penalty": -0.5}, None),
        ({"user": "alice", "logit_bias": {"42": -100}}, None),
        ({"prompt_cache_key": "conversation-7"}, None),  # the workers' prefix_affinity key
        ({"response_format": {"type": "json_object"}}, None),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}},
            {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}},
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "weather"}}},
            {"tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]},
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
            {"tool_choice": "required", "parallel_tool_calls": False},
        ),
        ({"ignore_eos": True, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 1}, None),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, None),
        ({"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"}, None),
    ],
)
def test_parameters_the_engine_supports_are_passed(fields: dict[str, Any], expected: dict[str, Any] | None) -> None:
    payload = chat(**fields).engine_payload()
    for key, value in (expected or fields).items():
        assert payload[key] == value, key


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "text"}},  # the default: nothing to constrain
        {"metadata": {"team": "a"}, "store": False, "service_tier": "auto", "prompt_cache_retention": "24h"},
        {"temperature": None, "top_p": None, "stop": None, "n": None, "tools": None, "audio": None},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"modalities": ["text"], "functions": None, "function_call": None},
    ],
)
def test_nulls_defaults_and_openai_side_features_never_reach_the_engine(fields: dict[str, Any]) -> None:
    payload = chat(**fields).engine_payload()
    assert set(payload) == {"model", "messages", "stream"} and payload["stream"] is False


@pytest.mark.parametrize(
    ("fields", "param", "why"),
    [
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio", "audio output is not supported"),
        ({"modalities": ["text", "audio"]}, "", "only text"),
        ({"functions": [{"name": "f"}]}, "functions", "use `tools`"),
        ({"function_call": "auto"}, "function_call", "use `tool_choice`"),
        ({"web_search_options": {}}, "web_search_options", "web search"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction", "predicted outputs"),
        ({"use_beam_search": True}, "use_beam_search", "beam search"),
        ({"n": 9}, "n", "less than or equal to 8"),
        ({"logprobs": False, "top_logprobs": 2}, "", "top_logprobs needs logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs", "less than or equal to 20"),
        ({"tool_choice": "auto"}, "", "tool_choice needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}, "", "not in tools"),
        ({"tools": []}, "tools", "at least 1"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
        ({"stream_options": {"include_usage": True}}, "", "needs stream"),
        ({"best_of": 2}, "best_of", "Extra inputs"),
        ({"temperature": float("nan")}, "temperature", "finite"),
    ],
)
def test_what_the_engines_cannot_do_is_refused_by_name(fields: dict[str, Any], param: str, why: str) -> None:
    message = refusal(ChatCompletionRequest, {"model": "tiny", "messages": [USER], **fields})
    assert message.startswith(param) and why in message


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ({"role": "tool", "content": "sunny"}, "needs tool_call_id"),
        ({"role": "user", "content": "hi", "tool_call_id": "x"}, "tool messages only"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "read text"),
        ({"role": "assistant", "content": "hi", "audio": {"id": "a1"}}, "audio is not supported"),
        ({"role": "assistant", "content": "hi", "function_call": {"name": "f", "arguments": "{}"}}, "use tool_calls"),
        ({"role": "wizard", "content": "hi"}, "Input should be"),
        ({"role": "user", "content": "\ud800"}, "lone surrogates"),
        ({"role": "user"}, "needs content"),
    ],
)
def test_bad_messages_are_refused(message: dict[str, Any], why: str) -> None:
    assert why in refusal(ChatCompletionRequest, {"model": "tiny", "messages": [message]})


def test_max_completion_tokens_wins_and_stays_with_the_gateway() -> None:
    request = chat(max_completion_tokens=7, max_tokens=99)
    assert request.requested_max_tokens() == 7
    assert "max_completion_tokens" not in request.engine_payload()


def test_completions_pass_echo_and_logprobs_and_refuse_suffix() -> None:
    request = CompletionRequest.model_validate(
        {"model": "tiny", "prompt": "Once", "echo": True, "logprobs": 2, "best_of": 1, "n": 2}
    )
    payload = request.engine_payload()
    assert (payload["echo"], payload["logprobs"], payload["n"]) == (True, 2, 2) and "best_of" not in payload
    assert "fill-in-the-middle" in refusal(CompletionRequest, {"model": "tiny", "prompt": "a", "suffix": "b"})
    assert "best_of" in refusal(CompletionRequest, {"model": "tiny", "prompt": "a", "best_of": 2})
    assert CompletionRequest.model_validate({"model": "tiny", "prompt": [1, 2]}).prompt == [1, 2]


async def _boom(request: Request) -> JSONResponse:
    raise RuntimeError(f"secret internals of {request_id(request.scope)}")


async def _fine(request: Request) -> JSONResponse:
    return JSONResponse({"id": request_id(request.scope)}, headers={"x-request-id": "forged"})


def test_an_unexpected_exception_is_an_openai_shaped_500_with_the_request_id() -> None:
    asyncio.run(_exception_is_a_500())


async def _exception_is_a_500() -> None:
    # As in the gateway: a user middleware, inside Starlette's own ServerErrorMiddleware (its plain-text 500).
    app = Starlette(routes=[Route("/boom", _boom), Route("/fine", _fine)], middleware=[Middleware(RequestId)])
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        response = await client.get("/boom")
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "internal_error"
        assert response.headers["x-request-id"] in error["message"]
        assert "secret" not in response.text and "RuntimeError" not in response.text
        fine = await client.get("/fine")
        assert fine.headers.get_list("x-request-id") == [fine.json()["id"]]
