"""Judge a GPU host's measured figures against the expected rates of its GPU model.

The ``gpu_validate`` role runs ``roles/gpu_validate/files/gpu_validate.py`` on
the host (with the host's toolchain Python and PyTorch); that script only
measures. This file turns its JSON, plus the ``gpu_facts`` module's reading, into
a verdict: one line per GPU per check, PASS or FAIL, each naming the GPU and the
figure, so a failed run says which card is slow and by how much. It is a pure
function of its inputs: unit tests feed it the real H200 readings committed
under tests/unit/fixtures/real-h200/ and altered copies of them.

Checks, per GPU (fail_fraction is a variable, 0.8 by default):

* ``memory``: total memory the driver reports >= 99% of the model's (a card
  that lost memory to retired rows or a wrong SKU shows less).
* ``clocks``: maximum SM clock >= the model's (a card capped by the board or
  the driver shows less).
* ``matmul``: bf16 matrix-multiply TFLOP/s >= fail_fraction x the model's expected rate.
* ``copy``: device-to-device copy GB/s (bytes read + written) >= fail_fraction x expected.
* ``memtest``: the pattern test found no mismatch and covered at least
  ``memtest_min_fraction`` of the memory that was free.

Per host with more than one GPU, ``allreduce``: the NCCL all-reduce gave the
right sum everywhere and its bus bandwidth, computed as nccl-tests does
(``busbw = bytes / time x 2 (n - 1) / n``), is >= fail_fraction x the model's
expected figure. One GPU: the check is SKIP, saying so.

A GPU model with no row in the table is FAIL (or WARN with
``unknown_model_fatal=False``): its figures cannot be judged.

Stdlib only: shared by the role's filter plugin and the unit tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The checks a table row can carry an expected figure for, with their units.
RATE_CHECKS = {"matmul": ("bf16_tflops", "TFLOP/s"), "copy": ("copy_gbs", "GB/s")}
MEMORY_TOLERANCE = 0.99
DEFAULT_FAIL_FRACTION = 0.8
DEFAULT_MEMTEST_MIN_FRACTION = 0.8


def expected_for(name: str, table: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first row whose ``match`` is in the GPU's name (case-insensitive); rows are tried in order."""
    for row in table:
        if str(row.get("match", "")).lower() in name.lower() and row.get("match"):
            return row
    return None


