"""The whole-stack lab scenario: `llmfleet lab up`, then site.yml end to end.

Ordered on purpose: converge, converge again, check mode, then teardown.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from llmfleet.bench import provisioning
from llmfleet.paths import cache_dir
from tests.lab.helpers import (
    LAB_TIMINGS,
    PLAYBOOK_LOGS,
    SITE_IN_ONE_BATCH,
    TEST_LAB_NAME,
    PlaybookRun,
    copy_lab_inventory,
    llmfleet_lab,
    mint_token,
    on_host,
    run_playbook,
    wait_for,
)

LAB_HOSTS = {"gw1", "redis1", "mon1", "gpu1", "gpu2", "gpu3"}
ALERTMANAGER = "http://10.78.0.30:9093"  # mon1's Alertmanager in the test lab (inventories/lab, moved to 10.78.0.0/24)
# The serving hosts and their addresses in the test lab (inventories/lab, moved to 10.78.0.0/24).
ENGINE_HOSTS = {"gpu1": "10.78.0.41", "gpu2": "10.78.0.42"}
# Each engine as (host, engine name, port): gpu1 runs two, one per "GPU group"
# (inventories/lab/host_vars/gpu1.yml), gpu2 one.
ENGINES = [("gpu1", "tiny", 8000), ("gpu1", "tiny-b", 8001), ("gpu2", "tiny", 8000)]
LAB_DUMMY_TOKEN = "hf_llmfleet_lab_dummy_token_not_a_secret"  # inventories/lab/group_vars/all/lab_secrets.yml
# The engines' API key (inventories/lab/group_vars/all/lab_secrets.yml): LAB-ONLY, not a secret.
LAB_ENGINE_KEY = "lab-only-not-a-secret-engine-key-7d3e52"
ENGINE_AUTH = {"Authorization": f"Bearer {LAB_ENGINE_KEY}"}
# The gateway host: the workers and the gateway run in its Docker engine.
GATEWAY_HOST, GATEWAY_ADDRESS = "gw1", "10.78.0.10"
SERVICE_CONTAINERS = ["llmfleet-gateway-1", "llmfleet-worker-1", "llmfleet-worker-2"]
# LAB-ONLY values (inventories/lab/group_vars/all/lab_secrets.yml), which must
# still never show in `docker inspect` or the services' logs.
LAB_SERVICE_SECRETS = [
    "lab-only-not-a-secret-jwt-key-0c71a9e4d2b85f36",
    "lab-only-not-a-secret-gateway-5e02",
    "lab-only-not-a-secret-worker-91b7",
    LAB_ENGINE_KEY,
]


def _engine_identity() -> dict[tuple[str, str], str]:
    """Each engine container's id and start time: a recreated or restarted container changes both."""
    return {(host, name): on_host(host, "docker", "inspect", "--format", "{{.Id}} {{.State.StartedAt}}",
                                   f"llmfleet-vllm-{name}").strip() for host, name, _ in ENGINES}


def _service_identity() -> dict[str, str]:
    """The gateway's and workers' ids and start times."""
    return {name: on_host(GATEWAY_HOST, "docker", "inspect", "--format", "{{.Id}} {{.State.StartedAt}}",
                           name).strip() for name in SERVICE_CONTAINERS}


def _post(address: str, port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"http://{address}:{port}{path}", json=body, headers=ENGINE_AUTH, timeout=60)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def test_lab_status_shows_every_host_running(lab_inventory: Path) -> None:
    status = llmfleet_lab(lab_inventory, "status")
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line.split() for line in status.stdout.splitlines()[2:]}
    assert set(rows) == LAB_HOSTS
    for host, row in rows.items():
        assert row[1] == f"{TEST_LAB_NAME}-{host}"
        assert row[2].startswith("10.78.0.")
        assert row[3:5] == ["running", "running"], row


def test_site_converges_with_no_failure(converged_site: PlaybookRun) -> None:
    run = converged_site
    assert run.returncode == 0, run.output[-5000:]
    assert set(run.recap) == LAB_HOSTS | {"localhost"}
    for host, counts in run.recap.items():
        assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)


