"""How tests call the project's own commands: from the venv running pytest,
whatever PATH says."""

from __future__ import annotations

import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
LLMFLEET = [sys.executable, "-m", "llmfleet"]


def venv_tool(name: str) -> str:
    """Absolute path of a console script installed beside this interpreter."""
    return str(VENV_BIN / name)
