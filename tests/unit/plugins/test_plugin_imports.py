"""Controller-side plugins reach the shared code one way: ``from llmfleet.module_utils.<x> import ...``.

Filter plugins once loaded plugins/module_utils files by path, each with its own
loader, so capacity_planner.py could run twice under two module names in one
process. These tests keep it one way (docs/layout.md): no plugin loads a file by
path, two plugins that use the planner share the one module, and a controller
without llmfleet gets a message that says how to fix it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.module_utils import capacity_planner
from llmfleet.paths import REPO_ROOT
from tests.tools import load_plugin

# Plugins that run on the controller: plugins/ (modules aside: Ansible ships those
# to hosts with ansible.module_utils) and the role-local plugin folders.
CONTROLLER_PLUGINS = sorted(
    [path for path in (REPO_ROOT / "plugins").glob("*/*.py") if path.parent.name not in ("modules", "module_utils")]
    + list((REPO_ROOT / "roles").glob("*/*_plugins/*.py"))
)


def test_the_controller_plugins_are_found() -> None:
    names = {path.name for path in CONTROLLER_PLUGINS}
    assert {"capacity.py", "engine_args.py", "gpu_validate.py", "vllm_container.py", "llmfleet_files.py"} <= names


@pytest.mark.parametrize("path", CONTROLLER_PLUGINS, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_no_plugin_loads_shared_code_by_path(path: Path) -> None:
    tree = ast.parse(path.read_text())
    loaders = [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("spec_from_file_location", "exec_module", "load_source")
    ]
    assert not loaders, f"{path.name} loads a file by path ({loaders}): import it from llmfleet.module_utils"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and "module_utils" in node.module:
            assert node.module.startswith("llmfleet.module_utils"), f"{path.name}: from {node.module} import ..."


def test_the_planner_is_one_module_for_every_plugin() -> None:
    capacity = load_plugin(REPO_ROOT / "plugins" / "filter" / "capacity.py", "llmfleet_test_capacity")
    vllm = load_plugin(REPO_ROOT / "roles" / "vllm" / "filter_plugins" / "vllm_container.py", "llmfleet_test_vllm")
    assert capacity.capacity_planner is vllm.capacity_planner is capacity_planner


@pytest.mark.parametrize(
    "path",
    [
        "plugins/filter/capacity.py",
        "plugins/filter/engine_args.py",
        "roles/gpu_validate/filter_plugins/gpu_validate.py",
        "roles/vllm/filter_plugins/vllm_container.py",
    ],
)
def test_without_llmfleet_the_plugin_says_how_to_install_it(path: str) -> None:
    # A Python where `import llmfleet` fails, as in a venv that never installed the package.
    code = (
        "import importlib.util, sys\n"
        "sys.modules['llmfleet'] = None\n"
        f"spec = importlib.util.spec_from_file_location('plugin', {str(REPO_ROOT / path)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "AnsibleFilterError" in result.stderr
    assert "No module named" in result.stderr
    assert "pip install -e '.[ops]'" in result.stderr
