"""The gateway role's preflight refuses a JWT key source and algorithm list that do not go together.

A secret verifies HS* tokens only, and a JWKS URL must be https with the
provider's asymmetric algorithms: the service would refuse the mismatch at
start-up, after the containers changed, so the role stops first and says
what to set. The preflight runs for real through ansible-playbook on
localhost; it only reads variables and the controller's model files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.tools import run_local_playbook

TASK = "gateway : preflight | Check the JWT key source and algorithms"
SECRET = "unit-test-only-jwt-key-5d0c8e1f2a7b93c4"
PREVIOUS = "unit-test-only-previous-jwt-key-7e21c0d9"
JWKS = "https://idp.example/.well-known/jwks.json"


def _jwt_check(tmp_path: Path, task: str = TASK, **variables: Any) -> str:
    """The output of one preflight task (the JWT check's by default), from its header to the next task's."""
    model = tmp_path / "tiny"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (model / name).write_text("{}")
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- name: Preflight\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Run the gateway role's preflight\n"
        "      ansible.builtin.include_role: {name: gateway, tasks_from: preflight}\n"
    )
    extra = {
        "gateway_image": "llmfleet/service:0.1.0-3f9c2a1",
        "gateway_models": [{"name": "tiny", "src": str(model)}],
        "gateway_redis_url": "redis://127.0.0.1:6379/0",
        "gateway_redis_password": "unit-test-only-redis-6a2f",
        **variables,
    }
    result = run_local_playbook(tmp_path, playbook, json.dumps(extra))
    output = result.stdout + result.stderr
    match = re.search(rf"TASK \[{re.escape(task)}\].*?(?=\nTASK \[|\nPLAY RECAP)", output, re.DOTALL)
    assert match, f"{task} did not run:\n{output[-3000:]}"
    return match.group(0)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"gateway_jwt_secret": SECRET, "gateway_jwt_algorithms": ["RS256"]}, "verifies HS256, HS384 or HS512"),
        ({"gateway_jwt_jwks_url": JWKS, "gateway_jwt_algorithms": ["HS256"]}, "not HS*"),
        ({"gateway_jwt_jwks_url": JWKS.replace("https", "http"), "gateway_jwt_algorithms": ["RS256"]}, "must be https"),
        ({"gateway_jwt_jwks_url": JWKS, "gateway_jwt_algorithms": ["RS256"],
          "gateway_jwt_previous_secrets": [PREVIOUS]}, "gateway_jwt_previous_secrets empty"),
    ],
    ids=["secret with RS256", "JWKS with HS256", "JWKS over http", "JWKS with previous secrets"],
)
def test_a_mismatched_key_source_is_refused_with_what_to_set(
    tmp_path: Path, variables: dict[str, Any], message: str
) -> None:
    task = _jwt_check(tmp_path, **variables)
    assert "fatal: [localhost]" in task, task
    assert message in " ".join(task.split()), task


@pytest.mark.parametrize(
    "variables",
    [
        {"gateway_jwt_secret": SECRET, "gateway_jwt_algorithms": ["HS256", "HS512"],
         "gateway_jwt_previous_secrets": [PREVIOUS]},
        # No secret at all: the provider's keys verify.
        {"gateway_jwt_jwks_url": JWKS, "gateway_jwt_algorithms": ["RS256", "ES256"]},
    ],
    ids=["secret and HS algorithms", "JWKS URL and RS/ES algorithms"],
)
def test_a_matching_key_source_passes(tmp_path: Path, variables: dict[str, Any]) -> None:
    task = _jwt_check(tmp_path, **variables)
    assert "ok: [localhost]" in task and "fatal" not in task, task


def test_a_weak_previous_secret_is_refused_by_name(tmp_path: Path) -> None:
    task = _jwt_check(
        tmp_path, "gateway : preflight | Check the secrets",
        gateway_jwt_secret=SECRET, gateway_jwt_previous_secrets=[SECRET[::-1], "short-key-4f1a"],
    )
    assert "fatal: [localhost]" in task, task
    # The second one is named (the first is fine), and no value is shown.
    assert "gateway_jwt_previous_secrets[1]" in task and "gateway_jwt_previous_secrets[0]" not in task, task
    assert "short-key-4f1a" not in task, task
