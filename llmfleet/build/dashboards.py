"""The fleet dashboard as data: Grafana JSON for each vLLM release the metric catalogs list.

Panels are written here as Python data and rendered with json.dumps, one file
per release (files/dashboards/vllm-<version>/llmfleet-fleet.json), because a
release decides some metric names (KV-cache use is vllm:kv_cache_usage_perc
in current releases and vllm:gpu_cache_usage_perc in 0.4.2; 0.4.2 counts no
preemptions). The metric catalogs in files/engine_metrics/ say what each
release, llmfleet's services and the exporters export;
tests/unit/build/test_dashboards.py checks every query against them and the
files against this generator. Recorded series (level:metric:operations, such
as the prefix-cache hit ratio) come from the prometheus role's recording rules
(roles/prometheus/vars/records.yml): tests/unit/roles/test_alert_rules.py checks
that each release's dashboard reads only the series that release's rules record.

    python -m llmfleet.build.dashboards          # rewrite the files
    python -m llmfleet.build.dashboards --check  # exit 1 when a file differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.paths import REPO_ROOT

CATALOG_DIR = REPO_ROOT / "files" / "engine_metrics"
DASHBOARD_DIR = REPO_ROOT / "files" / "dashboards"
# The Prometheus datasource's uid: the grafana role provisions the datasource with it.
DATASOURCE = {"type": "prometheus", "uid": "llmfleet-prometheus"}
QUANTILES = (0.5, 0.95, 0.99)
# What the prometheus role's prefix-cache recording rules read, and the series they record.
PREFIX_CACHE_COUNTERS = frozenset({"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"})
FLEET_PREFIX_CACHE_HIT_RATIO = "job:vllm_prefix_cache_hit_ratio:rate"
ENGINE_PREFIX_CACHE_HIT_RATIO = "instance:vllm_prefix_cache_hit_ratio:rate"
_RECORDED = re.compile(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""
    kind: str = "timeseries"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Release:
    """What the dashboard needs to know of one vLLM release's metrics."""

    version: str
    metrics: frozenset[str]
    kv_cache: str
    # Whether the release counts prefix-cache lookups, so that the role records the hit ratio.
    prefix_cache: bool = False

    @classmethod
    def load(cls, path: Path) -> Release:
        catalog = json.loads(path.read_text())
        names = frozenset(metric["name"] for metric in catalog["metrics"])
        # A release whose V0 fallback lacks kv_cache_usage_perc (0.9.2) is read through the name both engines export.
        current = "vllm:kv_cache_usage_perc"
        usable = current in names and current not in catalog.get("not_in_v0_engine", [])
        # The prefix-cache counters may be V1-only (0.9.2): the recorded ratio is then absent on the V0 fallback,
        # which the panel shows as no data.
        kv_cache = current if usable else "vllm:gpu_cache_usage_perc"
        return cls(str(catalog["vllm_version"]), names, kv_cache, prefix_cache=names >= PREFIX_CACHE_COUNTERS)


def releases() -> list[Release]:
    return [Release.load(path) for path in sorted(CATALOG_DIR.glob("vllm-*.json"))]


def dashboard_path(version: str) -> Path:
    """One directory per release: the grafana role provisions every dashboard of the stack's release's directory."""
    return DASHBOARD_DIR / f"vllm-{version}" / "llmfleet-fleet.json"


def _quantiles(metric: str, by: str = "") -> tuple[Query, ...]:
    group = f"le{', ' + by if by else ''}"
    return tuple(
        Query(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[5m])))",
              f"p{round(q * 100)}{' {{' + by + '}}' if by else ''}")
        for q in QUANTILES
    )


