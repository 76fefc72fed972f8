"""The prometheus role's alert and recording rules, rendered as hosts get them, pass `promtool test rules`.

The rules are rendered on the controller by ansible-playbook through the task file the
role runs on hosts (roles/prometheus/tasks/rules.yml, with its alert data, its filter and
its template, `promtool check rules` as the template's validate), once per engine
release. promtool's unit tests in tests/unit/roles/promtool/ then hold for every alert a
case that fires and one that does not. Each release's rules name its own KV-cache metric:
the tests feed that name, and the other name to prove it is not read. The recording
rules (the prefix-cache hit ratio) exist only for releases that count prefix-cache
lookups, and the fleet dashboard of each release reads only the series its rules record.

promtool comes from Debian's `prometheus` package (scripts/bootstrap.sh installs it).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.build import dashboards
from llmfleet.paths import REPO_ROOT

PROMTOOL_DIR = Path(__file__).resolve().parent / "promtool"
RENDER_PLAYBOOK = PROMTOOL_DIR / "render.yml"
RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
KV_CACHE = {"current": "vllm:kv_cache_usage_perc", "old": "vllm:gpu_cache_usage_perc"}
# The KV-cache name each release's rules must use, from its source or its running engine
# (files/engine_metrics/): 0.9.2's V1 engine exports both, its V0 fallback only the old one.
RELEASES = {"0.32.0": KV_CACHE["current"], "0.9.2": KV_CACHE["old"], "0.4.2": KV_CACHE["old"]}
# vLLM 0.4.2 has no preemption counter: a stack on it disables the alert.
DISABLED = {"0.4.2": ["PreemptionsHigh"]}
PREEMPTION_TESTS = "preemptions.yml"
# The recorded prefix-cache series, and the releases that count prefix-cache lookups
# (vllm:prefix_cache_{hits,queries}_total: 0.9.2's V1 engine, 0.32.0); 0.4.2 counts none.
PREFIX_CACHE_RECORDS = {
    "instance:vllm_prefix_cache_hits:rate",
    "instance:vllm_prefix_cache_queries:rate",
    "instance:vllm_prefix_cache_hit_ratio:rate",
    "job:vllm_prefix_cache_hit_ratio:rate",
}
PREFIX_CACHE_RELEASES = {"0.9.2", "0.32.0"}
PREFIX_CACHE_TESTS = "prefix_cache.yml"
RECORDS = REPO_ROOT / "roles" / "prometheus" / "vars" / "records.yml"
# Alerts that fire all the time by design (the dead man's switch's heartbeat): no state is quiet.
ALWAYS_FIRING = {"Watchdog"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: install Debian's `prometheus` package (scripts/bootstrap.sh does)")
    return path


def render(version: str, out: Path, **extra_vars: Any) -> subprocess.CompletedProcess[str]:
    """Run the role's rules task file on the controller, writing out/rules.yml."""
    variables = {
        "ansible_python_interpreter": sys.executable,
        "prometheus_vllm_version": version,
        "prometheus_alerts_disabled": DISABLED.get(version, []),
        "__prometheus_rules_path": str(out / "rules.yml"),
        "__prometheus_rules_owner": pwd.getpwuid(os.getuid()).pw_name,
        "__prometheus_rules_group": grp.getgrgid(os.getgid()).gr_name,
        "__prometheus_service_managed": False,
        **extra_vars,
    }
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(REPO_ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"}
    env.pop("ANSIBLE_CONFIG", None)
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    command += ["-e", json.dumps(variables), str(RENDER_PLAYBOOK)]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module", params=sorted(RELEASES), ids=lambda version: f"vllm-{version}")
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    version: str = request.param
    out = tmp_path_factory.mktemp(f"rules-{version}")
    result = render(version, out)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return version, out


def _rules(path: Path) -> list[dict[str, Any]]:
    """The alert rules of a rendered rules file."""
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _records(path: Path) -> list[dict[str, Any]]:
    """The recording rules of a rendered rules file."""
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "record" in rule]


def _test_files(version: str) -> list[Path]:
    files = sorted(PROMTOOL_DIR.glob("*.yml"))
    files = [path for path in files if path != RENDER_PLAYBOOK]
    if "PreemptionsHigh" in DISABLED.get(version, []):
        files = [path for path in files if path.name != PREEMPTION_TESTS]
    if version not in PREFIX_CACHE_RELEASES:
        files = [path for path in files if path.name != PREFIX_CACHE_TESTS]
    return files


