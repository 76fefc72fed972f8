"""Which part of the llmfleet package may import which, as docs/layout.md states it, and no import cycle.

Every module's imports are read with `ast`, those inside functions included (a lazy import is still a
dependency: it only moves the failure to the moment the function runs). Imports made by name through
importlib (llmfleet/cli.py's COMMAND_GROUPS, `llmfleet docs cli`) are not seen: only the command line
itself does that, and it may import anything.

A part is a folder of the package (`serve`, `ops`, `build`, `lab`, `bench`, `module_utils`), `cli`
(cli.py and __main__.py) or `base` (__init__.py, errors.py, paths.py, stacks.py). A part may always
import its own modules.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from llmfleet.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "llmfleet"
LAYOUT = REPO_ROOT / "docs" / "layout.md"
BASE = ("__init__", "errors", "paths", "stacks")
# Lower parts first. docs/layout.md's table "Which folder imports which" says the same, and
# test_layout_md_states_the_rule keeps the two equal.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "base": (),
    "module_utils": (),
    "serve": ("base",),
    "build": ("base",),
    "lab": ("base", "module_utils", "build"),
    "ops": ("base", "module_utils", "serve", "build", "lab"),
    "bench": ("base", "module_utils", "serve", "build", "lab", "ops"),
    "cli": ("base", "module_utils", "serve", "build", "lab", "ops", "bench"),
}
RULE_ROW = re.compile(r"^\| `([a-z_]+)` \| ([^|\n]*?) \|", re.MULTILINE)


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package, by dotted name; module_utils is a link into plugins/, followed."""
    found = {}
    for folder, _, files in os.walk(package, followlinks=True):
        for file in files:
            if file.endswith(".py"):
                path = Path(folder) / file
                found[module_name(path, package)] = path
    return found


def part(module: str) -> str:
    """The part of the package a dotted module name belongs to."""
    pieces = module.split(".")
    if len(pieces) == 1 or pieces[1] in BASE:
        return "base"
    if pieces[1] in ("cli", "__main__"):
        return "cli"
    return pieces[1]


def imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported module) for every import of the package's modules in the file, at any depth."""
    found = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package upwards
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                # `from llmfleet.lab import tiny` imports the module llmfleet.lab.tiny; `from x import name`, x.
                found.append((node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base))
    ours = [(line, name) for line, name in found if name == "llmfleet" or name.startswith("llmfleet.")]
    return list(dict.fromkeys(ours))  # `from x import a, b` once


def rule_problems(package: Path) -> list[str]:
    """One line per import that goes where its part may not, naming the file, the line and the import."""
    problems = []
    found = modules(package)
    for module, path in sorted(found.items()):
        source = part(module)
        if source not in MAY_IMPORT:
            problems.append(f"{path.relative_to(package.parent)}: part {source!r} has no rule: add it to MAY_IMPORT")
            continue
        for line, imported in imports(module, path, set(found)):
            target = part(imported)
            if target != source and target not in MAY_IMPORT[source]:
                problems.append(
                    f"{path.relative_to(package.parent)}:{line}: imports {imported}, but {source} may import only"
                    f" {', '.join(MAY_IMPORT[source]) or 'its own modules'} (docs/layout.md)"
                )
    return problems


