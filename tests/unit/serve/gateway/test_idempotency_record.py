"""What an Idempotency-Key stands for (llmfleet/serve/gateway/idempotency.py): the record and its digest."""

from __future__ import annotations

import re

from llmfleet.serve.gateway.idempotency import PATTERN, Record
from llmfleet.serve.queue.keys import Keys
from tests.queue_tools import sample_job as job


def test_the_same_request_has_the_same_digest_whatever_its_id_time_or_key_order() -> None:
    first = Record.of(job(), task=False)
    retry = Record.of(job(id="b" * 32, enqueued_ms=5_000, deadline_ms=65_000), task=False)
    reordered = Record.of(job(payload={"messages": [{"content": "hi", "role": "user"}]}), task=False)
    assert first.fingerprint == retry.fingerprint == reordered.fingerprint


def test_another_body_model_stream_flag_or_mode_is_another_request() -> None:
    first = Record.of(job(), task=False).fingerprint
    others = [
        Record.of(job(payload={"messages": [{"role": "user", "content": "ho"}]}), task=False),
        Record.of(job(model="tiny-b"), task=False),
        Record.of(job(stream=True), task=False),
        Record.of(job(kind="completion"), task=False),
        Record.of(job(), task=True),
    ]
    assert len({first, *(other.fingerprint for other in others)}) == 6


def test_a_record_survives_its_json_round_trip() -> None:
    record = Record.of(job(), task=True)
    assert Record.from_json(record.to_json()) == record


def test_keys_are_per_subject_and_hide_the_clients_text() -> None:
    keys = Keys("llmfleet")
    alice, bob = keys.idempotency("alice", "retry-1"), keys.idempotency("bob", "retry-1")
    assert alice != bob
    assert alice.startswith("llmfleet:idem:") and "retry-1" not in alice


def test_the_header_pattern_takes_visible_ascii_only() -> None:
    assert re.fullmatch(PATTERN, "order-2026-12-02_01:retry")
    for bad in ["", "has space", "x" * 256, "caf\u00e9", "tab\there"]:
        assert not re.fullmatch(PATTERN, bad), bad
