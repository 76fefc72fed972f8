"""Filters that check an engine before anything changes, and turn its plan into its container's env and mounts.

``engine | vllm_engine_problems(reserved, container_port)`` lists what in a
vllm_engines entry the role must refuse: flags it sets itself (above all a bind,
failure mode #4), and variables in its env that choose GPUs (#5) or hold the
token. ``model_check_facts | vllm_tensor_parallel_problems(tp)`` says why vLLM
would refuse that tensor-parallel size for the model (#5). tasks/preflight.yml
asserts both are empty before the role changes anything.

Python rather than Jinja: the rules (GPU numbering, which secrets appear how)
read better here, and tests/unit/roles/test_vllm_container.py checks them. The
tensor-parallel rules are the capacity planner's
(plugins/module_utils/capacity_planner.py), imported from the installed
llmfleet package (``llmfleet.module_utils``, a link to plugins/module_utils;
docs/layout.md): filter plugins run on the controller, where
``ansible.module_utils`` holds only Ansible's own module_utils.

This plugin stays in the role (roles/vllm/filter_plugins) rather than
plugins/filter: only the vllm role calls these filters (tasks/preflight.yml and
tasks/service.yml), and they encode that role's container contract (its
reserved flags, its env, its mounts, its restart rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

# Controller-side plugins import the shared code from the installed llmfleet package
# (llmfleet/module_utils is a link to plugins/module_utils): one import path, one module.
# Without llmfleet in the Python that runs ansible-playbook, say how to get it.
try:
    from llmfleet.module_utils import capacity_planner
except ImportError as error:  # pragma: no cover (every venv that runs Ansible here installs llmfleet)
    raise AnsibleFilterError(
        f"vllm_container: {error}; run ansible-playbook from the README's venv, or pip install -e '.[ops]' in yours"
    ) from error


# What chooses the GPUs a container sees. The role sets both from the engine's
# gpus; a value of the engine's own would give it other GPUs than its
# tensor parallelism was set for (NVIDIA_VISIBLE_DEVICES=all can even expose
# every GPU of the host to an unprivileged container).
_GPU_ENV = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
_TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# Flags that decide where the server listens, besides its port. --uds (vLLM
# 0.1x) swaps the TCP listener for a Unix socket, which no worker reaches either.
_LISTEN_FLAGS = ("host", "uds")


def _flag_name(word: str) -> str:
    """args key or option string -> the dest vLLM gives it: --served-model-name and served_model_name alike."""
    return word.lstrip("-").partition("=")[0].replace("-", "_")


def _flags_set(engine: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(where, dest, value) for every flag the engine's args and extra_args give (an args value None gives none)."""
    args = engine.get("args") or {}
    extra_args = engine.get("extra_args") or []
    if not isinstance(args, Mapping) or isinstance(extra_args, str | bytes) or not isinstance(extra_args, Sequence):
        raise AnsibleFilterError(
            f"Engine {engine.get('name')}: args must be a mapping of flags and extra_args a list of strings"
        )
    found = [("args", _flag_name(str(key)), str(value)) for key, value in args.items() if value is not None]
    extra = [str(word) for word in extra_args]
    for index, word in enumerate(extra):
        if not word.startswith("--"):
            continue
        _, attached, value = word.partition("=")
        if not attached and index + 1 < len(extra) and not extra[index + 1].startswith("--"):
            value = extra[index + 1]
        found.append(("extra_args", _flag_name(word), value))
    return found


def _env_problems(engine: Mapping[str, Any]) -> list[str]:
    name = engine.get("name")
    own = engine.get("env") or {}
    if not isinstance(own, Mapping):
        return [f"Engine {name}: env must be a mapping of variable -> value."]
    problems = []
    gpus = [str(gpu) for gpu in engine.get("gpus") or []]
    for variable in (variable for variable in _GPU_ENV if variable in own):
        problems.append(
            f"Engine {name}: env sets {variable}={own[variable]}, which would override the GPUs the role assigns"
            f" from its gpus [{', '.join(gpus)}] (NVIDIA_VISIBLE_DEVICES={','.join(gpus) or '(none)'},"
            f" CUDA_VISIBLE_DEVICES={','.join(str(i) for i in range(len(gpus))) or '(none)'}), so the engine"
            f" would see other GPUs than its tensor_parallel_size was set for; remove {variable} from env and"
            " list the host GPU indices the engine should use in its gpus instead."
        )
    clash = [variable for variable in _TOKEN_ENV if variable in own]
    if clash:
        problems.append(
            f"Engine {name}: env sets {', '.join(clash)}; give the token as vllm_hf_token,"
            " which the role mounts as a file instead of an environment variable."
        )
    return problems


