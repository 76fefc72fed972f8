"""The weights: one safetensors file or an index and its shards, complete, readable, one dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .findings import _SHARD_RE, WEIGHTS, WEIGHTS_INDEX, _Findings, _is_file, _join, _read_json
from .safetensors import DTYPE_NAMES, SafetensorsError, TensorInfo, read_safetensors_header


def _check_weights(model_dir: str, quantized: bool, findings: _Findings) -> dict[str, Any]:
    """Check the weight files; return bytes, parameters and dtype read from the headers."""
    index_path = _join(model_dir, WEIGHTS_INDEX)
    single_path = _join(model_dir, WEIGHTS)
    stage_fix = "copy the file again from the source: the copy is incomplete (staging verifies checksums)"
    tensors: dict[str, TensorInfo] = {}
    files: list[str] = []
    if Path(index_path).exists():
        index = _read_json(index_path, findings, "bad-weights-index", "copy the index again from the source")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if index is not None and not (
            isinstance(weight_map, dict) and weight_map and all(isinstance(v, str) for v in weight_map.values())
        ):
            findings.problem(
                "bad-weights-index", index_path, "has no 'weight_map' of tensor name -> shard file",
                "copy the index again from the source, or regenerate it with save_pretrained",
            )  # fmt: skip
            weight_map = None
        if isinstance(weight_map, dict):
            by_shard: dict[str, list[str]] = {}
            for name, shard in weight_map.items():
                by_shard.setdefault(shard, []).append(name)
            for shard in sorted(by_shard):
                shard_path = _join(model_dir, shard)
                files.append(shard)
                if not _is_file(shard_path):
                    findings.problem(
                        "missing-shard", shard_path,
                        f"is listed in {WEIGHTS_INDEX} ({len(by_shard[shard])} tensors) but is missing", stage_fix,
                    )  # fmt: skip
                    continue
                try:
                    header = read_safetensors_header(shard_path)
                except SafetensorsError as error:
                    findings.problem("bad-shard", shard_path, str(error), stage_fix)
                    continue
                absent = sorted(name for name in by_shard[shard] if name not in header)
                if absent:
                    shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
                    findings.problem(
                        "tensor-not-in-shard", shard_path,
                        f"lacks {len(absent)} tensor(s) that {WEIGHTS_INDEX} assigns to it ({shown})",
                        "the index and the shards come from different exports: copy both again from one export",
                    )  # fmt: skip
                extra = sorted(set(header) - set(weight_map))
                if extra:
                    findings.warnings.append(
                        f"{shard_path}: holds {len(extra)} tensor(s) that {WEIGHTS_INDEX} does not list"
                        f" (e.g. {extra[0]}); vLLM loads them anyway"
                    )
                tensors.update(header)
    elif Path(single_path).exists():
        files.append(WEIGHTS)
        try:
            tensors = read_safetensors_header(single_path)
        except SafetensorsError as error:
            findings.problem("bad-weights", single_path, str(error), stage_fix)
    else:
        present = sorted(entry.name for entry in Path(model_dir).iterdir())
        shards = [name for name in present if _SHARD_RE.match(name)]
        if shards:
            findings.problem(
                "missing-weights-index", index_path,
                f"is missing but the directory holds {len(shards)} shard(s) ({shards[0]}, ...):"
                " nothing says which tensors belong where or whether a shard is missing",
                "copy model.safetensors.index.json from the same export",
            )  # fmt: skip
        elif any(name.endswith(".bin") for name in present):
            findings.problem(
                "no-safetensors", single_path,
                "is missing: the directory holds only PyTorch .bin weights, whose sizes cannot be read"
                " without unpickling them",
                "convert the checkpoint to safetensors (transformers save_pretrained(safe_serialization=True))",
            )  # fmt: skip
        else:
            findings.problem(
                "no-weights", single_path, f"is missing and there is no {WEIGHTS_INDEX} either",
                "copy the model's weights into the directory",
            )  # fmt: skip
    if not tensors:
        return {"weights_files": files}
    by_dtype: dict[str, int] = {}
    for info in tensors.values():
        by_dtype[info.dtype] = by_dtype.get(info.dtype, 0) + 1
    dominant = max(by_dtype, key=lambda dtype: sum(t.nbytes for t in tensors.values() if t.dtype == dtype))
    if len(by_dtype) > 1:
        counts = ", ".join(f"{dtype} ({count} tensors)" for dtype, count in sorted(by_dtype.items()))
        if quantized:
            findings.warnings.append(f"weights mix dtypes {counts}; expected for a quantized checkpoint")
        else:
            findings.problem(
                "mixed-dtypes", single_path if files == [WEIGHTS] else index_path,
                f"tensors mix dtypes: {counts}",
                f"re-export the model in one dtype (e.g. model.to(torch.{DTYPE_NAMES.get(dominant, 'bfloat16')})"
                " before save_pretrained)",
            )  # fmt: skip
    return {
        "weights_files": files,
        "weights_bytes": sum(info.nbytes for info in tensors.values()),
        "parameters": sum(info.elements for info in tensors.values()),
        "tensors": len(tensors),
        "weights_dtype": DTYPE_NAMES.get(dominant, dominant),
        "_tensors": tensors,
    }
