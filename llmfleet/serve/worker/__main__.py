"""`python -m llmfleet.serve.worker`: run a worker with settings from the environment and secret files."""

from __future__ import annotations

import sys

from llmfleet.serve.worker.cli import serve

if __name__ == "__main__":
    sys.exit(serve())
