"""The services import nothing their install lacks.

The service image installs llmfleet bare, with the serving dependencies only
(files/images/llmfleet-service), so a gateway or worker module that imports a
library of the ops or dev extra (ansible, yaml, httpx) builds here and fails in
the image build, or worse, on a site. The scaler is installed with the ops
extra (roles/scaler, scaler_package), never the dev one. This imports each
service's app in a process where every library outside its install is blocked.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

from llmfleet.paths import REPO_ROOT

# Each service's app and the extras installed where it runs.
SERVICE_EXTRAS = {
    "llmfleet.serve.gateway.app": (),
    "llmfleet.serve.worker.app": (),
    "llmfleet.serve.scaler.app": ("ops",),
}

PROGRAM = """
import importlib, importlib.abc, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"{name} is installed by the dev extra only")
        return None
sys.meta_path.insert(0, Block())
for module in sys.argv[2:]:
    importlib.import_module(module)
"""


def _closure(requirements: list[str]) -> set[str]:
    """The distributions these requirements install, with theirs (markers evaluated, extras followed)."""
    found: set[str] = set()
    todo = [(Requirement(text), frozenset[str]()) for text in requirements]
    while todo:
        requirement, _ = todo.pop()
        name = requirement.name.lower().replace("_", "-")
        key = name + "[" + ",".join(sorted(requirement.extras)) + "]"
        if key in found:
            continue
        found.add(key)
        for text in metadata.requires(requirement.name) or []:
            dependency = Requirement(text)
            wanted = dependency.marker is None or any(
                dependency.marker.evaluate({**default_environment(), "extra": extra})
                for extra in (*requirement.extras, "")
            )
            if wanted:
                todo.append((dependency, frozenset()))
    return {key.split("[")[0] for key in found}


def _imports_outside(extras: tuple[str, ...]) -> set[str]:
    """Top-level modules that only the extras not in `extras` install (dev, ops)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    installed = _closure(project["dependencies"] + [text for extra in extras for text in optional[extra]])
    others = _closure([text for extra, texts in optional.items() if extra not in extras for text in texts]) - installed
    imports = set()
    for module, distributions in metadata.packages_distributions().items():
        names = {distribution.lower().replace("_", "-") for distribution in distributions}
        if names & others and not names & installed and not module.startswith("_"):
            imports.add(module)
    return imports


def test_the_block_lists_hold_what_they_are_about() -> None:
    # An empty block list would pass anything.
    assert {"httpx", "openai", "schemathesis", "molecule", "ansible", "ansible_runner", "numpy"} <= (
        _imports_outside(())
    )
    scaler = _imports_outside(("ops",))
    assert {"httpx", "molecule"} <= scaler
    assert not {"ansible", "ansible_runner"} & scaler


def test_each_service_imports_only_what_its_install_has() -> None:
    for module, extras in SERVICE_EXTRAS.items():
        result = subprocess.run(
            [sys.executable, "-c", PROGRAM, ",".join(sorted(_imports_outside(extras))), module],
            cwd=REPO_ROOT, capture_output=True, text=True, check=False,
        )
        assert result.returncode == 0, f"{module}: {result.stderr[-3000:]}"
