"""plugins/module_utils/gpu_validation.py: the verdict on the real H200's figures, and on altered copies.

tests/unit/fixtures/real-h200/gpu_validate.json is what the gpu_validate role
measured and kept on the lent H200 (769.8 TFLOP/s bf16, 4264 GB/s copy, 124 GiB
memory-tested); the expected rates are the role's one table
(roles/gpu_validate/defaults/main.yml). A slow, short or broken GPU in an
altered copy must fail, naming the GPU and the figure. The NCCL all-reduce
could not run on one GPU: its judgement is tested on synthetic figures.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from llmfleet.module_utils import gpu_validation as gv
from llmfleet.paths import REPO_ROOT

REAL = json.loads((REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200" / "gpu_validate.json").read_text())
DEFAULTS = yaml.safe_load((REPO_ROOT / "roles" / "gpu_validate" / "defaults" / "main.yml").read_text())
TABLE: list[dict[str, Any]] = DEFAULTS["gpu_validate_expected"]
FRACTION: float = DEFAULTS["gpu_validate_fail_fraction"]
LABEL = "GPU 0 (NVIDIA H200, GPU-217ee39e-ed23-4138-ecce-08c8168c2179)"


def judge(measurements: dict[str, Any], facts: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    return gv.judge(measurements, TABLE, gpu_facts=REAL["gpu_facts"] if facts is None else facts,
                    fail_fraction=options.pop("fail_fraction", FRACTION), **options)


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {check["check"]: check["status"] for check in report["gpus"][0]["checks"]}


def test_the_real_h200_passes_with_its_figures_in_the_report() -> None:
    report = judge(REAL["measurements"])
    assert report["ok"], report["failures"]
    assert statuses(report) == {"memory": "PASS", "clocks": "PASS", "matmul": "PASS", "copy": "PASS", "memtest": "PASS"}
    assert report["host_checks"][0]["status"] == "SKIP"
    text = "\n".join(report["lines"])
    assert f"[PASS] matmul    {LABEL}: bf16 matrix multiply 769.8 TFLOP/s is at or above 632.0 TFLOP/s" in text
    assert f"[PASS] copy      {LABEL}: device-to-device copy 4264.2 GB/s is at or above 3440.0 GB/s" in text
    assert "124.0 GiB (89% of the free memory) written and read back twice, no mismatch" in text
    # The report the role kept on the H200 is this function's verdict.
    assert report == REAL["report"]


def test_the_h200_row_is_the_figures_measured_there() -> None:
    row = gv.expected_for("NVIDIA H200", TABLE)
    assert row is not None and row["match"] == "H200"
    measured = REAL["measurements"]["gpus"][0]
    assert abs(measured["matmul"]["tflops"] - row["bf16_tflops"]) / row["bf16_tflops"] < 0.05
    assert abs(measured["copy"]["gbs"] - row["copy_gbs"]) / row["copy_gbs"] < 0.05
    assert row["memory_total_mib"] == REAL["gpu_facts"]["gpus"][0]["memory_total_mib"]


def _altered(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    measurements = copy.deepcopy(REAL["measurements"])
    target = measurements["gpus"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return measurements


@pytest.mark.parametrize(
    ("path", "value", "check", "words"),
    [
        (("matmul", "tflops"), 512.3, "matmul", "bf16 matrix multiply 512.3 TFLOP/s is BELOW 632.0 TFLOP/s"),
        (("copy", "gbs"), 2100.0, "copy", "device-to-device copy 2100.0 GB/s is BELOW 3440.0 GB/s"),
        (("memtest", "mismatches"), 3, "memtest", "read back 3 wrong value(s) in 124.0 GiB"),
        (("memtest", "bytes_tested"), 40 << 30, "memtest", "covered 40.0 GiB, 29% of the free memory"),
        (("errors",), ["matmul raised RuntimeError: CUDA error: an illegal memory access"], "error",
         "matmul raised RuntimeError"),
    ],
    ids=["slow-matmul", "slow-copy", "bad-memory", "memtest-short", "error"],
)
def test_an_altered_reading_fails_naming_the_gpu_and_the_figure(
    path: tuple[str, ...], value: Any, check: str, words: str
) -> None:
    report = judge(_altered(path, value))
    assert not report["ok"]
    [failure] = report["failures"]
    assert failure.startswith(LABEL) and words in failure, failure
    assert statuses(report)[check] == "FAIL"


@pytest.mark.parametrize(
    ("key", "value", "check", "words"),
    [
        ("memory_total_mib", 97871, "memory", "97871 MiB of memory, LESS than the 143771 MiB of a H200"),
        ("clocks", {"sm_max_mhz": 1410}, "clocks", "maximum SM clock 1410 MHz, BELOW the 1980 MHz of a H200"),
    ],
)
def test_altered_gpu_facts_fail(key: str, value: Any, check: str, words: str) -> None:
    facts = copy.deepcopy(REAL["gpu_facts"])
    facts["gpus"][0][key] = value
    report = judge(REAL["measurements"], facts)
    assert statuses(report)[check] == "FAIL"
    assert any(words in failure for failure in report["failures"]), report["failures"]


def test_the_fail_fraction_is_the_threshold() -> None:
    # 769.8 TFLOP/s is 97% of the 790 expected: it passes at 0.97, fails at 0.98.
    assert statuses(judge(REAL["measurements"], fail_fraction=0.97))["matmul"] == "PASS"
    strict = judge(REAL["measurements"], fail_fraction=0.98)
    assert statuses(strict)["matmul"] == "FAIL"
    assert "BELOW 774.2 TFLOP/s (0.98 x the 790 TFLOP/s" in strict["failures"][0]
    with pytest.raises(ValueError, match="fail_fraction"):
        judge(REAL["measurements"], fail_fraction=1.5)


def test_an_unknown_model_fails_unless_allowed() -> None:
    measurements = copy.deepcopy(REAL["measurements"])
    measurements["gpus"][0]["name"] = "NVIDIA B300"
    facts = copy.deepcopy(REAL["gpu_facts"])
    facts["gpus"][0]["name"] = "NVIDIA B300"
    report = judge(measurements, facts)
    assert not report["ok"]
    assert "no expected rates for this model in gpu_validate_expected" in report["failures"][0]
    relaxed = judge(measurements, facts, unknown_model_fatal=False)
    assert relaxed["ok"]
    assert statuses(relaxed)["model"] == "WARN"
    assert statuses(relaxed)["matmul"] == "UNKNOWN"


def test_rows_are_tried_in_order() -> None:
    table = [{"match": "H200 NVL", "bf16_tflops": 1}, {"match": "H200", "bf16_tflops": 2}]
    assert gv.expected_for("NVIDIA H200 NVL", table) == table[0]
    assert gv.expected_for("NVIDIA H200", table) == table[1]
    assert gv.expected_for("NVIDIA H100 80GB HBM3", TABLE)["match"] == "H100 80GB HBM3"  # type: ignore[index]
    assert gv.expected_for("NVIDIA GeForce RTX 4090", TABLE) is None


# --- NCCL all-reduce: synthetic figures (it needs two GPUs or more) ----------

@pytest.mark.parametrize(
    ("nbytes", "seconds", "ranks", "algbw", "busbw"),
    [
        (1 << 30, 0.005, 8, 214.748, 375.809),  # 2 (n-1)/n = 1.75
        (1 << 30, 0.005, 2, 214.748, 214.748),  # = 1
        (1 << 30, 0.005, 1, 214.748, 0.0),  # one rank moves nothing
    ],
)
def test_bus_bandwidth_is_nccl_tests_formula(nbytes: int, seconds: float, ranks: int, algbw: float,
                                             busbw: float) -> None:
    assert gv.bus_bandwidth_gbs(nbytes, seconds, ranks) == pytest.approx((algbw, busbw), abs=1e-3)


def _eight_gpus(nccl: dict[str, Any]) -> dict[str, Any]:
    measurements = copy.deepcopy(REAL["measurements"])
    gpu = measurements["gpus"][0]
    measurements["gpus"] = [{**copy.deepcopy(gpu), "index": i, "uuid": f"GPU-synthetic-{i}"} for i in range(8)]
    measurements["nccl"] = nccl
    return measurements


GOOD = {"ranks": 8, "bytes": 1 << 30, "iterations": 20, "seconds_per_op": 0.0045, "expected_sum": 36.0,
        "observed_sum": [36.0] * 8, "sum_ok": True}


@pytest.mark.parametrize(
    ("nccl", "status", "words"),
    [
        (GOOD, "PASS", "right sum, bus bandwidth 417.6 GB/s (algorithm 238.6 GB/s) is at or above 288.0 GB/s"),
        ({**GOOD, "seconds_per_op": 0.02}, "FAIL", "bus bandwidth 94.0 GB/s (algorithm 53.7 GB/s) is BELOW 288.0 GB/s"),
        ({**GOOD, "sum_ok": False, "observed_sum": [36.0] * 7 + [35.0]}, "FAIL", "gave a wrong sum (expected 36.0"),
        ({"ranks": 8, "bytes": 1 << 30, "error": "ProcessRaisedException: NCCL error: unhandled system error"},
         "FAIL", "failed: ProcessRaisedException: NCCL error: unhandled system error"),
        (None, "FAIL", "failed: it did not run"),
    ],
    ids=["good", "slow", "wrong-sum", "error", "missing"],
)
def test_the_all_reduce_on_synthetic_figures(nccl: dict[str, Any] | None, status: str, words: str) -> None:
    report = gv.judge(_eight_gpus(nccl) if nccl else _eight_gpus({}) | {"nccl": None}, TABLE, fail_fraction=FRACTION)
    check = report["host_checks"][0]
    assert check["status"] == status
    assert words in check["message"], check["message"]
    assert report["ok"] == (status == "PASS")


def test_local_facts_hold_the_verdict_and_the_headline_figures() -> None:
    report = judge(REAL["measurements"])
    facts = gv.local_facts(report, REAL["measurements"], "/var/lib/llmfleet/gpu_validate.json")
    assert facts["ok"] is True
    assert facts["gpus"][0]["matmul_bf16_tflops"] == 769.8
    assert facts["gpus"][0]["copy_gbs"] == 4264.2
    assert facts["gpus"][0]["memtest_gib"] == 124.0
    assert facts["allreduce"] == {"status": "SKIP", "busbw_gbs": None}
