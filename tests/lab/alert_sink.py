"""A test receiver for Alertmanager's notifications: what reaches the operators in the test lab.

Alertmanager posts its chat notifications (a Slack-compatible incoming webhook,
alertmanager_slack_api_url) and the Watchdog (alertmanager_watchdog_url) here,
on the build machine's address on the test lab's network, so a test can see an
outage reach a person's channel and clear, as an operator's chat would show it.
It stands in for the chat service only; Alertmanager, its routing and its
notifier are the real ones.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class AlertSink:
    """Every JSON body posted to it, by path, in arrival order."""

    def __init__(self, address: str, port: int) -> None:
        self._lock = threading.Lock()
        self._posts: list[tuple[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    sink._record(self.path, json.loads(body))
                except ValueError:
                    self.send_response(400)
                else:
                    self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return  # the posts are the record; pytest's output stays readable

        self._server = ThreadingHTTPServer((address, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="alert-sink", daemon=True)

    def _record(self, path: str, body: Any) -> None:
        with self._lock:
            self._posts.append((path, body))

    def __enter__(self) -> AlertSink:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def posts(self, path: str) -> list[Any]:
        with self._lock:
            return [body for posted, body in self._posts if posted == path]

    def chat_titles(self) -> list[str]:
        """The title of each chat notification: "[FIRING:1] RedisDown 10.78.0.20:9121 ...", "[RESOLVED] ..."."""
        return [str(attachment.get("title", "")) for body in self.posts("/chat")
                for attachment in body.get("attachments") or []]
