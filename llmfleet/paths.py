"""Where llmfleet keeps the repository, its caches and its generated artifacts."""

from __future__ import annotations

import os
from pathlib import Path

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
