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
