"""The Responses and Messages APIs' request checks: what is passed, ignored and refused, and the chat they count as."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.gateway.messages_schema import CountTokensRequest, MessagesRequest
from llmfleet.serve.gateway.responses_schema import ResponsesRequest
from llmfleet.serve.gateway.validation import ModelInfo, check_translated, count_chat_view, load_model


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> ModelInfo:
    return load_model("tiny", tiny_dir)


def refused(kind: type[ResponsesRequest | MessagesRequest], body: dict[str, Any], why: str) -> str:
    """Where body is refused for `why` (a union field reports each branch; the one that says why counts)."""
    with pytest.raises(ValidationError) as error:
        kind.model_validate(body)
    found = [".".join(str(part) for part in item["loc"]) for item in error.value.errors() if why in str(item["msg"])]
    assert found, error.value.errors()
    return found[0]


# -- Responses ----------------------------------------------------------------


def test_a_plain_response_request_is_sent_as_given_and_stores_nothing() -> None:
    request = ResponsesRequest.model_validate(
        {"model": "tiny", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 5, "temperature": 0.5,
         "metadata": {"team": "a"}, "service_tier": "auto", "store": False, "prompt_cache_key": "conversation-1",
         "top_k": 4, "ignore_eos": True},
    )  # fmt: skip
    assert request.engine_payload() == {
        "model": "tiny",
        "input": "Hi",
        "instructions": "Be brief.",
        "max_output_tokens": 5,
        "temperature": 0.5,
        "prompt_cache_key": "conversation-1",  # the workers' affinity key, and vLLM accepts it
        "top_k": 4,
        "ignore_eos": True,
        "stream": False,
        "store": False,  # the engines keep nothing either
    }
    assert request.requested_max_tokens() == 5


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("previous_response_id", "resp_1", "does not store responses"),
        ("store", True, "does not store responses"),
        ("background", True, "Prefer: respond-async"),
        ("conversation", "conv_1", "does not store responses"),
        ("prompt", {"id": "pmpt_1"}, "stored prompt templates"),
        ("truncation", "auto", "'disabled'"),
        ("tools", [{"type": "web_search"}], "'function'"),
        ("include", ["reasoning.encrypted_content"], "message.output_text.logprobs"),
        ("bogus", 1, "Extra inputs are not permitted"),
    ],
)
def test_what_needs_a_store_or_the_engines_lack_is_refused_by_name(field: str, value: Any, why: str) -> None:
    assert refused(ResponsesRequest, {"model": "tiny", "input": "Hi", field: value}, why).split(".")[0] == field


def test_null_is_not_set() -> None:
    request = ResponsesRequest.model_validate({"model": "tiny", "input": "Hi", "previous_response_id": None})
    assert "previous_response_id" not in request.engine_payload()


def test_images_and_files_in_the_input_are_refused() -> None:
    part = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
    body = {"model": "tiny", "input": [{"role": "user", "content": [part]}]}
    assert refused(ResponsesRequest, body, "read text").startswith("input")


def test_the_sdks_own_output_items_sent_back_make_the_chat_vllm_makes() -> None:
    # What `response.output` of the openai SDK serializes to, then the tool's output and a new question.
    body = {
        "model": "tiny",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}],
             "status": None},
            {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "phase": None,
             "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather",
             "arguments": '{"city": "Paris"}', "status": "completed", "namespace": None, "caller": None,
             "async_": None},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "user", "content": [{"type": "input_text", "text": "And"},
                                         {"type": "input_text", "text": "Rome?"}]},
        ],
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}, "strict": True}],
    }  # fmt: skip
    request = ResponsesRequest.model_validate(body)
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    view = request.chat_view()
    assert view["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        # reasoning, text and the call of one assistant turn are one message, as vLLM merges them
        {"role": "assistant", "content": "Let me look.", "reasoning": "Hm.", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "user", "content": "And\nRome?"},
    ]
    assert view["tools"] == [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}, "strict": True}}
    ]
    assert view["continue_final_message"] is False
    # Echoed nulls are dropped before the engine sees the items.
    sent = request.engine_payload()["input"]
    assert "phase" not in sent[2] and "namespace" not in sent[3] and "status" not in sent[1]


def test_an_unfinished_assistant_message_last_is_continued() -> None:
    partial = {"type": "message", "role": "assistant", "status": "incomplete", "content": "Once upon"}
    request = ResponsesRequest.model_validate({"model": "tiny", "input": [{"role": "user", "content": "Go"}, partial]})
    assert request.chat_view()["continue_final_message"] is True


def test_a_call_sent_back_from_a_namespaced_tool_is_refused() -> None:
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "namespace": "tools"}
    assert refused(ResponsesRequest, {"model": "tiny", "input": [call]}, "namespaced tools").endswith("namespace")


# -- Messages -----------------------------------------------------------------


def test_a_message_request_is_sent_as_given_less_what_only_the_gateway_reads() -> None:
    request = MessagesRequest.model_validate(
        {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}], "system": "Be brief.",
         "stop_sequences": ["\n\n"], "temperature": 0.7, "top_k": 5, "metadata": {"user_id": "u1"},
         "service_tier": "auto", "stream": True},
    )  # fmt: skip
    assert request.engine_payload() == {
        "model": "tiny",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Hi"}],
        "system": "Be brief.",
        "stop_sequences": ["\n\n"],
        "temperature": 0.7,
        "top_k": 5,
        "stream": False,
    }


@pytest.mark.parametrize(
    ("body", "where", "why"),
    [
        ({"mcp_servers": []}, "mcp_servers", "Extra inputs are not permitted"),
        ({"container": "c"}, "container", "Extra inputs are not permitted"),
        ({"temperature": 1.5}, "temperature", "less than or equal to 1"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "", "budget_tokens must be less than max_tokens"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role", "'user' or 'assistant'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]},
            "messages.0.content",
            "read text",
        ),
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "", "not in tools"),
    ],
)
def test_what_the_engines_cannot_do_is_refused(body: dict[str, Any], where: str, why: str) -> None:
    base = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
    assert refused(MessagesRequest, {**base, **body}, why).startswith(where)


def test_tool_use_and_results_make_the_chat_vllm_makes() -> None:
    request = MessagesRequest.model_validate(
        {
            "model": "tiny",
            "max_tokens": 16,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},  # vLLM drops it
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Hm.", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And Rome?"},
                ]},
            ],
            "tools": [{"name": "weather", "description": "The weather", "input_schema": {"type": "object"}}],
        }
    )  # fmt: skip
    call = {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    view = request.chat_view()
    assert view["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning": "Hm.", "tool_calls": [call], "content": "Let me look."},
        # the tool's result comes first, then the rest of the user's turn
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "And Rome?"},
    ]
    assert view["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "The weather", "parameters": {"type": "object"}},
        }
    ]


def test_a_user_turn_of_tool_results_alone_adds_no_user_message() -> None:
    request = CountTokensRequest.model_validate(
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": "Go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "done"}]},
            ],
        }
    )
    roles = [message["role"] for message in request.chat_view()["messages"]]
    assert roles == ["user", "assistant", "tool"]


# -- the length check ---------------------------------------------------------


def test_both_apis_count_the_same_conversation_alike_and_as_chat(model: ModelInfo) -> None:
    responses = ResponsesRequest.model_validate({"model": "tiny", "input": "Hello!", "instructions": "Be brief."})
    messages = MessagesRequest.model_validate(
        {"model": "tiny", "max_tokens": 4, "system": "Be brief.", "messages": [{"role": "user", "content": "Hello!"}]}
    )
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    expected = len(model.tokenizer.encode(rendered, add_special_tokens=False).ids)
    assert asyncio.run(count_chat_view(model, responses.chat_view())) == expected
    assert asyncio.run(count_chat_view(model, messages.chat_view())) == expected


def test_max_tokens_is_resolved_into_each_apis_own_field(model: ModelInfo) -> None:
    request = ResponsesRequest.model_validate({"model": "tiny", "input": "Hello!"})
    checked = asyncio.run(
        check_translated(model, request.engine_payload(), request.chat_view(), None, 2048, 64,
                         field="max_output_tokens", param="input")
    )  # fmt: skip
    assert checked.payload["max_output_tokens"] == 64 == checked.max_tokens  # the cap, when none is asked
    near = asyncio.run(
        check_translated(model, {}, request.chat_view(), 100, checked.prompt_tokens + 10, 4096, field="max_tokens",
                         param="messages")
    )  # fmt: skip
    assert near.payload == {"max_tokens": 10}  # clamped to the room the prompt leaves, as vLLM does


def test_a_prompt_with_no_room_left_is_a_400_naming_the_input(model: ModelInfo) -> None:
    request = ResponsesRequest.model_validate({"model": "tiny", "input": "Hello! " * 200})
    with pytest.raises(APIError) as error:
        asyncio.run(
            check_translated(model, {}, request.chat_view(), 4, 64, 4096, field="max_output_tokens", param="input")
        )
    assert error.value.status == 400 and error.value.code == "context_length_exceeded" and error.value.param == "input"
