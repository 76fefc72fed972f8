"""`llmfleet bench compare` on every path and `llmfleet bench locust`, at a tiny load on the real stack.

So neither can rot unnoticed: compare starts the pinned LiteLLM proxy and
vllm-router in front of the stack's real vLLM-CPU engine and loads direct, both
peers and our gateway for a few seconds each; Locust, from its pinned venv,
sends its requests to the gateway through a recording proxy, beside
`llmfleet bench`'s own. Only the counting and the request are checked, never
the speed.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmfleet.bench import compare, loadgen, peers
from tests.integration.serve.gateway.gatewaystack import Stack, bench_token_file, serving
from tests.tools import LLMFLEET

pytestmark = pytest.mark.vllm

RATE = 2.0  # req/s: one low rung
DURATION_S = 3.0
MAX_TOKENS = 8


def test_compare_loads_every_path_on_the_real_engine_and_relates_each_to_direct(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    command = [
        *LLMFLEET, "bench", "compare", "--engine-url", stack.vllm.url,
        "--gateway-url", stack.url, "--token-file", str(bench_token_file(stack, tmp_path)),
        "--rates", f"{RATE:g}", "--duration", f"{DURATION_S:g}", "--warmup", "1", "--max-tokens", str(MAX_TOKENS),
        "--workdir", str(tmp_path / "compare"), "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    document = json.loads(out.read_text())
    # With a gateway URL every path runs by default, in compare's order, each at the one rate.
    assert document["paths"] == list(compare.PATHS)
    rows = {row["path"]: row for row in document["rows"]}
    assert [row["path"] for row in document["rows"]] == list(compare.PATHS)
    assert all(row["rate"] == RATE for row in rows.values())
    pinned = {name: peers.version(peers.PEERS[name]) for name in (peers.LITELLM, peers.VLLM_ROUTER)}
    assert document["versions"] == pinned
    direct = rows[compare.DIRECT]["report"]
    for path, row in rows.items():
        report = row["report"]
        # The open loop's window holds ceil(rate x duration) requests; every one answered, none failed.
        assert report["requests"] == math.ceil(RATE * DURATION_S), (path, report)
        assert report["ok"] == report["requests"] and report["errors"] == {}, (path, report)
        assert report["answers_in_window"] > 0 and report["completion_tokens"] > 0, (path, report)
        assert report["throughput_rps"] == pytest.approx(report["answers_in_window"] / report["duration_s"], abs=0.01)
        # Each row against direct at the same rate, from the two reports' own figures.
        assert row["throughput_ratio"] == round(report["throughput_rps"] / direct["throughput_rps"], 3), path
        for name in ("p50", "p95", "p99"):
            assert row[f"added_{name}_ms"] == round(report[f"{name}_ms"] - direct[f"{name}_ms"], 1), (path, name)
        # A path with processes of its own (a peer's group; gateway, worker, Redis) has their CPU figure.
        # Only LiteLLM's is sure to be above 0 at this load: it spends tens of ms a request, the others
        # a few, and /proc counts in 10 ms ticks.
        if path == compare.DIRECT:
            assert row["path_cpu_ms_per_request"] is None
        else:
            assert row["path_cpu_ms_per_request"] >= 0, (path, row)
    assert rows[peers.LITELLM]["path_cpu_ms_per_request"] > 0, rows[peers.LITELLM]
    assert rows[compare.DIRECT]["throughput_ratio"] == 1.0
    table = [line for line in result.stdout.splitlines() if line.startswith("| ") and "req/s |" in line]
    assert [line.split(" | ")[0].removeprefix("| ") for line in table] == list(compare.PATHS)


class RecordingProxy(BaseHTTPRequestHandler):
    """Records each POST as (path, Authorization, body) and passes it on to `upstream` unchanged; keep-alive."""

    protocol_version = "HTTP/1.1"
    upstream: str
    seen: list[tuple[str, str | None, bytes]]
    lock: threading.Lock

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        authorization = self.headers.get("Authorization")
        with self.lock:
            self.seen.append((self.path, authorization, body))
        headers = {"Content-Type": self.headers.get("Content-Type") or ""}
        if authorization is not None:
            headers["Authorization"] = authorization
        answer = httpx.post(f"{self.upstream}{self.path}", content=body, headers=headers, timeout=120, trust_env=False)
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)


def test_locust_sends_the_request_bench_sends_through_the_gateway_and_counts_no_failures(
    stack: Stack, tmp_path: Path
) -> None:
    token = bench_token_file(stack, tmp_path)
    seen: list[tuple[str, str | None, bytes]] = []
    with serving(RecordingProxy, upstream=stack.url, seen=seen, lock=threading.Lock()) as proxy:
        bench_command = [
            *LLMFLEET, "bench", "--url", proxy, "--token-file", str(token), "--concurrency", "1",
            "--duration", "1", "--warmup", "0", "--max-tokens", str(MAX_TOKENS), "--out", str(tmp_path / "bench.json"),
        ]  # fmt: skip
        bench = subprocess.run(bench_command, capture_output=True, text=True, timeout=120, check=False)
        assert bench.returncode == 0, bench.stderr
        from_bench, seen[:] = list(seen), []
        locust_command = [
            *LLMFLEET, "bench", "locust", "--url", proxy, "--token-file", str(token), "--concurrency", "2",
            "--duration", f"{DURATION_S:g}", "--max-tokens", str(MAX_TOKENS), "--out", str(tmp_path / "locust.json"),
        ]  # fmt: skip
        locust = subprocess.run(locust_command, capture_output=True, text=True, timeout=600, check=False)
        from_locust = list(seen)
    output = f"{locust.stdout}\n{locust.stderr}"
    assert locust.returncode == 0, output
    # Locust's own count (its final stats, one entry per request name): requests made, none
    # failed, and each one seen on the wire.
    stats = json.loads((tmp_path / "locust.json").read_text())
    assert [entry["name"] for entry in stats] == [loadgen.PATHS["chat"]]
    assert stats[0]["num_requests"] > 0
    assert stats[0]["num_failures"] == 0, output
    assert stats[0]["num_requests"] == len(from_locust)
    assert f"locust: {stats[0]['num_requests']} requests, 0 failed," in locust.stdout
    # The same request from both, loadgen's: path, bearer token and body, byte for byte.
    body = loadgen.request_body("tiny", "chat", MAX_TOKENS)
    assert json.loads(body)["max_tokens"] == MAX_TOKENS
    request = (loadgen.PATHS["chat"], f"Bearer {token.read_text().strip()}", body)
    assert from_bench and set(from_bench) == {request}
    assert set(from_locust) == {request}
    # The token reached Locust in a file: it is on no command line, and nowhere in its output.
    assert token.read_text().strip() not in output
