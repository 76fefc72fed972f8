"""The GPU software-stack table, playbooks/vars/stacks.yml, as Python reads it (Ansible loads the same file).

It sits beside errors.py and paths.py, under the package's folders, because two of them read it:
`llmfleet stack` and `llmfleet engine` (llmfleet/ops/) and the lab's stand-in packages
(llmfleet/lab/standins.py); ops sits above the lab, which must not import it
(docs/layout.md, "Which folder imports which").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT

STACKS_FILE = REPO_ROOT / "playbooks" / "vars" / "stacks.yml"


def load_stacks(path: Path = STACKS_FILE) -> dict[str, Mapping[str, Any]]:
    """The `gpu_stacks` mapping of the table, name -> stack."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise LlmfleetError(f"cannot read the stack table {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise LlmfleetError(f"the stack table {path} is not valid YAML: {error}") from error
    stacks = document.get("gpu_stacks") if isinstance(document, dict) else None
    if not isinstance(stacks, dict) or not all(isinstance(stack, dict) for stack in stacks.values()):
        raise LlmfleetError(f"{path} must hold a 'gpu_stacks' mapping of stack name -> stack")
    return {str(name): stack for name, stack in stacks.items()}


def get_stack(name: str, path: Path = STACKS_FILE) -> Mapping[str, Any]:
    stacks = load_stacks(path)
    if name not in stacks:
        raise LlmfleetError(f"no stack {name!r} in {path}; known stacks: {', '.join(sorted(stacks))}")
    return stacks[name]
