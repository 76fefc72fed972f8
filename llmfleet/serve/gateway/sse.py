"""Server-sent events of a completion: chunks in OpenAI's shape, and the final result's part a client lacks.

Shared by the relay of a live stream (service.py) and the replay of a finished
one (idempotency.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from llmfleet.serve.queue.jobs import Job, Result

log = logging.getLogger(__name__)

# An SSE comment: clients ignore it, idle-timeout proxies see traffic.
KEEPALIVE = b": keep-alive\n\n"


def sse(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


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


def track(job: Job, sent: dict[int, Sent], chunk: dict[str, Any]) -> None:
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
            out.append({"index": index, "delta": delta, "logprobs": None, "finish_reason": finish})
        else:
            out.append({"index": index, "text": rest, "logprobs": None, "finish_reason": finish})
    return out


def final_events(job: Job, sent: dict[int, Sent], result: Result, include_usage: bool) -> list[bytes]:
    """The events that end a stream once its result is in: what the client lacks, the usage, [DONE]."""
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
