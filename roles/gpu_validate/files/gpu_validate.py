#!/usr/bin/env python3
"""llmfleet gpu_validate: measure every GPU of this host with PyTorch and print the figures as JSON.

Run by the gpu_validate role with the host's toolchain Python (the
python_toolchain venv, which holds the stack's CUDA build of PyTorch). It only
measures; the role judges the figures against the expected rates of each GPU
model (plugins/module_utils/gpu_validation.py) and fails with a report naming
the GPU and the figure.

Per GPU, one after the other:
  matmul   bf16 N x N x N products (torch.matmul on random data), TFLOP/s = 2 N^3 / time
  copy     device-to-device copies of a buffer, GB/s counting bytes read and written
  memtest  allocates most of the free memory in 1 GiB blocks (plain allocations,
           never managed memory), writes a position-dependent pattern, reads it
           back, then its bitwise complement, and counts mismatches
With two GPUs or more, once across all of them:
  nccl     torch.distributed all-reduce (sum) over NCCL, one process per GPU,
           checking the sum on every rank and timing it; the role computes the
           bus bandwidth as nccl-tests does. NCCL_NVLS_ENABLE=0 is forced: NVLink
           multicast stays off.

Exit 0 with the JSON on stdout; 2 with one line on stderr when nothing can be
measured (no PyTorch, no CUDA device); --probe prints what PyTorch sees.
Stdlib and torch only; torch is imported when the script runs, so --help works
without it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
# The memory test's pattern: value(i) = i x MULTIPLIER + block x 7919, in int32 (wrapping).
MULTIPLIER = 1103515245
VERIFY_SLICE = 64 * MIB  # int32 elements compared per step (256 MiB, inside the headroom)


def refuse(message: str) -> None:
    print(f"gpu_validate: {message}", file=sys.stderr)
    sys.exit(2)


def load_torch() -> Any:
    try:
        import torch  # imported when measuring, so --help needs no torch
    except ImportError as error:
        refuse(f"PyTorch is not installed for {sys.executable} ({error}); run the python_toolchain role, or point"
               " gpu_validate_python at a Python with a CUDA build of torch")
    return torch


def probe(torch: Any) -> dict[str, Any]:
    return {
        "python": sys.executable,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "device_count": int(torch.cuda.device_count()) if torch.cuda.is_available() else 0,
        "nccl": _nccl_version(torch) if torch.cuda.is_available() else None,
    }


def _nccl_version(torch: Any) -> str:
    version = torch.cuda.nccl.version()  # a tuple in PyTorch 2, an int before
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def timed(torch: Any, step: Any, iterations: int, warmup: int) -> float:
    """Seconds per step, timed with CUDA events after warm-up runs."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        step()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000 / iterations


def matmul(torch: Any, device: Any, n: int, iterations: int) -> dict[str, Any]:
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=generator)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=generator)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    seconds = timed(torch, lambda: torch.matmul(a, b, out=out), iterations, warmup=3)
    return {"n": n, "iterations": iterations, "seconds_per_op": seconds, "tflops": 2 * n**3 / seconds / 1e12}


def copy(torch: Any, device: Any, nbytes: int, iterations: int) -> dict[str, Any]:
    source = torch.empty(nbytes, device=device, dtype=torch.uint8).fill_(0x5A)
    target = torch.empty_like(source)
    seconds = timed(torch, lambda: target.copy_(source), iterations, warmup=3)
    ok = bool(torch.equal(source[: 16 * MIB], target[: 16 * MIB]))
    return {"bytes": nbytes, "iterations": iterations, "seconds_per_op": seconds,
            "gbs": 2 * nbytes / seconds / 1e9, "copied_correctly": ok}


def memtest(torch: Any, device: Any, fraction: float, headroom_mib: int) -> dict[str, Any]:
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    target = int(free * fraction) - headroom_mib * MIB
    elements = GIB // 4
    blocks: list[Any] = []
    started = time.monotonic()
    stopped_by = None
    while (len(blocks) + 1) * GIB <= target:
        try:
            blocks.append(torch.empty(elements, dtype=torch.int32, device=device))
        except torch.cuda.OutOfMemoryError as error:
            stopped_by = f"allocation {len(blocks) + 1} failed: {str(error).splitlines()[0]}"
            break

    def expected(block: int, begin: int, end: int) -> Any:
        values = torch.arange(begin, end, dtype=torch.int32, device=device)
        return values.mul_(MULTIPLIER).add_(block * 7919)

    mismatches = 0
    for complement in (False, True):
        for number, block in enumerate(blocks):
            for begin in range(0, elements, VERIFY_SLICE):
                end = min(begin + VERIFY_SLICE, elements)
                values = expected(number, begin, end)
                block[begin:end] = values.bitwise_not_() if complement else values
        torch.cuda.synchronize()
        for number, block in enumerate(blocks):
            for begin in range(0, elements, VERIFY_SLICE):
                end = min(begin + VERIFY_SLICE, elements)
                values = expected(number, begin, end)
                if complement:
                    values.bitwise_not_()
                mismatches += int((block[begin:end] != values).sum().item())
    tested = len(blocks) * GIB
    del blocks
    torch.cuda.empty_cache()
    return {"free_bytes_before": int(free), "total_bytes": int(total), "bytes_tested": tested,
            "fraction": fraction, "headroom_mib": headroom_mib, "passes": 2, "mismatches": mismatches,
            "seconds": round(time.monotonic() - started, 2), "stopped_by": stopped_by}


