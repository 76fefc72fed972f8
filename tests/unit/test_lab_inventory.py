"""inventories/lab is production.example plus one small overlay per group.

The lab proves production only if it runs production's group_vars. So each
group's directory under inventories/lab/group_vars links production.example's
vars for that group (`00-production.yml`, or `00-production` for a directory
such as all/) and holds one overlay, `lab.yml`, with only what the lab must
change or add; all/ also holds `lab_secrets.yml`, the lab's stand-in for the
vault. Ansible reads a group's directory in sorted order (DataLoader.
find_vars_files), so production's files load first and the overlays win.

These tests keep that shape: every production group is linked, every lab group
links production and holds only its overlays, Ansible really loads them in
that order, no overlay key repeats the value production already gives, and
every value production reads from the vault has a lab stand-in.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader

from llmfleet.paths import REPO_ROOT

PRODUCTION = REPO_ROOT / "inventories" / "production.example" / "group_vars"
LAB = REPO_ROOT / "inventories" / "lab" / "group_vars"
LINK = "00-production"
OVERLAY = "lab.yml"
# Extra overlays a group may hold beside lab.yml.
EXTRA_OVERLAYS = {"all": {"lab_secrets.yml"}}
VAULT_REFERENCE = re.compile(r"\bvault_[a-z0-9_]+\b")


def _groups(group_vars: Path) -> dict[str, Path]:
    """The groups a group_vars directory sets variables for: each one's file or directory."""
    groups = {}
    for entry in sorted(group_vars.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            groups[entry.name] = entry
        elif entry.suffix in {".yml", ".yaml", ".json"}:
            groups[entry.stem] = entry
    return groups


def _vars(files: list[str]) -> dict[str, Any]:
    """The variables of files in the order Ansible loads them, later files winning (hash_behaviour replace)."""
    merged: dict[str, Any] = {}
    for path in files:
        merged.update(yaml.safe_load(Path(path).read_text()) or {})
    return merged


def layout_problems(production: Path, lab: Path) -> list[str]:
    """What breaks `lab group = link to production's group + its overlays`, for each group of either side."""
    problems = []
    production_groups = _groups(production)
    for name, entry in sorted(_groups(lab).items()):
        if not entry.is_dir() or entry.is_symlink():
            problems.append(f"{name}: the lab sets it in {entry.name}, not in a directory {name}/ (link + overlay)")
            continue
        source = production_groups.get(name)
        if source is None:
            problems.append(f"{name}: production.example has no group_vars for it, so the lab has nothing to link;"
                            " add them there (the lab then overrides what differs)")
        overlays = {OVERLAY} | EXTRA_OVERLAYS.get(name, set())
        link_name = LINK + (source.suffix if source is not None and source.is_file() else "")
        for child in sorted(entry.iterdir()):
            if child.name == link_name:
                target = child.readlink() if child.is_symlink() else None
                if target is None or target.is_absolute():
                    problems.append(f"{name}/{child.name}: must be a relative symlink to production.example's vars")
                elif source is not None and child.resolve() != source.resolve():
                    problems.append(f"{name}/{child.name}: links {target}, not production.example's {source.name}")
            elif child.name not in overlays or child.is_symlink() or not child.is_file():
                problems.append(f"{name}/{child.name}: a group holds only {link_name} and the file(s)"
                                f" {', '.join(sorted(overlays))}")
        if not (entry / link_name).is_symlink():
            problems.append(f"{name}/: no link {link_name} to production.example's vars for {name}")
        if not (entry / OVERLAY).is_file():
            problems.append(f"{name}/: no overlay {OVERLAY}")
    for name in sorted(set(production_groups) - set(_groups(lab))):
        problems.append(f"{name}: production.example sets vars for it, but the lab does not link them"
                        f" (make {name}/ with {LINK} and {OVERLAY})")
    return problems


def _linked(path: str | Path, lab: Path) -> bool:
    """Whether a file Ansible found for a lab group comes through the link to production.example."""
    parts = Path(path).relative_to(lab).parts
    return len(parts) > 1 and parts[1].startswith(LINK)


def load_order_problems(production: Path, lab: Path) -> list[str]:
    """Ansible's own file order for each lab group must be production's files, then the overlays."""
    loader = DataLoader()
    problems = []
    for name in sorted(_groups(lab)):
        found = [Path(path) for path in loader.find_vars_files(str(lab), name)]
        expected = [Path(path).resolve() for path in loader.find_vars_files(str(production), name)]
        linked = [path for path in found if _linked(path, lab)]
        if [path.resolve() for path in linked] != expected or found[: len(linked)] != linked:
            problems.append(f"{name}: Ansible loads {[str(path.relative_to(lab)) for path in found]},"
                            " not production.example's files first and the overlays last")
    return problems


def override_problems(production: Path, lab: Path) -> list[str]:
    """Overlay keys that repeat production's value, and vault references the lab leaves in place."""
    loader = DataLoader()
    production_all = _vars(loader.find_vars_files(str(production), "all"))
    lab_all = _vars([path for path in loader.find_vars_files(str(lab), "all") if not _linked(path, lab)])
    problems = []
    for name in sorted(_groups(lab)):
        own = _vars(loader.find_vars_files(str(production), name))
        # What production gives the group's hosts: its own vars over all's (groups here have no parents but all).
        inherited = {**production_all, **own}
        seen: dict[str, str] = {}
        for overlay in [path for path in loader.find_vars_files(str(lab), name) if not _linked(path, lab)]:
            where = str(Path(overlay).relative_to(lab))
            for key, value in _vars([overlay]).items():
                if key in seen:
                    problems.append(f"{where}: {key} is set in {seen[key]} too")
                seen[key] = where
                if key in inherited and inherited[key] == value:
                    problems.append(f"{where}: {key} repeats production.example's value {value!r}: drop it")
        for key, value in own.items():
            if VAULT_REFERENCE.search(str(value)) and key not in seen and key not in lab_all:
                problems.append(f"{name}: production reads {key} from the vault ({value}); the lab has no vault,"
                                " so its overlay must set it")
    return problems


def test_production_and_the_lab_have_groups() -> None:
    assert {"all", "gateways", "gpu_nodes", "monitoring"} <= set(_groups(PRODUCTION))
    assert set(_groups(LAB)) == set(_groups(PRODUCTION))


def test_each_lab_group_links_production_and_holds_one_overlay() -> None:
    problems = layout_problems(PRODUCTION, LAB)
    assert not problems, "inventories/lab/group_vars:\n" + "\n".join(problems)


def test_ansible_loads_production_first_and_the_overlay_last() -> None:
    problems = load_order_problems(PRODUCTION, LAB)
    assert not problems, "inventories/lab/group_vars:\n" + "\n".join(problems)


def test_overlays_hold_only_differences_and_replace_every_vault_value() -> None:
    problems = override_problems(PRODUCTION, LAB)
    assert not problems, "inventories/lab/group_vars:\n" + "\n".join(problems)


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path]:
    """Both inventories' group_vars copied side by side, the links kept as links."""
    inventories = tmp_path / "inventories"
    for name in ("production.example", "lab"):
        shutil.copytree(REPO_ROOT / "inventories" / name / "group_vars", inventories / name / "group_vars",
                        symlinks=True)
    production, lab = inventories / "production.example" / "group_vars", inventories / "lab" / "group_vars"
    assert not layout_problems(production, lab) and not override_problems(production, lab)
    return production, lab


