"""`llmfleet wheelhouse build DIR`: every wheel the hosts need, for sites with no index.

Hosts then install with `pip install --no-index --find-links DIR llmfleet`:
the air-gapped pattern. Versions come from constraints.txt, so the wheelhouse
holds exactly the pinned tree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT

CONSTRAINTS = REPO_ROOT / "constraints.txt"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    wheelhouse = subparsers.add_parser("wheelhouse", help="wheels for hosts without a package index")
    actions = wheelhouse.add_subparsers(dest="wheelhouse_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="write the package and its pinned dependencies as wheels")
    build.add_argument("directory", type=Path, metavar="DIR")
    build.set_defaults(handler=_build)


def build(directory: Path) -> list[Path]:
    """Write wheels for llmfleet and its pinned runtime dependencies into directory."""
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
        str(REPO_ROOT),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LlmfleetError(f"pip wheel failed:\n{result.stderr.strip()[-2000:]}")
    return sorted(directory.glob("*.whl"))


def _build(args: argparse.Namespace) -> int:
    wheels = build(args.directory)
    print(f"{len(wheels)} wheels in {args.directory}")
    return 0
