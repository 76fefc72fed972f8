"""`python -m llmfleet.serve.gateway`: serve the gateway with settings from the environment and secret files."""

from __future__ import annotations

import sys

from llmfleet.serve.gateway.cli import serve

if __name__ == "__main__":
    sys.exit(serve())
