"""What an operator and Alertmanager notice on the monitoring host after the scaler role ran (dry-run mode).

The token and the inventory are converge.yml's and prepare.yml's.
"""

from __future__ import annotations

import json

import pytest

TOKEN = "molecule-test-only-scaler-8f2c41d07e"  # TEST VALUE ONLY, as converge.yml sets it
STATE_DIR = "/var/lib/llmfleet-scaler"
URL = "http://127.0.0.1:9095"

# POSTs a body with an optional token; prints the status and the body.
POST = """
import sys, urllib.request, urllib.error
request = urllib.request.Request(sys.argv[1], data=sys.stdin.buffer.read(), method="POST",
                                 headers={"Content-Type": "application/json"})
if len(sys.argv) > 2:
    request.add_header("Authorization", "Bearer " + open(sys.argv[2]).read().strip())
try:
    with urllib.request.urlopen(request, timeout=60) as response:
        print(response.status); print(response.read().decode())
except urllib.error.HTTPError as error:
    print(error.code); print(error.read().decode())
"""


def post(host, body: str, with_token: bool) -> tuple[int, str]:
    # The token goes through a root-only file, never a command line.
    host.run_test("install -m 0600 /dev/null /root/scaler-test-token && printf %%s %s > /root/scaler-test-token", TOKEN)
    token_arg = "/root/scaler-test-token" if with_token else ""
    result = host.run("printf %%s %s | python3 -c %s %s " + token_arg, body, POST, f"{URL}/alerts")
    assert result.rc == 0, result.stderr
    status, _, text = result.stdout.partition("\n")
    return int(status), text


def notification(kind: str, fingerprint: str) -> str:
    return json.dumps(
        {
            "version": "4",
            "groupKey": '{}:{alertname="ScaleOutNeeded"}',
            "status": "firing",
            "receiver": "scaler",
            "alerts": [
                {
                    "status": "firing",
                    "fingerprint": fingerprint,
                    "startsAt": "2026-12-01T10:00:00Z",
                    "labels": {"alertname": "ScaleOutNeeded", "scale_action": "out", "scale_kind": kind},
                }
            ],
        }
    )


def audit(host) -> list[dict]:
    return [json.loads(line) for line in host.file(f"{STATE_DIR}/audit.jsonl").content_string.splitlines()]


def test_the_service_runs_as_its_user_and_starts_at_boot(host):
    service = host.service("llmfleet-scaler")
    assert service.is_running and service.is_enabled
    assert host.run_test("systemctl show -p User --value llmfleet-scaler").stdout.strip() == "llmfleet-scaler"


def test_the_token_is_a_0400_file_and_nowhere_else(host):
    token = host.file("/opt/llmfleet-scaler/secrets/token")
    assert (token.mode, token.user) == (0o400, "llmfleet-scaler")
    assert TOKEN not in host.file("/etc/llmfleet/scaler.env").content_string
    assert TOKEN not in host.run_test("ps -eo args").stdout
    assert TOKEN not in host.run_test("systemctl show llmfleet-scaler").stdout


def test_without_the_token_401(host):
    status, _ = post(host, notification("engines", "f-noauth"), with_token=False)
    assert status == 401


@pytest.mark.parametrize(
    ("body", "reason"),
    [("not json", "Invalid JSON"), ('{"version": "3"}', "version")],
)
def test_a_malformed_payload_is_400_with_the_reason(host, body, reason):
    status, text = post(host, body, with_token=True)
    assert status == 400
    assert reason in " ".join(json.loads(text)["errors"])


def test_a_dry_run_decision_is_audited_and_runs_nothing(host):
    status, text = post(host, notification("engines", "f-dry"), with_token=True)
    assert status == 200, text
    decision = json.loads(text)["decisions"][0]
    # The real inventory, read with ansible-inventory and the plugin: gpu3 is the standby host.
    assert (decision["outcome"], decision["action"]["host"]) == ("dry_run", "gpu3")
    audited = [r for r in audit(host) if r["event"] == "decision" and r["alerts"][0]["fingerprint"] == "f-dry"]
    assert [r["outcome"] for r in audited] == ["dry_run"]
    assert not host.file(f"{STATE_DIR}/runner/artifacts").exists, "dry run: no playbook ran"
    rejected = [r["status"] for r in audit(host) if r["event"] == "rejected"]
    assert 401 in rejected and 400 in rejected
