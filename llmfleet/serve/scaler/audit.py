"""The audit log: one JSON object a line, appended and fsynced, for every decision and every action's end.

Records (field `event`):
- `decision`: outcome (taken, declined, dry_run), code, reason, kind,
  direction, the alerts behind it (name, fingerprint, startsAt, group key),
  the action (id, host or worker counts) when one was taken, and
  `decide_ms`, the time the decision took;
- `action_end`: the action id, result (ansible-runner's status), rc,
  duration_s, the artifacts directory;
- `interrupted`, `resumed`, `abandoned`: an action found in flight at start-up
  and what was done about it;
- `gave_up`: a kind and direction's max_failures-th failed action in a row,
  with the alerts now declined `gave_up`; `reset`: an operator cleared the
  failures (POST /failures/reset), and which;
- `rejected`: a webhook call refused before any decision (401, 400, 413),
  with the reason; never the token or the body.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from llmfleet.serve.scaler.policy import Decision


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"time": time.time(), "event": event, **fields}
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return record

    def decision(self, decision: Decision, *, dry_run: bool, decide_ms: float) -> dict[str, Any]:
        outcome = "dry_run" if dry_run and decision.outcome == "taken" else decision.outcome
        action = decision.action.model_dump(mode="json") if decision.action else None
        return self.write(
            "decision",
            outcome=outcome,
            code=decision.code,
            reason=decision.reason,
            kind=decision.kind,
            direction=decision.direction,
            alerts=[
                {"name": a.name, "fingerprint": a.fingerprint, "starts_at": a.starts_at, "group_key": a.group_key}
                for a in decision.alerts
            ],
            action=action,
            decide_ms=round(decide_ms, 3),
        )


def read(path: Path) -> list[dict[str, Any]]:
    """Every record of an audit log (for `llmfleet scaler status` and the tests)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]
