"""Dump the flags of vLLM's OpenAI API server parser as JSON (run by the engine's Python).

This file runs in the vLLM venv, not in llmfleet's: it imports only the standard
library and vllm, and prints one JSON document on stdout. `llmfleet engine flags
--regenerate` runs it and writes the result to files/engine_flags/.

It builds the very parser `python -m vllm.entrypoints.openai.api_server` builds
(make_arg_parser, in vllm.entrypoints.launchers.cli_args from 0.1x on, in
vllm.entrypoints.openai.cli_args before) and reads its actions, so the list is
what the engine accepts, not what its help text says.

With --source, the vllm package is taken from an unpacked release (a wheel's
`vllm/` tree) instead of the installed one: that is how the lists of the GPU
stacks' releases are made in the lab venv. Older releases need three shims there,
applied only with --source and recorded in the output: modules named with --stub
become empty stand-ins, AutoConfig.register tolerates configs newer transformers
already ships, and the platform is set to CPU (release wheels read their own
distribution's name to detect it). None of them adds, removes or renames a flag.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

# Parser classes vLLM used over time; the first importable one builds the parser.
_PARSER_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")
_MAKE_PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")

# vLLM's type callables, by name, mapped to what the checker knows how to check.
_TYPE_NAMES = {
    "int": "int",
    "float": "float",
    "str": "str",
    "loads": "json",  # json.loads
    "parse_dataclass": "json",  # a config dataclass given as JSON
    "union_dict_and_str": "json_or_str",
    "human_readable_int": "size",
    "human_readable_int_or_auto": "size_or_auto",
    "nullable_str": "str",
}
# Wrappers whose closure holds the real type: optional_type(int), parse_type(int).
_WRAPPERS = {"_optional_type": True, "_parse_type": False}


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stand-ins for named modules that the lab venv lacks (an older release's optional deps)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = set(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module: Any = mock.MagicMock(name=spec.name)
        module.__path__ = []
        module.__spec__ = spec
        return module  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        return None


def _apply_shims(stubs: Sequence[str]) -> None:
    sys.meta_path.append(_Stubs(stubs))
    transformers = importlib.import_module("transformers")
    register = transformers.AutoConfig.register

    def tolerant_register(model_type: str, config: Any, exist_ok: bool = False) -> Any:
        return register(model_type, config, exist_ok=True)

    transformers.AutoConfig.register = staticmethod(tolerant_register)
    try:
        platforms = importlib.import_module("vllm.platforms")
        cpu = importlib.import_module("vllm.platforms.cpu")
    except ImportError:
        return  # releases before 0.5 detect no platform while building the parser
    if hasattr(platforms, "_current_platform"):
        vars(platforms)["_current_platform"] = cpu.CpuPlatform()


def _import_first(names: Sequence[str], attribute: str) -> tuple[str, Any]:
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, attribute):
            return name, getattr(module, attribute)
    raise SystemExit(f"none of {', '.join(names)} defines {attribute}")


def build_parser() -> tuple[argparse.ArgumentParser, str]:
    where, make_arg_parser = _import_first(_MAKE_PARSER_MODULES, "make_arg_parser")
    if inspect.signature(make_arg_parser).parameters:
        _, parser_class = _import_first(_PARSER_MODULES, "FlexibleArgumentParser")
        parser = make_arg_parser(parser_class())
    else:  # 0.4.x: make_arg_parser() makes a plain ArgumentParser itself
        parser = make_arg_parser()
    return parser, f"{where}.make_arg_parser"


def _type_of(action: argparse.Action) -> tuple[str | None, bool]:
    """(type name, accepts "None"/"" as null) of an action's type callable."""
    kind: Callable[..., Any] | None = action.type  # type: ignore[assignment]
    if kind is None:
        return ("str" if action.nargs != 0 else None), False
    nullable = False
    name = getattr(kind, "__name__", type(kind).__name__)
    while name in _WRAPPERS and kind is not None and kind.__closure__:
        nullable = nullable or _WRAPPERS[name]
        inner = [cell.cell_contents for cell in kind.__closure__ if callable(cell.cell_contents)]
        kind = inner[0] if inner else None
        name = getattr(kind, "__name__", "str")
    if name == "nullable_str":
        nullable = True
    if name == "<lambda>":
        return "str", nullable  # a normaliser such as s.lower(); values stay strings
    return _TYPE_NAMES.get(name, f"custom:{name}"), nullable