def measure_gpu(torch: Any, index: int, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    props = torch.cuda.get_device_properties(device)
    result: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "uuid": f"GPU-{props.uuid}" if getattr(props, "uuid", None) else None,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_total_bytes": int(props.total_memory),
        "errors": [],
    }
    for name, run in (
        ("matmul", lambda: matmul(torch, device, args.matmul_n, args.matmul_iterations)),
        ("copy", lambda: copy(torch, device, args.copy_mib * MIB, args.copy_iterations)),
        ("memtest", lambda: memtest(torch, device, args.memtest_fraction, args.memtest_headroom_mib)),
    ):
        try:
            result[name] = run()
        except Exception as error:  # reported per GPU and judged as a failure
            result["errors"].append(f"{name} raised {type(error).__name__}: {str(error).splitlines()[0][:300]}")
        torch.cuda.empty_cache()
    return result


def _allreduce_rank(rank: int, ranks: int, port: int, nbytes: int, iterations: int, out_dir: str) -> None:
    """One process per GPU: all-reduce, check the sum, time it; writes rank<N>.json."""
    import torch  # in the spawned process
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=ranks)
    result: dict[str, Any] = {"rank": rank}
    try:
        data = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
        data.fill_(rank + 1)
        dist.all_reduce(data)
        torch.cuda.synchronize()
        expected = ranks * (ranks + 1) / 2
        result.update(expected_sum=expected, observed_sum=float(data[0].item()),
                      sum_ok=bool(torch.all(data == expected).item()))
        dist.barrier()
        result["seconds_per_op"] = timed(torch, lambda: dist.all_reduce(data), iterations, warmup=5)
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
        dist.destroy_process_group()


def nccl_allreduce(torch: Any, ranks: int, nbytes: int, iterations: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    os.environ["NCCL_NVLS_ENABLE"] = "0"  # inherited by the spawned processes too
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="gpu_validate_nccl_") as out_dir:
        try:
            mp.spawn(_allreduce_rank, args=(ranks, port, nbytes, iterations, out_dir), nprocs=ranks, join=True)
        except Exception as error:  # reported and judged as a failure
            return {"ranks": ranks, "bytes": nbytes, "error": f"{type(error).__name__}: {str(error)[:500]}"}
        results = [json.loads(Path(out_dir, f"rank{rank}.json").read_text(encoding="utf-8")) for rank in range(ranks)]
    return {
        "ranks": ranks,
        "bytes": nbytes,
        "iterations": iterations,
        # The slowest rank's time is the collective's.
        "seconds_per_op": max(result["seconds_per_op"] for result in results),
        "expected_sum": results[0]["expected_sum"],
        "observed_sum": [result["observed_sum"] for result in results],
        "sum_ok": all(result["sum_ok"] for result in results),
        "dev_shm_bytes": _dev_shm_bytes(),
    }


def _dev_shm_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")  # noqa: S108 - NCCL's shared memory, reported for the record
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", action="store_true", help="print what PyTorch sees (JSON) and exit")
    parser.add_argument("--matmul-n", type=int, default=8192)
    parser.add_argument("--matmul-iterations", type=int, default=20)
    parser.add_argument("--copy-mib", type=int, default=4096)
    parser.add_argument("--copy-iterations", type=int, default=20)
    parser.add_argument("--memtest-fraction", type=float, default=0.9, help="of the free memory")
    parser.add_argument("--memtest-headroom-mib", type=int, default=1024)
    parser.add_argument("--nccl-mib", type=int, default=1024)
    parser.add_argument("--nccl-iterations", type=int, default=20)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch = load_torch()
    seen = probe(torch)
    if args.probe:
        print(json.dumps(seen))
        return 0 if seen["device_count"] else 2
    if not seen["cuda_available"] or not seen["device_count"]:
        refuse(f"PyTorch {seen['torch']} (CUDA {seen['cuda_runtime']}) sees no CUDA device: this host has no"
               " working NVIDIA GPU, or torch is a CPU build (torch.version.cuda is None); nothing was measured")
    started = datetime.datetime.now(datetime.UTC)
    gpus = [measure_gpu(torch, index, args) for index in range(seen["device_count"])]
    nccl = (nccl_allreduce(torch, seen["device_count"], args.nccl_mib * MIB, args.nccl_iterations)
            if seen["device_count"] > 1 else None)
    print(json.dumps({
        "schema": 1,
        "started": started.isoformat(timespec="seconds"),
        "seconds": round((datetime.datetime.now(datetime.UTC) - started).total_seconds(), 1),
        "environment": {**seen, "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
                        "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER")},
        "settings": {key: value for key, value in vars(args).items() if key != "probe"},
        "gpus": gpus,
        "nccl": nccl,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
