"""The alertmanager role's routing, rendered as hosts get it: severity decides who hears of an alert.

critical pages the operators, warning goes to chat, the scaling alerts (info, scale_action) go to the scaler,
Watchdog (always firing) only to its dead man's switch, and a critical alert inhibits the warnings of its
instance. The configuration is rendered on the controller from the role's defaults, vars and template
(tests/unit/roles/alertmanager/render.yml); where amtool is installed (Debian's prometheus-alertmanager), it
checks the file and resolves each route as Alertmanager would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

RENDER_PLAYBOOK = Path(__file__).resolve().parent / "alertmanager" / "render.yml"
SITE = {
    "alertmanager_listen_address": "127.0.0.1",
    "alertmanager_email_to": ["oncall@example.internal"],
    "alertmanager_slack_api_url": "https://chat.example.internal/hooks/abc",
    "alertmanager_watchdog_url": "https://deadman.example.internal/ping/abc",
    "alertmanager_scaler_token": "a-token-of-sixteen-or-more",
}


def render(out: Path, **variables: Any) -> dict[str, Any]:
    path = out / "alertmanager.yml"
    extra = {"ansible_python_interpreter": sys.executable, "__alertmanager_render_path": str(path), **variables}
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1"}
    env.pop("ANSIBLE_CONFIG", None)
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    result = subprocess.run([*command, "-e", json.dumps(extra), str(RENDER_PLAYBOOK)], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    return config


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("alertmanager")
    return out / "alertmanager.yml", render(out, **SITE)


def _route(config: dict[str, Any], labels: dict[str, str]) -> str:
    """The receiver of the first child route whose matchers all match (the role's matchers: = and =~ only)."""
    for route in config["route"]["routes"]:
        matched = True
        for matcher in route["matchers"]:
            name, operator, value = re.match(r'^(\w+)(=~|=)"(.*)"$', matcher).groups()  # type: ignore[union-attr]
            found = labels.get(name, "")
            matched &= re.fullmatch(value, found) is not None if operator == "=~" else found == value
        if matched:
            return str(route["receiver"])
    return str(config["route"]["receiver"])


CASES = [
    ({"alertname": "Watchdog", "severity": "none"}, "watchdog"),
    ({"alertname": "ScaleOutNeeded", "severity": "info", "scale_action": "out", "scale_kind": "engines"}, "scaler"),
    ({"alertname": "ScaleInPossible", "severity": "info", "scale_action": "in", "scale_kind": "workers"}, "scaler"),
    ({"alertname": "RedisDown", "severity": "critical", "instance": "redis1:9121"}, "operators"),
    ({"alertname": "EngineDown", "severity": "critical", "instance": "gpu1:8000"}, "operators"),
    ({"alertname": "TargetDown", "severity": "warning", "instance": "gpu3:9100"}, "chat"),
    ({"alertname": "TTFTp95High", "severity": "warning", "instance": "gpu1:8000"}, "chat"),
]


@pytest.mark.parametrize(("labels", "receiver"), CASES, ids=[labels["alertname"] for labels, _ in CASES])
def test_severity_decides_the_receiver(site: tuple[Path, dict[str, Any]], labels: dict[str, str],
                                        receiver: str) -> None:
    path, config = site
    assert _route(config, labels) == receiver
    amtool = shutil.which("amtool")
    if amtool is not None:  # Alertmanager's own resolution agrees
        result = subprocess.run([amtool, "config", "routes", "test", f"--config.file={path}",
                                 *(f"{name}={value}" for name, value in labels.items())],
                                capture_output=True, text=True, check=False)
        assert result.stdout.strip() == receiver, result.stdout + result.stderr


def test_watchdog_pages_nobody_and_reaches_only_the_dead_mans_switch(site: tuple[Path, dict[str, Any]]) -> None:
    _, config = site
    first = config["route"]["routes"][0]
    assert first["matchers"] == ['alertname="Watchdog"'] and not first.get("continue")
    watchdog = next(receiver for receiver in config["receivers"] if receiver["name"] == "watchdog")
    assert watchdog == {"name": "watchdog", "webhook_configs": [
        {"url": SITE["alertmanager_watchdog_url"], "send_resolved": False}]}


def test_warnings_go_to_chat_and_critical_pages_by_mail_and_chat(site: tuple[Path, dict[str, Any]]) -> None:
    _, config = site
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    assert set(receivers["chat"]) == {"name", "slack_configs"}
    assert set(receivers["operators"]) == {"name", "email_configs", "slack_configs"}


def test_without_chat_warnings_go_to_the_operators_mail(tmp_path: Path) -> None:
    config = render(tmp_path, **{**SITE, "alertmanager_slack_api_url": "", "alertmanager_watchdog_url": ""})
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    assert set(receivers["chat"]) == {"name", "email_configs"}
    assert receivers["watchdog"] == {"name": "watchdog"}  # nowhere, and still not the operators


def test_a_critical_alert_inhibits_the_warnings_of_its_instance_only(site: tuple[Path, dict[str, Any]]) -> None:
    _, config = site
    assert {"source_matchers": ['severity="critical"', 'instance=~".+"'], "target_matchers": ['severity="warning"'],
            "equal": ["instance"]} in config["inhibit_rules"]


def test_amtool_accepts_the_configuration(site: tuple[Path, dict[str, Any]]) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool is not installed (Debian's prometheus-alertmanager); the role validates on the host")
    path, _ = site
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
