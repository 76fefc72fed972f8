"""vLLM server flags: check an argv against the pinned engine's real flag list, and render one.

DESIGN.md failure mode #9: a public write-up of this stack passes
``--gpu-memory-utilization-gpu0``, a flag no vLLM release has. The engine refuses
it at start-up, inside a container that then restarts forever. Here it is refused
before deploy, with the closest real flag.

The flag lists live in files/engine_flags/vllm-<version>.json, one per engine
release, made by ``llmfleet engine flags --regenerate`` from the parser the
engine itself builds (the lab's version is regenerated and compared by an
integration test). Each option there carries its names (aliases such as ``-tp``
included), whether it takes a value, its nargs, value type and choices.

Stdlib only, on purpose: the llmfleet CLI imports this file as
``llmfleet.module_utils.engine_args``, and so does the ``vllm_args`` filter
plugin, so both read flags one way.

What is refused, and why it is stricter than argparse in two places:

* unknown flags, with the closest real one (difflib);
* abbreviations (argparse's allow_abbrev accepts ``--gpu-memory``): a later
  release that adds ``--gpu-memory-foo`` would make the same argv ambiguous, so
  a deployed argv spells every flag in full;
* a missing value, a value on a flag that takes none, a value of the wrong type,
  a value outside the choices;
* a flag given twice (argparse silently keeps the last one), except append flags;
* positional arguments: ``python -m vllm.entrypoints.openai.api_server`` (the
  images' entrypoint) ignores a positional model in 0.1x releases and refuses it
  in older ones, while ``vllm serve`` reads it. The model goes in ``--model``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Where the flag lists live, relative to this file (plugins/module_utils/).
FLAGS_DIR = str(Path(__file__).resolve().parent.parent.parent / "files" / "engine_flags")

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_SIZE = re.compile(r"^\d+$|^\d+(\.\d+)?[kmgt]$|^\d+[KMGT]$")
_NULLS = ("", "None")


class EngineArgsError(ValueError):
    """The argv (or the options to render) cannot be given to the engine; .problems says why."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def flags_path(version: str, flags_dir: str = FLAGS_DIR) -> str:
    return str(Path(flags_dir) / f"vllm-{version}.json")


def known_versions(flags_dir: str = FLAGS_DIR) -> list[str]:
    directory = Path(flags_dir)
    names = [path.name for path in directory.iterdir()] if directory.is_dir() else []
    versions = [name[5:-5] for name in names if name.startswith("vllm-") and name.endswith(".json")]
    return sorted(versions, key=lambda v: [int(p) if p.isdigit() else p for p in re.split(r"[.+-]", v)])


def load_flags(version: str, flags_dir: str = FLAGS_DIR) -> dict[str, Any]:
    """The flag list of one engine version; ValueError naming the versions kept when absent."""
    path = flags_path(version, flags_dir)
    try:
        with Path(path).open(encoding="utf-8") as handle:
            document: dict[str, Any] = json.load(handle)
    except FileNotFoundError:
        raise ValueError(
            f"no flag list for vLLM {version} ({path}); kept: {', '.join(known_versions(flags_dir)) or 'none'}."
            " Add one with `llmfleet engine flags --regenerate`"
        ) from None
    if not isinstance(document.get("options"), list):
        raise ValueError(f"{path} has no 'options' list")
    return document