def vllm_engine_problems(engine: Mapping[str, Any], reserved: Sequence[str], container_port: int = 8000) -> list[str]:
    """What the role refuses in one vllm_engines entry, one sentence each naming the engine; empty when none.

    reserved: the flags the role sets itself (vars/main.yml's __vllm_reserved_args),
    refused in args and extra_args however they are spelled (--served-model-name,
    served_model_name). host, port and uds get their own message: the server
    must listen on 0.0.0.0:container_port inside its container, the only bind
    the workers can reach, and is published on the inventory's address.
    """
    if not isinstance(engine, Mapping):
        raise AnsibleFilterError(f"vllm_engine_problems expects a vllm_engines entry, got {type(engine).__name__}")
    name = engine.get("name")
    bind = f"the role makes the server listen on 0.0.0.0:{container_port} inside its container"
    problems = []
    for where, dest, value in _flags_set(engine):
        if dest in _LISTEN_FLAGS:
            problems.append(
                f"Engine {name}: {where} sets --{dest} {value}; remove it: {bind}, the only bind the workers can"
                " reach (bound to 127.0.0.1, or to a Unix socket, it refuses every connection from outside the"
                " container), and the address they use comes from the inventory: vllm_publish_address (default:"
                " the host's address) at the engine's port."
            )
        elif dest == "port":
            problems.append(
                f"Engine {name}: {where} sets --port {value}; remove it: {bind}, published at"
                f" vllm_publish_address on the engine's port ({engine.get('port')}): set the engine's port instead."
            )
        elif dest == "api_key":
            problems.append(
                f"Engine {name}: {where} sets --api-key; remove it and give the key as vllm_api_key (from the vault):"
                " the role mounts it as a file, while a flag shows in the host's process list."
            )
        elif dest in reserved or (dest.startswith("no_") and dest[3:] in reserved):
            problems.append(
                f"Engine {name}: {where} sets --{dest.removeprefix('no_')}; the role sets"
                f" {', '.join(str(flag) for flag in reserved)} itself: use the engine's model, port,"
                " served_model_name and adapters instead."
            )
    return problems + _env_problems(engine)


def vllm_tensor_parallel_problems(facts: Mapping[str, Any], tensor_parallel_size: Any) -> list[str]:
    """Why vLLM would refuse this tensor-parallel size for the model model_check described; empty when it would not.

    facts is what the model_check module returns, read from the model's
    config.json on the host. Without attention_heads or kv_heads there (a
    config the check could not size) there is nothing to judge: the engine
    decides at start-up. A size of None leaves the flag out (as vllm_args
    does), so the engine's default, 1, is judged.
    """
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError(
            f"vllm_tensor_parallel_problems expects the facts model_check returns, got {type(facts).__name__}"
        )
    try:
        tp = 1 if tensor_parallel_size is None else int(tensor_parallel_size)
    except (TypeError, ValueError):
        tp = 0
    if tp < 1:
        return [f"tensor_parallel_size {tensor_parallel_size!r} is not a whole number of GPUs of at least 1"]
    heads, kv_heads = facts.get("attention_heads"), facts.get("kv_heads")
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads < 1 or kv_heads < 1:
        return []
    problems: list[str] = capacity_planner.tensor_parallel_problems(heads, kv_heads, tp)
    if not problems:
        return []
    sizes = capacity_planner.valid_tensor_parallel_sizes(heads, kv_heads, max(tp, 8))
    return [
        "; ".join(problems)
        + f"; the sizes that work for this model up to {max(tp, 8)} are {sizes}: give the engine one of these"
        " numbers of gpus (tensor_parallel_size follows their count)"
    ]


def vllm_container_env(
    engine: Mapping[str, Any], base: Mapping[str, Any], token_path: str = "", offline: bool = True
) -> dict[str, str]:
    """The engine's environment: base, then offline, GPU, CPU and token settings, then the engine's own.

    The engine's own env comes last but may not choose GPUs or hold the token
    (AnsibleFilterError, as vllm_engine_problems says).

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
    # Preflight refuses these already; refused here too, so no caller can put them in a container.
    problems = _env_problems(engine)
    if problems:
        raise AnsibleFilterError(" ".join(problems))
    env.update(engine.get("env") or {})
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


def vllm_restart_needed(written: Mapping[str, Any], engine_name: str, force: bool = False) -> bool:
    """Whether the engine's container must restart: force (vllm_restart), or a new API key file for this engine.

    written is what tasks/service.yml registers from "Write each engine's secret
    files" (__vllm_secret_files_written): a looped result whose items are
    [engine, {key: file name, value: variable name}]. The server reads its API
    key once, at start-up, so only a changed ``engine_api_key`` file of this
    engine restarts it; the Hugging Face token (read when a model is fetched), a
    skipped item and other engines' files do not. force is ``vllm_restart | bool``,
    converted in the task so it keeps Ansible's own reading of yes/no strings.
    """
    if force:
        return True
    if not isinstance(written, Mapping):
        raise AnsibleFilterError(
            f"vllm_restart_needed expects the registered result of the secret files task, got {type(written).__name__}"
        )
    for result in written.get("results") or []:
        if not isinstance(result, Mapping) or not result.get("changed"):
            continue
        item = result.get("item")
        if not isinstance(item, Sequence) or isinstance(item, str) or len(item) < 2:
            continue
        engine, secret = item[0], item[1]
        if (
            isinstance(engine, Mapping)
            and isinstance(secret, Mapping)
            and engine.get("name") == engine_name
            and secret.get("key") == "engine_api_key"
        ):
            return True
    return False


class FilterModule:
    """Container settings of the vllm role."""

    def filters(self) -> dict[str, Any]:
        return {
            "vllm_engine_problems": vllm_engine_problems,
            "vllm_tensor_parallel_problems": vllm_tensor_parallel_problems,
            "vllm_container_env": vllm_container_env,
            "vllm_container_mounts": vllm_container_mounts,
            "vllm_restart_needed": vllm_restart_needed,
        }
