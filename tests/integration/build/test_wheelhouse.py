"""`llmfleet wheelhouse build`: a host with no package index installs from it alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.tools import LLMFLEET


def test_package_installs_from_the_wheelhouse_with_no_index(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheels"
    build = subprocess.run(
        [*LLMFLEET, "wheelhouse", "build", str(wheelhouse)], capture_output=True, text=True, check=False
    )
    assert build.returncode == 0, build.stderr
    names = {path.name.split("-")[0].lower() for path in wheelhouse.glob("*.whl")}
    assert {"llmfleet", "ansible", "ansible_core", "tokenizers", "numpy"} <= names

    venv = tmp_path / "host-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # No index and no machine-wide pip configuration: only the wheelhouse.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--no-index", "--find-links", str(wheelhouse), "llmfleet"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    version = subprocess.run([str(venv / "bin" / "llmfleet"), "--version"], capture_output=True, text=True, check=False)
    assert version.stdout.strip() == "llmfleet 0.1.0", version