def _normaliser(action: argparse.Action) -> str | None:
    """How the action's type rewrites a value before argparse compares it with choices."""
    if action.type is None or not action.choices:
        return None
    try:
        probe = action.type("Ab-C")  # type: ignore[operator]
    except Exception:
        return None
    return "lower-dash-to-underscore" if probe == "ab_c" else ("lower" if probe == "ab-c" else None)


def _choices(action: argparse.Action) -> list[Any] | None:
    if action.choices is None:
        return None
    values = list(action.choices)
    if all(isinstance(value, str | int | float) and not isinstance(value, bool) for value in values):
        return values
    return [str(value) for value in values]


def _action_kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    return {
        "_StoreTrueAction": "store_true",
        "_StoreFalseAction": "store_false",
        "_StoreConstAction": "store_const",
        "_AppendAction": "append",
        "_CountAction": "count",
    }.get(type(action).__name__, "store")


def describe(parser: argparse.ArgumentParser) -> dict[str, Any]:
    deprecated: set[argparse.Action] = getattr(parser, "_deprecated", set())
    options = []
    positionals = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue  # they print and exit: never a serving flag
        if not action.option_strings:
            positionals.append({"dest": action.dest, "nargs": action.nargs})
            continue
        kind = _action_kind(action)
        names = list(action.option_strings)
        negated: list[str] = []
        if kind == "boolean_optional":
            negated = [name for name in names if name.startswith("--no-") and f"--{name[5:]}" in names]
            names = [name for name in names if name not in negated]
        # The long name first: it is what the checker prints and renders.
        names.sort(key=lambda name: not name.startswith("--"))
        value_type, nullable = _type_of(action)
        nargs = action.nargs
        entry: dict[str, Any] = {
            "names": names,
            "dest": action.dest,
            "action": kind,
            "nargs": nargs,
            "takes_value": nargs != 0 and kind not in ("store_true", "store_false", "store_const", "count"),
            "type": value_type,
        }
        if nullable:
            entry["nullable"] = True
        choices = _choices(action)
        if choices is not None:
            entry["choices"] = choices
            normaliser = _normaliser(action)
            if normaliser:
                entry["normalise"] = normaliser
        if negated:
            entry["negated"] = negated
        if action in deprecated or getattr(action, "deprecated", False):
            entry["deprecated"] = True
        options.append(entry)
    options.sort(key=lambda entry: entry["names"][0])
    flexible = type(parser).__name__ == "FlexibleArgumentParser"
    source = inspect.getsource(type(parser).parse_args) if flexible else ""
    return {
        "parser": {
            "class": type(parser).__name__,
            "allow_abbrev": parser.allow_abbrev,
            # FlexibleArgumentParser reads --max_model_len as --max-model-len, and
            # --compilation-config.level 3 as --compilation-config '{"level": 3}'.
            "underscores": type(parser).__name__ == "FlexibleArgumentParser",
            "dotted_json": "create_nested_dict" in source,
            # 0.1x rewrites -O3, -O=3 and -O 3 to --optimization-level 3 before parsing.
            "short_O": "--optimization-level" if '"--optimization-level"' in source else None,
        },
        "positionals": positionals,
        "options": options,
    }


def main(argv: Sequence[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__)
    cli.add_argument("--source", help="a directory holding an unpacked vllm/ package to read instead")
    cli.add_argument("--stub", action="append", default=[], help="a module to stand in for (with --source)")
    args = cli.parse_args(argv)
    if args.source:
        sys.path.insert(0, str(Path(args.source).resolve()))
        _apply_shims(args.stub)
    parser, built_by = build_parser()
    vllm = importlib.import_module("vllm")
    document = {
        "vllm_version": getattr(vllm, "__version__", "unknown"),
        "built_by": built_by,
        "shims": ({"stubbed_modules": sorted(args.stub), "platform": "cpu"} if args.source else None),
        **describe(parser),
    }
    sys.stdout.flush()
    print("\n@@ENGINE-FLAGS@@" + json.dumps(document, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