def _assert_engines_serve() -> None:
    for host, name, port in ENGINES:
        address = ENGINE_HOSTS[host]
        answer = _post(address, port, "/v1/chat/completions",
                       {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
        assert answer["usage"]["completion_tokens"] > 0, (host, name, answer)
        metrics = httpx.get(f"http://{address}:{port}/metrics", timeout=30)
        assert "vllm:num_requests_waiting" in metrics.text, (host, name)


def test_engines_deployed_by_the_role_serve_completions(lab_inventory: Path) -> None:
    _assert_engines_serve()


def test_engine_token_and_api_key_are_secret_files_only(lab_inventory: Path) -> None:
    for host, name, _ in ENGINES:
        inspect = on_host(host, "docker", "inspect", f"llmfleet-vllm-{name}")
        logs = on_host(host, "docker", "logs", f"llmfleet-vllm-{name}")
        processes = on_host(host, "ps", "auxww")
        for secret_file, value in (("hf_token", LAB_DUMMY_TOKEN), ("engine_api_key", LAB_ENGINE_KEY)):
            path = f"/etc/llmfleet/vllm/{name}/{secret_file}"
            assert on_host(host, "stat", "-c", "%a %u", path).split() == ["400", "2000"], path
            assert f"/run/secrets/{secret_file}" in inspect
            assert value not in inspect and value not in logs and value not in processes, (host, name, secret_file)


def test_no_secret_reaches_a_hosts_journal_or_process_list(lab_inventory: Path) -> None:
    # Ansible logs in as an unprivileged user and becomes root with sudo, which logs each command it runs to the
    # journal (auth.log on a host with syslog): a secret given to a task as an environment variable would be there.
    secrets = yaml.safe_load((lab_inventory / "group_vars" / "all" / "lab_secrets.yml").read_text())
    values = {name: value for name, value in secrets.items() if isinstance(value, str) and value}
    assert len(values) >= 7, values.keys()  # the lab's stand-ins for every vault value it uses
    for host in sorted(LAB_HOSTS):
        seen = on_host(host, "journalctl", "--no-pager", "-q") + on_host(host, "ps", "auxww")
        assert "sudo" in seen, f"{host}: no sudo session in the journal; did Ansible log in as root?"
        leaked = sorted(name for name, value in values.items() if value in seen)
        assert leaked == [], f"{host}: {leaked} in its journal or process list"


def test_an_engine_refuses_v1_without_its_api_key(lab_inventory: Path) -> None:
    # vLLM guards /v1 only: /health and /metrics stay open for Docker's healthcheck and Prometheus.
    for host, _, port in ENGINES:
        url = f"http://{ENGINE_HOSTS[host]}:{port}"
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        wrong = {"Authorization": "Bearer not-the-engine-key"}
        assert httpx.get(f"{url}/v1/models", headers=wrong, timeout=10).status_code == 401
        assert httpx.get(f"{url}/v1/models", headers=ENGINE_AUTH, timeout=10).status_code == 200
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_the_nvswitch_host_runs_fabric_manager_at_the_driver_version_and_every_gpu_persists() -> None:
    # Issue 29, with STAND-INS: gpu1 carries the stand-in PCI listing of an HGX board (files/standins/pci-devices.yml,
    # four NVSwitches), whose stand-in Fabric Manager starts only at the driver's exact version; gpu2 and gpu3 have
    # no switch fabric and must get no Fabric Manager.
    assert on_host("gpu1", "systemctl", "is-active", "nvidia-fabricmanager").strip() == "active"
    held = on_host("gpu1", "dpkg-query", "-W", "-f=${Version} ${Status}", "nvidia-fabricmanager-535").strip()
    assert held == "535.261.03-1 hold ok installed", held
    report = on_host("gpu1", "cat", "/var/lib/llmfleet/preflight.txt")
    assert "4 NVSwitch(es)" in report and re.search(r"PASS\]?\s+nvswitch", report), report
    for host in ("gpu2", "gpu3"):
        packages = on_host(host, "dpkg-query", "-W", "-f=${Package} ${Status}\n")
        assert "nvidia-fabricmanager" not in packages, host
        assert "none on the PCI bus" in on_host(host, "cat", "/var/lib/llmfleet/preflight.txt"), host
    for host in ("gpu1", "gpu2", "gpu3"):
        output = on_host(host, "nvidia-smi", "--query-gpu=index,persistence_mode", "--format=csv,noheader")
        # One "INDEX, MODE" row a GPU; the stand-in also labels itself as one, on stderr, which on_host keeps.
        modes = [line.strip() for line in output.splitlines() if re.match(r"\d+, ", line.strip())]
        assert modes and all(mode.endswith(", Enabled") for mode in modes), (host, output)


def _connect_from(host: str, address: str, port: int) -> str:
    """A TCP connection from inside a lab host to address:port: "answered", "refused" (a reset) or the error's name."""
    script = (
        "import socket, sys\n"
        "connection = socket.socket()\n"
        "connection.settimeout(5)\n"
        "try:\n"
        "    connection.connect((sys.argv[1], int(sys.argv[2])))\n"
        "    print('answered')\n"
        "except ConnectionRefusedError:\n"
        "    print('refused')\n"
        "except OSError as error:\n"
        "    print(type(error).__name__)\n"
    )
    return on_host(host, "python3", "-c", script, address, str(port)).strip()


def test_the_firewall_opens_each_port_to_the_hosts_that_need_it_only() -> None:
    # Issue 29: roles/firewall on every host. Each port answers from one host and is refused from another, so the
    # refusal is the firewall's and not a closed port. The engine and the exporters are Docker-published on gpu1
    # (the engine) or host services (node exporter, Redis); the build machine, which every other lab test talks
    # from, is the lab's trusted source (firewall_trusted_sources).
    engine = ENGINE_HOSTS["gpu1"]
    checks = [
        # (from, to, port, expected): an engine answers the gateway and monitoring hosts only.
        ("gw1", engine, 8000, "answered"),
        ("mon1", engine, 8000, "answered"),
        ("redis1", engine, 8000, "refused"),
        ("gpu2", engine, 8001, "refused"),
        # The node exporter answers Prometheus's host only.
        ("mon1", engine, 9100, "answered"),
        ("gw1", engine, 9100, "refused"),
        # Redis answers the gateway host, not a GPU host.
        ("gw1", "10.78.0.20", 6379, "answered"),
        ("gpu2", "10.78.0.20", 6379, "refused"),
    ]
    seen = [(source, address, port, _connect_from(source, address, port)) for source, address, port, _ in checks]
    assert seen == checks
    assert httpx.get(f"http://{engine}:8000/health", timeout=10).status_code == 200
    table = on_host("gpu1", "nft", "list", "table", "inet", "llmfleet_firewall")
    assert 'comment "vLLM engines"' in table and 'comment "metrics"' in table, table


def test_cpu_engines_run_the_model_in_the_engine_core(lab_inventory: Path) -> None:
    # The inventory asks for the `uni` executor; the role adds VLLM_ENABLE_V1_MULTIPROCESSING=0, without which
    # vLLM-CPU runs the model in a VLLM::Worker process that busy-waits between steps.
    for host, name, _ in ENGINES:
        inspect = on_host(host, "docker", "inspect", "--format", "{{json .Config.Env}}", f"llmfleet-vllm-{name}")
        env = json.loads(inspect)
        assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in env, (host, name)
    for host in ENGINE_HOSTS:
        titles = on_host(host, "ps", "-eo", "args=").splitlines()
        engine_cores = sum(title.startswith("VLLM::EngineCore") for title in titles)
        assert engine_cores == sum(engine_host == host for engine_host, _, _ in ENGINES), titles
        assert not [title for title in titles if title.startswith("VLLM::Worker")], titles


def test_chat_completion_through_the_gateway(lab_inventory: Path, tmp_path: Path) -> None:
    url = f"http://{GATEWAY_ADDRESS}:8080"
    assert httpx.get(f"http://{GATEWAY_ADDRESS}:9300/readyz", timeout=10).json()["ready"] is True
    # The ops routes are on the ops listener only (gateway_ops_port), not on the API port.
    assert httpx.get(f"{url}/metrics", timeout=10).status_code == 404
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 404
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    refused = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=60)
    assert refused.status_code == 401
    token = mint_token(tmp_path)
    response = httpx.post(f"{url}/v1/chat/completions", json=request,
                          headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] > 0, answer


def test_the_responses_and_messages_apis_through_the_gateway_with_the_official_sdks(tmp_path: Path) -> None:
    # Issue 31: the two newer APIs through the deployed gateway, queue and workers to the lab's engines, as the
    # official clients call them (the integration stage covers their fields and errors in depth).
    token = mint_token(tmp_path)
    url = f"http://{GATEWAY_ADDRESS}:8080"
    openai_client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=60)
    response = openai_client.responses.create(model="tiny", input="hello", max_output_tokens=8)
    # The tiny model seldom stops by itself: 8 tokens may end it as "incomplete" (max_output_tokens), as the
    # integration tests allow.
    assert response.usage and response.usage.output_tokens > 0, response
    assert response.status == "completed" or (
        response.status == "incomplete" and response.incomplete_details
        and response.incomplete_details.reason == "max_output_tokens"), response
    events = [event.type for event in openai_client.responses.create(
        model="tiny", input="hello", max_output_tokens=8, stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed", events
    assert "response.output_text.delta" in events, events

    anthropic_client = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=60)
    message = anthropic_client.messages.create(
        model="tiny", max_tokens=8, system="Answer briefly.", messages=[{"role": "user", "content": "hello"}])
    assert message.type == "message" and message.usage.output_tokens > 0, message
    counted = anthropic_client.messages.count_tokens(
        model="tiny", system="Answer briefly.", messages=[{"role": "user", "content": "hello"}])
    assert counted.input_tokens == message.usage.input_tokens
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="not-a-token", max_retries=0).messages.create(
            model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hello"}])


def test_service_secrets_never_show_in_inspect_or_logs(lab_inventory: Path) -> None:
    for container in SERVICE_CONTAINERS:
        inspect = on_host(GATEWAY_HOST, "docker", "inspect", container)
        logs = on_host(GATEWAY_HOST, "docker", "logs", container)
        assert "/run/secrets/redis_password" in inspect
        for secret in LAB_SERVICE_SECRETS:
            assert secret not in inspect, container
            assert secret not in logs, container
    assert on_host(GATEWAY_HOST, "stat", "-c", "%a %u", "/etc/llmfleet/gateway/jwt_secret").split() == ["400", "2100"]


def test_second_run_changes_nothing(lab_inventory: Path, facts_dir: Path, converged_site: PlaybookRun,
                                    tmp_path: Path) -> None:
    engines = _engine_identity()
    services = _service_identity()
    # Check mode runs beside the second run (test_check_mode_on_a_converged_site_is_clean judges it): both only
    # read a converged site, and side by side they take about the time of the longer one. Check mode reads its own
    # copy of the fact cache, which the second run rewrites as it gathers.
    check_facts = tmp_path / "check-facts"
    shutil.copytree(facts_dir, check_facts)
    check = threading.Thread(target=_run_check_mode, args=(lab_inventory, check_facts))
    check.start()
    try:
        run = run_playbook(lab_inventory, "site.yml", *SITE_IN_ONE_BATCH, facts=facts_dir)
    finally:
        check.join()
    assert run.returncode == 0, run.output[-5000:]
    changed = {host: counts["changed"] for host, counts in run.recap.items() if counts["changed"]}
    assert changed == {}, f"not idempotent: {changed}\n{run.output[-5000:]}"
    assert _engine_identity() == engines, "the second run recreated or restarted an engine"
    assert _service_identity() == services, "the second run recreated or restarted a gateway or worker"
    # Issue 13's provisioning figures, measured here and reported, never asserted.
    figures = "".join(f"{step}: {seconds:.0f} s\n\n" for step, seconds in LAB_TIMINGS.items())
    figures += provisioning.report(provisioning.parse(converged_site.output), provisioning.parse(run.output))
    (PLAYBOOK_LOGS.parent / "lab-provisioning.md").write_text(figures)
    print(figures)


def _lab_secrets(inventory: Path) -> set[str]:
    """Every LAB-ONLY secret value the lab inventory sets (vault stand-ins and the engines' dummy token)."""
    texts = [path.read_text() for path in inventory.rglob("*.yml")]
    found = {match for text in texts for match in re.findall(r"lab-only-not-a-secret[\w-]*", text)}
    return found | {LAB_DUMMY_TOKEN}


# One host of each kind: gpu2 runs gpu1's roles with the same variables, and the standby gpu3 a subset of them,
# so leaving both out keeps every task of the site in the run at about two thirds of its time. localhost runs the
# inventory check. The other hosts' variables come from the inventory and the fact cache, as on a whole run.
CHECK_MODE_HOSTS = {"localhost", "gw1", "redis1", "mon1", "gpu1"}


# The check-mode run, made beside the second run (test_second_run_changes_nothing).
CHECK_MODE_RUNS: list[PlaybookRun] = []


def _run_check_mode(inventory: Path, facts: Path) -> None:
    # At -vvv Ansible prints every task's arguments and results: a task that handles a
    # secret without no_log would show it here (failure mode 10's last row).
    CHECK_MODE_RUNS.append(run_playbook(inventory, "site.yml", *SITE_IN_ONE_BATCH, "--check", "-vvv",
                                        "--limit", ",".join(sorted(CHECK_MODE_HOSTS)), facts=facts,
                                        log_as="test_check_mode_on_a_converged_site_is_clean"))


def test_check_mode_on_a_converged_site_is_clean(lab_inventory: Path, facts_dir: Path) -> None:
    if not CHECK_MODE_RUNS:  # this test run alone (-k): check mode has not run beside the second run
        _run_check_mode(lab_inventory, facts_dir)
    run = CHECK_MODE_RUNS[-1]
    assert run.returncode == 0, run.output[-5000:]
    assert set(run.recap) == CHECK_MODE_HOSTS, run.recap
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in run.recap.values()), run.recap
    secrets = _lab_secrets(lab_inventory)
    assert len(secrets) >= 6, secrets  # the five service secrets and the engines' token, at least
    assert sorted(secret for secret in secrets if secret in run.output) == []


