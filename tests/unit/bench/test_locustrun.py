"""`llmfleet bench locust` and its Locust file: the lock, Locust's command and environment, the summary, the refusals.

Locust itself runs against the real stack in
tests/integration/serve/gateway/test_bench_peers.py; here, what needs no network.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmfleet.bench import locustrun, peers
from llmfleet.cli import main
from llmfleet.errors import LlmfleetError

VENV = Path("/cache/venvs/locust-0")


def _args(**overrides: Any) -> argparse.Namespace:
    values: dict[str, Any] = {
        "url": "http://10.77.0.10:8080/",
        "token_file": None,
        "rate": None,
        "concurrency": 4,
        "users": None,
        "duration": 2.5,
        "model": "tiny",
        "endpoint": "chat",
        "max_tokens": 16,
        "out": "out/bench/locust.json",
    }
    return argparse.Namespace(**{**values, **overrides})


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_lock_pins_every_package_exactly_and_holds_locust() -> None:
    text = locustrun.LOCUST.lock.read_text()
    pins = peers.lock_pins(text, str(locustrun.LOCUST.lock))
    assert "locust" in pins
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(pins) == len(lines)
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "pip install locust" in header and "pip freeze" in header
    # The header names the version it was made with, and that is the version locked.
    assert f"locust    # {pins['locust']}," in header


def test_locust_runs_the_locust_file_headless_with_benchs_request_options() -> None:
    command = locustrun.command(VENV, _args())
    assert command[:4] == [str(VENV / "bin" / "locust"), "-f", str(locustrun.LOCUSTFILE), "--headless"]
    assert locustrun.LOCUSTFILE.is_file()
    assert _option(command, "--host") == "http://10.77.0.10:8080"
    assert _option(command, "--users") == _option(command, "--spawn-rate") == "4"
    assert _option(command, "--run-time") == "3s"  # whole seconds, never shorter than asked
    assert _option(command, "--json-file") == "out/bench/locust"  # Locust adds .json
    assert (_option(command, "--bench-model"), _option(command, "--bench-endpoint")) == ("tiny", "chat")
    assert (_option(command, "--bench-max-tokens"), _option(command, "--bench-rate")) == ("16", "0")


def test_a_rate_is_spread_over_users_that_may_each_take_two_seconds_a_request() -> None:
    assert _option(locustrun.command(VENV, _args(concurrency=None, rate=100)), "--users") == "200"
    assert _option(locustrun.command(VENV, _args(concurrency=None, rate=2)), "--users") == "16"
    command = locustrun.command(VENV, _args(concurrency=None, rate=2.5, users=5))
    assert (_option(command, "--users"), _option(command, "--bench-rate")) == ("5", "2.5")


def test_the_token_goes_to_locust_as_a_file_path_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "token").write_text("secret-token-value\n")
    env = locustrun.environment("token")
    assert env[locustrun.TOKEN_FILE_ENV] == str(tmp_path / "token")  # absolute: Locust may run elsewhere
    assert all(env[name] == value for name, value in peers.PEER_ENV.items())
    assert "secret-token-value" not in " ".join(locustrun.command(VENV, _args(token_file="token")))
    # Without a token file, none inherited from the caller's environment either.
    monkeypatch.setenv(locustrun.TOKEN_FILE_ENV, "/elsewhere/token")
    assert locustrun.TOKEN_FILE_ENV not in locustrun.environment(None)


def _locustfile() -> ast.Module:
    return ast.parse(locustrun.LOCUSTFILE.read_text())


def test_the_locust_file_reads_the_same_variable_and_builds_its_request_with_loadgen() -> None:
    tree = _locustfile()
    assigned = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    assert assigned["TOKEN_FILE_ENV"] == locustrun.TOKEN_FILE_ENV
    calls = {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
    }
    # The body, the path and the token come from loadgen; no JSON of its own is made.
    assert {"loadgen.request_body", "loadgen.read_token"} <= calls
    assert "json.dumps" not in calls


def test_the_package_never_imports_the_locust_file() -> None:
    # Nothing in the package names it as a module...
    package = Path(locustrun.__file__).parent.parent
    importers = [
        str(path)
        for path in package.rglob("*.py")
        if any(name in path.read_text() for name in ("import locustfile", "bench.locustfile"))
    ]
    assert importers == []
    # ...and the whole command line, every subcommand registered, loads without it (or Locust).
    check = (
        "import sys; from llmfleet.cli import build_parser; build_parser();"
        " assert 'llmfleet.bench.locustrun' in sys.modules;"
        " assert not {'llmfleet.bench.locustfile', 'locust'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", check], check=True)


def test_the_summary_is_locusts_final_count_with_percentiles_of_its_histogram() -> None:
    entries = [
        {
            "name": "/v1/chat/completions",
            "num_requests": 4,
            "num_failures": 1,
            "start_time": 100.0,
            "last_request_timestamp": 102.0,
            "response_times": {"40": 2, "45": 1, "900": 1},
        }
    ]
    assert locustrun.summarize(entries) == (
        "4 requests, 1 failed, 2.0 req/s; p50 40 ms, p95 900 ms, p99 900 ms (from each send)"
    )
    assert locustrun.summarize([]) == "0 requests, 0 failed, 0.0 req/s; p50 0 ms, p95 0 ms, p99 0 ms (from each send)"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"url": None}, "give --url"),
        ({"concurrency": None}, "give one of --rate"),
        ({"concurrency": 0}, "--concurrency at least 1"),
        ({"concurrency": None, "rate": 0.0}, "--rate must be above 0"),
        ({"users": 8}, "--users goes with --rate"),
        ({"concurrency": None, "rate": 5.0, "users": 0}, "--users goes with --rate"),
        ({"duration": 0.0}, "--duration must be above 0"),
        ({"out": "out/bench/locust.csv"}, "ending in .json"),
        ({"token_file": "/nonexistent/token"}, "cannot read /nonexistent/token"),
    ],
)
def test_bad_options_are_refused_before_locust_is_installed_or_run(
    overrides: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_venv(spec: peers.PeerSpec) -> Path:
        raise AssertionError("refused options must not reach the venv")

    monkeypatch.setattr(peers, "ensure_peer_venv", no_venv)
    with pytest.raises(LlmfleetError, match=message):
        locustrun.run(_args(**overrides))


def test_bench_locust_is_a_subcommand_of_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "locust", "--url", "http://127.0.0.1:1"]) == 1
    assert "give one of --rate" in capsys.readouterr().err