class FlagIndex:
    """Option-string lookups over one flag list."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.version = str(document.get("vllm_version", "?"))
        parser = document.get("parser") or {}
        self.underscores = bool(parser.get("underscores"))
        self.dotted_json = bool(parser.get("dotted_json"))
        self.allow_abbrev = bool(parser.get("allow_abbrev"))
        self.short_o = parser.get("short_O")
        self.by_name: dict[str, dict[str, Any]] = {}
        self.negated: dict[str, dict[str, Any]] = {}
        for option in document["options"]:
            for name in option["names"]:
                self.by_name[name] = option
            for name in option.get("negated", []):
                self.negated[name] = option

    @property
    def all_names(self) -> list[str]:
        return [*self.by_name, *self.negated]

    def lookup(self, name: str) -> tuple[dict[str, Any] | None, bool]:
        """(option, negated) for an exact option string."""
        if name in self.by_name:
            return self.by_name[name], False
        if name in self.negated:
            return self.negated[name], True
        return None, False

    def suggest(self, name: str) -> str | None:
        """The closest real flag, by spelling; also tried with the name's tail cut off."""
        candidates = self.all_names
        matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
        if matches:
            return matches[0]
        # --gpu-memory-utilization-gpu0 style: a real flag plus an invented suffix.
        prefixes = [real for real in candidates if real.startswith("--") and name.startswith(real + "-")]
        return max(prefixes, key=len) if prefixes else None

    def canonical(self, option: Mapping[str, Any], negated: bool) -> str:
        if negated:
            return str(option["negated"][0])
        return str(option["names"][0])


def _looks_like_flag(arg: str) -> bool:
    return arg.startswith("-") and arg != "-" and not _NEGATIVE_NUMBER.match(arg)


def _check_value(flag: str, option: Mapping[str, Any], value: str) -> str | None:
    """A problem with one value of a flag, or None."""
    kind = option.get("type") or "str"
    if option.get("nullable") and value in _NULLS:
        return None
    converted: Any = value
    try:
        if kind == "int":
            converted = int(value)
        elif kind == "float":
            converted = float(value)
        elif kind == "json":
            converted = json.loads(value)
        elif kind in ("size", "size_or_auto"):
            if not (_SIZE.match(value.strip()) or (kind == "size_or_auto" and value.strip().lower() in ("auto", "-1"))):
                raise ValueError(value)
            converted = value
    except ValueError:
        wanted = {"json": "JSON", "size": "an integer such as 4096 or 4k", "size_or_auto": "an integer, 4k or auto"}
        return f"{flag} takes {wanted.get(kind, 'an ' + kind if kind == 'int' else 'a ' + kind)}, not {value!r}"
    choices = option.get("choices")
    if choices is not None:
        if option.get("normalise") == "lower-dash-to-underscore" and isinstance(converted, str):
            converted = converted.lower().replace("-", "_")
        elif option.get("normalise") == "lower" and isinstance(converted, str):
            converted = converted.lower()
        if converted not in choices:
            close = _closest_choice(str(converted), [str(choice) for choice in choices])
            hint = f": did you mean {close}?" if close else ""
            shown = ", ".join(str(choice) for choice in choices)
            return f"{flag} {value!r} is not one of {shown}{hint}"
    return None


def _closest_choice(value: str, choices: Sequence[str]) -> str | None:
    """bfloat -> bfloat16 and fp8_e4m3 -> fp8 (a shared stem beats spelling distance), else difflib."""
    stems = [choice for choice in choices if value and (choice.startswith(value) or value.startswith(choice))]
    if stems:
        return min(stems, key=lambda choice: abs(len(choice) - len(value)))
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def _min_max_values(nargs: Any) -> tuple[int, int | None]:
    if nargs is None:
        return 1, 1
    if nargs == "?":
        return 0, 1
    if nargs == "*":
        return 0, None
    if nargs == "+":
        return 1, None
    return int(nargs), int(nargs)