def _engine_failures_met_by_workers() -> float:
    """Requests the workers had to retry because an engine failed them (connection, timeout, 5xx)."""
    total = 0.0
    for index in range(len(SERVICE_CONTAINERS) - 1):  # each worker's metrics port: worker_metrics_port + N - 1
        text = httpx.get(f"http://{GATEWAY_ADDRESS}:{9400 + index}/metrics", timeout=10).text
        for reason in ("connect", "timeout", "engine_5xx"):
            match = re.search(rf'^llmfleet_worker_errors_total{{reason="{reason}"}} (\S+)$', text, re.MULTILINE)
            total += float(match.group(1)) if match else 0.0
    return total


@contextmanager
def _gateway_traffic(tmp_path: Path) -> Iterator[Counter[int | str]]:
    """Two clients sending chat completions through the gateway back to back while the block runs; their outcomes."""
    url = f"http://{GATEWAY_ADDRESS}:8080/v1/chat/completions"
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 32}
    # The lab's `bench` tier: two clients back to back can exceed the default tier's 600 requests a minute,
    # and a restart can outlast a 10-minute token.
    headers = {"Authorization": f"Bearer {mint_token(tmp_path, '--tier', 'bench', '--ttl', '1h')}"}
    outcomes: Counter[int | str] = Counter()
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                try:
                    status: int | str = http.post(url, json=request, headers=headers).status_code
                except httpx.HTTPError as error:
                    status = type(error).__name__
                outcomes[status] += 1
                if status != 200:
                    stop.wait(0.2)  # counted; not retried in a tight loop that would starve the restart

    # Two clients keep a request running at every moment; more would only slow
    # the restarted engines' start on the machine they share.
    clients = [threading.Thread(target=client) for _ in range(2)]
    for thread in clients:
        thread.start()
    try:
        yield outcomes
    finally:
        stop.set()
        for thread in clients:
            thread.join(180)


