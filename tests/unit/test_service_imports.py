"""The services import nothing that only the dev extra installs.

The service image installs llmfleet with its runtime dependencies only
(files/images/llmfleet-service), so a module of the gateway, worker or scaler
that imports a test-only library (httpx, say) builds here and fails in the
image build, or worse, on a site. This imports each service's app in a
process where every dev-only library is blocked.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

from llmfleet.paths import REPO_ROOT

SERVICE_MODULES = ("llmfleet.serve.gateway.app", "llmfleet.serve.worker.app", "llmfleet.serve.scaler.app")

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


def _dev_only_imports() -> set[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    runtime = _closure(project["dependencies"])
    dev = _closure(project["optional-dependencies"]["dev"]) - runtime
    imports = set()
    for module, distributions in metadata.packages_distributions().items():
        names = {distribution.lower().replace("_", "-") for distribution in distributions}
        if names & dev and not names & runtime and not module.startswith("_"):
            imports.add(module)
    return imports


def test_dev_only_libraries_are_known() -> None:
    # The block list must hold what this check is about; an empty one would pass anything.
    assert {"httpx", "openai", "schemathesis", "molecule"} <= _dev_only_imports()


def test_the_services_import_without_dev_only_libraries() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, ",".join(sorted(_dev_only_imports())), *SERVICE_MODULES],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