def check_args(argv: Sequence[str], flags: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Check argv against one flag list: (normalised argv, problems).

    The normalised argv spells each flag by its canonical long name, dashes not
    underscores, values as separate items (``--flag=value`` only for a value
    that starts with "-"). It is meaningful only when problems is empty.
    """
    index = FlagIndex(flags)
    problems: list[str] = []
    normalised: list[str] = []
    seen: dict[str, str] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        arg = str(items[i])
        i += 1
        if arg == "--":
            for rest in items[i:]:
                problems.append(_positional_problem(str(rest)))
            break
        if not _looks_like_flag(arg):
            problems.append(_positional_problem(arg))
            continue

        name, has_attached, attached = arg.partition("=")
        if index.short_o and (name == "-O" or (name.startswith("-O") and not name.startswith("--"))):
            # -O3 / -O=3 / -O 3: vLLM rewrites them to --optimization-level N.
            if name != "-O":
                has_attached, attached = "=", name[2:]
            name = str(index.short_o)
        if name.startswith("--") and index.underscores:
            head, dot, tail = name.partition(".")
            name = head.replace("_", "-") + dot + tail

        option, negated = index.lookup(name)
        shown = name
        if option is None and "." in name and name.startswith("-"):
            base = name.split(".", 1)[0]
            base_option, _ = index.lookup(base)
            if index.dotted_json and base_option is not None and base_option.get("type") in ("json", "json_or_str"):
                # --compilation-config.mode 3: one key of a JSON flag, any value.
                if not has_attached:
                    if i >= len(items):
                        problems.append(f"{name} needs a value")
                        continue
                    attached = str(items[i])
                    i += 1
                normalised += [name, attached] if not attached.startswith("-") else [f"{name}={attached}"]
                continue
            if base_option is not None:
                problems.append(f"{base} does not take dotted keys ({name}): give it one JSON value")
                continue
        if option is None and not has_attached and not name.startswith("--") and name[:2] in index.by_name:
            # argparse's attached short value: -O3 for -O 3.
            option, negated = index.lookup(name[:2])
            has_attached, attached, shown = "=", name[2:], name[:2]
        if option is None:
            problems.append(_unknown_flag_problem(index, name))
            while not has_attached and i < len(items) and not _looks_like_flag(str(items[i])):
                i += 1  # its values, most likely: one problem per unknown flag is enough
            continue

        canonical = index.canonical(option, negated)
        values: list[str] = []
        lo, hi = _min_max_values(option.get("nargs")) if option.get("takes_value") else (0, 0)
        if has_attached:
            if hi == 0:
                problems.append(f"{shown} takes no value (got {attached!r})")
                continue
            values.append(attached)
        else:
            while (hi is None or len(values) < hi) and i < len(items) and not _looks_like_flag(str(items[i])):
                values.append(str(items[i]))
                i += 1
        if len(values) < lo:
            problems.append(f"{shown} needs {'a value' if lo == 1 else f'{lo} values'}")
            continue

        dest = str(option.get("dest", canonical))
        if option.get("action") != "append":
            if dest in seen:
                problems.append(
                    f"{canonical} given twice ({seen[dest]} and {shown}): vLLM keeps only the last; give it once"
                )
            seen[dest] = shown
        for value in values:
            problem = _check_value(canonical, option, value)
            if problem:
                problems.append(problem)
        if len(values) == 1 and _looks_like_flag(values[0]):
            normalised.append(f"{canonical}={values[0]}")  # as a separate item it would read as a flag
        else:
            normalised += [canonical, *values]
    return normalised, problems


def _positional_problem(arg: str) -> str:
    return (
        f"positional argument {arg!r}: the server entrypoint does not read a positional model;"
        f" give it as --model {arg}, and every other setting as --flag value"
    )


def _unknown_flag_problem(index: FlagIndex, name: str) -> str:
    if index.allow_abbrev and name.startswith("--"):
        expansions = [real for real in index.all_names if real.startswith(name)]
        if len(expansions) == 1:
            return f"abbreviated flag {name}: write it in full as {expansions[0]}"
    suggestion = index.suggest(name)
    if suggestion:
        return f"unknown flag {name}: did you mean {suggestion}?"
    return f"unknown flag {name}: vLLM {index.version} has no such flag"


def _flag_for_key(index: FlagIndex, key: str) -> str:
    name = key if key.startswith("-") else "--" + key.replace("_", "-")
    return name


def render_args(options: Mapping[str, Any], flags: Mapping[str, Any]) -> list[str]:
    """argv for a mapping of flag -> typed value, checked; EngineArgsError with every problem.

    Keys are flag names with or without the leading dashes, in dashes or
    underscores (``gpu_memory_utilization``, ``--enable-lora``). Values:

    * None: the flag is left out (the engine's default);
    * bool: ``--flag`` for true; false gives ``--no-flag`` where the engine has
      one and leaves a plain switch out;
    * int, float, str: ``--flag value``;
    * list: one flag with several values (nargs "+"), or the flag repeated (append);
    * dict, or a list for a JSON flag: the flag with compact JSON, keys sorted so
      the argv (and the container built from it) is the same on every run.
    """
    index = FlagIndex(flags)
    argv: list[str] = []
    problems: list[str] = []
    for key, value in options.items():
        if value is None:
            continue
        flag = _flag_for_key(index, str(key))
        option, negated = index.lookup(flag)
        if option is None:
            problems.append(_unknown_flag_problem(index, flag))
            continue
        canonical = index.canonical(option, negated)
        kind = option.get("type")
        if isinstance(value, bool):
            if option.get("takes_value"):
                problems.append(f"{canonical} takes a value, not true/false")
            elif value:
                argv.append(canonical)
            elif option.get("negated"):
                argv.append(option["negated"][0])
            continue
        if not option.get("takes_value"):
            problems.append(f"{canonical} is a switch: give true or false, not {value!r}")
            continue
        if isinstance(value, Mapping) or (isinstance(value, list | tuple) and kind in ("json", "json_or_str")):
            argv += [canonical, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, list | tuple):
            items = [_scalar(item) for item in value]
            if not items:
                continue
            if option.get("action") == "append":
                for item in items:
                    argv += [canonical, item]
            elif option.get("nargs") in ("+", "*"):
                argv += [canonical, *items]
            else:
                problems.append(f"{canonical} takes one value, not a list")
        else:
            argv += [canonical, _scalar(value)]
    if problems:
        raise EngineArgsError(problems)
    _, check_problems = check_args(argv, flags)
    if check_problems:
        raise EngineArgsError(check_problems)
    return argv


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def check_or_raise(argv: Iterable[str], flags: Mapping[str, Any]) -> list[str]:
    normalised, problems = check_args(list(argv), flags)
    if problems:
        raise EngineArgsError(problems)
    return normalised


# vLLM's V1 engine, the default from 0.8, turns automatic prefix caching on unless told
# otherwise (--no-enable-prefix-caching); before it, --enable-prefix-caching was a plain
# switch, off unless given (0.4.2's flag list: action store_true, no --no- form).
PREFIX_CACHING_DEFAULT_ON_SINCE = (0, 8)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def with_prefix_caching(options: Mapping[str, Any], flags: Mapping[str, Any], wanted: bool) -> dict[str, Any]:
    """options plus the enable_prefix_caching value that makes that release cache prefixes (or not) as wanted.

    Nothing is added where the release already does what is wanted by default, so
    an engine's command line only changes where it must. An enable_prefix_caching
    the options set already (an engine's own args) is kept: it is that engine's
    explicit choice. EngineArgsError when the release has no such flag at all.
    """
    chosen = dict(options)
    keys = [key for key in chosen if str(key).lstrip("-").replace("-", "_") == "enable_prefix_caching"]
    if any(chosen[key] is not None for key in keys):
        return chosen
    index = FlagIndex(flags)
    option, _ = index.lookup("--enable-prefix-caching")
    if option is None:
        raise EngineArgsError(
            [f"vLLM {index.version} has no --enable-prefix-caching: it cannot be told to cache prefixes"]
        )
    default_on = _release(index.version) >= PREFIX_CACHING_DEFAULT_ON_SINCE
    if wanted != default_on:
        chosen["enable_prefix_caching"] = wanted
    return chosen
