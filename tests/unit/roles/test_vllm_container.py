"""roles/vllm/filter_plugins/vllm_container.py: an engine's container environment and mounts."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from llmfleet.paths import REPO_ROOT


def _load() -> ModuleType:
    path = REPO_ROOT / "roles" / "vllm" / "filter_plugins" / "vllm_container.py"
    spec = importlib.util.spec_from_file_location("vllm_container", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = _load()
BASE = {"VLLM_NO_USAGE_STATS": "1"}


def _engine(**overrides: Any) -> dict[str, Any]:
    return {"name": "sft-b", "model_path": "/srv/m/versions/abc", "gpus": [], "adapters": [], "env": {}, **overrides}


def test_gpus_keep_their_order_and_are_renumbered_inside() -> None:
    env = FILTERS.vllm_container_env(_engine(gpus=[3, 2]), BASE)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "3,2"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_cpu_engine_gets_no_gpu_variables() -> None:
    env = FILTERS.vllm_container_env(_engine(), BASE)
    assert not {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} & set(env)
    assert env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize(
    ("argv", "gpus", "expected"),
    [
        (["--distributed-executor-backend", "uni"], [], "0"),
        (["--distributed-executor-backend=uni"], [], "0"),
        (["--distributed_executor_backend", "uni"], [], "0"),  # vLLM takes underscores too
        (["--distributed-executor-backend", "uni", "--distributed-executor-backend", "mp"], [], None),
        (["--distributed-executor-backend", "mp"], [], None),
        ([], [], None),
        (["--distributed-executor-backend", "uni"], [0], None),  # GPU engines honour uni as it is
    ],
)
def test_a_cpu_engine_asking_for_uni_gets_multiprocessing_off(
    argv: list[str], gpus: list[int], expected: str | None
) -> None:
    env = FILTERS.vllm_container_env(_engine(argv=argv, gpus=gpus), BASE)
    assert env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == expected


def test_the_engines_own_multiprocessing_setting_wins() -> None:
    engine = _engine(argv=["--distributed-executor-backend", "uni"], env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    assert FILTERS.vllm_container_env(engine, BASE)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_token_appears_as_a_path_only() -> None:
    env = FILTERS.vllm_container_env(_engine(), BASE, "/run/secrets/hf_token", offline=False)
    assert env["HF_TOKEN_PATH"] == "/run/secrets/hf_token"
    assert "HF_HUB_OFFLINE" not in env


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"])
def test_token_in_the_environment_is_refused(name: str) -> None:
    with pytest.raises(AnsibleFilterError, match="vllm_hf_token"):
        FILTERS.vllm_container_env(_engine(env={name: "hf_x"}), BASE)


def test_engine_env_comes_last_and_values_are_strings() -> None:
    env = FILTERS.vllm_container_env(_engine(env={"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_NO_USAGE_STATS": "0"}), BASE)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == "0"


def test_every_mount_is_read_only_and_the_token_is_mounted_when_given() -> None:
    engine = _engine(adapters=[["support", "/srv/a/versions/x"]])
    mounts = FILTERS.vllm_container_mounts(engine, "/models", "/adapters", "/var/cache/hf", "/root/.cache/hf",
                                           "/etc/llmfleet/vllm/sft-b/hf_token", "/run/secrets/hf_token")
    assert [(m["source"], m["target"]) for m in mounts] == [
        ("/srv/m/versions/abc", "/models/sft-b"),
        ("/var/cache/hf", "/root/.cache/hf"),
        ("/srv/a/versions/x", "/adapters/support"),
        ("/etc/llmfleet/vllm/sft-b/hf_token", "/run/secrets/hf_token"),
    ]
    assert all(m["read_only"] for m in mounts)
    without = FILTERS.vllm_container_mounts(_engine(), "/models", "/adapters", "/h", "/home")
    assert len(without) == 2