def test_the_checks_find_a_group_production_has_and_the_lab_does_not_link(copies: tuple[Path, Path]) -> None:
    production, lab = copies
    (production / "redis.yml").write_text("---\nredis_port: 6379\n")
    assert any("redis: production.example sets vars" in problem for problem in layout_problems(production, lab))
    (lab / "redis").mkdir()
    (lab / "redis" / OVERLAY).write_text("---\nredis_port: 6380\n")
    assert any("redis/: no link 00-production.yml" in problem for problem in layout_problems(production, lab))
    (lab / "redis" / "00-production.yml").symlink_to("../../../production.example/group_vars/redis.yml")
    assert not layout_problems(production, lab)


def test_the_checks_find_a_loose_file_a_wrong_link_and_a_stray_overlay(copies: tuple[Path, Path]) -> None:
    production, lab = copies
    (lab / "gateways" / "00-production.yml").unlink()
    (lab / "gateways" / "00-production.yml").symlink_to("../../../production.example/group_vars/monitoring.yml")
    (lab / "monitoring" / "extra.yml").write_text("---\nprometheus_retention: 1d\n")
    shutil.move(lab / "gpu_nodes" / OVERLAY, lab / "gpu_nodes.yml")
    shutil.rmtree(lab / "gpu_nodes")
    problems = "\n".join(layout_problems(production, lab))
    assert "gateways/00-production.yml: links ../../../production.example/group_vars/monitoring.yml" in problems
    assert "monitoring/extra.yml: a group holds only" in problems
    assert "gpu_nodes: the lab sets it in gpu_nodes.yml" in problems


def test_the_checks_find_a_late_link_a_redundant_key_and_a_vault_reference(copies: tuple[Path, Path]) -> None:
    production, lab = copies
    (lab / "gateways" / "00-production.yml").rename(lab / "gateways" / "production.yml")
    assert any("gateways: Ansible loads" in problem for problem in load_order_problems(production, lab))
    (lab / "gateways" / "production.yml").rename(lab / "gateways" / "00-production.yml")
    with (lab / "gpu_nodes" / OVERLAY).open("a") as overlay:
        overlay.write("vllm_client_hosts: \"{{ groups['gateways'] | default([]) }}\"\n")
    secrets = lab / "all" / "lab_secrets.yml"
    secrets.write_text(secrets.read_text().replace("vllm_api_key:", "# vllm_api_key:"))
    problems = "\n".join(override_problems(production, lab))
    assert "gpu_nodes/lab.yml: vllm_client_hosts repeats production.example's value" in problems
    assert "all: production reads vllm_api_key from the vault" in problems


def test_the_lab_logs_in_as_production_does() -> None:
    """Production reaches hosts over SSH as an unprivileged user with become: the lab's hosts.yml says the same,
    so a task that forgot become, or a file written with the wrong owner, fails in the lab as on a site."""
    def login(inventory: str) -> dict[str, Any]:
        top = yaml.safe_load((REPO_ROOT / "inventories" / inventory / "hosts.yml").read_text())["all"]["vars"]
        return {key: top.get(key) for key in ("ansible_user", "ansible_become", "ansible_connection")}

    assert login("lab") == login("production.example")
    assert login("lab")["ansible_user"] not in (None, "root") and login("lab")["ansible_become"] is True
    overlay = yaml.safe_load((LAB / "all" / OVERLAY).read_text())
    assert "ansible_connection" not in overlay, "the lab overlay must not swap SSH for another connection"
