"""The lab's host-side toolchain (torch, transformers, PEFT) in a cached venv on this machine.

The python_toolchain role installs these pins on hosts from the wheelhouse
`llmfleet wheelhouse toolchain` builds. Merging a LoRA adapter
(`llmfleet model merge-adapter`) needs the same toolchain where llmfleet runs,
so this module installs the very same wheelhouse, with `pip --no-index`, into a
venv under `cache_dir()/venvs/`, named by the lock's hash (and the Python that
builds it), as llmfleet.vllm_cpu does for the engine: change a pin and a fresh
venv is built beside the old one. About 1 GB; a minute or two the first time.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from llmfleet import wheelhouse
from llmfleet.errors import LlmfleetError
from llmfleet.paths import cache_dir, exclusive_build
from llmfleet.vllm_cpu import relocate_scripts, run_logged, venv_python

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

    Built in `.<name>.build-<pid>` beside the final directory under an flock and
    renamed into place once installed and checked against the lock, so an
    interrupted build never looks cached.
    """
    venv = venv_dir(lock)
    if venv_python(venv).exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_build(venv.parent / f".{venv.name}.lock", "the toolchain venv"):
        if venv_python(venv).exists():  # built while this process waited
            return venv
        for leftover in venv.parent.glob(f".{venv.name}.build-*"):
            log.warning("removing %s, left by an interrupted build", leftover)
            shutil.rmtree(leftover)
        _build(venv, venv.parent / f".{venv.name}.build-{os.getpid()}", lock)
    return venv


def _build(venv: Path, build: Path, lock: Path) -> None:
    wheels = wheelhouse.ensure_locked(lock)
    log_file = venv.with_name(f"{venv.name}.install.log")
    log_file.write_text("")
    log.warning("building the toolchain venv %s from %s (about 1 GB); log: %s", venv, wheels, log_file)
    started = time.monotonic()
    try:
        run_logged([sys.executable, "-m", "venv", "--prompt", venv.name, build], log_file, "creating the venv")
        python = venv_python(build)
        run_logged(
            [python, "-m", "pip", "install", "--no-input", "--no-index", "--find-links", wheels, "-r", lock],
            log_file,
            "installing the toolchain from its wheelhouse",
        )
        _check_pins(python, lock, log_file)
        run_logged([python, "-c", IMPORTS], log_file, "importing the toolchain in the new venv")
        relocate_scripts(venv, build)
        build.rename(venv)
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
    log.warning("built %s in %.0f s", venv, time.monotonic() - started)


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
