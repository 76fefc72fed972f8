"""Unit tests for plugins/filter/serving.py: the engines and models the gateway layer reads from the inventory."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

_SPEC = importlib.util.spec_from_file_location(
    "llmfleet_filter_serving", Path(__file__).parents[4] / "plugins" / "filter" / "serving.py"
)
assert _SPEC and _SPEC.loader
serving = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(serving)

TINY = {"name": "tiny", "src": "/cache/models/tiny"}


def _gpu(address: str, *engines: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"llmfleet_address": address, "vllm_engines": list(engines), "model_staging_models": [TINY], **more}


HOSTVARS = {
    "gpu1": _gpu("10.0.0.41", {"name": "tiny", "model": "tiny", "port": 8000}),
    "gpu2": _gpu(
        "10.0.0.42",
        {"name": "tiny", "model": "tiny", "port": 8000},
        {"name": "chat", "model": "tiny", "port": "8001", "served_model_name": "tiny-chat"},
        vllm_publish_address="192.0.2.42",
    ),
    "gw1": {"llmfleet_address": "10.0.0.10"},
}


def test_engine_urls_list_every_engine_once_at_its_published_address() -> None:
    assert serving.engine_urls(["gpu1", "gpu2", "gpu1"], HOSTVARS) == [
        "http://10.0.0.41:8000",
        "http://192.0.2.42:8000",
        "http://192.0.2.42:8001",
    ]


def test_hosts_without_engines_add_nothing() -> None:
    assert serving.engine_urls(["gw1"], HOSTVARS) == []
    assert serving.served_models(["gw1"], HOSTVARS) == []


def test_served_models_name_each_served_model_once_with_its_source() -> None:
    assert serving.served_models(["gpu1", "gpu2"], HOSTVARS) == [
        {"name": "tiny", "src": "/cache/models/tiny"},
        {"name": "tiny-chat", "src": "/cache/models/tiny"},
    ]


def test_a_model_not_staged_from_the_controller_asks_for_gateway_models() -> None:
    hostvars = {"gpu1": _gpu("10.0.0.41", {"name": "big", "model": "/srv/big", "port": 8000})}
    with pytest.raises(AnsibleFilterError, match=r"set gateway_models to \[\{name: big"):
        serving.served_models(["gpu1"], hostvars)


def test_one_served_name_for_two_models_is_refused() -> None:
    hostvars = {
        "gpu1": _gpu("10.0.0.41", {"name": "a", "model": "tiny", "port": 8000}),
        "gpu2": {
            **_gpu("10.0.0.42", {"name": "a", "model": "tiny", "port": 8000}),
            "model_staging_models": [{"name": "tiny", "src": "/elsewhere/tiny"}],
        },
    }
    with pytest.raises(AnsibleFilterError, match="one served name must be one model"):
        serving.served_models(["gpu1", "gpu2"], hostvars)


@pytest.mark.parametrize(
    ("hosts", "hostvars", "message"),
    [
        ("gpu1", HOSTVARS, "expects a list of host names"),
        (["nowhere"], HOSTVARS, "not in the inventory"),
        (["gpu1"], {"gpu1": {"vllm_engines": "tiny"}}, "must be a list"),
        (["gpu1"], {"gpu1": {"vllm_engines": [{"name": "tiny"}]}}, "needs name, model and port"),
    ],
)
def test_bad_input_is_refused(hosts: Any, hostvars: dict[str, Any], message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        serving.engine_urls(hosts, hostvars)


# rotation_worker: which worker container playbooks/tasks/engine_rotation.yml drains through.

def _host(host: str, *workers: tuple[str, str]) -> dict[str, Any]:
    """One docker_host_info loop result (verbose listing): the host and its worker containers' names and states."""
    return {"item": host, "containers": [{"Names": [f"/{name}"], "State": state} for name, state in workers]}


def test_the_first_running_worker_by_host_and_number() -> None:
    results = [
        _host("gw1", ("llmfleet-worker-10", "running"), ("llmfleet-worker-2", "running")),
        _host("gw2", ("llmfleet-worker-1", "running")),
    ]
    assert serving.rotation_worker(results) == {"host": "gw1", "container": "llmfleet-worker-2", "stopped": []}


def test_a_stopped_first_worker_is_passed_over_not_a_reason_to_skip_the_drain() -> None:
    # The bug this replaced: only gw1's llmfleet-worker-1 was asked, and when it was down the drain was skipped.
    results = [
        _host("gw1", ("llmfleet-worker-1", "exited"), ("llmfleet-worker-2", "running")),
        _host("gw2", ("llmfleet-worker-1", "running")),
    ]
    chosen = serving.rotation_worker(results)
    assert (chosen["host"], chosen["container"]) == ("gw1", "llmfleet-worker-2")
    assert chosen["stopped"] == ["gw1/llmfleet-worker-1"]


def test_workers_that_exist_but_none_running_are_named() -> None:
    results = [_host("gw1", ("llmfleet-worker-1", "exited"), ("llmfleet-worker-2", "restarting")), _host("gw2")]
    assert serving.rotation_worker(results) == {
        "host": "",
        "container": "",
        "stopped": ["gw1/llmfleet-worker-1", "gw1/llmfleet-worker-2"],
    }


def test_no_worker_anywhere_is_a_first_deploy() -> None:
    assert serving.rotation_worker([_host("gw1"), {"item": "gw2", "containers": None}]) == {
        "host": "",
        "container": "",
        "stopped": [],
    }


def test_other_containers_are_not_workers() -> None:
    # docker's name filter matches substrings on some engines; the filter reads the exact names.
    results = [_host("gw1", ("llmfleet-worker-1-old", "running"), ("llmfleet-gateway-1", "running"))]
    assert serving.rotation_worker(results)["container"] == ""