def _critical_alerts() -> dict[str, dict[str, Any]]:
    """Every critical alert Alertmanager holds now, firing or silenced, by alert name and instance (or host)."""
    found = {}
    for alert in httpx.get(f"{ALERTMANAGER}/api/v2/alerts", timeout=10).json():
        labels = alert["labels"]
        if labels.get("severity") == "critical":
            where = labels.get("instance") or labels.get("host") or ""
            found[f"{labels['alertname']} {where}"] = {"state": alert["status"]["state"],
                                                       "silencedBy": alert["status"]["silencedBy"]}
    return found


@contextmanager
def _critical_alerts_seen() -> Iterator[dict[str, dict[str, Any]]]:
    """Critical alerts that appear while the block runs (read every 2 s) or are there right after it; those
    already there before it are left out."""
    before = set(_critical_alerts())
    seen: dict[str, dict[str, Any]] = {}
    stop = threading.Event()

    def read() -> None:
        try:
            now = _critical_alerts()
        except httpx.HTTPError:
            return  # a missed read; the next one, and the one after the block, still count
        seen.update({key: value for key, value in now.items() if key not in before})

    def poll() -> None:
        while not stop.wait(2):
            read()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
        read()


def _alertmanager_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _assert_each_engine_host_was_silenced_then_lifted(started: datetime, ended: datetime) -> None:
    """engines.yml silenced each GPU host it restarted (tasks/maintenance_silence.yml: one silence on `instance`,
    one on `host`), with matchers that cover that host's targets and no other host's, and lifted the silences
    itself when the host served again, not at their bound (llmfleet_maintenance_silence_max_s)."""
    slack = timedelta(seconds=5)  # the lab's containers share the build machine's clock
    silences = [s for s in httpx.get(f"{ALERTMANAGER}/api/v2/silences", timeout=10).json()
                if s["createdBy"] == "llmfleet engines.yml" and _alertmanager_time(s["startsAt"]) >= started - slack]
    for host, address in ENGINE_HOSTS.items():
        mine = [s for s in silences if f"planned maintenance of {host} (" in s["comment"]]
        by_label = {matcher["name"]: matcher for s in mine for matcher in s["matchers"]}
        assert len(mine) == 2 and set(by_label) == {"instance", "host"}, f"{host}'s silences: {mine}"
        assert all(s["status"]["state"] == "expired" for s in mine), f"{host}'s silence was not lifted: {mine}"
        assert all(_alertmanager_time(s["endsAt"]) <= ended + slack for s in mine), f"lifted only at its end: {mine}"
        instance, cut = by_label["instance"]["value"], by_label["host"]["value"]
        targets = [f"{address}:{port}" for engine_host, _, port in ENGINES if engine_host == host] + [f"{address}:9100"]
        assert all(re.fullmatch(instance, target) for target in targets), (instance, targets)
        assert re.fullmatch(cut, address), (cut, address)
        others = [other for name, other in ENGINE_HOSTS.items() if name != host] + [GATEWAY_ADDRESS]
        assert not any(re.fullmatch(instance, f"{other}:8000") or re.fullmatch(cut, other) for other in others), (
            f"{host}'s silence covers another host: {instance}, {cut}")


