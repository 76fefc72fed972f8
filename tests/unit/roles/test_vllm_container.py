"""roles/vllm/filter_plugins/vllm_container.py: what preflight refuses in an engine; its container's env and mounts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from llmfleet.lab import tiny
from llmfleet.module_utils import model_validation
from llmfleet.paths import REPO_ROOT
from tests.tools import load_plugin, venv_tool

FILTERS = load_plugin(REPO_ROOT / "roles" / "vllm" / "filter_plugins" / "vllm_container.py", "vllm_container")
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


# --- what preflight refuses before anything changes (vllm_engine_problems) ---------------------------

RESERVED = [
    "model", "host", "port", "served_model_name", "enable_lora", "lora_modules", "max_loras", "max_lora_rank",
    "api_key",
]  # fmt: skip


def _problems(**overrides: Any) -> list[str]:
    problems: list[str] = FILTERS.vllm_engine_problems(_engine(port=8101, **overrides), RESERVED, 8000)
    return problems


@pytest.mark.parametrize(
    "overrides",
    [{"args": {"api_key": "a-key-on-the-command-line"}}, {"extra_args": ["--api-key", "a-key-on-the-command-line"]}],
    ids=["args", "extra_args"],
)
def test_an_api_key_flag_is_refused_for_the_secret_file(overrides: dict[str, Any]) -> None:
    problems = _problems(**overrides)
    assert len(problems) == 1 and "--api-key" in problems[0] and "vllm_api_key" in problems[0], problems
    assert "a-key-on-the-command-line" not in problems[0]


def test_the_reserved_list_is_the_roles_own() -> None:
    reserved = yaml.safe_load((REPO_ROOT / "roles" / "vllm" / "vars" / "main.yml").read_text())["__vllm_reserved_args"]
    assert reserved == RESERVED


@pytest.mark.parametrize(
    ("where", "overrides"),
    [
        ("args", {"args": {"host": "127.0.0.1"}}),
        ("args", {"args": {"--host": "127.0.0.1"}}),
        ("extra_args", {"extra_args": ["--host", "127.0.0.1"]}),
        ("extra_args", {"extra_args": ["--enforce-eager", "--host=127.0.0.1"]}),
    ],
    ids=["args", "args-dashed", "extra_args", "extra_args-attached"],
)
def test_an_engine_bound_to_localhost_is_refused(where: str, overrides: dict[str, Any]) -> None:
    [problem] = _problems(**overrides)
    assert problem.startswith(f"Engine sft-b: {where} sets --host 127.0.0.1; remove it")
    assert "listen on 0.0.0.0:8000 inside its container" in problem
    assert "vllm_publish_address" in problem


@pytest.mark.parametrize(
    ("extra_args", "expected"),
    [
        (["--port", "9000"], "sets --port 9000; remove it"),
        (["--port=9000"], "set the engine's port instead"),
        (["--uds", "/tmp/vllm.sock"], "sets --uds /tmp/vllm.sock; remove it"),
    ],
)
def test_a_port_or_socket_of_its_own_is_refused(extra_args: list[str], expected: str) -> None:
    [problem] = _problems(extra_args=extra_args)
    assert expected in problem
    assert "0.0.0.0:8000" in problem


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"args": {"served-model-name": "x"}}, "--served_model_name"),
        ({"extra_args": ["--served_model_name", "x"]}, "--served_model_name"),
        ({"extra_args": ["--no-enable-lora"]}, "--enable_lora"),
        ({"args": {"model": "/srv/other"}}, "--model"),
    ],
)
def test_other_flags_the_role_sets_are_refused_however_spelled(overrides: dict[str, Any], flag: str) -> None:
    [problem] = _problems(**overrides)
    assert f"sets {flag}; the role sets model, host, port" in problem


def test_an_engine_that_leaves_them_to_the_role_passes() -> None:
    engine = {
        "args": {"max_model_len": 4096, "host": None},  # None leaves the flag out
        "extra_args": ["--enforce-eager", "--tokenizer", "host", "--chat-template=/t/port.jinja"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "4", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        "gpus": [0, 1],
    }
    assert _problems(**engine) == []


@pytest.mark.parametrize("variable", ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"])
def test_gpu_variables_in_the_engines_env_are_refused(variable: str) -> None:
    [problem] = _problems(gpus=[2, 3], env={variable: "0,1,2,3"})
    assert problem.startswith(f"Engine sft-b: env sets {variable}=0,1,2,3, which would override the GPUs")
    assert "NVIDIA_VISIBLE_DEVICES=2,3, CUDA_VISIBLE_DEVICES=0,1" in problem
    assert problem.endswith(f"remove {variable} from env and list the host GPU indices the engine should use in"
                            " its gpus instead.")
    # The container's env is never built with it either.
    with pytest.raises(AnsibleFilterError, match=variable):
        FILTERS.vllm_container_env(_engine(gpus=[2, 3], env={variable: "0,1,2,3"}), BASE)


def test_a_cpu_engine_cannot_take_gpus_through_its_env() -> None:
    [problem] = _problems(env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert "env sets NVIDIA_VISIBLE_DEVICES=all" in problem
    assert "from its gpus [] (NVIDIA_VISIBLE_DEVICES=(none), CUDA_VISIBLE_DEVICES=(none))" in problem


def test_the_token_in_env_is_refused_by_preflight_too() -> None:
    [problem] = _problems(env={"HF_TOKEN": "hf_x"})
    assert "env sets HF_TOKEN; give the token as vllm_hf_token" in problem


def test_every_problem_of_an_engine_is_named_at_once() -> None:
    problems = _problems(args={"host": "127.0.0.1"}, extra_args=["--port", "9000"], env={"CUDA_VISIBLE_DEVICES": "1"})
    assert [problem.split(";")[0] for problem in problems] == [
        "Engine sft-b: args sets --host 127.0.0.1",
        "Engine sft-b: extra_args sets --port 9000",
        "Engine sft-b: env sets CUDA_VISIBLE_DEVICES=1, which would override the GPUs the role assigns from its gpus []"
        " (NVIDIA_VISIBLE_DEVICES=(none), CUDA_VISIBLE_DEVICES=(none)), so the engine would see other GPUs than its"
        " tensor_parallel_size was set for",
    ]


@pytest.mark.parametrize("engine", [[], "sft-b"])
def test_an_engine_that_is_not_a_mapping_is_an_error(engine: Any) -> None:
    with pytest.raises(AnsibleFilterError, match="vllm_engines entry"):
        FILTERS.vllm_engine_problems(engine, RESERVED)


# --- attention heads against the tensor-parallel size (vllm_tensor_parallel_problems) ------------------

CONFIGS = REPO_ROOT / "tests" / "unit" / "fixtures" / "configs"


def _facts(model: str) -> dict[str, Any]:
    """What the model_check module returns for a published config.json (28 heads and 4 KV heads for Qwen2-7B)."""
    facts: dict[str, Any] = model_validation.check_model(str(CONFIGS / model), chat=False)["facts"]
    return facts


@pytest.mark.parametrize(
    ("model", "tp", "heads", "sizes"),
    [
        ("qwen2-7b-instruct", 8, "does not divide the 28 attention heads", "[1, 2, 4]"),
        ("qwen2-7b-instruct", 3, "does not divide the 28 attention heads", "[1, 2, 4]"),
        ("qwen2-1.5b-instruct", 3, "is above the 2 KV heads but not a multiple of them", "[1, 2, 4, 6]"),
    ],
    ids=["qwen2-7b-on-8", "qwen2-7b-on-3", "qwen2-1.5b-on-3"],
)
def test_a_size_that_does_not_divide_the_heads_is_refused(model: str, tp: int, heads: str, sizes: str) -> None:
    [problem] = FILTERS.vllm_tensor_parallel_problems(_facts(model), tp)
    assert problem.startswith(f"tensor-parallel size {tp} ")
    assert heads in problem
    assert f"the sizes that work for this model up to 8 are {sizes}: give the engine one of these numbers" in problem


@pytest.mark.parametrize(("model", "tp"), [("qwen2-7b-instruct", 4), ("qwen2-7b-instruct", "2"),
                                           ("qwen2-1.5b-instruct", 6), ("qwen2-1.5b-instruct", None)])
def test_a_size_that_divides_the_heads_passes(model: str, tp: Any) -> None:
    assert FILTERS.vllm_tensor_parallel_problems(_facts(model), tp) == []


def test_without_heads_in_the_facts_there_is_nothing_to_judge() -> None:
    assert FILTERS.vllm_tensor_parallel_problems({"attention_heads": None, "kv_heads": None}, 3) == []


@pytest.mark.parametrize("tp", [0, "two"])
def test_a_size_that_is_no_gpu_count_is_refused(tp: Any) -> None:
    [problem] = FILTERS.vllm_tensor_parallel_problems(_facts("qwen2-7b-instruct"), tp)
    assert "is not a whole number of GPUs of at least 1" in problem


# --- the same refusals through the role's preflight, run by ansible-playbook on localhost ---------------
# Preflight changes nothing (asserts, stat, realpath, model_check without fixes, set_fact), so it runs here
# for real against the tiny model (2 attention heads, 1 KV head); the failing task must be a preflight one.


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny"
    tiny.make_tiny_model(path)
    return path


def _preflight(tmp_path: Path, engine: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- name: Preflight\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Run the vllm role's preflight\n"
        "      ansible.builtin.include_role: {name: vllm, tasks_from: preflight}\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts")}
    command = [
        venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
        "-e", f"ansible_python_interpreter={sys.executable}",
        "-e", json.dumps({"vllm_version": "0.32.0", "vllm_engines": [{"name": "sft-b", "port": 8101, **engine}]}),
    ]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)


def _failed_task(output: str) -> str:
    """The name of the last task the play started before its first failure."""
    before_failure = re.split(r"^(?:\[ERROR\]|fatal:|failed:)", output, maxsplit=1, flags=re.MULTILINE)[0]
    tasks = re.findall(r"^TASK \[vllm : (.+?)\] \**$", before_failure, flags=re.MULTILINE)
    return tasks[-1] if tasks else ""


BIND_CHECK = "preflight | Check the bind, the GPUs and the flags the role sets are left to it"


@pytest.mark.parametrize(
    ("engine", "task", "message"),
    [
        pytest.param(
            {"extra_args": ["--host", "127.0.0.1"]},
            BIND_CHECK,
            "Engine sft-b: extra_args sets --host 127.0.0.1; remove it: the role makes the server listen on"
            " 0.0.0.0:8000 inside its container",
            id="host-127.0.0.1",
        ),
        pytest.param(
            {"gpus": [0, 1], "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}},
            BIND_CHECK,
            "Engine sft-b: env sets CUDA_VISIBLE_DEVICES=0,1,2,3, which would override the GPUs the role assigns",
            id="cuda-visible-devices",
        ),
        pytest.param(
            {"gpus": [0, 1], "args": {"tensor_parallel_size": 1}},
            "preflight | Check tensor parallelism equals the GPUs each engine gets",
            "Engine sft-b: tensor_parallel_size is 1 but it gets 2 GPU(s) [0, 1]",
            id="tp-not-the-gpu-count",
        ),
        pytest.param(
            {"gpus": [0, 1, 2]},
            "preflight | Check the full command line of each engine",
            "Engine sft-b: vLLM 0.32.0 would refuse its flags: tensor-parallel size 3 does not divide the 2 attention"
            " heads (vLLM: heads must be divisible by the tensor parallel size); the sizes that work for this model"
            " up to 8 are [1, 2]",
            id="tp-not-dividing-the-heads",
        ),
    ],
)
def test_the_roles_preflight_refuses_it(
    tmp_path: Path, tiny_model: Path, engine: dict[str, Any], task: str, message: str
) -> None:
    result = _preflight(tmp_path, {"model": str(tiny_model), **engine})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert _failed_task(output) == task, output
    assert message in " ".join(output.split()), output


def test_the_roles_preflight_passes_an_engine_that_leaves_them_to_it(tmp_path: Path, tiny_model: Path) -> None:
    engine = {"model": str(tiny_model), "gpus": [0, 1], "args": {"max_model_len": 1024},
              "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    result = _preflight(tmp_path, engine)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Check the full command line of each engine" in result.stdout
    engine = {
        "model": str(tiny_model),
        "gpus": [0, 1],
        "args": {"max_model_len": 1024},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }


def _written(*results: dict[str, Any]) -> dict[str, Any]:
    """What tasks/service.yml registers from "Write each engine's secret files": one result per (engine, secret)."""
    return {"changed": any(result.get("changed") for result in results), "results": list(results)}


def _secret(engine: str, key: str, changed: bool, **extra: Any) -> dict[str, Any]:
    return {"changed": changed, "item": [{"name": engine}, {"key": key, "value": f"vllm_{key}"}], **extra}


@pytest.mark.parametrize(
    ("written", "force", "expected"),
    [
        # vllm_restart=true restarts whatever the files did.
        (_written(), True, True),
        (_written(_secret("sft-b", "engine_api_key", changed=False)), True, True),
        # A new API key for this engine: the server reads it only at start-up.
        (_written(_secret("sft-b", "engine_api_key", changed=True)), False, True),
        # The same key written again (unchanged): no restart.
        (_written(_secret("sft-b", "engine_api_key", changed=False)), False, False),
        # Another engine's new key restarts that engine, not this one.
        (_written(_secret("base-a", "engine_api_key", changed=True)), False, False),
        # A new Hugging Face token is read when a model is fetched, not at start-up.
        (_written(_secret("sft-b", "hf_token", changed=True)), False, False),
        # A skipped item (no key set) has changed false.
        (
            _written({"changed": False, "skipped": True, "item": [{"name": "sft-b"}, {"key": "engine_api_key"}]}),
            False,
            False,
        ),
        # An empty plan registers no results; a result without them reads as none.
        ({"changed": False, "skipped": True, "results": []}, False, False),
        ({"changed": False}, False, False),
        # Among several results, one matching is enough.
        (
            _written(
                _secret("base-a", "engine_api_key", changed=True),
                _secret("sft-b", "hf_token", changed=True),
                _secret("sft-b", "engine_api_key", changed=True),
            ),
            False,
            True,
        ),
    ],
)
def test_restart_needed_only_for_force_or_this_engines_new_api_key(
    written: dict[str, Any], force: bool, expected: bool
) -> None:
    assert FILTERS.vllm_restart_needed(written, "sft-b", force=force) is expected


def test_restart_needed_refuses_what_is_not_a_registered_result() -> None:
    with pytest.raises(AnsibleFilterError, match="registered result"):
        FILTERS.vllm_restart_needed(["not", "a", "result"], "sft-b")
