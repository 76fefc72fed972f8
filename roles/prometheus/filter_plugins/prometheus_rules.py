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
prometheus_record_groups(records, engine=, own=, exporters=, choices=)
    The recording-rule groups, from the role's record data: a rule whose `needs`
    (engine meanings, keys of choices) the release does not export is left out, and
    every metric a kept rule's expression names is checked against the catalogs as
    the alerts' are, except that a metric the release's default engine exports counts
    even where its fallback engine lacks it (0.9.2's V0): a recording rule whose input
    is absent records nothing, which its reader (a dashboard panel) shows as no data,
    whereas an alert would stay silent. No alert reads a recorded series.
prometheus_records_left_out(records, engine=, choices=)
    Record name -> the meanings the release lacks, for the rules that
    prometheus_record_groups leaves out (the rules file says so in a comment).

These filters stay in the role (roles/prometheus/filter_plugins) rather than
plugins/filter: only the prometheus role calls them, on its own alert and record
data (docs/layout.md, "Plugins and shared code").
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
# Recorded series (level:metric:operations): a recording rule may read those the rules before it record.
_RECORDED = re.compile(r"(?<![A-Za-z0-9_:])([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)(?![A-Za-z0-9_:])")
# none: Watchdog's, an alert that always fires to prove the pipeline works; it pages nobody
# (Alertmanager routes it to its own receiver, an external dead man's switch).
_SEVERITIES = ("critical", "warning", "info", "none")
_REQUIRED_ANNOTATIONS = ("summary", "description")


def _exported(catalog: Mapping[str, Any], reliable: bool = True) -> dict[str, str]:
    """Name -> type of what a catalog lists as always exported.

    A 0.9.2 engine falls back to its V0 engine for some features; what only V1
    exports (the catalog's not_in_v0_engine) cannot be relied on, and is left out
    unless `reliable` is false. Metrics that need a feature (`when`) are always left out.
    """
    unreliable = set(catalog.get("not_in_v0_engine", [])) if reliable else set()
    return {
        metric["name"]: metric["type"]
        for metric in catalog.get("metrics", [])
        if metric["name"] not in unreliable and not metric.get("when")
    }


def prometheus_engine_metric_names(
    catalog: Mapping[str, Any], choices: Mapping[str, list[str]], reliable: bool = True
) -> dict[str, str]:
    if not isinstance(catalog, Mapping) or "metrics" not in catalog:
        raise AnsibleFilterError("prometheus_engine_metric_names: the catalog is not an engine metric list")
    exported = _exported(catalog, reliable)
    picked = {}
    for meaning, names in choices.items():
        if not names:
            raise AnsibleFilterError(f"prometheus_engine_metric_names: {meaning} has no candidate names")
        picked[meaning] = next((name for name in names if name in exported), names[0])
    return picked


def _known(
    engine: Mapping[str, Any], own: Mapping[str, Any], exporters: Mapping[str, Any], reliable: bool = True
) -> dict[str, tuple[dict[str, str], str]]:
    """Prefix -> (name -> type, what lists it), for the check's messages."""
    version = engine.get("vllm_version", "?")
    exporter_names: dict[str, str] = {}
    for exporter in exporters.get("exporters", {}).values():
        exporter_names.update(_exported(exporter))
    exporters_what = "the exporters' list (files/engine_metrics/exporters.json)"
    return {
        "vllm:": (_exported(engine, reliable), f"vLLM {version} (files/engine_metrics/vllm-{version}.json)"),
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


def _check_record_shape(rule: Any, choices: Mapping[str, Any]) -> str:
    if not isinstance(rule, Mapping) or not all(isinstance(rule.get(key), str) for key in ("record", "expr")):
        raise AnsibleFilterError(f"prometheus_record_groups: a rule needs `record` and `expr` strings: {rule!r}")
    name: str = rule["record"]
    # level:metric:operations, Prometheus's naming convention for recorded series.
    if not re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", name):
        raise AnsibleFilterError(f"record {name}: name it level:metric:operations (e.g. instance:x_hits:rate)")
    unknown = [need for need in rule.get("needs") or [] if need not in choices]
    if unknown:
        raise AnsibleFilterError(
            f"record {name}: needs {', '.join(unknown)}, which __prometheus_engine_metric_choices does not list"
        )
    return name


def _lacking(rule: Mapping[str, Any], engine: Mapping[str, Any], choices: Mapping[str, list[str]]) -> list[str]:
    """The engine meanings a rule needs of which the release exports no name (V1-only names count)."""
    listed = _exported(engine, reliable=False)
    return [need for need in rule.get("needs") or [] if not any(name in listed for name in choices[need])]


def prometheus_records_left_out(
    records: Iterable[Mapping[str, Any]], engine: Mapping[str, Any], choices: Mapping[str, list[str]]
) -> dict[str, list[str]]:
    left_out = {}
    for rule in records:
        name = _check_record_shape(rule, choices)
        lacking = _lacking(rule, engine, choices)
        if lacking:
            left_out[name] = lacking
    return left_out


def prometheus_record_groups(
    records: Iterable[Mapping[str, Any]],
    engine: Mapping[str, Any],
    own: Mapping[str, Any],
    exporters: Mapping[str, Any],
    choices: Mapping[str, list[str]],
) -> list[dict[str, Any]]:
    records = list(records)
    left_out = prometheus_records_left_out(records, engine, choices)
    known = _known(engine, own, exporters, reliable=False)
    groups: dict[str, list[dict[str, Any]]] = {}
    problems = []
    recorded: set[str] = set()
    for rule in records:
        if rule["record"] in left_out:
            continue
        problems += [f"record {rule['record']} names {problem}" for problem in _missing(rule["expr"], known)]
        problems += [
            f"record {rule['record']} reads {name}, which no rule before it records"
            for name in sorted(set(_RECORDED.findall(rule["expr"])) - recorded)
        ]
        recorded.add(rule["record"])
        rendered: dict[str, Any] = {"record": rule["record"], "expr": rule["expr"].strip()}
        if rule.get("labels"):
            rendered["labels"] = dict(rule["labels"])
        groups.setdefault(rule.get("group", "llmfleet-records"), []).append(rendered)
    if problems:
        raise AnsibleFilterError(
            "refusing to render recording rules that name metrics the stack does not export: "
            + "; ".join(problems)
            + ". Name engine metrics through __prometheus_engine_metric_recorded, and list the meanings in `needs`."
        )
    return [{"name": name, "rules": group} for name, group in groups.items()]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "prometheus_engine_metric_names": prometheus_engine_metric_names,
            "prometheus_alert_groups": prometheus_alert_groups,
            "prometheus_record_groups": prometheus_record_groups,
            "prometheus_records_left_out": prometheus_records_left_out,
        }
