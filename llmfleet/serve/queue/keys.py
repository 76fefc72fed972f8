"""Every Redis key the queue uses, derived from one prefix (docs/gateway.md lists them).

One Redis primary holds them all; the Lua scripts build per-request key names
from the prefix, so Redis Cluster (which needs every key in KEYS) is not supported.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

GROUP = "workers"
# The model of the lanes shared by every model before lanes were per model (Keys.lane).
LEGACY_MODEL = ""


@dataclass(frozen=True)
class Keys:
    prefix: str

    def lane(self, lane: str, model: str) -> str:
        """The stream of one model's priority lane; consumer group GROUP.

        Each model has its own lanes, so that a worker reads only the models its
        engines serve. LEGACY_MODEL names the lanes every model shared before
        (`<prefix>:q:<lane>`): workers read them while they exist, so that what an
        older gateway queued is still served after an upgrade.
        """
        return f"{self.prefix}:q:{model}:{lane}" if model else f"{self.prefix}:q:{lane}"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}:dlq"

    def reply(self, gateway_id: str) -> str:
        """One gateway process's reply stream: chunks and final results for its waiters."""
        return f"{self.prefix}:reply:{gateway_id}"

    def job(self, request_id: str) -> str:
        """Hash: owner, attempts, state, subject, ... of one request."""
        return f"{self.prefix}:job:{request_id}"

    def result(self, request_id: str) -> str:
        """The first result of one request (SET NX), kept for the retention period."""
        return f"{self.prefix}:result:{request_id}"

    def partial(self, request_id: str) -> str:
        """Text a streaming request has already sent to its client (for continuation)."""
        return f"{self.prefix}:partial:{request_id}"

    def cancel(self, request_id: str) -> str:
        return f"{self.prefix}:cancel:{request_id}"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    @property
    def engines(self) -> str:
        """Hash: worker id -> JSON report of the engines it sees."""
        return f"{self.prefix}:engines"

    @property
    def drained(self) -> str:
        """Set of engine URLs the workers send no new requests to (`llmfleet worker drain`)."""
        return f"{self.prefix}:drained"

    def concurrency(self, subject: str) -> str:
        """Sorted set of a subject's in-flight request ids, scored by lease expiry (ms)."""
        return f"{self.prefix}:conc:{subject}"

    def idempotency(self, subject: str, key: str) -> str:
        """The request one subject's Idempotency-Key stands for (hashed: the key is the client's free text)."""
        digest = hashlib.sha256(f"{subject}\0{key}".encode()).hexdigest()
        return f"{self.prefix}:idem:{digest}"

    def rate(self, scope: str, name: str, unit: str) -> str:
        """Sliding-window counter of one limit: scope sub|tenant, unit req|tok."""
        return f"{self.prefix}:rl:{scope}:{unit}:{name}"

    def usage(self, day: str, subject: str, model: str) -> str:
        """Hash: requests, errors, prompt and completion tokens of one subject's answers from one model that day.

        The subject and the model are escaped (`%` and `:`), so that no two pairs share a key.
        """
        return f"{self.prefix}:usage:{day}:{_escape(subject)}:{_escape(model)}"

    def usage_index(self, day: str) -> str:
        """Set: the (subject, model) pairs with a usage record that day (usage.pair_member)."""
        return f"{self.prefix}:usage:{day}"

    def spend(self, period: str, when: str, subject: str) -> str:
        """Hash `used`, `held`: a subject's tokens in one period, d (a day) or m (a month), for its budgets."""
        return f"{self.prefix}:spend:{period}:{when}:{_escape(subject)}"

    @property
    def budgets(self) -> str:
        """Hash: `<daily|monthly>:<tier|sub>:<name>` -> token budget (usage.py)."""
        return f"{self.prefix}:budgets"


def _escape(part: str) -> str:
    """A free-text part of a key name with `%` and `:` escaped, so it cannot run into the next part."""
    return part.replace("%", "%25").replace(":", "%3A")
