"""`llmfleet stack check|show`: the GPU software-stack table and its compatibility check.

The table is playbooks/vars/stacks.yml (Ansible loads the same file); the rules
are plugins/module_utils/stack_compat/, shared with the `stack_check` Ansible
module. `stack check` exits 0 when the versions work together and 2 with one
line per broken rule when they do not; input that is not a version exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llmfleet.errors import LlmfleetError, RefusedError
from llmfleet.module_utils import stack_compat
from llmfleet.stacks import STACKS_FILE, get_stack, load_stacks


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stack = subparsers.add_parser("stack", help="GPU driver/CUDA/PyTorch/vLLM version table and checks")
    actions = stack.add_subparsers(dest="stack_command", required=True, metavar="ACTION")

    check = actions.add_parser(
        "check",
        help="refuse driver/CUDA/PyTorch/vLLM/GPU combinations that cannot work",
        description=(
            "Check versions against the compatibility rules. Give --driver and --cuda (plus any of "
            "--torch, --vllm, --gpu/--compute-capability), or --stack NAME to check a stack from the "
            "table (with --driver, the driver installed on a host). Exit 0: compatible; 2: refused, "
            "one line per rule; 1: bad input."
        ),
    )
    check.add_argument("--stack", metavar="NAME", help="a stack from the table, e.g. mission-cu121")
    check.add_argument("--driver", metavar="V", help="NVIDIA driver, as nvidia-smi prints it: 535.104.05")
    check.add_argument("--cuda", metavar="V", help="CUDA toolkit: 12.1 or 12.1.1")
    check.add_argument("--torch", metavar="V", help="PyTorch, with its wheel label: 2.3.0+cu121")
    check.add_argument("--vllm", metavar="V", help="vLLM: 0.4.2")
    check.add_argument("--transformers", metavar="V", help="transformers, checked against --vllm's range: 4.40.2")
    gpu = check.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", metavar="NAME", help='GPU name, e.g. "RTX 4090", "H100", "NVIDIA A100-SXM4-80GB"')
    gpu.add_argument("--compute-capability", metavar="X.Y", help="GPU compute capability: 8.9 or sm_89")
    check.add_argument("--json", action="store_true", help="print {ok, problems, checked} as JSON")
    check.add_argument("--stacks-file", type=Path, default=STACKS_FILE, help=argparse.SUPPRESS)
    check.set_defaults(handler=_check)

    show = actions.add_parser("show", help="print the stack table, or one stack")
    show.add_argument("name", nargs="?", metavar="NAME", help="one stack, e.g. mission-cu121")
    show.add_argument("--json", action="store_true", help="print the stack(s) as JSON")
    show.add_argument("--stacks-file", type=Path, default=STACKS_FILE, help=argparse.SUPPRESS)
    show.set_defaults(handler=_show)


def _compute_capability(args: argparse.Namespace) -> str | None:
    if args.gpu is not None:
        return stack_compat.format_compute_capability(stack_compat.gpu_compute_capability(args.gpu))
    if args.compute_capability is None:
        return None
    return str(args.compute_capability)


def _check(args: argparse.Namespace) -> int:
    try:
        compute_capability = _compute_capability(args)
        if args.stack is not None:
            given = [
                f"--{flag}" for flag in ("cuda", "torch", "vllm", "transformers") if getattr(args, flag) is not None
            ]
            if given:
                raise LlmfleetError(
                    f"{', '.join(given)} cannot be combined with --stack: the stack names those versions"
                )
            stack = get_stack(args.stack, args.stacks_file)
            checked: dict[str, str | None] = {"stack": args.stack}
            checked.update(stack_compat.stack_versions(stack, args.stack))
            if args.driver is not None:
                checked["driver"] = args.driver
            problems = stack_compat.check_stack(
                stack, args.stack, driver=args.driver, compute_capability=compute_capability
            )
        else:
            missing = [f"--{flag}" for flag in ("driver", "cuda") if getattr(args, flag) is None]
            if missing:
                raise LlmfleetError(f"give {' and '.join(missing)} (or --stack NAME)")
            checked = {
                "driver": args.driver,
                "cuda": args.cuda,
                "torch": args.torch,
                "vllm": args.vllm,
                "transformers": args.transformers,
            }
            problems = stack_compat.check(
                args.driver,
                args.cuda,
                torch=args.torch,
                vllm=args.vllm,
                compute_capability=compute_capability,
                transformers=args.transformers,
            )
    except ValueError as error:
        raise LlmfleetError(str(error)) from error
    checked["compute_capability"] = compute_capability
    if args.gpu is not None:
        checked["gpu"] = args.gpu

    if args.json:
        result = {"ok": not problems, "problems": [problem.as_dict() for problem in problems], "checked": checked}
        print(json.dumps(result, indent=2))
        return RefusedError.exit_code if problems else 0
    if problems:
        for problem in problems:
            print(f"llmfleet: refused {problem.line()}", file=sys.stderr)
        return RefusedError.exit_code
    summary = ", ".join(f"{key} {value}" for key, value in checked.items() if value is not None)
    print(f"ok: compatible ({summary})")
    return 0


def _show(args: argparse.Namespace) -> int:
    stacks = load_stacks(args.stacks_file)
    if args.name is not None:
        if args.name not in stacks:
            raise LlmfleetError(f"no stack {args.name!r}; known stacks: {', '.join(sorted(stacks))}")
        stacks = {args.name: stacks[args.name]}
    if args.json:
        print(json.dumps(stacks, indent=2, sort_keys=True))
        return 0
    blocks = []
    for name, stack in stacks.items():
        try:
            versions = stack_compat.stack_versions(stack, name)
            packages = stack_compat.stack_packages(stack, name)
        except ValueError as error:
            raise LlmfleetError(str(error)) from error
        driver = stack.get("driver", {})
        lines = [
            name,
            f"  driver   branch {driver.get('branch')}, >= {versions['driver']}",
            f"  cuda     {versions['cuda']}",
        ]
        lines += [f"    {distro:<11} {' '.join(names)}" for distro, names in sorted(packages.items())]
        lines += [
            f"  torch    {versions['torch']}",
            f"  vllm     {versions['vllm']}",
            f"  image    {stack.get('vllm', {}).get('image')}",
            f"  tooling  transformers {versions['transformers']}, peft {versions['peft']}",
        ]
        description = " ".join(str(stack.get("description", "")).split())
        if description:
            lines.append(f"  about    {description}")
        blocks.append("\n".join(lines))
    print("\n\n".join(blocks))
    return 0
