"""How tests call the project's own commands (from the venv running pytest,
whatever PATH says) and find a free loopback port."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
LLMFLEET = [sys.executable, "-m", "llmfleet"]


def venv_tool(name: str) -> str:
    """Absolute path of a console script installed beside this interpreter."""
    return str(VENV_BIN / name)


def free_loopback_port() -> int:
    """A port nothing listens on now, on 127.0.0.1, for a server the test starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
