"""Cached venvs under `cache_dir()/venvs/`, built once per content key and never half-built.

llmfleet.lab.vllm_cpu (the engine) and llmfleet.build.toolchain (torch, transformers,
PEFT) each keep a venv named by the hash of its lock. ensure_cached_venv holds
what they share: one builder at a time (an flock), a build in
`.<name>.build-<pid>` renamed into place only once installed and checked, so an
interrupted build never looks cached, and a log of every step.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from llmfleet.errors import LlmfleetError
from llmfleet.paths import cache_dir, exclusive_build

log = logging.getLogger(__name__)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def run_logged(command: Sequence[str | Path], log_file: Path, what: str) -> None:
    """Run a build step, appending its output to log_file; raise with the tail on failure."""
    with log_file.open("a") as output:
        output.write(f"$ {' '.join(str(part) for part in command)}\n")
        output.flush()
        returncode = subprocess.call(list(command), stdout=output, stderr=subprocess.STDOUT)
    if returncode != 0:
        hint = ""
        tail = log_tail(log_file)
        if "torch" in tail and ("No matching distribution" in tail or "Could not find a version" in tail):
            hint = (
                " torch==2.13.0+cpu is not on PyPI: set PIP_FIND_LINKS to a folder holding its wheel,"
                " or PIP_EXTRA_INDEX_URL to the PyTorch CPU wheel index."
            )
        raise LlmfleetError(
            f"{what} failed (exit {returncode}); full log in {log_file}.{hint}\n--- last lines ---\n{tail}"
        )


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def relocate_scripts(venv: Path, built_at: Path) -> None:
    """Point bin/'s shebangs and activate scripts at the venv's final path.

    The venv is built in a temporary directory and renamed into place; only the
    text files in bin/ (and pyvenv.cfg's record of the command) carry the build
    path: bin/python is a symlink, and Python fixes up the paths of compiled
    modules on import.
    """
    old, new = str(built_at).encode(), str(venv).encode()
    for script in [built_at / "pyvenv.cfg", *(built_at / "bin").iterdir()]:
        if script.is_symlink() or not script.is_file():
            continue
        content = script.read_bytes()
        if old in content:
            script.write_bytes(content.replace(old, new))


def ensure_cached_venv(name: str, what: str, populate: Callable[[Path, Path], None]) -> Path:
    """Return cache_dir()/venvs/name, building it first if it is missing.

    populate(python, log_file) installs into the new venv and checks it; it runs
    on the build directory, which is renamed to name only when it returns.
    Leftovers of killed builds are removed by the next builder.
    """
    venvs = cache_dir() / "venvs"
    venvs.mkdir(parents=True, exist_ok=True)
    venv = venvs / name
    if venv_python(venv).exists():
        return venv
    with exclusive_build(venvs / f".{name}.lock", what):
        if venv_python(venv).exists():  # built while this process waited
            return venv
        for leftover in venvs.glob(f".{name}.build-*"):
            log.warning("removing %s, left by an interrupted build", leftover)
            shutil.rmtree(leftover)
        build = venvs / f".{name}.build-{os.getpid()}"
        log_file = venv.with_name(f"{name}.install.log")
        log_file.write_text("")
        log.warning("building %s in %s; log: %s", what, venv, log_file)
        started = time.monotonic()
        try:
            run_logged([sys.executable, "-m", "venv", "--prompt", name, build], log_file, "creating the venv")
            populate(venv_python(build), log_file)
            relocate_scripts(venv, build)
            build.rename(venv)
        finally:
            if build.exists():
                shutil.rmtree(build, ignore_errors=True)
        log.warning("built %s in %.0f s", venv, time.monotonic() - started)
    return venv
