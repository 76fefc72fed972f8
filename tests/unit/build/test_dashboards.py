"""The fleet dashboard names only metrics the stack exports, and the shipped files are what the generator writes.

What the stack exports is read from the metric catalogs (files/engine_metrics/):
each vLLM release's list, llmfleet's own services' list and the exporters'.
Prometheus's own `up` is the one name outside them, besides the series the
prometheus role's recording rules record (roles/prometheus/vars/records.yml);
tests/unit/roles/test_alert_rules.py checks those per release against the rules
the role renders.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from llmfleet.build import dashboards
from llmfleet.build.dashboards import Release, metric_names
from llmfleet.paths import REPO_ROOT

RELEASES = dashboards.releases()
PROMETHEUS_OWN = {"up"}
RECORDS = REPO_ROOT / "roles" / "prometheus" / "vars" / "records.yml"


def _catalog_names(name: str) -> set[str]:
    catalog: dict[str, Any] = json.loads((dashboards.CATALOG_DIR / name).read_text())
    if "exporters" in catalog:
        return {metric["name"] for exporter in catalog["exporters"].values() for metric in exporter["metrics"]}
    return {metric["name"] for metric in catalog["metrics"]}


def _recorded() -> set[str]:
    return {rule["record"] for rule in yaml.safe_load(RECORDS.read_text())["__prometheus_recording_rules"]}


def _exported(release: Release) -> set[str]:
    return (set(release.metrics) | _catalog_names("llmfleet.json") | _catalog_names("exporters.json")
            | PROMETHEUS_OWN | _recorded())


def test_there_are_releases_to_build_for() -> None:
    assert {release.version for release in RELEASES} >= {"0.4.2", "0.9.2", "0.32.0"}


@pytest.mark.parametrize("release", RELEASES, ids=[release.version for release in RELEASES])
def test_every_query_names_only_exported_metrics(release: Release) -> None:
    exported = _exported(release)
    model = dashboards.dashboard(release)
    unknown = {expr: sorted(metric_names(expr) - exported) for expr in dashboards.queries(model)
               if metric_names(expr) - exported}
    assert not unknown, f"vLLM {release.version}: queries name metrics the stack does not export: {unknown}"


@pytest.mark.parametrize("release", RELEASES, ids=[release.version for release in RELEASES])
def test_the_shipped_file_is_what_the_generator_writes(release: Release) -> None:
    path = dashboards.dashboard_path(release.version)
    assert path.is_file(), f"{path} is missing: run python -m llmfleet.build.dashboards"
    assert path.read_text() == dashboards.render(release), f"{path} differs: run python -m llmfleet.build.dashboards"


@pytest.mark.parametrize(("version", "kv_cache"), [("0.4.2", "vllm:gpu_cache_usage_perc"),
                                                   ("0.9.2", "vllm:gpu_cache_usage_perc"),
                                                   ("0.32.0", "vllm:kv_cache_usage_perc")])
def test_kv_cache_use_is_read_through_the_releases_own_name(version: str, kv_cache: str) -> None:
    release = next(release for release in RELEASES if release.version == version)
    assert release.kv_cache == kv_cache
    assert any(kv_cache in expr for expr in dashboards.queries(dashboards.dashboard(release)))


def test_the_dashboard_shows_what_operators_need() -> None:
    model = dashboards.dashboard(RELEASES[-1])
    text = " ".join(dashboards.queries(model))
    for needed in ("llmfleet_gateway_requests_total", "llmfleet_request_seconds_bucket",
                   "vllm:time_to_first_token_seconds_bucket", "llmfleet_queue_depth", "llmfleet_queue_wait_seconds",
                   "vllm:generation_tokens_total", 'up{job="vllm"}', 'up{job="worker"}', "DCGM_FI_DEV_GPU_UTIL",
                   "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "llmfleet_worker_errors_total"):
        assert needed in text, needed
    for quantile in dashboards.QUANTILES:
        assert f"histogram_quantile({quantile}, " in text


def test_panels_do_not_overlap_and_use_the_provisioned_datasource() -> None:
    model = dashboards.dashboard(RELEASES[-1])
    cells: set[tuple[int, int]] = set()
    for panel in model["panels"]:
        grid = panel["gridPos"]
        xs, ys = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        mine = {(x, y) for x in xs for y in ys}
        assert not cells & mine, panel["title"]
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"] == dashboards.DATASOURCE and panel["targets"], panel["title"]
    assert len({panel["id"] for panel in model["panels"]}) == len(model["panels"])


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le, model) (rate(llmfleet_request_seconds_bucket{lane="a"}[5m]))', {"llmfleet_request_seconds"}),
        ("redis_memory_used_bytes / redis_memory_max_bytes", {"redis_memory_used_bytes", "redis_memory_max_bytes"}),
        ('1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[5m]))', {"node_cpu_seconds_total"}),
        ("max by (instance) (vllm:gpu_cache_usage_perc) > 0.9 and on (instance) up",
         {"vllm:gpu_cache_usage_perc", "up"}),
        ('up{job="vllm"}', {"up"}),
    ],
)
def test_metric_names_reads_the_selectors_of_a_query(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_metric_the_release_lacks_is_caught() -> None:
    # 0.4.2 has no kv_cache_usage_perc, and 0.32.0 no gpu_cache_usage_perc: a panel naming either would be reported.
    by_version = {release.version: release for release in RELEASES}
    assert metric_names("max by (instance) (vllm:kv_cache_usage_perc)") - _exported(by_version["0.4.2"]) == {
        "vllm:kv_cache_usage_perc"}
    assert metric_names("max by (instance) (vllm:gpu_cache_usage_perc)") - _exported(by_version["0.32.0"]) == {
        "vllm:gpu_cache_usage_perc"}


@pytest.mark.parametrize(("version", "shown"), [("0.4.2", False), ("0.9.2", True), ("0.32.0", True)])
def test_the_prefix_cache_hit_ratio_is_shown_where_the_release_counts_lookups(version: str, shown: bool) -> None:
    release = next(release for release in RELEASES if release.version == version)
    model = dashboards.dashboard(release)
    panels = [panel for panel in model["panels"] if panel["title"] == "Prefix-cache hit ratio"]
    assert len(panels) == int(shown)
    if shown:
        exprs = [target["expr"] for target in panels[0]["targets"]]
        assert exprs == [dashboards.FLEET_PREFIX_CACHE_HIT_RATIO, dashboards.ENGINE_PREFIX_CACHE_HIT_RATIO]
        assert panels[0]["fieldConfig"]["defaults"] == {"unit": "percentunit", "min": 0, "max": 1}
        assert {dashboards.FLEET_PREFIX_CACHE_HIT_RATIO, dashboards.ENGINE_PREFIX_CACHE_HIT_RATIO} <= _recorded()


def test_a_series_no_rule_records_is_caught() -> None:
    release = RELEASES[-1]
    assert dashboards.is_recorded("job:vllm_prefix_cache_hit_ratio:rate")
    assert not dashboards.is_recorded("vllm:prefix_cache_hits_total")
    assert metric_names("job:vllm_prefix_cache_hit_ratio:rate5m") - _exported(release) == {
        "job:vllm_prefix_cache_hit_ratio:rate5m"}
