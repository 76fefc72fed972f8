"""`llmfleet docs alerts [--check]`: the alert table of docs/monitoring.md, generated
from the prometheus role's data so it cannot drift.

One row per rule of roles/prometheus/vars/alerts.yml (an alert with two rules, such
as ScaleOutNeeded for workers and for engines, has two rows): its severity and
scaling labels, what it means (its description annotation, made readable), its
`for:`, the prometheus_alert_* thresholds its expression and `for:` use with their
defaults from roles/prometheus/defaults/main.yml, and a link to its runbook entry.

The descriptions are Ansible templates wrapped around Prometheus templates: text in
`{% raw %}` blocks is Prometheus's (`{{ $labels.lane }}`, `{{ $value }}`), the
`{{ prometheus_alert_x }}` outside them are the role's variables. The table shows
the first as `<lane>` / `<value>` and the second as the variable's name with its
default, e.g. `prometheus_alert_queue_backlog_threshold` (100).

The table sits between ALERTS_BEGIN and ALERTS_END; the rest of the page belongs
to its authors. The README carries no copy: it links this table and the runbook,
so there is one table to keep current. tests/unit/build/test_alertdocs.py fails,
as `--check` does, until the table matches the data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT

COMMAND = "llmfleet docs alerts"
ALERTS_BEGIN = "<!-- alerts:begin -->"
ALERTS_END = "<!-- alerts:end -->"
PAGE = Path("docs") / "monitoring.md"
RUNBOOK = Path("docs") / "runbook.md"
RULES = Path("roles") / "prometheus" / "vars" / "alerts.yml"
DEFAULTS = Path("roles") / "prometheus" / "defaults" / "main.yml"
RULES_KEY = "__prometheus_alert_rules"
SCALE_LABELS = ("scale_action", "scale_kind")

THRESHOLD = re.compile(r"\bprometheus_alert_\w+")
# Jinja's raw blocks, whitespace control included; the text between is Prometheus's.
_RAW = re.compile(r"\{%-?\s*raw\s*-?%\}(.*?)\{%-?\s*endraw\s*-?%\}", flags=re.DOTALL)
_EXPRESSION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", flags=re.DOTALL)
_STATEMENT = re.compile(r"\{%.*?%\}", flags=re.DOTALL)
_PROMETHEUS_LABEL = re.compile(r"\{\{-?\s*\$labels\.(\w+)[^}]*\}\}")
_PROMETHEUS_VALUE = re.compile(r"\{\{-?\s*\$value\b[^}]*\}\}")


@dataclass
class Rule:
    alert: str
    group: str
    expr: str
    for_: str
    labels: dict[str, str]
    description: str


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `alerts` to the `llmfleet docs` actions."""
    alerts = actions.add_parser(
        "alerts", help=f"rewrite the alert table of {PAGE} from the prometheus role's alert rules"
    )
    alerts.add_argument("--check", action="store_true", help="only report whether it is current")
    alerts.set_defaults(handler=_alerts)


def load_rules(repo: Path) -> list[Rule]:
    """The alert rules of the prometheus role, in the data's order."""
    path = repo / RULES
    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get(RULES_KEY) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise LlmfleetError(f"{path}: expected a list under {RULES_KEY}")
    rules = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("alert") or "expr" not in entry:
            raise LlmfleetError(f"{path}: rule {index + 1} of {RULES_KEY} lacks `alert` or `expr`")
        rules.append(
            Rule(
                alert=str(entry["alert"]),
                group=str(entry.get("group", "")),
                expr=str(entry["expr"]),
                for_=str(entry.get("for", "")),
                labels={str(key): str(value) for key, value in (entry.get("labels") or {}).items()},
                description=str((entry.get("annotations") or {}).get("description", "")),
            )
        )
    return rules


def load_defaults(repo: Path) -> dict[str, Any]:
    data = yaml.safe_load((repo / DEFAULTS).read_text())
    return data if isinstance(data, dict) else {}


def thresholds(rule: Rule) -> list[str]:
    """The prometheus_alert_* variables the rule's expression and `for:` use, first use first."""
    return list(dict.fromkeys(THRESHOLD.findall(f"{rule.expr}\n{rule.for_}")))


