"""The named-event streams of the Responses and Messages APIs, both ways.

Workers pass the engine's events through as they come and put the whole
answer together from them (Assembler): the stored result is the body the
same request would have had without `stream`, so GET /v1/tasks/{id} and a
non-streamed retry read the same thing. The gateway goes the other way when
a client lacks events (an answer that came whole, a replayed stream, lost
events): `whole_events` and `closing_events` make them from that body.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

# The events that end a stream of each API.
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "message_stop"})


def delta_text(event: dict[str, Any]) -> str:
    """The generated text an event adds (empty for the rest)."""
    if event.get("type") == "response.output_text.delta":
        delta = event.get("delta")
        return delta if isinstance(delta, str) else ""
    if event.get("type") == "content_block_delta":
        delta = event.get("delta") or {}
        text = delta.get("text") if isinstance(delta, dict) and delta.get("type") == "text_delta" else None
        return text if isinstance(text, str) else ""
    return ""


@dataclass
class Assembler:
    """The whole answer of a stream, from its events; `body` is None until the stream's end was seen."""

    kind: str
    body: dict[str, Any] | None = None
    events: int = 0
    _message: dict[str, Any] | None = None
    _blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    _json: dict[int, list[str]] = field(default_factory=dict)

    def add(self, event: dict[str, Any]) -> None:
        self.events += 1
        kind = event.get("type")
        if self.kind == "responses":
            if kind in TERMINAL and isinstance(event.get("response"), dict):
                self.body = event["response"]
            return
        index = int(event.get("index") or 0)
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self._message = {**event["message"], "content": []}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self._blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta":
            self._delta(index, event.get("delta") or {})
        elif kind == "message_delta" and self._message is not None:
            delta = event.get("delta") or {}
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    self._message[key] = delta[key]
            if isinstance(event.get("usage"), dict):
                self._message["usage"] = {**(self._message.get("usage") or {}), **event["usage"]}
        elif kind == "message_stop" and self._message is not None:
            for position in sorted(self._blocks):
                block = self._blocks[position]
                if block.get("type") == "tool_use" and position in self._json:
                    text = "".join(self._json[position])
                    block["input"] = json.loads(text) if text.strip() else {}
                self._message["content"].append(block)
            self.body = self._message

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json") or ""))


def _numbered(events: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    return [{**event, "sequence_number": first + number} for number, event in enumerate(events)]


def closing_events(kind: str, body: dict[str, Any], sent: int) -> list[dict[str, Any]]:
    """The events that end a stream whose client lacks its end (`sent`: how many events it has)."""
    if kind == "responses":
        # Whatever the response's status: the pinned vLLM ends every stream with response.completed.
        return _numbered([{"type": "response.completed", "response": body}], sent)
    usage = body.get("usage") or {}
    delta = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
    return [
        {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage.get("output_tokens", 0)}},
        {"type": "message_stop"},
    ]


def whole_events(kind: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of a stream that carries the answer `body`, as the engines write them."""
    if kind == "responses":
        return _response_events(body)
    start = {**copy.deepcopy(body), "content": [], "stop_reason": None, "stop_sequence": None}
    usage = dict(start.get("usage") or {})
    start["usage"] = {**usage, "output_tokens": 0}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(body.get("content") or []):
        kind_of = block.get("type")
        opening: dict[str, Any]
        deltas: list[dict[str, Any]]
        if kind_of == "text":
            opening = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block.get("text") or ""}]
        elif kind_of == "tool_use":
            opening = {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}]
        elif kind_of == "thinking":
            opening = {"type": "thinking", "thinking": ""}
            deltas = [{"type": "thinking_delta", "thinking": block.get("thinking") or ""}]
            if block.get("signature") is not None:
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            continue
        events.append({"type": "content_block_start", "index": index, "content_block": opening})
        events += [{"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas]
        events.append({"type": "content_block_stop", "index": index})
    return events + closing_events(kind, body, len(events))


def _response_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    started = {**body, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for position, item in enumerate(body.get("output") or []):
        if not isinstance(item, dict):
            continue
        opening = {**item, "status": "in_progress"}
        if item.get("type") == "message":
            opening["content"] = []
        elif item.get("type") == "function_call":
            opening["arguments"] = ""
        events.append({"type": "response.output_item.added", "output_index": position, "item": opening})
        if item.get("type") == "function_call":
            arguments = item.get("arguments") or ""
            where = {"output_index": position, "item_id": item.get("id")}
            events.append({"type": "response.function_call_arguments.delta", **where, "delta": arguments})
            events.append({"type": "response.function_call_arguments.done", **where, "arguments": arguments})
        for part_index, part in enumerate(item.get("content") or [] if item.get("type") == "message" else []):
            where = {"output_index": position, "item_id": item.get("id"), "content_index": part_index}
            text = part.get("text") or ""
            events.append({"type": "response.content_part.added", **where, "part": {**part, "text": ""}})
            if part.get("type") == "output_text":
                events.append({"type": "response.output_text.delta", **where, "delta": text, "logprobs": []})
                events.append({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
            events.append({"type": "response.content_part.done", **where, "part": part})
        events.append({"type": "response.output_item.done", "output_index": position, "item": item})
    events = _numbered(events, 0)
    return events + closing_events("responses", body, len(events))
