"""Provisioning figures from ansible-playbook's own output: a run's time, its changed counts and its slowest tasks.

The runs must have the `ansible.posix.profile_tasks` callback on (ANSIBLE_CALLBACKS_ENABLED), which
prints the elapsed time after every task and a "TASKS RECAP" of the slowest ones at the end; the
PLAY RECAP gives each host's counts. The lab stage feeds it the first site.yml run and the
idempotent re-run (tests/lab/test_site.py); an operator can feed it the logs of their own site.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)",
    re.MULTILINE,
)
# profile_tasks' stamp after each task: "(0:00:01.234)       0:07:44.311 ****"; the last is the run's total.
ELAPSED = re.compile(r"\(\d+:\d\d:\d\d\.\d+\)\s+(\d+):(\d\d):(\d\d\.\d+) \*+\s*$", re.MULTILINE)
SLOW_TASK = re.compile(r"^(?P<name>\S.*?) -+ (?P<seconds>\d+(?:\.\d+)?)s$", re.MULTILINE)


@dataclass(frozen=True)
class PlaybookProfile:
    total_s: float
    changed: dict[str, int]
    failed: dict[str, int]
    slowest: list[tuple[str, float]]

    @property
    def changed_total(self) -> int:
        return sum(self.changed.values())


def parse(output: str) -> PlaybookProfile:
    """The figures of one ansible-playbook run's output; ValueError names what is missing."""
    stamps = ELAPSED.findall(output)
    if not stamps:
        raise ValueError(
            "no profile_tasks timings: run ansible-playbook with ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks"
        )
    hours, minutes, seconds = stamps[-1]
    recap = list(RECAP_LINE.finditer(output))
    if not recap:
        raise ValueError("no PLAY RECAP: the output ends before the run did")
    _, _, tasks_recap = output.rpartition("TASKS RECAP")
    return PlaybookProfile(
        total_s=int(hours) * 3600 + int(minutes) * 60 + float(seconds),
        changed={m["host"]: int(m["changed"]) for m in recap},
        failed={m["host"]: int(m["failed"]) for m in recap},
        slowest=[(m["name"], float(m["seconds"])) for m in SLOW_TASK.finditer(tasks_recap)],
    )


# The design's target for an idempotent re-run, as a share of the first run's time.
RERUN_TARGET = 0.25


def report(first: PlaybookProfile, rerun: PlaybookProfile, title: str = "site.yml", top: int = 10) -> str:
    """Markdown: the two runs side by side, the re-run's share of the first, and each run's slowest tasks."""
    share = rerun.total_s / first.total_s
    lines = [
        f"### {title}: first run and idempotent re-run",
        "",
        "| run | time | changed (all hosts) | failed |",
        "|---|---|---|---|",
        f"| first | {first.total_s:.0f} s | {first.changed_total} | {sum(first.failed.values())} |",
        f"| re-run | {rerun.total_s:.0f} s | {rerun.changed_total} | {sum(rerun.failed.values())} |",
        "",
        f"The re-run took {share:.0%} of the first run's time (target: at most {RERUN_TARGET:.0%},"
        f" {'met' if share <= RERUN_TARGET else 'missed'}).",
    ]
    for label, profile in (("first run", first), ("re-run", rerun)):
        lines += ["", f"The {top} slowest tasks of the {label}:", "", "| task | s |", "|---|---|"]
        # Task names hold "|" (role : file | name): escaped, or it would split the row.
        lines += [f"| {name.replace('|', chr(92) + '|')} | {seconds:.1f} |" for name, seconds in profile.slowest[:top]]
    return "\n".join(lines) + "\n"
