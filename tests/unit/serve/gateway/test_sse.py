"""A stream's events (llmfleet/serve/gateway/sse.py): chunk order at a gap, and an answer that came whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmfleet.serve.gateway.sse import Sequencer, final_events
from llmfleet.serve.queue.jobs import Job, Result
from tests.queue_tools import sample_job


def job(**changes: object) -> Job:
    """A streamed request admitted at 1000 s: its chunks say `created: 1000`."""
    timing = {"enqueued_ms": 1_000_000, "deadline_ms": 61_000_000, "queue_deadline_ms": 31_000_000}
    return sample_job(**{"stream": True, **timing, **changes})


def events(raw: list[bytes]) -> list[Any]:
    """The data of each event: parsed JSON, or the [DONE] marker as a string."""
    out: list[Any] = []
    for event in raw:
        text = event.decode()
        assert text.startswith("data: ") and text.endswith("\n\n"), text
        data = text[len("data: ") : -2]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chunk_events_in_order_pass_at_once_and_duplicates_are_dropped() -> None:
    order = Sequencer(patience_s=2.0)
    assert order.add(1, "a", now=0.0) == ["a"]
    assert order.add(2, "b", now=0.1) == ["b"]
    assert order.add(2, "b again", now=0.2) == []
    assert order.add(1, "a again", now=0.2) == []
    assert order.wait_s(0.3) is None and not order.pending


def test_an_event_late_within_the_wait_releases_those_held_behind_it() -> None:
    order = Sequencer(patience_s=2.0)
    order.add(1, "a", now=0.0)
    assert order.add(3, "c", now=1.0) == []
    assert order.add(4, "d", now=1.5) == []
    assert order.wait_s(1.5) == pytest.approx(1.5)
    assert order.give_up(2.9) == []  # still within the wait
    assert order.add(2, "b", now=2.9) == ["b", "c", "d"]
    assert order.skipped == 0 and order.wait_s(3.0) is None


def test_a_gap_holds_later_events_only_for_the_wait_then_they_go_on() -> None:
    order = Sequencer(patience_s=2.0)
    order.add(1, "a", now=0.0)
    order.add(3, "c", now=1.0)
    order.add(4, "d", now=1.2)
    assert order.wait_s(3.0) == 0.0
    assert order.give_up(3.0) == ["c", "d"]
    assert order.skipped == 1
    # The missing event coming after all is a duplicate now; later ones flow at once.
    assert order.add(2, "b", now=3.1) == []
    assert order.add(5, "e", now=3.2) == ["e"]


def test_a_second_gap_gets_its_own_wait() -> None:
    order = Sequencer(patience_s=2.0)
    order.add(2, "b", now=0.0)
    order.add(4, "d", now=1.0)
    assert order.give_up(2.0) == ["b"]  # 1 skipped; 3 is missing now, since 2.0
    assert order.wait_s(2.0) == 2.0
    assert order.give_up(3.0) == []
    assert order.give_up(4.0) == ["d"]
    assert order.skipped == 2


def test_a_chat_answer_that_came_whole_is_streamed_as_chunks_with_usage() -> None:
    logprobs = {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}]}
    body = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi there"}, "logprobs": logprobs,
             "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "Hello"}, "logprobs": None,
             "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }  # fmt: skip
    out = events(final_events(job(), {}, Result(200, body), include_usage=True))
    assert out[-1] == "[DONE]"
    chunk, usage = out[0], out[1]
    assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == "chatcmpl-" + "a" * 32
    assert chunk["created"] == 1_000 and chunk["model"] == "tiny"
    assert chunk["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": "Hi there"}, "logprobs": logprobs,
         "finish_reason": "stop"},
        {"index": 1, "delta": {"role": "assistant", "content": "Hello"}, "logprobs": None, "finish_reason": "length"},
    ]  # fmt: skip
    assert usage["choices"] == [] and usage["usage"] == body["usage"]
    assert len(out) == 3


def test_a_completion_that_came_whole_is_streamed_as_text_completion_chunks_without_usage_unasked() -> None:
    logprobs = {"tokens": ["Hi"], "token_logprobs": [-0.1], "top_logprobs": None, "text_offset": [0]}
    body = {
        "choices": [{"index": 0, "text": "Hi", "logprobs": logprobs, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    out = events(final_events(job(kind="completion"), {}, Result(200, body), include_usage=False))
    assert out[0]["object"] == "text_completion" and out[0]["id"] == "cmpl-" + "a" * 32
    assert out[0]["choices"] == [{"index": 0, "text": "Hi", "logprobs": logprobs, "finish_reason": "stop"}]
    assert out[1:] == ["[DONE]"]


def test_an_error_result_is_one_openai_error_event_then_done() -> None:
    body = {"error": {"message": "the client cancelled the request", "type": "cancelled", "code": "client_closed"}}
    assert events(final_events(job(), {}, Result(499, body), include_usage=True)) == [body, "[DONE]"]
