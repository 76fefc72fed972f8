"""Filters that turn one engine's plan (built in tasks/preflight.yml) into its container's env and mounts.

Python rather than Jinja: the rules (GPU numbering, which secrets appear how)
read better here, and tests/unit/roles/test_vllm_container.py checks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError


def vllm_container_env(
    engine: Mapping[str, Any], base: Mapping[str, Any], token_path: str = "", offline: bool = True
) -> dict[str, str]:
    """The engine's environment: base, then offline, GPU, CPU and token settings, then the engine's own.

    GPUs: NVIDIA_VISIBLE_DEVICES names the host's GPUs (what the runtime
    exposes); inside, CUDA renumbers them from 0 in that order, so
    CUDA_VISIBLE_DEVICES is 0..n-1, and PCI bus order makes CUDA's numbering
    match nvidia-smi's. The token appears as a path, never as its value.

    A CPU engine (no GPUs) that asks for the in-process executor
    (--distributed-executor-backend uni) gets VLLM_ENABLE_V1_MULTIPROCESSING=0:
    without it vLLM-CPU silently swaps in its multiprocess executor, whose model
    process busy-waits between steps (vLLM 0.32, platforms/cpu.py).
    """
    gpus = [str(int(gpu)) for gpu in engine.get("gpus") or []]
    env: dict[str, Any] = dict(base)
    if offline:
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if gpus:
        env.update(
            NVIDIA_VISIBLE_DEVICES=",".join(gpus),
            CUDA_VISIBLE_DEVICES=",".join(str(index) for index in range(len(gpus))),
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
        )
    if not gpus and _in_process_executor(engine.get("argv") or []):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if token_path:
        env["HF_TOKEN_PATH"] = token_path
    own = engine.get("env") or {}
    if not isinstance(own, Mapping):
        raise AnsibleFilterError(f"engine {engine.get('name')}: env must be a mapping")
    clash = sorted({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"} & set(own))
    if clash:
        raise AnsibleFilterError(
            f"engine {engine.get('name')}: env sets {', '.join(clash)}; give the token as vllm_hf_token,"
            " which the role mounts as a file instead of an environment variable"
        )
    env.update(own)
    return {str(key): str(value) for key, value in env.items()}


def _in_process_executor(argv: Sequence[str]) -> bool:
    """Whether argv (the last one wins, as in argparse) chooses the `uni` executor, however the flag is spelled."""
    chosen = None
    for index, word in enumerate(argv):
        name, attached, value = word.partition("=")
        if name.replace("_", "-") != "--distributed-executor-backend":
            continue
        if attached:
            chosen = value
        elif index + 1 < len(argv):
            chosen = argv[index + 1]
    return chosen == "uni"


def _bind(source: str, target: str) -> dict[str, Any]:
    return {"type": "bind", "source": source, "target": target, "read_only": True}


def vllm_container_mounts(
    engine: Mapping[str, Any],
    models_dir: str,
    adapters_dir: str,
    hf_cache: str,
    hf_home: str,
    token_source: str = "",
    token_target: str = "",
) -> list[dict[str, Any]]:
    """Read-only binds: the model's served version, each adapter, the HF cache, and the token file if any."""
    mounts = [_bind(engine["model_path"], f"{models_dir}/{engine['name']}"), _bind(hf_cache, hf_home)]
    adapters: Sequence[Sequence[str]] = engine.get("adapters") or []
    mounts += [_bind(path, f"{adapters_dir}/{name}") for name, path in adapters]
    if token_source:
        mounts.append(_bind(token_source, token_target))
    return mounts


class FilterModule:
    """Container settings of the vllm role."""

    def filters(self) -> dict[str, Any]:
        return {"vllm_container_env": vllm_container_env, "vllm_container_mounts": vllm_container_mounts}