def test_rolling_restart_under_traffic_cuts_no_request(lab_inventory: Path, facts_dir: Path, tmp_path: Path) -> None:
    engines = _engine_identity()
    failures_before = _engine_failures_met_by_workers()
    started = datetime.now(UTC)
    with _gateway_traffic(tmp_path) as outcomes, _critical_alerts_seen() as critical:
        run = run_playbook(lab_inventory, "engines.yml", "-e", "vllm_restart=true", facts=facts_dir)
    ended = datetime.now(UTC)
    assert run.returncode == 0, run.output[-5000:]
    restarted = _engine_identity()
    assert all(restarted[engine] != engines[engine] for engine in engines), "an engine was not restarted"
    # Each host's engines were drained before its restart, and the play went on only once they served again.
    unwrapped = " ".join(run.output.split())  # the YAML callback folds long lines
    drained = re.findall(r"(\d+) workers know it, \1 drained it, 0 requests running", unwrapped)
    assert len(drained) == len(ENGINES) and "0" not in drained, run.output[-5000:]
    assert outcomes and set(outcomes) == {200}, f"requests failed during the rolling restart: {dict(outcomes)}"
    assert _engine_failures_met_by_workers() == failures_before, "a request reached an engine that was stopping"
    # Issue 34: planned work pages nobody. Each host was silenced for its restart and the silence lifted after it;
    # and no critical alert came at all, silenced or not (a drained engine is not down; the silence is the second
    # line of defence).
    _assert_each_engine_host_was_silenced_then_lifted(started, ended)
    assert critical == {}, f"critical alerts during the rolling restart (state, silenced by): {critical}"


