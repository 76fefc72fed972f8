"""Pure ASGI middleware (no BaseHTTPMiddleware: it would break disconnect detection and streaming).

- BodyLimit: a request body over max_body_bytes is answered 413 before any
  route (and any JSON parser) sees it.
- Metrics: request counts and latency by route template and status.
- RequestId (outermost): every request gets an id, sent back as
  `x-request-id` on every response, errors included, and used as the job's
  id once queued; an exception nothing else handled becomes an
  OpenAI-shaped 500 (the traceback goes to the log with the id, never to
  the client).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmfleet.serve.gateway.metrics import GatewayMetrics
from llmfleet.serve.queue.jobs import error_body

log = logging.getLogger(__name__)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] = []) -> None:  # noqa: B006  # never mutated
    content = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(content)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_large = error_body(
            f"the request body is larger than this gateway's limit of {self.max_bytes} bytes",
            "invalid_request_error",
            "body_too_large",
        )
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_json(send, 400, error_body("bad Content-Length", "invalid_request_error", None))
                    return
                if declared > self.max_bytes:
                    await _send_json(send, 413, too_large)
                    return
        # Read the body here (it is small: at most max_bytes) and replay it.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, too_large)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


class Metrics:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "other"  # bounded labels, whatever is sent
            self.metrics.requests.labels(template, method, str(status)).inc()
            self.metrics.latency.labels(template).observe(time.perf_counter() - started)


def request_id(scope: Scope) -> str:
    """The id RequestId gave this request."""
    return str(scope.get("state", {}).get("request_id") or "")


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        header = (b"x-request-id", rid.encode())
        started = False

        async def tagged(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(name, value) for name, value in message.get("headers", []) if name != b"x-request-id"]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        try:
            await self.app(scope, receive, tagged)
        except Exception:
            log.exception("request %s (%s %s) failed", rid, scope.get("method"), scope.get("path"))
            if started:
                raise  # the status line is out: all that is left is to drop the connection
            body = error_body(
                f"internal error; quote request id {rid} when reporting it", "server_error", "internal_error"
            )
            await _send_json(send, 500, body, [header])
