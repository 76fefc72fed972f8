"""The whole-stack lab scenario: `llmfleet lab up`, then site.yml end to end.

Ordered on purpose: converge, converge again, check mode, then teardown.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.lab.helpers import TEST_LAB_NAME, copy_lab_inventory, llmfleet_lab, run_playbook

LAB_HOSTS = {"gw1", "redis1", "mon1", "gpu1", "gpu2", "gpu3"}


def test_lab_status_shows_every_host_running(lab_inventory: Path) -> None:
    status = llmfleet_lab(lab_inventory, "status")
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line.split() for line in status.stdout.splitlines()[2:]}
    assert set(rows) == LAB_HOSTS
    for host, row in rows.items():
        assert row[1] == f"{TEST_LAB_NAME}-{host}"
        assert row[2].startswith("10.78.0.")
        assert row[3:5] == ["running", "running"], row


def test_site_converges_with_no_failure(lab_inventory: Path, facts_dir: Path) -> None:
    run = run_playbook(lab_inventory, "site.yml", facts=facts_dir)
    assert run.returncode == 0, run.output[-5000:]
    assert set(run.recap) == LAB_HOSTS | {"localhost"}
    for host, counts in run.recap.items():
        assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)


def test_second_run_changes_nothing(lab_inventory: Path, facts_dir: Path) -> None:
    run = run_playbook(lab_inventory, "site.yml", facts=facts_dir)
    assert run.returncode == 0, run.output[-5000:]
    changed = {host: counts["changed"] for host, counts in run.recap.items() if counts["changed"]}
    assert changed == {}, f"not idempotent: {changed}\n{run.output[-5000:]}"


def test_check_mode_on_a_converged_site_is_clean(lab_inventory: Path, facts_dir: Path) -> None:
    run = run_playbook(lab_inventory, "site.yml", "--check", facts=facts_dir)
    assert run.returncode == 0, run.output[-5000:]
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in run.recap.values()), run.recap


def test_missing_group_fails_first_play_naming_it(tmp_path: Path, facts_dir: Path) -> None:
    inventory = copy_lab_inventory(tmp_path / "broken")
    hosts = inventory / "hosts.yml"
    lines = hosts.read_text().splitlines()
    start = lines.index("    gpu_nodes:")
    del lines[start:start + 4]  # the group header, `hosts:` and its two hosts
    hosts.write_text("\n".join(lines) + "\n")
    run = run_playbook(inventory, "site.yml", facts=facts_dir)
    assert run.returncode != 0
    assert "group 'gpu_nodes' is missing from the inventory" in run.output
    # It stopped on the controller: no lab host was contacted.
    assert set(run.recap) == {"localhost"}, run.recap


def test_lab_down_leaves_nothing_behind(lab_inventory: Path) -> None:
    down = llmfleet_lab(lab_inventory, "down")
    assert down.returncode == 0, down.stderr
    label = f"label=llmfleet.lab={TEST_LAB_NAME}"
    for kind in (["ps", "-a"], ["volume", "ls"], ["network", "ls"]):
        listing = subprocess.run(["docker", *kind, "-q", "--filter", label],
                                 capture_output=True, text=True, check=True)
        assert listing.stdout.strip() == "", (kind, listing.stdout)
    # And by name, in case something escaped the label.
    names = subprocess.run(["docker", "ps", "-a", "--format", "{{json .Names}}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert not [n for n in map(json.loads, names) if n.startswith(TEST_LAB_NAME)]
