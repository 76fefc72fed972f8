"""`llmfleet bench` against the real stack: every request it sends is accounted for, through the gateway and direct.

The figures themselves are the benchmark's (scripts/bench.sh in the lab); here only
the counting is checked, and that --cpu finds each part of the stack working, so
nothing depends on this machine's speed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.serve.gateway.gatewaystack import Stack, bench_token_file
from tests.tools import LLMFLEET


def test_bench_accounts_for_every_request_through_the_gateway_and_direct(stack: Stack, tmp_path: Path) -> None:
    token_file = bench_token_file(stack, tmp_path)
    out = tmp_path / "bench.json"
    command = [
        *LLMFLEET, "bench", "--url", stack.url, "--token-file", str(token_file), "--label", "gateway",
        "--concurrency", "4", "--duration", "2", "--warmup", "0.5", "--max-tokens", "8",
        "--peer-url", stack.vllm.url, "--peer-label", "direct", "--cpu", "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    gateway, direct = report["reports"]
    for measured in (gateway, direct):
        assert measured["requests"] > 0
        assert measured["ok"] == measured["requests"], measured["errors"]
        assert measured["completion_tokens"] == 8 * measured["ok"]
        # Throughput is the answers that arrived in the window, per second of it.
        assert measured["answers_in_window"] > 0
        rate = measured["answers_in_window"] / measured["duration_s"]
        assert measured["throughput_rps"] == pytest.approx(rate, abs=0.01)
        assert 0 < measured["p50_ms"] <= measured["p95_ms"] <= measured["p99_ms"] <= measured["max_ms"]
    assert report["throughput_ratio"] == round(gateway["throughput_rps"] / direct["throughput_rps"], 3)
    assert "gateway / direct:" in result.stdout
    # The stack's processes run on this machine: --cpu sees each part work.
    through_gateway = ("gateway", "worker", "redis", "engine API server", "engine core", "load generator")
    assert all(gateway["cpu_ms_per_request"].get(part, 0) > 0 for part in through_gateway), gateway
    assert all(direct["cpu_ms_per_request"].get(part, 0) > 0 for part in ("engine API server", "engine core")), direct
    assert all(0 < measured["cores_busy"] <= measured["cores"] for measured in (gateway, direct))
    assert "CPU ms per answered request:" in result.stdout


def test_bench_streams_through_the_gateway_and_direct_and_times_the_first_token(stack: Stack, tmp_path: Path) -> None:
    token_file = bench_token_file(stack, tmp_path)
    out = tmp_path / "bench.json"
    command = [
        *LLMFLEET, "bench", "--url", stack.url, "--token-file", str(token_file), "--label", "gateway",
        "--rate", "4", "--duration", "2", "--warmup", "0.5", "--max-tokens", "8", "--stream",
        "--peer-url", stack.vllm.url, "--peer-label", "direct", "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    gateway, direct = json.loads(out.read_text())["reports"]
    for measured in (gateway, direct):
        assert measured["requests"] > 0
        assert measured["ok"] == measured["requests"], measured["errors"]
        # The tokens come from each stream's usage event; the first token comes before the whole answer.
        assert measured["completion_tokens"] == 8 * measured["ok"]
        assert 0 < measured["ttft_p50_ms"] <= measured["ttft_p95_ms"] <= measured["ttft_p99_ms"]
        assert measured["ttft_p50_ms"] < measured["p50_ms"]
    assert result.stdout.count("time to first token: p50") == 2


def test_profile_samples_the_gateway_and_the_worker_and_counts_redis_commands_per_answer(
    stack: Stack, tmp_path: Path
) -> None:
    token_file = bench_token_file(stack, tmp_path)
    password_file = tmp_path / "redis.password"
    password_file.write_text(stack.redis.password)
    password_file.chmod(0o600)
    out, profile_dir = tmp_path / "bench.json", tmp_path / "profile"
    command = [
        *LLMFLEET, "bench", "--url", stack.url, "--token-file", str(token_file), "--rate", "20", "--duration", "4",
        "--warmup", "0.5", "--max-tokens", "8", "--cpu", "--profile", str(profile_dir),
        # This stack's processes only: the lab stage's gateway side may run on this machine meanwhile.
        *[option for service in (stack.gateway, *stack.live_workers()) if service
          for option in ("--profile-pid", str(service.pid))],
        "--redis-url", f"redis://llmfleet@127.0.0.1:{stack.redis.port}/0", "--redis-password-file", str(password_file),
        "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    [report] = json.loads(out.read_text())["reports"]
    assert report["ok"] == report["requests"] > 0
    # Every answer took one admission, one take or blocking read, a BEGIN and a DELIVER: 3 scripts or more each.
    costs = report["redis_commands_per_request"]
    assert costs["evalsha"]["calls"] >= 3 and costs["evalsha"]["usec"] > 0, costs
    assert "Redis commands per answer:" in result.stdout
    # py-spy sampled this stack's gateway and its worker: each with stacks, a flame graph and a share per layer.
    document = json.loads(Path(report["profile"]).read_text())
    sampled = {process["part"]: process for process in document["processes"]}
    assert {"gateway", "worker"} <= set(sampled)
    for part in ("gateway", "worker"):
        process = sampled[part]
        assert process["samples"] > 0
        assert sum(process["layers"].values()) == pytest.approx(1.0, abs=0.01)
        assert process["layers_ms_per_request"], process  # --cpu gave the part's ms per answer
        assert (profile_dir / f"{part}-{process['pid']}.txt").stat().st_size > 0
        assert (profile_dir / f"{part}-{process['pid']}.png").read_bytes()[:4] == b"\x89PNG"
    # The gateway's own code ran in the window: its handler is among the stacks.
    stacks = (profile_dir / f"gateway-{sampled['gateway']['pid']}.txt").read_text()
    assert "llmfleet/serve/gateway" in stacks