def readable(template: str, defaults: dict[str, Any], where: str) -> str:
    """An annotation or `for:` template as a reader wants it: no Jinja, variables named with their defaults."""
    parts = _RAW.split(template)
    text = []
    for index, part in enumerate(parts):
        if index % 2:  # inside {% raw %}: Prometheus's templates
            part = _PROMETHEUS_LABEL.sub(lambda match: f"`<{match.group(1)}>`", part)
            part = _PROMETHEUS_VALUE.sub("`<value>`", part)
            text.append(_EXPRESSION.sub(lambda match: f"`{match.group(1)}`", part))
            continue
        statement = _STATEMENT.search(part)
        if statement:
            raise LlmfleetError(
                f"{where}: `{statement.group(0)}` is neither {{% raw %}} nor {{% endraw %}}, "
                "and the alert table only shows plain text and variables"
            )
        text.append(_EXPRESSION.sub(lambda match: _variable(match.group(1), defaults, where), part))
    return " ".join("".join(text).split())


def render_table(rules: list[Rule], defaults: dict[str, Any]) -> str:
    """The generated part of the page: one row per rule."""
    runbook = Path(os.path.relpath(RUNBOOK, PAGE.parent)).as_posix()
    lines = [
        f"| alert | severity | {', '.join(SCALE_LABELS)} | meaning | for | thresholds (default) | what to do |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule in rules:
        where = f"{RULES}: {rule.alert}"
        scale = ", ".join(f"`{rule.labels[label]}`" for label in SCALE_LABELS if label in rule.labels) or "-"
        used = ", ".join(f"`{name}`: `{_shown(_default(name, defaults, where))}`" for name in thresholds(rule))
        meaning = readable(rule.description, defaults, where) or "-"
        cells = [
            f"`{rule.alert}`",
            rule.labels.get("severity", "-"),
            scale,
            meaning,
            readable(rule.for_, defaults, where) or "-",
            used or "-",
            f"[runbook]({runbook}#{rule.alert.lower()})",
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def expected(repo: Path) -> str:
    """What the page should hold."""
    path = repo / PAGE
    if not path.is_file():
        raise LlmfleetError(f"{path} is missing: it holds the alert table between {ALERTS_BEGIN} and {ALERTS_END}")
    text = path.read_text()
    if text.count(ALERTS_BEGIN) != 1 or text.count(ALERTS_END) != 1 or text.index(ALERTS_BEGIN) > text.index(
        ALERTS_END
    ):
        raise LlmfleetError(f"{path} needs one {ALERTS_BEGIN} followed by one {ALERTS_END} around the alert table")
    head, rest = text.split(ALERTS_BEGIN, 1)
    _, tail = rest.split(ALERTS_END, 1)
    table = render_table(load_rules(repo), load_defaults(repo))
    return f"{head}{ALERTS_BEGIN}\n{table}\n{ALERTS_END}{tail}"


def is_stale(repo: Path) -> bool:
    return (repo / PAGE).read_text() != expected(repo)


def check(repo: Path) -> None:
    """Raise, saying what to run, when the table differs from the data."""
    if is_stale(repo):
        raise LlmfleetError(
            f"the alert table in {PAGE} is stale: it differs from {RULES} and {DEFAULTS}; "
            f"run `{COMMAND}` and commit the result"
        )


def write(repo: Path) -> bool:
    """Bring the table up to date; True when the page was rewritten."""
    wanted = expected(repo)
    if (repo / PAGE).read_text() == wanted:
        return False
    (repo / PAGE).write_text(wanted)
    return True


def _variable(expression: str, defaults: dict[str, Any], where: str) -> str:
    if THRESHOLD.fullmatch(expression):
        return f"`{expression}` ({_shown(_default(expression, defaults, where))})"
    return f"`{expression}`"


def _default(name: str, defaults: dict[str, Any], where: str) -> Any:
    if name not in defaults:
        raise LlmfleetError(f"{where} uses {name}, which {DEFAULTS} does not define: add it there, with a comment")
    return defaults[name]


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _cell(value: str) -> str:
    return value.replace("|", "\\|")


def _alerts(args: argparse.Namespace) -> int:
    if args.check:
        check(REPO_ROOT)
        print(f"the alert table in {PAGE} is current")
        return 0
    print(f"wrote {PAGE}" if write(REPO_ROOT) else f"the alert table in {PAGE} is already current")
    return 0
