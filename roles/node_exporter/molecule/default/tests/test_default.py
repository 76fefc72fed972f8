"""What an operator notices on a host after the node_exporter role ran (converge.yml: port 9111, a textfile flag)."""

from __future__ import annotations

import httpx
import pytest

PORT = 9111
SERVICE = "prometheus-node-exporter"


@pytest.fixture(scope="module")
def address(host) -> str:
    """The test host's own address: the role's default listen address, reachable from here."""
    return str(host.check_output("hostname -I").split()[0])


def test_the_service_runs_and_starts_at_boot(host):
    service = host.service(SERVICE)
    assert service.is_running
    assert service.is_enabled


def test_it_listens_on_the_hosts_address_only(host, address):
    assert host.socket(f"tcp://{address}:{PORT}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{PORT}").is_listening
    assert not host.socket(f"tcp://127.0.0.1:{PORT}").is_listening


def test_prometheus_can_scrape_machine_metrics(address):
    text = httpx.get(f"http://{address}:{PORT}/metrics", timeout=10).text
    for metric in ("node_exporter_build_info", "node_cpu_seconds_total", "node_memory_MemAvailable_bytes"):
        assert f"\n{metric}" in text, metric


def test_the_extra_flags_reach_the_exporter(address):
    text = httpx.get(f"http://{address}:{PORT}/metrics", timeout=10).text
    assert "\nllmfleet_molecule_probe 42" in text


def test_it_runs_as_the_unprivileged_prometheus_user(host):
    assert host.process.get(comm="prometheus-node").user == "prometheus"
