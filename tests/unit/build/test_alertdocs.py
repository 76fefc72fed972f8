"""The alert table of docs/monitoring.md is generated from the prometheus role's alert
data; these fail when someone changes a rule or a threshold and forgets to regenerate
it, when an alert has no runbook entry, or when a rule uses a threshold that has no
default. The cases that change the data work on copies in a temporary directory. The
README carries no copy of the table: it links this one and the runbook."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet import cli
from llmfleet.build import alertdocs
from llmfleet.build.alertdocs import (
    ALERTS_BEGIN,
    ALERTS_END,
    COMMAND,
    DEFAULTS,
    PAGE,
    RULES,
    RULES_KEY,
    RUNBOOK,
)
from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT


def _rules(repo: Path = REPO_ROOT) -> list[dict[str, Any]]:
    rules = yaml.safe_load((repo / RULES).read_text())[RULES_KEY]
    assert isinstance(rules, list) and rules, f"{RULES}: no rules under {RULES_KEY}"
    return rules


def _table(repo: Path = REPO_ROOT) -> list[str]:
    """The rows of the generated table, header and separator left out."""
    text = (repo / PAGE).read_text()
    assert text.count(ALERTS_BEGIN) == 1 and text.count(ALERTS_END) == 1, f"{PAGE}: keep the alert table's markers"
    block = text.split(ALERTS_BEGIN, 1)[1].split(ALERTS_END, 1)[0]
    return block.strip().splitlines()[2:]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]


def _copy(tmp_path: Path) -> Path:
    for relative in (RULES, DEFAULTS, PAGE, RUNBOOK):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / relative, tmp_path / relative)
    return tmp_path


def _add_rule(repo: Path, rule: dict[str, Any]) -> None:
    data = yaml.safe_load((repo / RULES).read_text())
    data[RULES_KEY].append(rule)
    (repo / RULES).write_text(yaml.safe_dump(data, sort_keys=False, width=1000))


DEMO_RULE = {
    "group": "llmfleet-demo",
    "alert": "DemoBacklogHigh",
    "expr": "max(llmfleet_queue_depth) > {{ prometheus_alert_demo_threshold }}",
    "for": "{{ prometheus_alert_demo_for }}",
    "labels": {"severity": "warning", "scale_action": "out", "scale_kind": "workers"},
    "annotations": {
        "summary": "{% raw %}Demo {{ $value }}{% endraw %}",
        "description": "{% raw %}Over {% endraw %}{{ prometheus_alert_demo_threshold }}{% raw %} requests in lane "
        "{{ $labels.lane }} ({{ $value | humanize }}) for {% endraw %}{{ prometheus_alert_demo_for }}.",
    },
}


def test_generated_alert_table_is_current() -> None:
    assert not alertdocs.is_stale(REPO_ROOT), f"{PAGE}: the alert table is stale: run `.venv/bin/{COMMAND}`"


def test_the_check_command_passes_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["docs", "alerts", "--check"]) == 0
    assert f"the alert table in {PAGE} is current" in capsys.readouterr().out


def test_docs_help_lists_alerts_beside_roles(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["docs", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "alerts" in out and "roles" in out


def test_the_table_has_one_row_per_rule_with_its_scale_kind() -> None:
    rules = _rules()
    rows = [_cells(row) for row in _table()]
    assert [row[0] for row in rows] == [f"`{rule['alert']}`" for rule in rules]
    for rule, row in zip(rules, rows, strict=True):
        assert row[1] == rule["labels"]["severity"]
        if "scale_kind" in rule["labels"]:
            assert f"`{rule['labels']['scale_kind']}`" in row[2], f"{rule['alert']}: the row must name its scale_kind"
        assert "{%" not in row[3] and "{{" not in row[3], f"{rule['alert']}: Jinja left in the meaning: {row[3]}"
        assert row[6] == f"[runbook](runbook.md#{rule['alert'].lower()})"
    kinds = {row[2] for row in rows if row[0] in ("`ScaleOutNeeded`", "`ScaleInPossible`")}
    assert kinds == {"`out`, `workers`", "`out`, `engines`", "`in`, `workers`", "`in`, `engines`"}


def test_every_alert_has_a_runbook_heading() -> None:
    headings = {
        match.group(1).strip().lower()
        for match in re.finditer(r"^##\s+(.+)$", (REPO_ROOT / RUNBOOK).read_text(), flags=re.MULTILINE)
    }
    missing = sorted(alert for alert in {rule["alert"] for rule in _rules()} if alert.lower() not in headings)
    assert not missing, f"{RUNBOOK}: add a `## <alert>` section for {missing}"


def test_every_threshold_in_the_rules_has_a_default() -> None:
    defaults = yaml.safe_load((REPO_ROOT / DEFAULTS).read_text())
    used = {
        name
        for rule in _rules()
        for name in re.findall(r"prometheus_alert_\w+", f"{rule['expr']} {rule.get('for', '')}")
    }
    assert len(used) > 10, f"expected the rules to use the role's thresholds, found {sorted(used)}"
    missing = sorted(used - set(defaults))
    assert not missing, f"{DEFAULTS}: the alert rules use {missing}, which have no default"


def test_a_rule_added_to_the_data_shows_up(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    page_before = (repo / PAGE).read_text()
    _add_rule(repo, DEMO_RULE)
    with (repo / DEFAULTS).open("a") as defaults:
        defaults.write("\nprometheus_alert_demo_threshold: 7\nprometheus_alert_demo_for: 3m\n")
    assert alertdocs.is_stale(repo)
    with pytest.raises(LlmfleetError, match=re.escape(f"run `{COMMAND}`")):
        alertdocs.check(repo)

    assert alertdocs.write(repo) is True
    alertdocs.check(repo)
    rows = _table(repo)
    assert len(rows) == len(_rules(repo)) == len(_table()) + 1
    assert _cells(rows[-1]) == [
        "`DemoBacklogHigh`",
        "warning",
        "`out`, `workers`",
        "Over `prometheus_alert_demo_threshold` (7) requests in lane `<lane>` (`<value>`) "
        "for `prometheus_alert_demo_for` (3m).",
        "`prometheus_alert_demo_for` (3m)",
        "`prometheus_alert_demo_threshold`: `7`, `prometheus_alert_demo_for`: `3m`",
        "[runbook](runbook.md#demobackloghigh)",
    ]
    # Only the table changed: the rest of the page is its authors'.
    page_after = (repo / PAGE).read_text()
    assert page_after.split(ALERTS_BEGIN)[0] == page_before.split(ALERTS_BEGIN)[0]
    assert page_after.split(ALERTS_END)[1] == page_before.split(ALERTS_END)[1]
    assert alertdocs.write(repo) is False


def test_a_changed_default_makes_the_table_stale(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    text = (repo / DEFAULTS).read_text()
    assert "\nprometheus_alert_queue_backlog_threshold: 100\n" in text
    (repo / DEFAULTS).write_text(
        text.replace("prometheus_alert_queue_backlog_threshold: 100", "prometheus_alert_queue_backlog_threshold: 250")
    )
    assert alertdocs.is_stale(repo)
    alertdocs.write(repo)
    assert "`prometheus_alert_queue_backlog_threshold` (250)" in _table(repo)[0]


def test_a_threshold_without_a_default_is_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    _add_rule(repo, DEMO_RULE)
    with pytest.raises(LlmfleetError, match="DemoBacklogHigh uses prometheus_alert_demo_threshold"):
        alertdocs.expected(repo)


def test_a_page_without_the_markers_is_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    (repo / PAGE).write_text((repo / PAGE).read_text().replace(ALERTS_END, ""))
    with pytest.raises(LlmfleetError, match=re.escape(ALERTS_END)):
        alertdocs.check(repo)


def test_readable_leaves_no_jinja_and_refuses_what_it_cannot_show() -> None:
    defaults = {"prometheus_alert_x": 0.5}
    shown = alertdocs.readable(
        "{%- raw -%}On {{ $labels.instance }}:{%- endraw -%} {{\n prometheus_alert_x }} and {{ other.name }}",
        defaults,
        "demo",
    )
    assert shown == "On `<instance>`: `prometheus_alert_x` (0.5) and `other.name`"
    with pytest.raises(LlmfleetError, match="if x"):
        alertdocs.readable("{% if x %}a{% endif %}", defaults, "demo")


def test_the_readme_links_the_table_and_the_runbook_instead_of_copying_them() -> None:
    """One generated table: the README points at it (and at the runbook) rather than carrying a second one."""
    text = (REPO_ROOT / "README.md").read_text()
    assert ALERTS_BEGIN not in text and ALERTS_END not in text, "README.md: the alert table lives in " + str(PAGE)
    assert "](docs/monitoring.md#the-rules)" in text and "](docs/runbook.md)" in text


def test_a_hand_edited_table_is_found_and_rewritten(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    page = repo / PAGE
    page.write_text(page.read_text().replace("| `EngineDown` |", "| `EngineGone` |"))
    with pytest.raises(LlmfleetError, match=re.escape(f"the alert table in {PAGE} is stale")):
        alertdocs.check(repo)
    assert alertdocs.write(repo) is True
    alertdocs.check(repo)
    assert "| `EngineGone` |" not in page.read_text()
    assert [_cells(row)[0] for row in _table(repo)] == [f"`{rule['alert']}`" for rule in _rules()]
