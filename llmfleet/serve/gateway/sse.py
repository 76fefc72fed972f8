"""Server-sent events of a completion: chunks in OpenAI's shape, and the final result's part a client lacks.

Shared by the relay of a live stream (service.py) and the replay of a finished
one (idempotency.py); Sequencer puts a live stream's chunk events in order.
The Responses and Messages APIs stream named events (`event: <type>`) and
end without `[DONE]`; their events pass through as the engine wrote them, and
what a client lacks is made from the whole answer (queue.events).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from llmfleet.serve.gateway.errors import anthropic_error
from llmfleet.serve.queue.events import TERMINAL, closing_events, delta_text, whole_events
from llmfleet.serve.queue.jobs import EVENT_KINDS, Job, Result

log = logging.getLogger(__name__)

# An SSE comment: clients ignore it, idle-timeout proxies see traffic.
KEEPALIVE = b": keep-alive\n\n"
# The response headers of every stream (besides its content type): no caching, no proxy buffering.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


def frame(job: Job, data: dict[str, Any]) -> bytes:
    """One relayed event as its API frames it: `data:` alone, or with `event: <type>` for the named-event APIs."""
    text = json.dumps(data, separators=(",", ":"))
    if job.kind in EVENT_KINDS:
        return f"event: {data.get('type')}\ndata: {text}\n\n".encode()
    return sse(text)


def stream_error(job: Job, status: int, body: dict[str, Any], sent: dict[int, Sent]) -> list[bytes]:
    """The events that end a stream with an error, in the API's own shape."""
    if job.kind == "messages":
        return [frame(job, anthropic_error(status, body))]
    if job.kind == "responses":
        found = body.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        have = sent.get(0, Sent()).events
        event = {"type": "error", "code": error.get("code"), "message": error.get("message")}
        return [frame(job, {**event, "param": error.get("param"), "sequence_number": have})]
    return [sse(json.dumps(body)), sse("[DONE]")]


def chunk(job: Job, choices: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "id": f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{job.id}",
            "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
            "created": job.enqueued_ms // 1000,
            "model": job.model,
            "choices": choices,
        }
    )


@dataclass
class Sent:
    """What the client has of one choice: its text, and whether any tool call delta reached it."""

    text: list[str] = field(default_factory=list)
    tool_calls: bool = False
    # The named-event APIs: how many events the client has, and whether the stream's end is among them.
    events: int = 0
    closed: bool = False


def track(job: Job, sent: dict[int, Sent], chunk: dict[str, Any]) -> None:
    if job.kind in EVENT_KINDS:
        into = sent.setdefault(0, Sent())
        into.events += 1
        into.closed = into.closed or chunk.get("type") in TERMINAL
        into.text.append(delta_text(chunk))
        return
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        into = sent.setdefault(int(choice.get("index") or 0), Sent())
        if job.kind == "chat":
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                into.text.append(delta["content"])
            if delta.get("tool_calls"):
                into.tool_calls = True
        elif isinstance(choice.get("text"), str):
            into.text.append(choice["text"])


