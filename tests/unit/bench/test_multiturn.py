"""`llmfleet bench multiturn`: its workload, its stream and metrics parsing, its report arithmetic and its
documents, and whole conversations against a fake vLLM on loopback.

A run against the lab's engines is in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from llmfleet.bench import loadgen, multiturn
from llmfleet.bench.loadgen import Report, Sample
from llmfleet.bench.multiturn import (
    TENANTS,
    WORDS,
    Conversation,
    Row,
    Turn,
    Workload,
    appended,
    cache_counters,
    converse,
    document,
    opening,
    parse_paths,
    plan_conversation,
    rows_of,
    saturated,
    streamed_answer,
    summarize,
    tenant_prompt,
    turn_body,
)
from llmfleet.errors import LlmfleetError

# --- the workload -------------------------------------------------------------------------


def test_a_tenants_system_prompt_is_the_same_for_the_same_seed_and_its_own_for_each_tenant() -> None:
    workload = Workload(system_words=12)
    prompt = tenant_prompt(workload, 3)
    assert prompt == tenant_prompt(Workload(system_words=12), 3)
    assert prompt.startswith("You are assistant 3 of this service. ")
    words = prompt.removeprefix("You are assistant 3 of this service. ").split()
    assert len(words) == 12 and set(words) <= set(WORDS)
    assert len({tenant_prompt(workload, tenant) for tenant in range(TENANTS)}) == TENANTS
    assert tenant_prompt(Workload(system_words=12, seed=1), 3) != prompt


def test_a_conversation_is_planned_from_the_run_and_its_number_alone() -> None:
    workload = Workload(turns=3, document_words=20)
    conversation = plan_conversation(workload, "n0nce", 5)
    assert conversation == plan_conversation(Workload(turns=3, document_words=20), "n0nce", 5)
    assert conversation.document.startswith("Document n0nce-5: ")
    document_words = conversation.document.removeprefix("Document n0nce-5: ").split()
    assert len(document_words) == 20 and set(document_words) <= set(WORDS)
    # Its own document: another number or another run's nonce gives another.
    assert plan_conversation(workload, "n0nce", 6).document != conversation.document
    assert plan_conversation(workload, "other", 5).document.split(": ", 1)[1].split() != document_words
    # Its tenant's system prompt: number % TENANTS, shared with that tenant's other conversations.
    assert conversation.system == tenant_prompt(workload, 5 % TENANTS)
    assert plan_conversation(workload, "other", 5 + TENANTS).system == conversation.system
    assert plan_conversation(workload, "n0nce", 6).system != conversation.system
    # One question a turn, numbered.
    assert len(conversation.questions) == 3 and len(set(conversation.questions)) == 3
    assert [question.split(":")[0] for question in conversation.questions] == [
        "Question 1",
        "Question 2",
        "Question 3",
    ]
    assert all(question.endswith("?") for question in conversation.questions)
    assert len(plan_conversation(Workload(turns=5), "n0nce", 5).questions) == 5


def test_the_opening_is_the_system_prompt_then_the_document_with_the_first_question() -> None:
    conversation = Conversation("Be brief.", "Document x-1: sea salt", ("Question 1: why?", "Question 2: how?"))
    assert opening(conversation) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Document x-1: sea salt\n\nQuestion 1: why?"},
    ]


def test_a_turns_request_streams_with_the_usage_and_carries_the_conversation() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
    body = json.loads(turn_body(Workload(max_tokens=7, model="tiny-chat"), messages))
    assert body == {
        "model": "tiny-chat",
        "messages": messages,
        "max_tokens": 7,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# --- streams ------------------------------------------------------------------------------


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    """A vLLM chat.completion.chunk event (usage null until the last event, as with include_usage)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return _event(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "tiny",
            "choices": [choice],
            "usage": None,
        }
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    return _event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "choices": [], "usage": usage})


DONE = b"data: [DONE]\n\n"


def _stream(parts: list[str], prompt_tokens: int, completion_tokens: int) -> list[bytes]:
    """The events of a streamed chat answer made of these text deltas, as vLLM sends them."""
    texts = [_chunk({"content": part}) for part in parts[:-1]]
    last = _chunk({"content": parts[-1]}, finish_reason="length")
    return [_chunk({"role": "assistant", "content": ""}), *texts, last, _usage(prompt_tokens, completion_tokens), DONE]