def rows(release: Release) -> list[tuple[str, list[Panel]]]:
    """The dashboard's rows and panels for one release."""
    engine_panels = [
        Panel("KV-cache use per engine", "percentunit",
              (Query(f"max by (instance) ({release.kv_cache})", "{{instance}}"),),
              "A 0-1 fraction of the engine's KV-cache blocks in use; near 1 the engine preempts or queues.",
              extra={"max": 1}),
        Panel("Requests running and waiting per engine", "short",
              (Query("sum by (instance) (vllm:num_requests_running)", "running {{instance}}"),
               Query("sum by (instance) (vllm:num_requests_waiting)", "waiting {{instance}}"))),
        Panel("Engine liveness", "short",
              (Query('up{job="vllm"}', "scraped {{instance}}"),
               Query("min by (engine) (llmfleet_engine_up)", "admitted by workers {{engine}}")),
              "1 = up. Scraped: Prometheus reaches /metrics; admitted: the workers send it requests."),
    ]
    if "vllm:num_preemptions_total" in release.metrics:
        engine_panels.append(Panel(
            "Preemptions per engine", "ops",
            (Query("sum by (instance) (rate(vllm:num_preemptions_total[5m]))", "{{instance}}"),),
            "Requests evicted from the KV cache to be recomputed: the cache is too small for the load."))
    if release.prefix_cache:
        engine_panels.append(Panel(
            "Prefix-cache hit ratio", "percentunit",
            (Query(FLEET_PREFIX_CACHE_HIT_RATIO, "fleet"),
             Query(ENGINE_PREFIX_CACHE_HIT_RATIO, "{{instance}}")),
            "Prompt tokens found in the engines' prefix cache over tokens looked up, over the recording rules' rate "
            "window: for the fleet (each engine weighted by its traffic) and per engine. No point where an engine "
            "served no prompt. Recorded by the prometheus role (roles/prometheus/vars/records.yml).",
            extra={"max": 1, "min": 0}))
    return [
        ("Traffic", [
            Panel("Request rate", "reqps",
                  (Query("sum by (status) (rate(llmfleet_gateway_requests_total[1m]))", "HTTP {{status}}"),
                   Query("sum by (mode) (rate(llmfleet_gateway_admitted_total[1m]))", "admitted {{mode}}"))),
            Panel("End-to-end latency (admission to answer)", "s", _quantiles("llmfleet_request_seconds")),
            Panel("Time to first token", "s", _quantiles("vllm:time_to_first_token_seconds")),
            Panel("Tokens per second", "short",
                  (Query("sum(rate(vllm:prompt_tokens_total[1m]))", "prompt"),
                   Query("sum(rate(vllm:generation_tokens_total[1m]))", "generated"))),
        ]),
        ("Queue", [
            Panel("Queue depth", "short",
                  (Query("max by (model, lane) (llmfleet_queue_depth)", "queued + in flight {{model}} {{lane}}"),
                   Query("max by (model, lane) (llmfleet_queue_pending)",
                         "delivered, not acknowledged {{model}} {{lane}}"),
                   Query("sum(llmfleet_gateway_waiting)", "clients waiting"))),
            Panel("Queue wait", "s", _quantiles("llmfleet_queue_wait_seconds")),
            Panel("Worker load", "percentunit",
                  (Query("sum(llmfleet_worker_inflight) / sum(llmfleet_worker_concurrency)", "in flight / capacity"),),
                  "Near 1 while engines have room: the workers are the bottleneck (scale workers out).",
                  extra={"max": 1}),
        ]),
        ("Engines", engine_panels),
        ("Workers and gateways", [
            Panel("Worker and gateway liveness", "short",
                  (Query('up{job="worker"}', "worker {{instance}}"),
                   Query('up{job="gateway"}', "gateway {{instance}}"),
                   Query("llmfleet_worker_draining", "draining {{instance}}")),
                  "1 = up (draining: 1 while a worker finishes its requests after SIGTERM)."),
            Panel("Redis memory against its limit", "percentunit",
                  (Query("redis_memory_used_bytes / redis_memory_max_bytes", "{{instance}}"),),
                  "Redis runs noeviction: at 1 every admission fails.", extra={"max": 1}),
        ]),
        ("GPUs", [
            Panel("GPU use", "percent",
                  (Query("avg by (instance, gpu) (DCGM_FI_DEV_GPU_UTIL)", "{{instance}} GPU {{gpu}}"),),
                  extra={"max": 100}),
            Panel("GPU memory use", "percentunit",
                  (Query("sum by (instance, gpu) (DCGM_FI_DEV_FB_USED) / sum by (instance, gpu) "
                         "(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", "{{instance}} GPU {{gpu}}"),),
                  extra={"max": 1}),
            Panel("GPU temperature", "celsius",
                  (Query("max by (instance, gpu) (DCGM_FI_DEV_GPU_TEMP)", "{{instance}} GPU {{gpu}}"),)),
            Panel("Host CPU use", "percentunit",
                  (Query('1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[5m]))', "{{instance}}"),),
                  extra={"max": 1}),
        ]),
        ("Errors", [
            Panel("Errors by kind", "ops",
                  (Query("sum by (reason) (rate(llmfleet_worker_errors_total[5m]))", "worker: {{reason}}"),
                   Query("sum by (reason) (rate(llmfleet_gateway_rejected_total[5m]))", "refused: {{reason}}"),
                   Query('sum by (status) (rate(llmfleet_gateway_requests_total{status=~"5.."}[5m]))',
                         "gateway HTTP {{status}}"))),
            Panel("Dead letters (last hour)", "short",
                  (Query("sum(increase(llmfleet_dead_letters_total[1h]))", "dead-lettered"),),
                  "Requests given up on after their attempts coincided with engine deaths (failure mode #15).",
                  kind="stat"),
        ]),
    ]


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit, **panel.extra}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if panel.kind == "timeseries" else {},
        "targets": [
            {"datasource": DATASOURCE, "expr": query.expr, "legendFormat": query.legend, "refId": chr(ord("A") + i)}
            for i, query in enumerate(panel.queries)
        ],
    }


def dashboard(release: Release) -> dict[str, Any]:
    """The Grafana dashboard model (schema 39) for one release: rows of two panels side by side."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row_panels in rows(release):
        panels.append({"id": len(panels) + 1, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        for index, panel in enumerate(row_panels):
            panels.append(_panel_json(panel, len(panels) + 1, 12 * (index % 2), y + 8 * (index // 2)))
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "uid": "llmfleet-fleet",
        "title": "llmfleet fleet",
        "description": f"Gateway, queue, workers, vLLM {release.version} engines and GPUs (generated by "
                       "llmfleet.build.dashboards: edit there, not here).",
        "tags": ["llmfleet", f"vllm-{release.version}"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": panels,
    }


def render(release: Release) -> str:
    return json.dumps(dashboard(release), indent=2, sort_keys=True) + "\n"


def queries(model: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard model."""
    return [target["expr"] for panel in model["panels"] for target in panel.get("targets", [])]


_FUNCTION_OR_AGGREGATION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*\(")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}


def is_recorded(name: str) -> bool:
    """Whether a name is a recorded series (level:metric:operations), not a metric an exporter serves."""
    return _RECORDED.fullmatch(name) is not None


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (histogram series map to their family's name)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    text = _FUNCTION_OR_AGGREGATION.sub("(", text)
    names = set()
    for token in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if token.lower() not in _KEYWORDS:
            names.add(re.sub(r"_(bucket|sum|count)$", "", token) if token.startswith(("vllm:", "llmfleet_")) else token)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmfleet.build.dashboards", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs from what is generated")
    args = parser.parse_args(argv)
    stale = []
    for release in releases():
        path, text = dashboard_path(release.version), render(release)
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{'differs' if args.check else 'wrote'}: {path.relative_to(REPO_ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
