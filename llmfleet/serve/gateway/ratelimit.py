"""Rate limits: which limits apply to a request, and the headers and errors that report them.

The counting itself happens in Redis, inside the ADMIT script
(llmfleet/serve/queue/scripts.py), so every gateway process on every host shares
the same counters and a check-then-increment can never race. Each limit is a
sliding window of one minute, estimated from the current and the previous
fixed window (weighted by how much of the previous one still overlaps).

Tokens per minute count prompt tokens + max_tokens at admission: a
reservation, known before the engine runs. Unused tokens are not refunded,
so a client asking for far more max_tokens than it uses reaches the limit early.

Token budgets (daily, monthly: llmfleet/serve/queue/usage.py) are checked in
the same script with the same estimate, held until the answer, which then
charges what the engine reports instead.
"""

from __future__ import annotations

import math

from llmfleet.serve.gateway.auth import Principal
from llmfleet.serve.gateway.config import TierLimits
from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.producer import Admission, Limit, LimitState
from llmfleet.serve.queue.usage import BudgetRefusal

WINDOW_MS = 60_000


def limits_for(principal: Principal, tier: TierLimits, keys: Keys, cost_tokens: int) -> tuple[Limit, ...]:
    """The limits checked for one request. The subject's requests and tokens come first (they make the headers)."""
    candidates = (
        Limit("subject", "requests", keys.rate("sub", principal.subject, "req"), tier.requests_per_minute, 1),
        Limit("subject", "tokens", keys.rate("sub", principal.subject, "tok"), tier.tokens_per_minute, cost_tokens),
        Limit("tenant", "requests", keys.rate("tenant", principal.tenant, "req"), tier.tenant_requests_per_minute, 1),
        Limit(
            "tenant", "tokens", keys.rate("tenant", principal.tenant, "tok"), tier.tenant_tokens_per_minute, cost_tokens
        ),
    )
    return tuple(limit for limit in candidates if limit.limit > 0)


def _seconds(ms: int) -> str:
    return f"{max(ms, 0) / 1000:.3g}s"


def headers(states: tuple[LimitState, ...]) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the subject's request and token limits."""
    out: dict[str, str] = {}
    for state in states:
        if state.limit.scope != "subject":
            continue
        unit = state.limit.unit
        remaining = state.remaining
        if state.limit.cost and remaining >= state.limit.cost:
            remaining -= state.limit.cost  # after this request
        out[f"x-ratelimit-limit-{unit}"] = str(state.limit.limit)
        out[f"x-ratelimit-remaining-{unit}"] = str(max(remaining, 0))
        out[f"x-ratelimit-reset-{unit}"] = _seconds(state.reset_ms)
    return out


def refusal(admission: Admission, tier: TierLimits) -> APIError:
    """The 429 for a refused admission, with Retry-After (whole seconds, rounded up)."""
    retry_after = str(max(1, math.ceil(admission.retry_after_ms / 1000)))
    limit = admission.refused_by
    extra = headers(admission.limits)
    if limit is None:
        message = f"too many requests in flight for this subject (limit {tier.concurrency}); retry after one finishes"
        code = "concurrency_limit_exceeded"
    elif limit.cost > limit.limit:
        message = (
            f"this request needs {limit.cost} {limit.unit} but the {limit.scope} limit is {limit.limit} per minute;"
            " lower max_tokens or shorten the prompt"
        )
        code = f"{limit.unit}_limit_exceeded"
    else:
        message = (
            f"{limit.scope} rate limit of {limit.limit} {limit.unit} per minute reached; retry after {retry_after} s"
        )
        code = f"{limit.unit}_limit_exceeded"
    return APIError(429, message, "rate_limit_error", code, headers={"Retry-After": retry_after, **extra})


def budget_refusal(refusal: BudgetRefusal, now_ms: int) -> APIError:
    """The 429 for a request over a token budget: which budget, and when it resets (Retry-After until then)."""
    retry_after = str(refusal.retry_after_s(now_ms))
    code = f"{refusal.period}_budget_exceeded"
    return APIError(429, refusal.message(now_ms), "rate_limit_error", code, headers={"Retry-After": retry_after})
