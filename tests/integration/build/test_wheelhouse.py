"""`llmfleet wheelhouse build`: a host with no package index installs from it alone.

Bare, as the service image installs it, the package brings only what serves and
its CLI offers only the serving commands; with the ops extra, as the scaler's
venv installs it, everything.
"""

from __future__ import annotations

import os
import re
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

    def pip_install(requirement: str) -> None:
        install = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--no-index", "--find-links", str(wheelhouse), requirement],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    def llmfleet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "llmfleet"), *args], capture_output=True, text=True, check=False)

    def installed() -> set[str]:
        listing = subprocess.run(
            [str(venv / "bin" / "pip"), "list", "--format=freeze"], capture_output=True, text=True, env=env, check=True
        )
        return {line.split("==")[0].lower() for line in listing.stdout.splitlines()}

    pip_install("llmfleet")
    assert llmfleet("--version").stdout.strip() == "llmfleet 0.1.0"
    assert {"fastapi", "redis", "tokenizers"} <= installed()
    assert not {"ansible", "ansible-core", "ansible-runner", "numpy", "docker"} & installed()
    bare = llmfleet("--help")
    assert bare.returncode == 0, bare.stderr
    assert {"gateway", "worker", "token"} <= _commands(bare.stdout)
    assert not {"lab", "image", "scaler", "bench", "wheelhouse"} & _commands(bare.stdout)
    assert "pip install 'llmfleet[ops]'" in " ".join(bare.stdout.split())
    refused = llmfleet("lab", "up")
    assert refused.returncode == 2 and "invalid choice: 'lab'" in refused.stderr
    assert "pip install 'llmfleet[ops]'" in refused.stderr

    pip_install("llmfleet[ops]")
    assert {"ansible", "ansible-runner", "numpy"} <= installed()
    full = llmfleet("--help")
    assert full.returncode == 0, full.stderr
    assert {"gateway", "worker", "token", "lab", "image", "scaler", "bench", "wheelhouse"} <= _commands(full.stdout)


def _commands(help_text: str) -> set[str]:
    """The command names `llmfleet --help` lists: the first word of each line of its COMMAND list."""
    listing = help_text.split("positional arguments:", 1)[1].split("options:", 1)[0]
    return set(re.findall(r"^    (\S+)", listing, flags=re.MULTILINE))