def remainder(job: Job, sent: dict[int, Sent], body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunk choices that complete what the client has, from the final result (after lost chunks)."""
    out = []
    for choice in body.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        index = int(choice.get("index") or 0)
        have = sent.get(index, Sent())
        already = "".join(have.text)
        message: dict[str, Any] = (choice.get("message") or {}) if job.kind == "chat" else {}
        value = message.get("content") if job.kind == "chat" else choice.get("text")
        full: str = value if isinstance(value, str) else ""
        if not full.startswith(already):
            log.error("request %s: streamed text of choice %d is not a prefix of the final result", job.id, index)
            rest = ""
        else:
            rest = full[len(already) :]
        finish = choice.get("finish_reason")
        calls = message.get("tool_calls") if not have.tool_calls else None
        if not rest and not calls and index in sent:
            continue  # the client has all of it
        if job.kind == "chat":
            delta: dict[str, Any] = {"content": rest} if rest or index not in sent else {}
            if calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
            if index not in sent:
                delta = {"role": "assistant", **delta}
        # A choice the client has nothing of gets its logprobs too (the chunk's shape is the result's);
        # those of a remainder cannot be split from what was streamed.
        logprobs = choice.get("logprobs") if index not in sent else None
        if job.kind == "chat":
            out.append({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
        else:
            out.append({"index": index, "text": rest, "logprobs": logprobs, "finish_reason": finish})
    return out


def final_events(job: Job, sent: dict[int, Sent], result: Result, include_usage: bool) -> list[bytes]:
    """The events that end a stream once its result is in: what the client lacks, the usage, [DONE]."""
    if job.kind in EVENT_KINDS:
        return _final_named(job, sent, result)
    events = []
    if result.status != 200:
        events.append(sse(json.dumps(result.body)))
    else:
        # Whatever the client lacks (lost chunks, or an answer that was complete before any chunk
        # was relayed) comes from the final result.
        choices = remainder(job, sent, result.body)
        if choices:
            events.append(sse(chunk(job, choices)))
        if include_usage and result.body.get("usage"):
            usage_chunk = json.loads(chunk(job, []))
            usage_chunk["usage"] = result.body["usage"]
            events.append(sse(json.dumps(usage_chunk)))
    events.append(sse("[DONE]"))
    return events


def _final_named(job: Job, sent: dict[int, Sent], result: Result) -> list[bytes]:
    """A named-event stream's end: all of it when the client has nothing, its closing events when it lacks them."""
    if result.status != 200:
        return stream_error(job, result.status, result.body, sent)
    have = sent.get(0, Sent())
    if have.closed:
        return []
    if have.events == 0:
        events = whole_events(job.kind, result.body)
    else:
        # Events went missing on the way: the closing events carry the whole answer (a Responses client reads
        # it from response.completed; a Messages client gets the stop reason and usage).
        log.warning("request %s: the stream's end never came as events; closing it from the final result", job.id)
        events = closing_events(job.kind, result.body, have.events)
    return [frame(job, event) for event in events]


@dataclass
class Sequencer:
    """A live stream's chunk events (numbered 1, 2, ... by seq) in order, with a bounded wait at a gap.

    Workers number a request's chunk events in the same atomic step that adds
    them to the reply stream, so they arrive in order; a missing number means
    events were lost on the way (trimmed from a reply stream read too late,
    or lost with Redis's last writes) and will not come later. Events after a
    gap are held for at most `patience_s`: if the final result comes within it,
    it fills in everything from where the client is (exact text); past it, the
    relay skips the missing numbers and goes on, so a gap costs a bounded
    pause, not every later chunk.
    """

    patience_s: float
    expected: int = 1
    pending: dict[int, str] = field(default_factory=dict)
    gap_since: float | None = None
    skipped: int = 0

    def add(self, seq: int, data: str, now: float) -> list[str]:
        """Take chunk event `seq`; the data of the events now ready to relay, in order (duplicates ignored)."""
        if seq >= self.expected and seq not in self.pending:
            self.pending[seq] = data
        return self._ready(now)

    def wait_s(self, now: float) -> float | None:
        """How long the relay may still wait for a missing event; None without a gap."""
        if self.gap_since is None:
            return None
        return max(self.patience_s - (now - self.gap_since), 0.0)

    def give_up(self, now: float) -> list[str]:
        """Once a gap has waited patience_s: skip the missing numbers and return what follows them."""
        wait = self.wait_s(now)
        if wait is None or wait > 0:
            return []
        first = min(self.pending)
        self.skipped += first - self.expected
        self.expected = first
        return self._ready(now)

    def _ready(self, now: float) -> list[str]:
        out = []
        while self.expected in self.pending:
            out.append(self.pending.pop(self.expected))
            self.expected += 1
        if not self.pending:
            self.gap_since = None
        elif out or self.gap_since is None:
            self.gap_since = now  # a new gap (or one left after progress) gets its own wait
        return out
