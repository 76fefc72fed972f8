"""Shared by the gateway's and worker's unit tests: one queued request (a Job) to vary field by field."""

from __future__ import annotations

import dataclasses

from llmfleet.serve.queue.jobs import Job

# The sample job's queue deadline: admitted at 1 s, 30 s to wait for a worker, 60 s in all.
QUEUE_DEADLINE_MS = 31_000


def sample_job(**changes: object) -> Job:
    """A non-streaming chat request of alice's for model tiny; `changes` replace any field."""
    base = Job(
        id="a" * 32, kind="chat", model="tiny", payload={"messages": [{"role": "user", "content": "hi"}]},
        stream=False, reply="r", subject="alice", tenant="t", lane="default", prompt_tokens=3, max_tokens=8,
        enqueued_ms=1_000, deadline_ms=61_000, queue_deadline_ms=QUEUE_DEADLINE_MS,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