def _place_tests(version: str, out: Path) -> list[Path]:
    """The promtool test files beside the rendered rules, with the release's KV-cache names filled in."""
    kv_cache = RELEASES[version]
    other = next(name for name in KV_CACHE.values() if name != kv_cache)
    placed = []
    for path in _test_files(version):
        text = path.read_text().replace("OTHER_KV_CACHE_METRIC", other).replace("KV_CACHE_METRIC", kv_cache)
        target = out / f"test-{path.name}"
        target.write_text(text)
        placed.append(target)
    return placed


def run_promtool_tests(version: str, out: Path) -> subprocess.CompletedProcess[str]:
    command = [promtool(), "test", "rules", *[str(path) for path in _place_tests(version, out)]]
    return subprocess.run(command, cwd=out, capture_output=True, text=True, check=False)


def test_the_rules_pass_promtools_unit_tests(rendered: tuple[str, Path]) -> None:
    version, out = rendered
    result = run_promtool_tests(version, out)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert result.stdout.count("SUCCESS") == len(_test_files(version))


def test_the_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """The promtool tests can fail: rules rendered with another KV-cache threshold do not pass them."""
    result = render("0.32.0", tmp_path, prometheus_alert_kv_cache_threshold=0.96)
    assert result.returncode == 0, result.stdout[-4000:]
    tested = run_promtool_tests("0.32.0", tmp_path)
    assert tested.returncode != 0
    assert "KVCacheNearFull" in tested.stdout + tested.stderr


def test_every_alert_has_a_case_that_fires_and_one_that_does_not(rendered: tuple[str, Path]) -> None:
    version, out = rendered
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in _test_files(version):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in _rules(out / "rules.yml")}
    assert alerts - firing == set(), f"alerts with no firing case: {sorted(alerts - firing)}"
    assert alerts - ALWAYS_FIRING - quiet == set(), f"alerts with no quiet case: {sorted(alerts - quiet)}"
    # An always-firing alert has no quiet case: one would fail, or test nothing.
    assert not ALWAYS_FIRING & quiet


def test_watchdog_always_fires_and_pages_nobody(rendered: tuple[str, Path]) -> None:
    """Its expression is constant, its severity `none` (Alertmanager routes it to the dead man's switch only), and
    it carries no scale_action, so the scaler never takes it for a scaling request."""
    _, out = rendered
    [watchdog] = [rule for rule in _rules(out / "rules.yml") if rule["alert"] == "Watchdog"]
    assert watchdog["expr"] == "vector(1)" and "for" not in watchdog
    assert watchdog["labels"] == {"severity": "none"}
    others = [rule for rule in _rules(out / "rules.yml") if rule["alert"] not in ALWAYS_FIRING]
    assert all(rule["labels"]["severity"] != "none" for rule in others)


def test_the_kv_cache_rules_name_the_releases_metric(rendered: tuple[str, Path]) -> None:
    version, out = rendered
    expressions = " ".join(rule["expr"] for rule in _rules(out / "rules.yml"))
    other = next(name for name in KV_CACHE.values() if name != RELEASES[version])
    assert RELEASES[version] in expressions
    assert other not in expressions


def test_every_alert_carries_severity_summary_description_and_its_runbook_entry(rendered: tuple[str, Path]) -> None:
    _, out = rendered
    headings = set(re.findall(r"^## (\w+)$", RUNBOOK.read_text(), flags=re.MULTILINE))
    for rule in _rules(out / "rules.yml"):
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info", "none"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule["annotations"]["runbook_url"] == f"docs/runbook.md#{name.lower()}"
        assert name in headings, f"docs/runbook.md has no `## {name}` entry"


def test_the_scaling_alerts_carry_what_the_scaler_acts_on(rendered: tuple[str, Path]) -> None:
    _, out = rendered
    scaling = {
        (rule["alert"], rule["labels"]["scale_action"], rule["labels"]["scale_kind"])
        for rule in _rules(out / "rules.yml")
        if "scale_action" in rule["labels"]
    }
    assert scaling == {
        ("ScaleOutNeeded", "out", "workers"),
        ("ScaleOutNeeded", "out", "engines"),
        ("ScaleInPossible", "in", "workers"),
        ("ScaleInPossible", "in", "engines"),
    }


def test_rendering_refuses_a_metric_the_release_does_not_export(tmp_path: Path) -> None:
    result = render("0.4.2", tmp_path, prometheus_alerts_disabled=[])
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    assert "alert PreemptionsHigh names vllm:num_preemptions_total, which vLLM 0.4.2" in output
    assert not (tmp_path / "rules.yml").exists()