def test_a_drain_goes_through_any_running_worker_and_stops_the_play_when_none_runs(
    lab_inventory: Path, facts_dir: Path
) -> None:
    # Issue 29 item 6: the drain asked gw1's llmfleet-worker-1 only and was skipped when it was down, so a host
    # could change under load. Now any running worker drains (the set is in Redis), and workers that exist but
    # none running stop the play before the host changes. engines.yml on gpu2 alone, converged: drain, no change,
    # undrain.
    workers = SERVICE_CONTAINERS[1:]
    engines = _engine_identity()
    try:
        on_host(GATEWAY_HOST, "docker", "stop", workers[0])
        one_down = run_playbook(lab_inventory, "engines.yml", "--limit", "gpu2", facts=facts_dir,
                                log_as="drain_through_the_second_worker")
        assert one_down.returncode == 0, one_down.output[-5000:]
        unwrapped = " ".join(one_down.output.split())
        assert f"gw1/{workers[1]} asked:" in unwrapped, one_down.output[-5000:]
        # The worker that runs knows the engine and drained it: the drain was confirmed, not skipped.
        assert re.search(r"1 workers know it, 1 drained it, 0 requests running", unwrapped), one_down.output[-5000:]

        on_host(GATEWAY_HOST, "docker", "stop", workers[1])
        none_up = run_playbook(lab_inventory, "engines.yml", "--limit", "gpu2", facts=facts_dir,
                               log_as="drain_with_no_worker_running")
        assert none_up.returncode != 0, none_up.output[-5000:]
        refusal = " ".join(none_up.output.split())
        assert f"No worker runs to drain gpu2's engines: gw1/{workers[0]}, gw1/{workers[1]} exist" in refusal, (
            none_up.output[-5000:])
        assert "engines_drain_required=false" in refusal
        assert none_up.recap["gpu2"]["failed"] == 1, none_up.recap
        assert _engine_identity() == engines, "an engine changed although the drain could not be confirmed"
    finally:
        on_host(GATEWAY_HOST, "docker", "start", *workers)
        for index in range(len(workers)):
            wait_for(partial(_worker_ready, index), f"worker {index + 1} ready again", timeout_s=120)


