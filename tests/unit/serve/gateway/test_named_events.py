"""The Responses and Messages APIs' named-event streams: the whole answer from its events and back, and their ends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmfleet.serve.gateway.errors import anthropic_error, shaped
from llmfleet.serve.gateway.sse import Sent, final_events, frame, stream_error, track
from llmfleet.serve.queue.events import Assembler, closing_events, delta_text, whole_events
from llmfleet.serve.queue.jobs import Job, Result, error_body, usage_tokens
from tests.queue_tools import sample_job

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "tiny",
    "content": [
        {"type": "thinking", "thinking": "Hm.", "signature": "s"},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 9},
}

RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "model": "tiny",
    "status": "completed",
    "output": [
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Hello there", "annotations": [], "logprobs": []}]},
        {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Rome"}', "status": "completed"},
    ],
    "usage": {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12},
}  # fmt: skip


def job(kind: str) -> Job:
    return sample_job(kind=kind, stream=True)


def parsed(raw: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each named event; each data's type is its event's name."""
    out = []
    for item in raw:
        name, data = item.decode().removesuffix("\n\n").split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        body = json.loads(data[len("data: ") :])
        assert body["type"] == name[len("event: ") :]
        out.append((body["type"], body))
    return out


@pytest.mark.parametrize(("kind", "body"), [("messages", MESSAGE), ("responses", RESPONSE)])
def test_the_events_of_a_whole_answer_put_it_back_together(kind: str, body: dict[str, Any]) -> None:
    answer = Assembler(kind)
    for event in whole_events(kind, body):
        answer.add(event)
    assert answer.body == body


def test_a_message_stream_as_the_engines_write_it_is_assembled() -> None:
    answer = Assembler("messages")
    start = {**MESSAGE, "content": [], "stop_reason": None, "usage": {"input_tokens": 12, "output_tokens": 0}}
    stream = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "me look."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f",
                                                                      "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a"'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ": 1}"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
    ]  # fmt: skip
    for event in stream:
        answer.add(event)
    assert answer.body is None  # no message_stop yet: not a whole answer
    answer.add({"type": "message_stop"})
    assert answer.body is not None
    assert answer.body["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
    ]
    assert answer.body["stop_reason"] == "tool_use" and answer.body["usage"] == {"input_tokens": 12, "output_tokens": 9}
    assert "".join(delta_text(event) for event in stream) == "Let me look."
    assert usage_tokens(answer.body) == (12, 9)


def test_a_response_stream_is_its_completed_events_response() -> None:
    answer = Assembler("responses")
    answer.add({"type": "response.created", "response": {**RESPONSE, "status": "in_progress", "output": []}})
    answer.add({"type": "response.output_text.delta", "delta": "Hello"})
    assert answer.body is None
    answer.add({"type": "response.completed", "response": RESPONSE})
    assert answer.body == RESPONSE and usage_tokens(RESPONSE) == (7, 5)


def test_replayed_responses_events_are_numbered_and_end_with_response_completed() -> None:
    events = whole_events("responses", {**RESPONSE, "status": "incomplete"})
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert "".join(delta_text(event) for event in events) == "Hello there"


def test_named_events_are_framed_with_their_type() -> None:
    raw = frame(job("messages"), {"type": "message_stop"})
    assert raw == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    assert frame(job("chat"), {"id": "x"}) == b'data: {"id":"x"}\n\n'


@pytest.mark.parametrize(("kind", "body"), [("messages", MESSAGE), ("responses", RESPONSE)])
def test_a_stream_ends_with_what_its_client_lacks(kind: str, body: dict[str, Any]) -> None:
    request = job(kind)
    result = Result(200, body)
    # Nothing relayed (the answer came whole): every event, and no [DONE] (neither API sends one).
    everything = parsed(final_events(request, {}, result, include_usage=False))
    assert [event for _, event in everything] == whole_events(kind, body)
    # Some relayed, the end lost: its closing events, numbered on from what the client has.
    sent: dict[int, Sent] = {}
    for event in whole_events(kind, body)[:3]:
        track(request, sent, event)
    closing = [event for _, event in parsed(final_events(request, sent, result, include_usage=False))]
    assert closing == closing_events(kind, body, 3)
    # All relayed: nothing more.
    for event in whole_events(kind, body)[3:]:
        track(request, sent, event)
    assert sent[0].closed and final_events(request, sent, result, include_usage=False) == []


def test_a_stream_that_fails_ends_with_an_error_event_in_its_apis_shape() -> None:
    failed = error_body("the engines failed", "engine_error", "engine_5xx")
    [(_, event)] = parsed(stream_error(job("messages"), 502, failed, {}))
    assert event == {"type": "error", "error": {"type": "api_error", "message": "the engines failed"}}
    sent: dict[int, Sent] = {}
    track(job("responses"), sent, {"type": "response.created"})
    [(_, event)] = parsed(stream_error(job("responses"), 502, failed, sent))
    assert event == {"type": "error", "code": "engine_5xx", "message": "the engines failed", "param": None,
                     "sequence_number": 1}  # fmt: skip
    data = [item.decode() for item in stream_error(job("chat"), 502, failed, {})]
    assert data[-1] == "data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
     (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"), (502, "api_error"),
     (503, "overloaded_error"), (504, "timeout_error")],
)  # fmt: skip
def test_errors_on_the_messages_routes_take_anthropics_shape(status: int, kind: str) -> None:
    body = error_body("why", "whatever", "code")
    assert anthropic_error(status, body) == {"type": "error", "error": {"type": kind, "message": "why"}}
    assert shaped("/v1/messages", status, body) == anthropic_error(status, body)
    assert shaped("/v1/messages/count_tokens", status, body)["type"] == "error"
    assert shaped("/v1/responses", status, body) == body  # every other route keeps OpenAI's shape
    assert shaped("/v1/messages", 200, MESSAGE) == MESSAGE
