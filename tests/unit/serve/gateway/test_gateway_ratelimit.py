"""Rate-limit headers and 429 messages (the counting itself is tested against Redis)."""

from __future__ import annotations

from llmfleet.serve.gateway import ratelimit
from llmfleet.serve.gateway.auth import Principal
from llmfleet.serve.gateway.config import TierLimits
from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.producer import Admission, LimitState

PRINCIPAL = Principal("alice", "acme", frozenset({"*"}), "normal", "default")


def test_limits_skip_zero_and_charge_tokens() -> None:
    tier = TierLimits(
        requests_per_minute=10, tokens_per_minute=1000, tenant_requests_per_minute=0, tenant_tokens_per_minute=5000
    )
    limits = ratelimit.limits_for(PRINCIPAL, tier, Keys("p"), cost_tokens=300)
    assert [(limit.scope, limit.unit, limit.limit, limit.cost) for limit in limits] == [
        ("subject", "requests", 10, 1),
        ("subject", "tokens", 1000, 300),
        ("tenant", "tokens", 5000, 300),
    ]
    assert limits[0].key == "p:rl:sub:req:alice"


def test_headers_and_refusals() -> None:
    tier = TierLimits(requests_per_minute=10, tokens_per_minute=1000)
    limits = ratelimit.limits_for(PRINCIPAL, tier, Keys("p"), cost_tokens=300)
    states = (LimitState(limits[0], 4, 61_500), LimitState(limits[1], 200, 1_000))
    headers = ratelimit.headers(states)
    assert headers["x-ratelimit-remaining-requests"] == "3"  # after this request
    assert headers["x-ratelimit-remaining-tokens"] == "200"  # too few for its cost: not subtracted
    assert headers["x-ratelimit-reset-requests"] == "61.5s"
    refusal = ratelimit.refusal(
        Admission("rate_limited", refused_by=limits[1], retry_after_ms=2_100, limits=states), tier
    )
    assert refusal.status == 429 and refusal.headers["Retry-After"] == "3" and refusal.code == "tokens_limit_exceeded"
    concurrency = ratelimit.refusal(Admission("rate_limited", retry_after_ms=1000), tier)
    assert concurrency.code == "concurrency_limit_exceeded" and "in flight" in concurrency.message
