"""`python -m llmfleet.worker`: run a worker with settings from the environment and secret files."""

from __future__ import annotations

import sys

from llmfleet.worker.cli import serve

if __name__ == "__main__":
    sys.exit(serve())