def test_a_streamed_answer_is_its_deltas_joined_with_the_usage_events_counts() -> None:
    body = b"".join(_stream(["The", " sea", " is", " salt"], prompt_tokens=431, completion_tokens=4))
    assert streamed_answer(body) == ("The sea is salt", 431, 4)
    # A delta without content (a last event holding only the finish reason) adds nothing.
    body = b"".join([_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hi"}), _chunk({}, "length")])
    assert streamed_answer(body + _usage(9, 1) + DONE) == ("Hi", 9, 1)


def test_a_stream_that_is_not_a_whole_answer_is_refused() -> None:
    events = _stream(["The", " sea"], prompt_tokens=9, completion_tokens=2)
    failed = _event({"error": {"object": "error", "message": "engine failed", "code": 500}})
    with pytest.raises(ValueError, match=r"ended with an error: .*engine failed"):
        streamed_answer(b"".join([*events[:2], failed, DONE]))
    with pytest.raises(ValueError, match="no usage event"):
        streamed_answer(b"".join(event for event in events if b'"choices": []' not in event))


# --- the engines' prefix-cache counters -----------------------------------------------------

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 800.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7500000012e+09
vllm:prefix_cache_queries_created{engine="1",model_name="tiny"} 1.7500000012e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 600.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 150.0
# HELP vllm:prefix_cache_hits_created Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_created gauge
vllm:prefix_cache_hits_created{engine="0",model_name="tiny"} 1.7500000012e+09
vllm:prefix_cache_hits_created{engine="1",model_name="tiny"} 1.7500000012e+09
"""

OLD_METRICS = """\
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="tiny"} 500.0
vllm:gpu_prefix_cache_queries_created{model_name="tiny"} 1.7500000012e+09
vllm:gpu_prefix_cache_hits_total{model_name="tiny"} 320.0
vllm:gpu_prefix_cache_hits_created{model_name="tiny"} 1.7500000012e+09
"""


def test_cache_counters_sum_every_series_of_the_counters_and_nothing_else() -> None:
    # 1200 + 800 looked up, 600 + 150 found: not the _created timestamps, not the comments, not other metrics.
    assert cache_counters(METRICS) == (2000.0, 750.0)
    assert cache_counters("vllm:prefix_cache_queries_total 40.0\nvllm:prefix_cache_hits_total 10.0\n") == (40.0, 10.0)


def test_cache_counters_fall_back_to_the_older_names_and_prefer_the_current_ones() -> None:
    assert cache_counters(OLD_METRICS) == (500.0, 320.0)
    # 0.9.2 exports both spellings of the same counters: read once, by the current name.
    assert cache_counters(OLD_METRICS + METRICS) == (2000.0, 750.0)


def test_cache_counters_are_none_without_either_name() -> None:
    assert cache_counters("") is None
    assert cache_counters(METRICS.split("# HELP vllm:prefix_cache_queries_total")[0]) is None
    assert cache_counters("vllm:prefix_cache_queries_created 1.75e+09\n") is None


# --- the row: report arithmetic -----------------------------------------------------------

WINDOW = (10.0, 20.0)
TURNS = [
    Turn(0, Sample(9.0, 9.5, "ok", 16, 9.1), 100),  # due in the warm-up: nowhere but throughput's window
    Turn(0, Sample(10.0, 10.5, "ok", 16, 10.2), 120),  # an opening turn: TTFT 200 ms, not a later turn's
    Turn(1, Sample(11.0, 11.4, "ok", 16, 11.05), 200),  # later turns: TTFT 50, 100 and 30 ms
    Turn(2, Sample(12.0, 12.6, "ok", 16, 12.1), 300),
    Turn(1, Sample(13.0, 13.1, "500")),  # a failed turn: an error, no prompt
    Turn(3, Sample(19.5, 20.5, "ok", 16, 19.53), 400),  # due in the window, answered after it
    Turn(1, Sample(20.0, 20.2, "ok", 16, 20.01), 999),  # due at the window's end: the ramp-down, nowhere
]


def test_a_row_counts_the_turns_due_in_the_window_and_later_turns_ttft_without_the_openings() -> None:
    row = summarize("gateway-prefix_affinity", 2.0, TURNS, WINDOW, started=7, caches={})
    assert (row.path, row.rate, row.conversations) == ("gateway-prefix_affinity", 2.0, 7)
    report = row.report
    assert (report.requests, report.ok, report.errors) == (5, 4, {"500": 1})
    assert (report.answers_in_window, report.throughput_rps) == (3, 0.3)
    # Every answered turn's TTFT: 30, 50, 100, 200 ms; the later turns': 30, 50, 100.
    assert (report.ttft_p50_ms, report.ttft_p95_ms) == (50.0, 200.0)
    assert (row.later_ttft_p50_ms, row.later_ttft_p95_ms) == (50.0, 100.0)
    # The answered turns due in the window: 120, 200, 300 and 400 prompt tokens.
    assert (row.prompt_tokens_mean, row.prompt_tokens_max) == (255.0, 400)


def test_a_row_without_later_turns_has_no_later_ttft() -> None:
    row = summarize("direct", 2.0, TURNS[:2], WINDOW, started=1, caches={})
    assert row.report.ttft_p50_ms == 200.0
    assert (row.later_ttft_p50_ms, row.later_ttft_p95_ms) == (None, None)
    row = summarize("direct", 2.0, [], WINDOW, started=0, caches={})
    assert (row.prompt_tokens_mean, row.prompt_tokens_max, row.report.requests) == (0.0, 0, 0)


def test_the_hit_rate_and_shares_are_of_the_windows_prompt_tokens_over_all_engines() -> None:
    caches = {
        "http://127.0.0.1:8001": ((100.0, 40.0), (1100.0, 640.0)),  # 1000 looked up, 600 found
        "http://127.0.0.1:8002": ((50.0, 0.0), (3050.0, 1560.0)),  # 3000 looked up, 1560 found
    }
    row = summarize("direct", 2.0, TURNS, WINDOW, started=7, caches=caches)
    assert (row.cache_queries, row.cache_hits) == (4000.0, 2160.0)
    assert row.hit_rate == 0.54
    assert row.engine_shares == {"http://127.0.0.1:8001": 0.25, "http://127.0.0.1:8002": 0.75}


def test_no_prompt_tokens_looked_up_means_no_hit_rate() -> None:
    idle = {"http://127.0.0.1:8001": ((100.0, 40.0), (100.0, 40.0))}
    for caches in (idle, {}):
        row = summarize("direct", 2.0, TURNS, WINDOW, started=7, caches=caches)
        assert (row.cache_queries, row.cache_hits, row.hit_rate, row.engine_shares) == (0.0, 0.0, None, {})


def _row(path: str, rate: float, throughput: float, errors: dict[str, int] | None = None) -> Row:
    report = Report(label=path, url="", mode="rate", load=rate, duration_s=10.0)
    report.throughput_rps, report.errors = throughput, errors or {}
    report.requests = report.ok = int(throughput * 10)
    return Row(path, rate, report, conversations=int(rate * 10), hit_rate=0.5, engine_shares={"e": 1.0})


def test_a_rate_is_saturated_below_its_share_of_the_turns_asked_for_or_at_any_error() -> None:
    # 2 conversations a second of 4 turns: 8 turns a second asked for, 7.6 (95%) enough.
    assert not saturated(_row("direct", 2.0, 8.0), turns=4)
    assert not saturated(_row("direct", 2.0, 7.6), turns=4)
    assert saturated(_row("direct", 2.0, 7.59), turns=4)
    assert not saturated(_row("direct", 2.0, 5.8), turns=3)  # 6 asked for at 3 turns
    assert saturated(_row("direct", 2.0, 8.0, {"timeout": 1}), turns=4)


# --- the document and --append ------------------------------------------------------------


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "warmup": 5.0,
        "duration": 30.0,
        "engine_url": ["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
    }
    return argparse.Namespace(**{**values, **overrides})


def _document(rows: list[Row], workload: Workload | None = None, **args: object) -> dict[str, Any]:
    # Four turns unless told: the rows' throughputs (8 turns a second at 2 conversations) assume it.
    argv = ["bench", "multiturn", "--paths", ",".join(row.path for row in rows)]
    return document(_args(**args), workload or Workload(turns=4), rows, argv)


def test_appending_adds_the_later_runs_rows_and_command_to_the_earlier_ones() -> None:
    earlier = _document([_row("direct", 2.0, 8.0), _row("direct", 4.0, 12.0)])
    later = _document([_row("gateway-prefix_affinity", 2.0, 8.0)])
    merged = appended(earlier, later, Path("out/bench/multiturn.json"))
    assert [row["path"] for row in merged["rows"]] == ["direct", "direct", "gateway-prefix_affinity"]
    assert [row["saturated"] for row in merged["rows"]] == [False, True, False]
    assert merged["commands"] == [
        ["llmfleet", "bench", "multiturn", "--paths", "direct,direct"],
        ["llmfleet", "bench", "multiturn", "--paths", "gateway-prefix_affinity"],
    ]
    assert (merged["workload"], merged["window"], merged["engines"]) == (
        earlier["workload"],
        earlier["window"],
        earlier["engines"],
    )


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"workload": Workload(turns=3)}, "workload"),
        ({"duration": 60.0}, "window"),
        ({"engine_url": ["http://127.0.0.1:8001"]}, "engines"),
    ],
)
def test_appending_a_run_of_another_workload_window_or_engines_is_refused(changes: dict[str, Any], key: str) -> None:
    earlier = _document([_row("direct", 2.0, 8.0)])
    later = _document([_row("gateway-least_outstanding", 2.0, 8.0)], **changes)
    with pytest.raises(LlmfleetError, match=rf"--append: out/m.json was run with another {key} "):
        appended(earlier, later, Path("out/m.json"))


def test_appending_a_path_already_there_is_refused() -> None:
    earlier = _document([_row("direct", 2.0, 8.0), _row("gateway-prefix_affinity", 2.0, 8.0)])
    later = _document([_row("gateway-prefix_affinity", 4.0, 16.0)])
    with pytest.raises(LlmfleetError, match="already holds rows of gateway-prefix_affinity"):
        appended(earlier, later, Path("out/m.json"))


def test_rows_come_back_from_a_saved_document_as_they_went_in() -> None:
    rows = [_row("direct", 2.0, 8.0), _row("vllm-router", 4.0, 12.0, {"502": 2})]
    rows[0].later_ttft_p50_ms, rows[0].prompt_tokens_max = 41.5, 431
    rows[1].report.ttft_p95_ms, rows[1].report.cpu_ms_per_request = 80.2, {"gateway": 1.5}
    saved = json.loads(json.dumps(_document(rows)))
    assert "saturated" in saved["rows"][0]
    assert rows_of(saved) == rows


# --- --paths ------------------------------------------------------------------------------


def _path_args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "gateway_url": "http://127.0.0.1:8080",
        "token_file": "token",
        "gateway_policy": "prefix_affinity",
    }
    return argparse.Namespace(**{**values, **overrides})


def test_paths_are_taken_in_the_order_given() -> None:
    assert parse_paths(" gateway, direct ,vllm-router-cache-aware", _path_args()) == [
        "gateway",
        "direct",
        "vllm-router-cache-aware",
    ]
    assert parse_paths("direct", _path_args(gateway_url=None, token_file=None, gateway_policy=None)) == ["direct"]


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("direct,nginx", {}, "choose from direct, vllm-router, vllm-router-cache-aware, gateway, each at most once"),
        ("direct,vllm-router,direct", {}, "each at most once"),
        (",", {}, "choose from"),
        ("direct,gateway", {"gateway_policy": None}, r"--paths gateway needs .*--gateway-policy"),
        ("gateway", {"gateway_url": None}, "--paths gateway needs --gateway-url"),
    ],
)
def test_bad_paths_are_refused_clearly(text: str, overrides: dict[str, object], message: str) -> None:
    with pytest.raises(LlmfleetError, match=message):
        parse_paths(text, _path_args(**overrides))


# --- whole conversations against a fake vLLM ----------------------------------------------


async def _fake_vllm(fail_at: int | None = None) -> tuple[asyncio.Server, list[dict[str, Any]]]:
    """A loopback server that answers the n-th chat request (from 0) with a stream like vLLM's.

    Its answer is "Answer n." in two deltas, with 100 + n prompt tokens and 2 completion tokens; request
    `fail_at` gets a 500 instead. Returns the server and the bodies of the requests it got, in order.
    """
    bodies: list[dict[str, Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                number = len(bodies)
                bodies.append(json.loads(await reader.readexactly(length)))
                if number == fail_at:
                    error = json.dumps({"object": "error", "message": "engine died", "code": 500}).encode()
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n")
                    writer.write(b"content-length: %d\r\n\r\n%s" % (len(error), error))
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                for event in _stream(["Answer", f" {number}."], prompt_tokens=100 + number, completion_tokens=2):
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                    await asyncio.sleep(0.005)
                writer.write(b"0\r\n\r\n")
                await writer.drain()

    return await asyncio.start_server(handle, "127.0.0.1", 0), bodies


def _converse(
    workload: Workload, conversation: Conversation, fail_at: int | None = None
) -> tuple[list[Turn], list[dict[str, Any]]]:
    async def main() -> tuple[list[Turn], list[dict[str, Any]]]:
        server, bodies = await _fake_vllm(fail_at)
        port = server.sockets[0].getsockname()[1]
        target = loadgen.Target(f"http://127.0.0.1:{port}/v1/chat/completions", b"", {}, 4, stream=True)
        async with server:
            try:
                turns = await converse(workload, conversation, lambda: target, time.perf_counter())
            finally:
                target.close()
        return turns, bodies

    return asyncio.run(main())


def test_each_turn_replays_the_conversation_with_the_answers_as_streamed() -> None:
    workload = Workload(turns=3, system_words=5, document_words=8, max_tokens=2)
    conversation = plan_conversation(workload, "n0nce", 1)
    turns, bodies = _converse(workload, conversation)
    assert len(bodies) == 3
    assert all(body["stream"] and body["stream_options"] == {"include_usage": True} for body in bodies)
    assert all((body["model"], body["max_tokens"], body["ignore_eos"]) == ("tiny", 2, True) for body in bodies)
    assert bodies[0]["messages"] == opening(conversation)
    for number in (1, 2):
        assert bodies[number]["messages"] == [
            *bodies[number - 1]["messages"],
            {"role": "assistant", "content": f"Answer {number - 1}."},
            {"role": "user", "content": conversation.questions[number]},
        ]
    assert [turn.number for turn in turns] == [0, 1, 2]
    assert [turn.sample.outcome for turn in turns] == ["ok"] * 3
    assert [turn.prompt_tokens for turn in turns] == [100, 101, 102]
    assert [turn.sample.completion_tokens for turn in turns] == [2] * 3
    for turn in turns:
        first = turn.sample.first_token
        assert first is not None and turn.sample.due < first < turn.sample.done
    # Each later turn is due when the one before it was answered, not when the conversation began.
    assert turns[1].sample.due >= turns[0].sample.done and turns[2].sample.due >= turns[1].sample.done


def test_a_conversation_stops_at_its_first_failed_turn() -> None:
    workload = Workload(turns=3, system_words=5, document_words=8, max_tokens=2)
    turns, bodies = _converse(workload, plan_conversation(workload, "n0nce", 2), fail_at=1)
    assert len(bodies) == 2
    assert [(turn.number, turn.sample.outcome) for turn in turns] == [(0, "ok"), (1, "500")]
    assert (turns[1].prompt_tokens, turns[1].sample.first_token) == (0, None)


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    multiturn.register(parser.add_subparsers())
    return parser.parse_args(["multiturn", *argv])


def test_append_is_checked_before_any_load(tmp_path: Path) -> None:
    # The engine URL answers nothing: a run that got as far as loading it would fail otherwise, not on the file.
    out = tmp_path / "multiturn.json"
    engine = ["--engine-url", "http://127.0.0.1:9", "--paths", "direct", "--duration", "30", "--warmup", "5"]
    args = _parsed(*engine, "--turns", "3", "--append", "--out", str(out))
    with pytest.raises(LlmfleetError, match="does not exist; run without --append first"):
        multiturn.run(args)
    out.write_text("not json")
    with pytest.raises(LlmfleetError, match=r"cannot read .*give the file bench multiturn wrote"):
        multiturn.run(args)
    out.write_text(json.dumps(_document([_row("vllm-router", 2.0, 8.0)], engine_url=["http://127.0.0.1:9"])))
    with pytest.raises(LlmfleetError, match="another workload"):
        multiturn.run(args)
    out.write_text(json.dumps(_document([_row("direct", 2.0, 8.0)], engine_url=["http://127.0.0.1:9"])))
    with pytest.raises(LlmfleetError, match="already holds rows of direct"):
        multiturn.run(_parsed(*engine, "--turns", "4", "--append", "--out", str(out)))
    assert json.loads(out.read_text())["rows"][0]["path"] == "direct"  # the earlier document is left as it was
