"""Provisioning figures read from real ansible-playbook output (the tail of two lab site.yml runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.bench import provisioning

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ansible-profile"


def _profile(name: str) -> provisioning.PlaybookProfile:
    return provisioning.parse((FIXTURES / f"site-{name}.log").read_text())


def test_a_run_gives_its_total_time_counts_and_slowest_tasks() -> None:
    rerun = _profile("rerun")
    assert rerun.total_s == pytest.approx(464.311)
    assert set(rerun.changed) == {"gpu1", "gpu2", "gpu3", "gw1", "localhost", "mon1", "redis1"}
    assert rerun.changed_total == 0
    assert rerun.slowest[0] == (
        "python_toolchain : verify | Import the frameworks and read the installed versions",
        12.37,
    )
    assert len(rerun.slowest) == 20  # profile_tasks lists twenty
    assert _profile("first").changed["gpu1"] > 0


def test_the_report_gives_the_reruns_share_against_the_target_and_escapes_task_names() -> None:
    text = provisioning.report(_profile("first"), _profile("rerun"))
    assert "| first | 958 s | 266 | 0 |" in text
    assert "| re-run | 464 s | 0 | 0 |" in text
    assert "The re-run took 48% of the first run's time (target: at most 25%, missed)." in text
    assert "| python_toolchain : verify \\| Import the frameworks and read the installed versions | 12.4 |" in text
    table_rows = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(" |")]
    # Unescaped pipes only between cells: 3 in a two-column row, 5 in a four-column one.
    assert all(line.replace("\\|", "").count("|") in (3, 5) for line in table_rows), table_rows


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("PLAY RECAP ***\nh : ok=1 changed=0 unreachable=0 failed=0\n", "no profile_tasks timings"),
        ("Wednesday 02 December 2026  10:37:40 +0000 (0:00:00.029)       0:00:01.000 ****\n", "no PLAY RECAP"),
    ],
)
def test_output_without_the_callback_or_the_recap_is_refused_naming_it(text: str, missing: str) -> None:
    with pytest.raises(ValueError, match=missing):
        provisioning.parse(text)