def cycles(package: Path) -> list[list[str]]:
    """Every import cycle among the package's modules (each once, from its smallest name)."""
    found = modules(package)
    graph = {
        module: sorted({name for _, name in imports(module, path, set(found)) if name in found and name != module})
        for module, path in found.items()
    }
    seen: set[tuple[str, ...]] = set()
    result = []

    def walk(start: str, module: str, trail: list[str]) -> None:
        for nxt in graph[module]:
            if nxt == start:
                key = tuple(sorted(trail))
                if key not in seen:
                    seen.add(key)
                    result.append([*trail, start])
            elif nxt > start and nxt not in trail:
                walk(start, nxt, [*trail, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return result


def layout_rule(text: str) -> dict[str, tuple[str, ...]]:
    """docs/layout.md's table: `part` | the parts it may import, in backticks, or "nothing"."""
    table = text.partition("## Which folder imports which")[2].partition("\n## ")[0]
    return {name: tuple(re.findall(r"`([a-z_]+)`", allowed)) for name, allowed in RULE_ROW.findall(table)}


# --- the real package ------------------------------------------------------------------------------


def test_every_import_follows_the_layering() -> None:
    problems = rule_problems(PACKAGE)
    assert not problems, "imports against the rule of docs/layout.md:\n" + "\n".join(problems)


def test_no_module_imports_itself_back() -> None:
    found = cycles(PACKAGE)
    assert not found, "import cycles (make each go one way):\n" + "\n".join(" -> ".join(c) for c in found)


def test_layout_md_states_the_rule() -> None:
    assert layout_rule(LAYOUT.read_text()) == MAY_IMPORT, (
        "docs/layout.md's table 'Which folder imports which' differs from MAY_IMPORT here: change both"
    )


def test_the_walk_sees_the_whole_package() -> None:
    found = modules(PACKAGE)
    assert {"llmfleet.cli", "llmfleet.bench.cli", "llmfleet.module_utils.stack_compat.rules"} <= set(found)
    assert {part(module) for module in found} == set(MAY_IMPORT)


# --- the checker finds what it is meant to find ----------------------------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "llmfleet" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "llmfleet"


@pytest.mark.parametrize("where", ["top", "function"])
def test_an_import_against_the_rule_is_named_with_its_file_and_line(tmp_path: Path, where: str) -> None:
    # The old lab -> ops import (lab/standins.py read the stack table from ops/stack.py) beside the
    # ops -> lab one (ops/engine.py, inside a function): the first goes against the rule, the second not.
    statement = "from llmfleet.ops.stack import load_stacks\n"
    body = statement if where == "top" else "def load():\n    " + statement
    package = _package(tmp_path, {
        "__init__.py": "", "errors.py": "", "ops/__init__.py": "", "lab/__init__.py": "", "lab/vllm_cpu.py": "",
        "ops/stack.py": "from llmfleet.errors import LlmfleetError\n",
        "ops/engine.py": "def regenerate():\n    from llmfleet.lab import vllm_cpu\n",
        "lab/standins.py": "import os\n" + body,
    })  # fmt: skip
    assert rule_problems(package) == [
        f"llmfleet/lab/standins.py:{2 if where == 'top' else 3}: imports llmfleet.ops.stack,"
        " but lab may import only base, module_utils, build (docs/layout.md)"
    ]


def test_serve_may_import_only_the_base(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "__init__.py": "", "serve/__init__.py": "", "ops/__init__.py": "", "ops/token.py": "",
        "serve/app.py": "from llmfleet import __version__\nfrom ..ops import token\n",
    })  # fmt: skip
    assert rule_problems(package) == [
        "llmfleet/serve/app.py:2: imports llmfleet.ops.token, but serve may import only base (docs/layout.md)"
    ]


def test_a_part_without_a_rule_is_named(tmp_path: Path) -> None:
    package = _package(tmp_path, {"__init__.py": "", "extra/__init__.py": ""})
    assert rule_problems(package) == ["llmfleet/extra/__init__.py: part 'extra' has no rule: add it to MAY_IMPORT"]


def test_a_cycle_inside_a_function_is_found(tmp_path: Path) -> None:
    # The old bench cycle in small: the command's module registers a subcommand whose module imports it back.
    package = _package(tmp_path, {
        "__init__.py": "", "bench/__init__.py": "",
        "bench/loadgen.py": "def register():\n    from llmfleet.bench import compare\n",
        "bench/compare.py": "from llmfleet.bench import loadgen\n",
    })  # fmt: skip
    assert cycles(package) == [["llmfleet.bench.compare", "llmfleet.bench.loadgen", "llmfleet.bench.compare"]]


def test_the_layout_table_is_read(tmp_path: Path) -> None:
    text = (
        "## Which folder imports which\n\n| part | may import |\n|---|---|\n"
        "| `serve` | `base` |\n| `base` | nothing |\n\n## Next\n\n| `ops` | `lab` |\n"
    )
    assert layout_rule(text) == {"serve": ("base",), "base": ()}
