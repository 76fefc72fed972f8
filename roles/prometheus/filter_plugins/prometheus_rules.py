"""Filters of the prometheus role: alert rules rendered only from metrics the stack exports.

prometheus_engine_metric_names(catalog, choices)
    The name the engine release exports for each meaning (KV-cache use, ...): the
    first of its candidate names that the release's catalog lists.
prometheus_alert_groups(rules, engine=, own=, exporters=, disabled=, runbook_url=)
    The rule groups for the rules file, from the role's alert data: disabled alerts
    left out, a runbook_url annotation added, and every metric each expression names
    checked against the catalogs (files/engine_metrics/). A rule that names a metric
    the stack does not export is refused with an AnsibleFilterError naming the alert,
    the metric and the catalog, so that the rules file is never written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

# Metric names by the prefix that says who exports them. Expressions name nothing else
# but Prometheus's own `up`, functions, label names and quoted strings, none of which
# carry these prefixes.
_METRIC = re.compile(
    r"(?<![A-Za-z0-9_:\"'])(vllm:[A-Za-z0-9_:]+|llmfleet_[A-Za-z0-9_]+|node_[A-Za-z0-9_]+|redis_[A-Za-z0-9_]+|DCGM_[A-Za-z0-9_]+)"
)
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
# none: Watchdog's, an alert that always fires to prove the pipeline works; it pages nobody
# (Alertmanager routes it to its own receiver, an external dead man's switch).
_SEVERITIES = ("critical", "warning", "info", "none")
_REQUIRED_ANNOTATIONS = ("summary", "description")


def _exported(catalog: Mapping[str, Any]) -> dict[str, str]:
    """Name -> type of what a catalog lists as always exported.

    A 0.9.2 engine falls back to its V0 engine for some features; what only V1
    exports (the catalog's not_in_v0_engine) cannot be relied on.
    """
    unreliable = set(catalog.get("not_in_v0_engine", []))
    return {
        metric["name"]: metric["type"]
        for metric in catalog.get("metrics", [])
        if metric["name"] not in unreliable and not metric.get("when")
    }


def prometheus_engine_metric_names(catalog: Mapping[str, Any], choices: Mapping[str, list[str]]) -> dict[str, str]:
    if not isinstance(catalog, Mapping) or "metrics" not in catalog:
        raise AnsibleFilterError("prometheus_engine_metric_names: the catalog is not an engine metric list")
    exported = _exported(catalog)
    picked = {}
    for meaning, names in choices.items():
        if not names:
            raise AnsibleFilterError(f"prometheus_engine_metric_names: {meaning} has no candidate names")
        picked[meaning] = next((name for name in names if name in exported), names[0])
    return picked


def _known(
    engine: Mapping[str, Any], own: Mapping[str, Any], exporters: Mapping[str, Any]
) -> dict[str, tuple[dict[str, str], str]]:
    """Prefix -> (name -> type, what lists it), for the check's messages."""
    version = engine.get("vllm_version", "?")
    exporter_names: dict[str, str] = {}
    for exporter in exporters.get("exporters", {}).values():
        exporter_names.update(_exported(exporter))
    exporters_what = "the exporters' list (files/engine_metrics/exporters.json)"
    return {
        "vllm:": (_exported(engine), f"vLLM {version} (files/engine_metrics/vllm-{version}.json)"),
        "llmfleet_": (_exported(own), "llmfleet's services (files/engine_metrics/llmfleet.json)"),
        "node_": (exporter_names, exporters_what),
        "redis_": (exporter_names, exporters_what),
        "DCGM_": (exporter_names, exporters_what),
    }


def _missing(expr: str, known: Mapping[str, tuple[dict[str, str], str]]) -> list[str]:
    problems = []
    for name in sorted(set(_METRIC.findall(expr))):
        prefix = next(prefix for prefix in known if name.startswith(prefix))
        names, what = known[prefix]
        if name in names:
            continue
        base = next((name[: -len(suffix)] for suffix in _HISTOGRAM_SERIES if name.endswith(suffix)), None)
        if base is not None and names.get(base) == "histogram":
            continue
        problems.append(f"{name}, which {what} does not export")
    return problems


def _check_shape(rule: Any) -> str:
    if not isinstance(rule, Mapping) or not isinstance(rule.get("alert"), str) or not isinstance(rule.get("expr"), str):
        raise AnsibleFilterError(f"prometheus_alert_groups: a rule needs `alert` and `expr` strings: {rule!r}")
    name: str = rule["alert"]
    severity = (rule.get("labels") or {}).get("severity")
    if severity not in _SEVERITIES:
        raise AnsibleFilterError(f"alert {name}: labels.severity must be one of {', '.join(_SEVERITIES)}")
    annotations = rule.get("annotations") or {}
    absent = [key for key in _REQUIRED_ANNOTATIONS if not annotations.get(key)]
    if absent:
        raise AnsibleFilterError(f"alert {name}: needs the annotations {', '.join(absent)}")
    return name


def prometheus_alert_groups(
    rules: Iterable[Mapping[str, Any]],
    engine: Mapping[str, Any],
    own: Mapping[str, Any],
    exporters: Mapping[str, Any],
    disabled: Iterable[str] = (),
    runbook_url: str = "",
) -> list[dict[str, Any]]:
    rules = list(rules)
    names = {_check_shape(rule) for rule in rules}
    disabled = list(disabled)
    unknown = sorted(set(disabled) - names)
    if unknown:
        raise AnsibleFilterError(
            f"prometheus_alerts_disabled names {', '.join(unknown)}, which no rule has; the alerts are"
            f" {', '.join(sorted(names))}"
        )
    known = _known(engine, own, exporters)
    groups: dict[str, list[dict[str, Any]]] = {}
    problems = []
    for rule in rules:
        if rule["alert"] in disabled:
            continue
        problems += [f"alert {rule['alert']} names {problem}" for problem in _missing(rule["expr"], known)]
        rendered: dict[str, Any] = {"alert": rule["alert"], "expr": rule["expr"].strip()}
        if rule.get("for"):
            rendered["for"] = rule["for"]
        rendered["labels"] = dict(rule["labels"])
        rendered["annotations"] = dict(rule["annotations"])
        if runbook_url:
            rendered["annotations"]["runbook_url"] = f"{runbook_url}#{rule['alert'].lower()}"
        groups.setdefault(rule.get("group", "llmfleet"), []).append(rendered)
    if problems:
        raise AnsibleFilterError(
            "refusing to render alert rules that name metrics the stack does not export: "
            + "; ".join(problems)
            + ". Choose the stack whose engine exports them, or list the alert in prometheus_alerts_disabled."
        )
    return [{"name": name, "rules": group} for name, group in groups.items()]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "prometheus_engine_metric_names": prometheus_engine_metric_names,
            "prometheus_alert_groups": prometheus_alert_groups,
        }