def test_disabling_an_alert_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    result = render("0.32.0", tmp_path, prometheus_alerts_disabled=["PreemptionHigh"])
    assert result.returncode != 0
    assert "prometheus_alerts_disabled names PreemptionHigh, which no rule has" in " ".join(result.stdout.split())


def test_the_prefix_cache_records_follow_the_release(rendered: tuple[str, Path]) -> None:
    """0.9.2 and 0.32.0 record the hit ratio from the current counters; 0.4.2, which counts no prefix-cache
    lookups, records nothing and its rules file says why."""
    version, out = rendered
    records = {rule["record"]: rule["expr"] for rule in _records(out / "rules.yml")}
    if version in PREFIX_CACHE_RELEASES:
        assert set(records) == PREFIX_CACHE_RECORDS
        reads = " ".join(records.values())
        assert "rate(vllm:prefix_cache_hits_total[5m])" in reads
        assert "rate(vllm:prefix_cache_queries_total[5m])" in reads
        assert "gpu_prefix_cache" not in reads
    else:
        assert records == {}
        text = (out / "rules.yml").read_text()
        for record in PREFIX_CACHE_RECORDS:
            assert f"# Left out: recording rule {record}, because vLLM {version} exports no" in text


def test_the_records_use_the_roles_rate_window(tmp_path: Path) -> None:
    result = render("0.32.0", tmp_path, prometheus_alert_rate_window="10m")
    assert result.returncode == 0, result.stdout[-4000:]
    exprs = " ".join(rule["expr"] for rule in _records(tmp_path / "rules.yml"))
    assert "rate(vllm:prefix_cache_hits_total[10m])" in exprs and "[5m]" not in exprs


def test_the_tests_catch_an_unweighted_fleet_ratio(tmp_path: Path) -> None:
    """The promtool tests can fail: a fleet ratio that averages the engines' ratios (ignoring their traffic)
    does not pass them."""
    records = yaml.safe_load(RECORDS.read_text())["__prometheus_recording_rules"]
    for rule in records:
        if rule["record"] == "job:vllm_prefix_cache_hit_ratio:rate":
            rule["expr"] = "avg without (instance) (instance:vllm_prefix_cache_hit_ratio:rate)"
    result = render("0.32.0", tmp_path, __prometheus_recording_rules=records)
    assert result.returncode == 0, result.stdout[-4000:]
    tested = run_promtool_tests("0.32.0", tmp_path)
    assert tested.returncode != 0
    assert "job:vllm_prefix_cache_hit_ratio:rate" in tested.stdout + tested.stderr


def test_rendering_refuses_a_record_naming_a_metric_the_release_does_not_export(tmp_path: Path) -> None:
    records = [{"group": "llmfleet-test", "record": "instance:vllm_preemptions:rate", "needs": [],
                "expr": "sum by (job, instance) (rate(vllm:num_preemptions_total[5m]))"}]
    result = render("0.4.2", tmp_path, __prometheus_recording_rules=records)
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    assert "record instance:vllm_preemptions:rate names vllm:num_preemptions_total, which vLLM 0.4.2" in output
    assert not (tmp_path / "rules.yml").exists()


def test_rendering_refuses_a_record_reading_a_series_no_rule_records(tmp_path: Path) -> None:
    records = [{"group": "llmfleet-test", "record": "job:vllm_prefix_cache_hit_ratio:rate", "needs": [],
                "expr": "sum without (instance) (instance:vllm_prefix_cache_hits:rate)"}]
    result = render("0.32.0", tmp_path, __prometheus_recording_rules=records)
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    assert "reads instance:vllm_prefix_cache_hits:rate, which no rule before it records" in output


def test_the_dashboard_reads_only_what_the_rules_record(rendered: tuple[str, Path]) -> None:
    """Each release's fleet dashboard reads recorded series that its rules record, and shows the prefix-cache
    hit ratio (fleet and per engine) wherever they record it."""
    version, out = rendered
    release = next(release for release in dashboards.releases() if release.version == version)
    read = {name for expr in dashboards.queries(dashboards.dashboard(release))
            for name in dashboards.metric_names(expr) if dashboards.is_recorded(name)}
    recorded = {rule["record"] for rule in _records(out / "rules.yml")}
    assert read <= recorded, f"vLLM {version}: the dashboard reads series no rule records: {sorted(read - recorded)}"
    hit_ratio = {"instance:vllm_prefix_cache_hit_ratio:rate", "job:vllm_prefix_cache_hit_ratio:rate"}
    assert (hit_ratio <= read) == (version in PREFIX_CACHE_RELEASES)
