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


def test_a_budget_refusal_is_a_429_until_the_reset_in_either_shape() -> None:
    import asyncio
    import json
    from datetime import UTC, datetime

    from starlette.requests import Request

    from llmfleet.serve.gateway.errors import api_error_handler
    from llmfleet.serve.queue.usage import BudgetRefusal

    now_ms = int(datetime(2026, 12, 4, 18, 0, tzinfo=UTC).timestamp() * 1000)
    error = ratelimit.budget_refusal(BudgetRefusal("monthly", "sub", "alice", 5000, 4990, 40), now_ms)
    assert error.status == 429 and error.code == "monthly_budget_exceeded" and error.kind == "rate_limit_error"
    assert "monthly token budget of subject 'alice'" in error.message
    assert "resets at 2027-01-01T00:00:00Z" in error.message
    assert error.headers["Retry-After"] == str(27 * 86400 + 6 * 3600)

    def answered(path: str) -> dict[str, object]:
        request = Request({"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""})
        response = asyncio.run(api_error_handler(request, error))
        assert response.status_code == 429 and response.headers["retry-after"] == error.headers["Retry-After"]
        body: dict[str, object] = json.loads(bytes(response.body))
        return body

    openai = answered("/v1/chat/completions")
    assert openai["error"] == {
        "message": error.message,
        "type": "rate_limit_error",
        "code": "monthly_budget_exceeded",
        "param": None,
    }
    # Anthropic's shape on its route, with its rate-limit type: its SDK raises RateLimitError.
    anthropic = answered("/v1/messages")
    assert anthropic == {"type": "error", "error": {"type": "rate_limit_error", "message": error.message}}
