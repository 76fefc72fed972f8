"""`llmfleet model check|merge-adapter`: the operator's checks and merges of model directories.

These commands share the `llmfleet model` group with the lab's generators
(llmfleet.lab.tiny_cli); llmfleet.cli gathers both into it. Each sub-command
is a `register_<name>(subparsers)` function listed in SUBCOMMANDS; a new one
adds a function and one line there.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from llmfleet.errors import LlmfleetError, RefusedError
from llmfleet.module_utils import model_validation
from llmfleet.ops.merge import merge_adapter

log = logging.getLogger(__name__)

# argparse's sub-parser action has no public name; this alias is only for typing.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _fixes(values: list[str]) -> dict[str, Any]:
    fixes: dict[str, Any] = {}
    for text in values:
        try:
            key, value = model_validation.parse_fix(text)
        except ValueError as error:
            raise LlmfleetError(str(error)) from error
        fixes[key] = value
    return fixes


def _summary(facts: dict[str, Any]) -> str:
    parts = [
        str(facts.get("architecture")),
        f"{facts.get('layers')} layers",
        f"{facts.get('attention_heads')} heads ({facts.get('kv_heads')} KV)",
        f"head_dim {facts.get('head_dim')}",
        str(facts.get("dtype")),
        f"{facts.get('parameters', 0):,} parameters",
        f"{facts.get('weights_bytes', 0):,} weight bytes",
        f"max {facts.get('max_model_len')} tokens",
    ]
    return ", ".join(parts)


def _check(args: argparse.Namespace) -> int:
    fixes = _fixes(args.fix_config)
    try:
        report = model_validation.check_model(
            args.dir,
            adapters=args.adapter,
            engine_version=args.engine_version,
            chat=args.chat,
            config_fixes=fixes or None,
            write_fixes=not args.dry_run,
            backup=True,
            base_names=args.base_name,
        )
    except (ValueError, OSError) as error:
        raise LlmfleetError(str(error)) from error
    fix = report["config_fix"]
    if fix is not None and fix["changed"]:
        if fix["written"]:
            log.warning(
                "changed %s as asked: set %s; original saved as %s",
                fix["path"],
                ", ".join(fix["keys"]),
                fix["backup_file"],
            )
        else:
            log.warning("--dry-run: %s would change (%s); nothing written", fix["path"], ", ".join(fix["keys"]))
        if not args.json:
            print(fix["diff"], end="")
    elif fix is not None:
        log.warning("%s already has the values given with --fix-config; nothing to change", fix["path"])
    code = RefusedError.exit_code if report["problems"] else 0
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return code
    for warning in report["warnings"]:
        print(f"llmfleet: warning: {warning}", file=sys.stderr)
    if report["problems"]:
        for line in report["problem_lines"]:
            print(f"llmfleet: refused {line}", file=sys.stderr)
        return code
    print(f"ok: {args.dir} is servable by vLLM {report['engine_version']}: {_summary(report['facts'])}")
    for adapter in report["adapters"]:
        print(
            f"ok: adapter {adapter['path']}: LoRA r={adapter['rank']} (--max-lora-rank {adapter['max_lora_rank']}),"
            f" targets {', '.join(adapter['target_modules'])}"
        )
    return code


def register_check(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "check",
        help="refuse a model directory (and LoRA adapters) the pinned vLLM cannot serve",
        description=(
            "Check that DIR is servable by vLLM: config.json and its architecture, the keys that architecture"
            " needs (rope_theta for Qwen2/Llama), complete safetensors weights (read from headers only),"
            " tokenizer files, a chat template, and each --adapter (PEFT LoRA, base model, target modules,"
            " rank). Exit 0: servable; 2: not, one line per problem naming the file and the fix; 1: bad input."
            " --fix-config KEY=VALUE sets a config.json key explicitly: the change is shown as a diff,"
            " logged, and the original is kept as config.json.orig-<timestamp>."
        ),
    )
    parser.add_argument("dir", metavar="DIR", help="the model directory")
    parser.add_argument(
        "--adapter", action="append", default=[], metavar="DIR", help="a LoRA adapter directory (repeatable)"
    )
    parser.add_argument(
        "--engine-version",
        default=model_validation.LAB_ENGINE_VERSION,
        metavar="V",
        help=(
            f"the vLLM release that will serve it (known: {', '.join(model_validation.ENGINE_VERSIONS)};"
            f" default {model_validation.LAB_ENGINE_VERSION}, the lab engine)"
        ),
    )
    parser.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="require a chat template (default: yes; --no-chat for completions only)",
    )
    parser.add_argument(
        "--fix-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config.json key first, e.g. rope_theta=1000000.0 (VALUE is JSON when it parses; repeatable)",
    )
    parser.add_argument("--dry-run", action="store_true", help="show what --fix-config would change; write nothing")
    parser.add_argument(
        "--base-name",
        action="append",
        default=[],
        metavar="NAME",
        help="another name of the model (e.g. the hub name it was staged from) that adapters may record",
    )
    parser.add_argument("--json", action="store_true", help="print the whole report, facts included, as JSON")
    parser.set_defaults(handler=_check)


def _merge_adapter(args: argparse.Namespace) -> int:
    if args.python is not None:
        python = Path(args.python)
    else:
        from llmfleet.build import toolchain  # builds a venv: only when no --python is given

        python = toolchain.ensure_venv() / "bin" / "python"
    result = merge_adapter(
        Path(args.base), Path(args.adapter), Path(args.out), python, engine_version=args.engine_version, chat=args.chat
    )
    written = result.written
    print(
        f"merged {written['adapter']} (LoRA r={written['adapter_rank']}) into {written['base']}:"
        f" wrote {result.out} ({written['dtype']}, toolchain torch {written['toolchain']['torch']},"
        f" transformers {written['toolchain']['transformers']}, peft {written['toolchain']['peft']})"
    )
    print(f"ok: {result.out} is servable by vLLM {result.report['engine_version']}: {_summary(result.report['facts'])}")
    return 0


def register_merge_adapter(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "merge-adapter",
        help="merge a LoRA adapter into its base model as a new directory, then check it",
        description=(
            "Check that the adapter fits the base, merge it with PEFT (merge_and_unload, in float32, saved in the"
            " base's dtype) into the NEW directory OUT (missing or empty; written beside it and renamed when"
            " complete), copy the tokenizer files and chat template, then check OUT as `llmfleet model check`"
            " does. The merge runs roles/python_toolchain/files/merge_adapter.py with the toolchain's python."
            " Exit 0: merged and servable; 2: refused (OUT not empty, adapter does not fit, merged model not"
            " servable); 1: the toolchain failed."
        ),
    )
    parser.add_argument("--base", required=True, metavar="DIR", help="the base model directory")
    parser.add_argument("--adapter", required=True, metavar="DIR", help="the PEFT LoRA adapter directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="the new directory for the merged model")
    parser.add_argument(
        "--python",
        metavar="VENV_PYTHON",
        help=(
            "python of a venv with the pinned torch, transformers and peft (on a host: the python_toolchain"
            " role's <python_toolchain_dir>/bin/python). Default: the lab toolchain venv under llmfleet's cache,"
            " built from `llmfleet wheelhouse toolchain`'s wheelhouse on first use (about 1 GB)"
        ),
    )
    parser.add_argument(
        "--engine-version",
        default=model_validation.LAB_ENGINE_VERSION,
        metavar="V",
        help=f"the vLLM release the merged model is checked for (default {model_validation.LAB_ENGINE_VERSION})",
    )
    parser.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="require a chat template in the result (default: yes)",
    )
    parser.set_defaults(handler=_merge_adapter)


SUBCOMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    register_check,
    register_merge_adapter,
)


def register(subparsers: Subparsers) -> None:
    """Add check and merge-adapter to the `llmfleet model` group's sub-parsers."""
    for register_subcommand in SUBCOMMANDS:
        register_subcommand(subparsers)
