"""The metric catalogs in files/engine_metrics/ are what the code exports, in one shape.

llmfleet.json must equal what the gateway's, workers' and scaler's registries export
(`llmfleet engine metrics --regenerate --llmfleet` rewrites it); the engine lists
must each name a release, say where they came from, and give every metric a type.
The lab engine's list is checked against a running engine in
tests/integration/test_engine_metrics.py.
"""

from __future__ import annotations

import json

import pytest

from llmfleet.ops import metrics_catalog

ENGINE_FILES = sorted(metrics_catalog.METRICS_DIR.glob("vllm-*.json"))
TYPES = {"counter", "gauge", "histogram", "summary", "info", "unknown"}


def test_the_llmfleet_list_is_what_the_services_export() -> None:
    kept = metrics_catalog.load(metrics_catalog.LLMFLEET_FILE)
    generated = metrics_catalog.llmfleet_document()
    assert json.dumps(kept, indent=1) == json.dumps(generated, indent=1), (
        "files/engine_metrics/llmfleet.json differs from the services' registries:"
        " run `llmfleet engine metrics --regenerate --llmfleet` and review the diff"
    )


def test_the_llmfleet_list_holds_what_the_alert_rules_read() -> None:
    names = metrics_catalog.names([metrics_catalog.load(metrics_catalog.LLMFLEET_FILE)])
    assert {"llmfleet_queue_depth", "llmfleet_queue_wait_seconds", "llmfleet_engine_up"} <= names
    assert "llmfleet_dead_letters_total" in names  # a counter, named as queries name it


@pytest.mark.parametrize("path", ENGINE_FILES, ids=[path.name for path in ENGINE_FILES])
def test_an_engine_list_names_its_release_and_its_source(path) -> None:
    document = metrics_catalog.load(path)
    assert path.name == f"vllm-{document['vllm_version']}.json"
    assert document["provenance"]["from"] and document["provenance"]["regenerate"]
    for metric in document["metrics"]:
        assert metric["name"].startswith("vllm:") and metric["type"] in TYPES, metric
        assert isinstance(metric["labels"], list), metric
        if metric["type"] == "counter":
            assert metric["name"].endswith("_total"), metric


@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [
        ("0.4.2", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
        ("0.9.2", "vllm:kv_cache_usage_perc", None),  # its V1 engine exports both names
        ("0.32.0", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ],
)
def test_kv_cache_use_is_a_fraction_under_the_releases_name(version: str, present: str, absent: str | None) -> None:
    metrics = {m["name"]: m for m in metrics_catalog.load(metrics_catalog.engine_path(version))["metrics"]}
    assert metrics[present]["unit"].startswith("fraction 0-1")
    if absent is not None:
        assert absent not in metrics


def test_families_reads_names_types_and_labels_from_an_exposition() -> None:
    text = (
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="tiny"} 0.0\n'
        "# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.\n"
        "# TYPE vllm:num_preemptions_created gauge\n"
        'vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7e9\n'
        "# HELP vllm:e2e_request_latency_seconds e2e latency\n"
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 0.0\n'
        'vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 0.0\n'
        "# HELP process_open_fds Number of open file descriptors.\n"
        "# TYPE process_open_fds gauge\n"
        "process_open_fds 12.0\n"
    )
    found = metrics_catalog.families(text, "vllm:")
    assert [(m["name"], m["type"], m["labels"]) for m in found] == [
        ("vllm:e2e_request_latency_seconds", "histogram", ["engine", "model_name"]),
        ("vllm:num_preemptions_total", "counter", ["engine", "model_name"]),
    ]
    assert found[0]["unit"] == "seconds"
