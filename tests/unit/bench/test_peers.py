"""The peers of `llmfleet bench compare`: their locks, the config and command each gets, and their CPU confinement.

Starting them against real engines is what `llmfleet bench compare` does (docs/benchmarks.md,
"Against the peers"); here, what can be checked without a network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.bench import peers
from llmfleet.errors import LlmfleetError

ENGINES = ["http://127.0.0.1:8001/", "http://127.0.0.1:8002"]


@pytest.mark.parametrize("name", sorted(peers.PEERS))
def test_each_lock_pins_every_package_exactly_and_holds_its_peer(name: str) -> None:
    spec = peers.PEERS[name]
    text = spec.lock.read_text()
    pins = peers.lock_pins(text, str(spec.lock))
    assert peers.normalize(name) in pins
    # Every line that is not a comment is one exact pin: as many pins as such lines.
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(pins) == len(lines)
    assert all("==" in line and not any(mark in line for mark in ("<", ">", "~", ";", "@", "[")) for line in lines)
    # The header says how the lock was made.
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "pip install" in header and "pip freeze" in header


def test_the_litellm_lock_holds_the_proxy_extra() -> None:
    pins = peers.lock_pins(peers.PEERS[peers.LITELLM].lock.read_text(), "litellm lock")
    # litellm[proxy] brings the proxy's server and its bundled parts; plain litellm does not.
    assert {"uvicorn", "litellm-proxy-extras", "fastapi"} <= set(pins)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("litellm>=1.0\n", "not an exact pin"),
        ("litellm[proxy]==1.0\n", "not an exact pin"),
        ('litellm==1.0 ; python_version > "3"\n', "not an exact pin"),
        ("litellm @ file:///tmp/x.whl\n", "not an exact pin"),
        ("litellm==1.0\nLiteLLM==1.1\n", "pinned twice"),
        ("# only a comment\n", "no pins"),
    ],
)
def test_an_inexact_lock_is_refused(text: str, message: str) -> None:
    with pytest.raises(LlmfleetError, match=message):
        peers.lock_pins(text, "some.lock.txt")


def test_pins_compare_names_as_pep_503_does() -> None:
    assert peers.lock_pins("Pydantic_Core==2.1  # a comment\n\nzope.interface==7\n", "x") == {
        "pydantic-core": "2.1",
        "zope-interface": "7",
    }


def test_a_venv_that_differs_from_its_lock_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / "peer.lock.txt"
    lock.write_text("# header\naiohttp==3.14.5\nyarl==1.25.1\n")
    peers.check_frozen("aiohttp==3.14.5\nyarl==1.25.1\n", lock)  # the same, spelled by pip freeze
    with pytest.raises(LlmfleetError, match=r"installed but not locked \['yarl==1.26.0'\].*locked but not installed"):
        peers.check_frozen("aiohttp==3.14.5\nyarl==1.26.0\n", lock)


def test_version_is_the_peers_own_pin() -> None:
    version = peers.version(peers.PEERS[peers.VLLM_ROUTER])
    assert f"vllm-router=={version}" in peers.PEERS[peers.VLLM_ROUTER].lock.read_text()


def test_litellm_gets_the_engines_as_one_model_group_with_a_master_key_and_nothing_logged() -> None:
    config = peers.litellm_config(ENGINES, "tiny", "sk-bench-1")
    assert [deployment["model_name"] for deployment in config["model_list"]] == ["tiny", "tiny"]
    assert [deployment["litellm_params"]["api_base"] for deployment in config["model_list"]] == [
        "http://127.0.0.1:8001/v1",
        "http://127.0.0.1:8002/v1",
    ]
    assert {deployment["litellm_params"]["model"] for deployment in config["model_list"]} == {"hosted_vllm/tiny"}
    settings = config["general_settings"]
    assert settings["master_key"] == "sk-bench-1"
    assert settings["disable_spend_logs"] is True and settings["disable_error_logs"] is True
    # No database and no callbacks: nothing is written per request.
    assert "database_url" not in settings
    assert "callbacks" not in config["litellm_settings"] and "success_callback" not in config["litellm_settings"]


def test_litellm_sends_the_engines_api_key_when_they_take_one() -> None:
    keyless = peers.litellm_config(ENGINES, "tiny", "sk-bench-1")
    keyed = peers.litellm_config(ENGINES, "tiny", "sk-bench-1", "the-engines-key")
    assert {deployment["litellm_params"]["api_key"] for deployment in keyless["model_list"]} == {"none"}
    assert {deployment["litellm_params"]["api_key"] for deployment in keyed["model_list"]} == {"the-engines-key"}


def test_litellm_runs_one_uvicorn_worker_on_loopback(tmp_path: Path) -> None:
    command = peers.litellm_command(tmp_path / "venv", tmp_path / "c.yaml", 4000, 1)
    assert command[0] == str(tmp_path / "venv" / "bin" / "litellm")
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--num_workers") + 1] == "1"
    assert command[command.index("--config") + 1] == str(tmp_path / "c.yaml")


def test_vllm_router_round_robins_over_every_engine_on_loopback(tmp_path: Path) -> None:
    command = peers.router_command(tmp_path / "venv", ENGINES, 30000, 29000)
    assert command[0] == str(tmp_path / "venv" / "bin" / "vllm-router")
    start = command.index("--worker-urls") + 1
    assert command[start : start + 2] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert command[command.index("--policy") + 1] == "round_robin"
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--prometheus-host") + 1] == "127.0.0.1"
    assert command[command.index("--prometheus-port") + 1] == "29000"


def test_a_peer_with_cpus_runs_under_taskset() -> None:
    assert peers.pinned(["litellm", "--port", "1"], "1") == ["taskset", "-c", "1", "litellm", "--port", "1"]
    assert peers.pinned(["litellm"], None) == ["litellm"]


def test_cpus_are_parsed_as_taskset_lists() -> None:
    own = sorted(os.sched_getaffinity(0))
    assert peers.parse_cpus(str(own[0])) == [own[0]]
    assert peers.parse_cpus(f"{own[0]}-{own[-1]}") == list(range(own[0], own[-1] + 1))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("one", "give cores as taskset takes them"),
        ("0-", "give cores as taskset takes them"),
        ("1-0", "runs backwards"),
        ("0,0", "named twice"),
        ("4096", "not among this process's"),
    ],
)
def test_bad_cpus_are_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(LlmfleetError, match=message):
        peers.parse_cpus(text)


def test_group_pids_finds_a_process_group_and_nothing_else() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert peers.group_pids(child.pid) == {child.pid}
        assert child.pid not in peers.group_pids(os.getpgrp())
    finally:
        child.kill()
        child.wait()


def test_a_peer_that_exits_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    # A stand-in venv whose vllm-router prints a line and exits: start_peer must say so, with the line.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "vllm-router"
    script.write_text('#!/bin/sh\necho "error: no such worker (in $(pwd))" >&2\nexit 3\n')
    script.chmod(0o755)
    work = tmp_path / "work"
    with pytest.raises(LlmfleetError, match=r"(?s)vllm-router exited with code 3.*error: no such worker") as raised:
        peers.start_peer(peers.VLLM_ROUTER, ENGINES, "tiny", work, venv=venv, startup_timeout_s=30)
    # It ran in the work folder, where its log is.
    assert f"(in {work})" in str(raised.value)
    assert (work / "vllm-router.log").read_text().startswith("error: no such worker")
