"""A site behind an HTTP proxy: every play applies llmfleet_proxy_env, and dockerd gets docker_proxy_env.

The drop-in's task runs here as written, through ansible-playbook on
localhost, writing under tmp_path; the docker role's Molecule scenario runs
a real dockerd with it and reads back what `docker info` reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

PLAYBOOKS = sorted((REPO_ROOT / "playbooks").glob("*.yml"))
PROXY_ENV = "{{ llmfleet_proxy_env | default({}) }}"
DOCKER = REPO_ROOT / "roles" / "docker"


def _plays() -> list[tuple[str, dict[str, object]]]:
    return [
        (f"{path.name}: {play['name']}", play)
        for path in PLAYBOOKS
        for play in yaml.safe_load(path.read_text())
        if "hosts" in play
    ]


@pytest.mark.parametrize(("name", "play"), _plays(), ids=[name for name, _ in _plays()])
def test_every_play_applies_the_sites_proxy(name: str, play: dict[str, object]) -> None:
    assert play.get("environment") == PROXY_ENV, f"{name} runs its tasks without llmfleet_proxy_env"


def test_the_example_inventory_shows_the_proxy_commented() -> None:
    common = (REPO_ROOT / "inventories" / "production.example" / "group_vars" / "all" / "common.yml").read_text()
    assert "# llmfleet_proxy_env:" in common and "# docker_proxy_env:" in common
    assert "llmfleet_proxy_env" not in (yaml.safe_load(common) or {})


def _run_dropin_task(tmp_path: Path, proxy_env: dict[str, str]) -> tuple[str, Path]:
    tasks = yaml.safe_load((DOCKER / "tasks" / "configure.yml").read_text())
    task = next(task for task in tasks if task["name"] == "configure | Give dockerd the site's proxy")
    task = {key: value for key, value in task.items() if key != "notify"}  # no handler here
    dropin = tmp_path / "llmfleet-proxy.conf"
    play = [{"name": "Proxy drop-in", "hosts": "all", "gather_facts": False, "tasks": [task]}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    variables = {"docker_proxy_env": proxy_env, "__docker_proxy_dropin": str(dropin)}
    result = run_local_playbook(tmp_path, playbook, json.dumps(variables))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    return output, dropin


def test_the_drop_in_is_root_only_escapes_percent_and_keeps_a_password_out_of_the_log(tmp_path: Path) -> None:
    proxy = "http://ops:p%40ss-s3cret@proxy.test:3128"
    output, dropin = _run_dropin_task(tmp_path, {"HTTPS_PROXY": proxy, "NO_PROXY": "localhost,127.0.0.1"})
    text = dropin.read_text()
    assert "[Service]" in text
    assert 'Environment="HTTPS_PROXY=http://ops:p%%40ss-s3cret@proxy.test:3128"' in text
    assert 'Environment="NO_PROXY=localhost,127.0.0.1"' in text
    assert dropin.stat().st_mode & 0o777 == 0o600
    assert "s3cret" not in output
