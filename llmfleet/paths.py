"""Where llmfleet keeps the repository, its caches and its generated artifacts."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# The repository root: the package lives one level below it.
REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Content-keyed caches (base image rootfs, vLLM venv, wheels).

    Outside the clone on purpose: a fresh clone on the same machine reuses them,
    and every entry is keyed by what built it, so a stale one is never picked.
    """
    path = Path(os.environ.get("LLMFLEET_CACHE", Path.home() / ".cache" / "llmfleet"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def exclusive_build(lock_path: Path, what: str) -> Iterator[None]:
    """Hold an flock on lock_path while building a cache entry; released when the holder dies.

    One builder per entry: a second one waits, then finds the entry built.
    """
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("another process is building %s; waiting for it (%s)", what, lock_path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
