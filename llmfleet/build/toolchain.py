"""The lab's host-side toolchain (torch, transformers, PEFT) in a cached venv on this machine.

The python_toolchain role installs these pins on hosts from the wheelhouse
`llmfleet wheelhouse toolchain` builds. Merging a LoRA adapter
(`llmfleet model merge-adapter`) needs the same toolchain where llmfleet runs,
so this module installs the very same wheelhouse, with `pip --no-index`, into a
venv under `cache_dir()/venvs/`, named by the lock's hash (and the Python that
builds it), as llmfleet.lab.vllm_cpu does for the engine: change a pin and a fresh
venv is built beside the old one. About 1 GB; a minute or two the first time.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from llmfleet.build import wheelhouse
from llmfleet.build.venvs import ensure_cached_venv, run_logged
from llmfleet.errors import LlmfleetError
from llmfleet.paths import cache_dir

log = logging.getLogger(__name__)

LOCK = wheelhouse.TOOLCHAIN_LOCK
# What must import for the venv to count as built.
IMPORTS = "import torch, transformers, peft, safetensors"


def venv_dir(lock: Path = LOCK) -> Path:
    """Where the venv for this lock lives (whether or not it is built)."""
    stem = lock.name.removesuffix(".txt").removesuffix(".lock")
    return cache_dir() / "venvs" / f"{stem}-{wheelhouse.locked_key(lock)}"


def ensure_venv(lock: Path = LOCK) -> Path:
    """Return the cached toolchain venv for lock, building it from the lock's wheelhouse if missing.

    Built by llmfleet.build.venvs.ensure_cached_venv (under an flock, in a temporary
    directory renamed into place once installed and checked against the lock).
    """
    wheels = wheelhouse.ensure_locked(lock)

    def populate(python: Path, log_file: Path) -> None:
        run_logged(
            [python, "-m", "pip", "install", "--no-input", "--no-index", "--find-links", wheels, "-r", lock],
            log_file,
            "installing the toolchain from its wheelhouse",
        )
        _check_pins(python, lock, log_file)
        run_logged([python, "-c", IMPORTS], log_file, "importing the toolchain in the new venv")

    return ensure_cached_venv(venv_dir(lock).name, f"the toolchain venv (about 1 GB) from {wheels}", populate)


def _check_pins(python: Path, lock: Path, log_file: Path) -> None:
    """Refuse a venv whose packages (pip excepted) differ from the lock's pins."""
    frozen = subprocess.run([python, "-m", "pip", "freeze", "--all"], check=True, capture_output=True, text=True).stdout
    installed = wheelhouse.lock_pins(frozen)
    installed.pop("pip", None)
    locked = wheelhouse.lock_pins(lock.read_text())
    if installed != locked:
        differ = sorted(
            f"{name}: locked {locked.get(name)}, installed {installed.get(name)}"
            for name in set(installed) | set(locked)
            if installed.get(name) != locked.get(name)
        )
        raise LlmfleetError(f"the toolchain venv does not match {lock}: {'; '.join(differ)}; build log in {log_file}")
