"""The queue timeout bounds a request's wait for its first worker only (issue 17: redelivery keeps its time).

A request redelivered after a worker died, stalled or drained is run however long the redelivery took; its
client's own deadline still cuts the engine call (EngineCaller) and the gateway's wait.
"""

from __future__ import annotations

import pytest

from llmfleet.serve.queue.consumer import Entry
from llmfleet.serve.worker.job import past_queue_timeout
from tests.queue_tools import QUEUE_DEADLINE_MS, sample_job


def entry(*, reclaimed: bool) -> Entry:
    return Entry("default", "1-0", {"id": "a" * 32}, reclaimed=reclaimed)


@pytest.mark.parametrize(
    ("reclaimed", "attempt", "now", "timed_out"),
    [
        (False, 1, QUEUE_DEADLINE_MS - 1, False),  # first delivery, in time
        (False, 1, QUEUE_DEADLINE_MS + 1, True),  # first delivery, waited too long: 504 without an engine call
        (True, 1, QUEUE_DEADLINE_MS + 1, False),  # taken by a worker that died before starting it: reclaimed
        (False, 2, QUEUE_DEADLINE_MS + 1, False),  # started once, handed back on a drain
        (True, 3, QUEUE_DEADLINE_MS + 50_000, False),  # past even the job's deadline: the engine call answers 504
    ],
)
def test_the_queue_timeout_counts_only_the_wait_for_a_first_worker(
    reclaimed: bool, attempt: int, now: int, timed_out: bool
) -> None:
    assert past_queue_timeout(sample_job(), entry(reclaimed=reclaimed), attempt, now) is timed_out


def test_the_rule_reads_the_jobs_own_queue_deadline() -> None:
    later = sample_job(queue_deadline_ms=QUEUE_DEADLINE_MS + 10_000)
    assert past_queue_timeout(later, entry(reclaimed=False), 1, QUEUE_DEADLINE_MS + 1) is False