def bus_bandwidth_gbs(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in GB/s of one all-reduce, as nccl-tests computes them.

    algbw = bytes / time; an all-reduce moves 2 (n - 1) / n of the buffer
    over each GPU's link, so busbw = algbw x 2 (n - 1) / n, a figure that can
    be compared across GPU counts and with the link's bandwidth.
    """
    if seconds <= 0 or ranks < 1:
        raise ValueError(f"an all-reduce needs a positive time and at least one rank, got {seconds} s, {ranks}")
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def _label(gpu: Mapping[str, Any]) -> str:
    uuid = gpu.get("uuid")
    return f"GPU {gpu.get('index')} ({gpu.get('name')}{', ' + str(uuid) if uuid else ''})"


def _result(check: str, status: str, message: str, **figures: Any) -> dict[str, Any]:
    return {"check": check, "status": status, "message": message, **figures}


def _rate(check: str, gpu: Mapping[str, Any], measured: float | None, row: Mapping[str, Any] | None,
          fraction: float) -> dict[str, Any]:
    key, unit = RATE_CHECKS[check]
    what = {"matmul": "bf16 matrix multiply", "copy": "device-to-device copy"}[check]
    if measured is None:
        return _result(check, "FAIL", f"{_label(gpu)}: no {what} figure was measured", unit=unit)
    if row is None or row.get(key) is None:
        return _result(check, "UNKNOWN", f"{_label(gpu)}: {what} {measured:.1f} {unit}; no expected figure",
                       figure=round(measured, 1), unit=unit)
    expected = float(row[key])
    threshold = fraction * expected
    ok = measured >= threshold
    relation = "at or above" if ok else "BELOW"
    message = (
        f"{_label(gpu)}: {what} {measured:.1f} {unit} is {relation} {threshold:.1f} {unit}"
        f" ({fraction:g} x the {expected:g} {unit} expected of a {row.get('match')}; {measured / expected:.0%} of it)"
    )
    return _result(check, "PASS" if ok else "FAIL", message, figure=round(measured, 1), expected=expected,
                   threshold=round(threshold, 1), unit=unit)


def _memory(gpu: Mapping[str, Any], row: Mapping[str, Any] | None) -> dict[str, Any]:
    total = gpu.get("memory_total_mib")
    if total is None or row is None or row.get("memory_total_mib") is None:
        return _result("memory", "UNKNOWN", f"{_label(gpu)}: {total} MiB; no expected figure", figure=total,
                       unit="MiB")
    expected = int(row["memory_total_mib"])
    ok = total >= MEMORY_TOLERANCE * expected
    advice = " (retired rows, a wrong SKU, or MIG carving it up: nvidia-smi -q -d PAGE_RETIREMENT,ROW_REMAPPER)"
    message = (
        f"{_label(gpu)}: {total} MiB of memory, {'as' if ok else 'LESS than'} the {expected} MiB of a"
        f" {row.get('match')}{'' if ok else advice}"
    )
    return _result("memory", "PASS" if ok else "FAIL", message, figure=total, expected=expected, unit="MiB")


def _clocks(gpu: Mapping[str, Any], row: Mapping[str, Any] | None) -> dict[str, Any]:
    clock = (gpu.get("clocks") or {}).get("sm_max_mhz")
    if clock is None or row is None or row.get("sm_max_mhz") is None:
        return _result("clocks", "UNKNOWN", f"{_label(gpu)}: maximum SM clock {clock} MHz; no expected figure",
                       figure=clock, unit="MHz")
    expected = int(row["sm_max_mhz"])
    ok = clock >= expected
    advice = " (clocks locked or capped: nvidia-smi -q -d CLOCK,PERFORMANCE; nvidia-smi -rgc resets them)"
    message = (
        f"{_label(gpu)}: maximum SM clock {clock} MHz, {'as' if ok else 'BELOW'} the {expected} MHz of a"
        f" {row.get('match')}{'' if ok else advice}"
    )
    return _result("clocks", "PASS" if ok else "FAIL", message, figure=clock, expected=expected, unit="MHz")


def _memtest(gpu: Mapping[str, Any], test: Mapping[str, Any] | None, min_fraction: float) -> dict[str, Any]:
    if not test:
        return _result("memtest", "FAIL", f"{_label(gpu)}: the memory test did not run")
    tested = int(test.get("bytes_tested") or 0)
    free = int(test.get("free_bytes_before") or 0)
    mismatches = int(test.get("mismatches") or 0)
    covered = tested / free if free else 0.0
    gib = tested / (1 << 30)
    if mismatches:
        return _result("memtest", "FAIL",
                       f"{_label(gpu)}: the memory test read back {mismatches} wrong value(s) in {gib:.1f} GiB: bad"
                       " memory; check nvidia-smi -q -d ECC,ROW_REMAPPER and take the GPU out of service",
                       figure=mismatches, tested_gib=round(gib, 1))
    if covered < min_fraction:
        return _result("memtest", "FAIL",
                       f"{_label(gpu)}: the memory test covered {gib:.1f} GiB, {covered:.0%} of the free memory, less"
                       f" than {min_fraction:.0%} (another process holds memory, or allocations failed)",
                       figure=0, tested_gib=round(gib, 1), covered=round(covered, 3))
    return _result("memtest", "PASS",
                   f"{_label(gpu)}: {gib:.1f} GiB ({covered:.0%} of the free memory) written and read back twice,"
                   " no mismatch", figure=0, tested_gib=round(gib, 1), covered=round(covered, 3))


def _allreduce(nccl: Mapping[str, Any] | None, gpus: Sequence[Mapping[str, Any]],
               table: Sequence[Mapping[str, Any]], fraction: float) -> dict[str, Any]:
    if len(gpus) < 2:
        return _result("allreduce", "SKIP", f"{len(gpus)} GPU: no NCCL all-reduce to run (it needs two or more)")
    if not nccl or nccl.get("error"):
        reason = (nccl or {}).get("error") or "it did not run"
        return _result("allreduce", "FAIL", f"NCCL all-reduce across {len(gpus)} GPUs failed: {reason}")
    ranks = int(nccl["ranks"])
    if not nccl.get("sum_ok"):
        return _result("allreduce", "FAIL",
                       f"NCCL all-reduce across {ranks} GPUs gave a wrong sum (expected {nccl.get('expected_sum')},"
                       f" got {nccl.get('observed_sum')}): a broken link or a GPU corrupting data")
    algbw, busbw = bus_bandwidth_gbs(int(nccl["bytes"]), float(nccl["seconds_per_op"]), ranks)
    names = sorted({str(gpu.get("name")) for gpu in gpus})
    rows = [expected_for(name, table) for name in names]
    expected = min((float(row["allreduce_busbw_gbs"]) for row in rows if row and row.get("allreduce_busbw_gbs")),
                   default=None)
    figures = {"figure": round(busbw, 1), "algbw_gbs": round(algbw, 1), "unit": "GB/s", "ranks": ranks}
    if expected is None:
        return _result("allreduce", "UNKNOWN",
                       f"NCCL all-reduce across {ranks} GPUs: right sum, bus bandwidth {busbw:.1f} GB/s; no expected"
                       f" figure for {', '.join(names)}", **figures)
    threshold = fraction * expected
    ok = busbw >= threshold
    advice = "; check the links: nvidia-smi topo -m, nvidia-smi nvlink -s"
    return _result(
        "allreduce", "PASS" if ok else "FAIL",
        f"NCCL all-reduce across {ranks} GPUs ({', '.join(names)}): right sum, bus bandwidth {busbw:.1f} GB/s"
        f" (algorithm {algbw:.1f} GB/s) is {'at or above' if ok else 'BELOW'} {threshold:.1f} GB/s"
        f" ({fraction:g} x the {expected:g} GB/s expected){'' if ok else advice}",
        expected=expected, threshold=round(threshold, 1), **figures)


def judge(
    measurements: Mapping[str, Any],
    table: Sequence[Mapping[str, Any]],
    gpu_facts: Mapping[str, Any] | None = None,
    fail_fraction: float = DEFAULT_FAIL_FRACTION,
    memtest_min_fraction: float = DEFAULT_MEMTEST_MIN_FRACTION,
    unknown_model_fatal: bool = True,
) -> dict[str, Any]:
    """The report: {ok, gpus: [{index, name, uuid, model, checks}], host_checks, failures, lines}.

    measurements is the validation script's JSON; gpu_facts the gpu_facts
    module's result (memory and clocks as the driver reports them; matched
    to the measured GPUs by UUID, else by index).
    """
    if not 0 < fail_fraction <= 1:
        raise ValueError(f"fail_fraction is a fraction of the expected rate (0-1], got {fail_fraction}")
    fact_gpus: list[Mapping[str, Any]] = list((gpu_facts or {}).get("gpus") or [])
    facts_by_uuid = {g.get("uuid"): g for g in fact_gpus}
    facts_by_index = {g.get("index"): g for g in fact_gpus}
    gpus: list[dict[str, Any]] = []
    for measured in measurements.get("gpus") or []:
        facts = facts_by_uuid.get(measured.get("uuid")) or facts_by_index.get(measured.get("index")) or {}
        gpu = {**measured, **{key: facts[key] for key in ("memory_total_mib", "clocks", "pci_bus_id") if key in facts}}
        if "memory_total_mib" not in gpu and measured.get("memory_total_bytes"):
            gpu["memory_total_mib"] = int(measured["memory_total_bytes"]) // (1 << 20)
        row = expected_for(str(gpu.get("name")), table)
        checks = [_memory(gpu, row), _clocks(gpu, row)]
        checks.append(_rate("matmul", gpu, (gpu.get("matmul") or {}).get("tflops"), row, fail_fraction))
        checks.append(_rate("copy", gpu, (gpu.get("copy") or {}).get("gbs"), row, fail_fraction))
        checks.append(_memtest(gpu, gpu.get("memtest"), memtest_min_fraction))
        for error in gpu.get("errors") or []:
            checks.append(_result("error", "FAIL", f"{_label(gpu)}: {error}"))
        if row is None:
            checks.insert(0, _result(
                "model", "FAIL" if unknown_model_fatal else "WARN",
                f"{_label(gpu)}: no expected rates for this model in gpu_validate_expected; add a row (match,"
                " bf16_tflops, copy_gbs, memory_total_mib, sm_max_mhz) measured on a known-good card, or set"
                " gpu_validate_unknown_model_fatal: false",
            ))
        gpus.append({"index": gpu.get("index"), "name": gpu.get("name"), "uuid": gpu.get("uuid"),
                     "model": row.get("match") if row else None, "checks": checks})
    host_checks = [_allreduce(measurements.get("nccl"), measurements.get("gpus") or [], table, fail_fraction)]
    if not gpus:
        host_checks.append(_result("gpus", "FAIL", "no GPU was measured: the script saw no CUDA device"))
    every: list[dict[str, Any]] = [check for gpu in gpus for check in gpu["checks"]] + host_checks
    failures = [check["message"] for check in every if check["status"] == "FAIL"]
    lines = [f"[{check['status']}] {check['check']:<9} {check['message']}" for check in every]
    return {"ok": not failures, "fail_fraction": fail_fraction, "gpus": gpus, "host_checks": host_checks,
            "failures": failures, "lines": lines}


def local_facts(report: Mapping[str, Any], measurements: Mapping[str, Any], results_path: str) -> dict[str, Any]:
    """What the role keeps as ansible_local.gpu_validate: the verdict and the headline figures per GPU."""
    measured = {gpu.get("index"): gpu for gpu in measurements.get("gpus") or []}
    gpus = []
    for gpu in report["gpus"]:
        figures = measured.get(gpu["index"], {})
        tested = (figures.get("memtest") or {}).get("bytes_tested")
        gpus.append({
            "index": gpu["index"],
            "name": gpu["name"],
            "uuid": gpu["uuid"],
            "model": gpu["model"],
            "status": {check["check"]: check["status"] for check in gpu["checks"]},
            "matmul_bf16_tflops": _rounded((figures.get("matmul") or {}).get("tflops")),
            "copy_gbs": _rounded((figures.get("copy") or {}).get("gbs")),
            "memtest_gib": None if tested is None else round(int(tested) / (1 << 30), 1),
        })
    allreduce = report["host_checks"][0]
    return {
        "schema": 1,
        "ok": report["ok"],
        "measured_at": measurements.get("started"),
        "fail_fraction": report["fail_fraction"],
        "results_path": results_path,
        "gpus": gpus,
        "allreduce": {"status": allreduce["status"], "busbw_gbs": allreduce.get("figure")},
        "failures": report["failures"],
    }


def _rounded(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)