def _worker_ready(index: int) -> bool:
    """Whether worker index + 1 answers /readyz on its metrics port (worker_metrics_port + N - 1)."""
    try:
        return httpx.get(f"http://{GATEWAY_ADDRESS}:{9400 + index}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _engine_up_per_worker(address: str, port: int) -> list[float]:
    """Each worker's llmfleet_engine_up for the engine at address:port (1 admitted, 0 ejected or unhealthy)."""
    values = []
    for index in range(len(SERVICE_CONTAINERS) - 1):  # each worker's metrics port: worker_metrics_port + N - 1
        text = httpx.get(f"http://{GATEWAY_ADDRESS}:{9400 + index}/metrics", timeout=10).text
        pattern = rf'^llmfleet_engine_up{{engine="{re.escape(f"http://{address}:{port}")}"}} (\S+)$'
        match = re.search(pattern, text, re.MULTILINE)
        assert match, f"worker {index + 1} has no llmfleet_engine_up for {address}:{port}"
        values.append(float(match.group(1)))
    return values


def _serves_its_model(address: str, port: int) -> bool:
    try:
        response = httpx.get(f"http://{address}:{port}/v1/models", headers=ENGINE_AUTH, timeout=5)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and "tiny" in response.text


def test_a_crashed_engine_is_restarted_by_docker_while_the_workers_carry_its_requests(tmp_path: Path) -> None:
    # Failure mode 14, Docker's part. The crash is real: SIGKILL to the engine core, found as the runbook says.
    # The lab's CPU engines keep the core in the server's process, so the container ends at once, as it does on a
    # GPU host seconds later when the server exits after its core (tests/integration/lab/test_engine_death.py);
    # the role's restart policy must bring it back, and the workers must answer every request meanwhile.
    host, name, port = "gpu2", "tiny", 8000
    address, container = ENGINE_HOSTS[host], f"llmfleet-vllm-{name}"

    def restarts() -> int:
        return int(on_host(host, "docker", "inspect", "--format", "{{.RestartCount}}", container))

    restarts_before = restarts()
    cores = [line.split()[0] for line in on_host(host, "docker", "top", container, "-eo", "pid,args").splitlines()
             if "VLLM::EngineCore" in line]
    assert len(cores) == 1, cores
    worker_saw_it_down = False

    def back_and_admitted() -> bool:
        nonlocal worker_saw_it_down
        up = _engine_up_per_worker(address, port)
        worker_saw_it_down |= 0.0 in up
        return restarts() > restarts_before and _serves_its_model(address, port) and set(up) == {1.0}

    with _gateway_traffic(tmp_path) as outcomes:
        wait_for(lambda: outcomes[200] > 0, "the clients' first answer")
        on_host(host, "kill", "-9", cores[0])
        wait_for(back_and_admitted, f"{host}'s {name} engine restarted, serving and admitted again", timeout_s=360)
        answered_before = outcomes[200]
        wait_for(lambda: outcomes[200] > answered_before, "an answer after the engine came back")
    assert restarts() == restarts_before + 1, "the engine crashed again after its restart"
    assert worker_saw_it_down, "no worker ejected the dead engine"
    assert set(outcomes) == {200}, f"requests failed while the engine was down: {dict(outcomes)}"


def test_unservable_model_fails_before_any_change_and_engines_keep_serving(
    lab_inventory: Path, facts_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "tiny-without-rope-theta"
    shutil.copytree(cache_dir() / "models" / "tiny", broken)
    config = json.loads((broken / "config.json").read_text())
    del config["rope_theta"]  # failure mode #3: a Qwen2 export that lost it
    (broken / "config.json").write_text(json.dumps(config))
    engines = _engine_identity()
    served = {host: on_host(host, "readlink", "/srv/llmfleet/models/tiny/current") for host in ENGINE_HOSTS}
    models = json.dumps({"model_staging_models": [{"name": "tiny", "src": str(broken)}]})
    run = run_playbook(lab_inventory, "engines.yml", "-e", models, facts=facts_dir)
    assert run.returncode != 0
    assert "rope_theta is missing" in run.output
    assert {host: on_host(host, "readlink", "/srv/llmfleet/models/tiny/current") for host in ENGINE_HOSTS} == served
    assert _engine_identity() == engines
    _assert_engines_serve()


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
