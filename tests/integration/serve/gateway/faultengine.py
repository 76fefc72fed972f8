"""FAULT INJECTOR: an engine process that dies on a marker in the request, in front of the real vLLM.

    python -m tests.integration.serve.gateway.faultengine PORT UPSTREAM MARKER

Everything is passed to the real engine at UPSTREAM (health checks, model
list, completions) except a POST whose body contains MARKER: then the process
exits at once (os._exit), without answering, as an engine whose core crashes
on a request drops its connections and stops answering /health. Real vLLM
cannot be made to crash on demand (the crash seen in the lab, logprobs on an
image without a compiler, is fixed); this stands in for it and for nothing
else.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultEngine(BaseHTTPRequestHandler):
    upstream = ""
    marker = b""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _relay(self, body: bytes | None) -> None:
        url = f"{self.upstream}{self.path}"  # upstream is the test's http:// loopback engine
        request = urllib.request.Request(url, data=body, method=self.command)  # noqa: S310
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:  # noqa: S310  # loopback engine
                status, content, kind = answer.status, answer.read(), answer.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            status, content, kind = error.code, error.read(), error.headers.get("Content-Type", "")
        self.send_response(status)
        self.send_header("Content-Type", kind or "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def do_GET(self) -> None:
        self._relay(None)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.marker in body:
            os._exit(70)  # the crash: no answer, connections dropped, the port closed
        self._relay(body)


def main() -> None:
    port, upstream, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    handler = type("Handler", (FaultEngine,), {"upstream": upstream, "marker": marker.encode()})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
