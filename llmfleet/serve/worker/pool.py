"""The engine pool: least-outstanding-requests balancing, health checks, ejection, re-admission.

- Active checks: every health_interval_s each engine's GET /health (200 or
  not) and, when healthy, GET /v1/models (the served names and max_model_len).
  A non-200 answer or a refused connection takes the engine out at once. A
  check that times out takes an admitted engine out only after
  slow_checks_to_remove of them in a row: an engine busy on a loaded host may
  answer one check late, and taking every such engine out at once left no
  engine for the model, so requests were answered 503 while all of them served.
- Passive ejection: eject_after consecutive failed requests (connection
  errors, timeouts, 5xx) eject an engine for at least eject_s; only a
  successful health check after that re-admits it. This catches the engine
  that says "healthy" on /health but fails every request.
- Balancing, by the model's policy (docs/gateway.md, "Choosing an engine"):
  - least_outstanding (the default): among admitted engines serving the
    model, the one with the fewest requests this worker has open on it; ties
    go round-robin, so an idle pool spreads work instead of always picking
    the first engine;
  - prefix_affinity: the engine the request's key maps to on a consistent-hash
    ring with bounded loads (affinity.py), so a conversation's turns find the
    engine that holds their prefix in its cache.
  A retry avoids the engines that failed it (`exclude`) under either policy.
- Draining: an engine in the queue's drained set (`llmfleet worker drain`)
  gets no new requests; those running on it finish. The worker reads the set
  every report round.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmfleet.serve.queue.registry import EngineReport
from llmfleet.serve.worker import affinity
from llmfleet.serve.worker.config import Policy
from llmfleet.serve.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)


@dataclass
class Engine:
    url: str
    healthy: bool = False
    checked: bool = False
    ejected_until: float = 0.0
    consecutive_failures: int = 0
    slow_checks: int = 0  # health checks in a row that timed out
    outstanding: int = 0
    drained: bool = False
    models: dict[str, int] = field(default_factory=dict)

    def admitted(self, now: float) -> bool:
        return self.healthy and not self.drained and now >= self.ejected_until


class EnginePool:
    def __init__(
        self,
        urls: tuple[str, ...],
        http: aiohttp.ClientSession,
        metrics: WorkerMetrics,
        *,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 2.0,
        slow_checks_to_remove: int = 3,
        eject_after: int = 2,
        eject_s: float = 10.0,
        policy: Policy = "least_outstanding",
        model_policies: Mapping[str, Policy] | None = None,
        affinity_epsilon: float = 0.25,
        affinity_prefix_chars: int = 8192,
    ) -> None:
        self.engines = [Engine(url) for url in urls]
        self.policy = policy
        self.model_policies = dict(model_policies or {})
        self.affinity_epsilon = affinity_epsilon
        self.affinity_prefix_chars = affinity_prefix_chars
        # Every configured engine, whatever its state: pick skips those that may not take a request.
        self.ring = affinity.HashRing(urls)
        self.http = http
        self.metrics = metrics
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.slow_checks_to_remove = slow_checks_to_remove
        self.eject_after = eject_after
        self.eject_s = eject_s
        self._turn = itertools.count()
        self.changed = asyncio.Event()
        for engine in self.engines:
            metrics.engine_up.labels(engine.url).set(0)
            metrics.engine_drained.labels(engine.url).set(0)
            metrics.engine_outstanding.labels(engine.url).set(0)

    def policy_for(self, model: str) -> Policy:
        return self.model_policies.get(model, self.policy)

    def pick(
        self, model: str, exclude: frozenset[str] = frozenset(), payload: Mapping[str, Any] | None = None
    ) -> Engine | None:
        """An admitted engine serving model, avoiding `exclude` if possible, chosen by the model's policy.

        prefix_affinity needs the request body (payload) for its key; without
        one, or with a single candidate, the choice is least_outstanding's.
        """
        now = time.monotonic()
        serving = [engine for engine in self.engines if engine.admitted(now) and model in engine.models]
        candidates = [engine for engine in serving if engine.url not in exclude] or serving
        if not candidates:
            return None
        policy = self.policy_for(model)
        if policy == "prefix_affinity" and payload is not None and len(candidates) > 1:
            key = affinity.request_key(model, payload, self.affinity_prefix_chars)
            by_url = {engine.url: engine for engine in candidates}
            chosen = affinity.choose(
                self.ring, key, {url: engine.outstanding for url, engine in by_url.items()}, self.affinity_epsilon
            )
            if chosen is not None:
                url, first_choice = chosen
                if not first_choice:
                    self.metrics.affinity_spills.inc()
                self.metrics.engine_picks.labels(url, policy).inc()
                return by_url[url]
        least = min(engine.outstanding for engine in candidates)
        tied = [engine for engine in candidates if engine.outstanding == least]
        engine = tied[next(self._turn) % len(tied)]
        self.metrics.engine_picks.labels(engine.url, policy).inc()
        return engine

    def served_models(self) -> set[str]:
        """The models the admitted engines serve: the worker takes only their jobs."""
        now = time.monotonic()
        return {model for engine in self.engines if engine.admitted(now) for model in engine.models}

    def serves(self, model: str) -> bool:
        return model in self.served_models()

    @contextlib.contextmanager
    def using(self, engine: Engine) -> Iterator[None]:
        engine.outstanding += 1
        self.metrics.engine_outstanding.labels(engine.url).set(engine.outstanding)
        try:
            yield
        finally:
            engine.outstanding -= 1
            self.metrics.engine_outstanding.labels(engine.url).set(engine.outstanding)

    def set_drained(self, urls: set[str]) -> None:
        """Mark the engines listed in the drained set; the others take work again."""
        for engine in self.engines:
            drained = engine.url in urls
            if drained != engine.drained:
                log.info("engine %s %s", engine.url, "drained: no new requests" if drained else "takes requests again")
                engine.drained = drained
                self.metrics.engine_drained.labels(engine.url).set(1 if drained else 0)
                self.metrics.engine_up.labels(engine.url).set(1 if engine.admitted(time.monotonic()) else 0)
                self.changed.set()

    def succeeded(self, engine: Engine) -> None:
        engine.consecutive_failures = 0

    def failed(self, engine: Engine, reason: str) -> None:
        engine.consecutive_failures += 1
        if engine.consecutive_failures >= self.eject_after and engine.healthy:
            log.warning(
                "ejecting engine %s after %d failed requests (last: %s); a health check re-admits it after %.0f s",
                engine.url,
                engine.consecutive_failures,
                reason,
                self.eject_s,
            )
            engine.healthy = False
            engine.ejected_until = time.monotonic() + self.eject_s
            self.metrics.engine_ejections.labels(engine.url).inc()
            self.metrics.engine_up.labels(engine.url).set(0)
            self.changed.set()

    async def alive(self, engine: Engine) -> bool:
        """Whether the engine's /health answers 200 now (after a failed request: did the engine die?)."""
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
            async with self.http.get(f"{engine.url}/health", timeout=timeout) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def check(self, engine: Engine) -> None:
        """One active check: /health, then /v1/models when healthy."""
        healthy = False
        timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
        try:
            async with self.http.get(f"{engine.url}/health", timeout=timeout) as response:
                await response.read()  # read to the end, so the connection is kept for the next check
                healthy = response.status == 200
            if healthy:
                async with self.http.get(f"{engine.url}/v1/models", timeout=timeout) as response:
                    response.raise_for_status()
                    served = json.loads(await response.read())["data"]
                engine.models = {str(model["id"]): int(model.get("max_model_len") or 0) for model in served}
        except TimeoutError:
            engine.slow_checks += 1
            if engine.healthy and engine.slow_checks < self.slow_checks_to_remove:
                return  # it stays in: one late answer on a busy host is not a dead engine
            if engine.healthy or not engine.checked:
                log.warning("engine %s timed out %d health checks in a row", engine.url, engine.slow_checks)
            healthy = False
        except (aiohttp.ClientError, ValueError, KeyError, TypeError) as error:
            if engine.healthy or not engine.checked:
                log.warning("engine %s failed its health check: %s", engine.url, type(error).__name__)
            healthy = False
        else:
            engine.slow_checks = 0
        was = engine.admitted(time.monotonic())
        engine.checked = True
        if healthy and time.monotonic() >= engine.ejected_until:
            if not engine.healthy:
                log.info("engine %s admitted (models: %s)", engine.url, ", ".join(sorted(engine.models)))
            engine.healthy = True
            engine.consecutive_failures = 0
        elif not healthy:
            engine.healthy = False
        now_admitted = engine.admitted(time.monotonic())
        self.metrics.engine_up.labels(engine.url).set(1 if now_admitted else 0)
        if was != now_admitted:
            self.changed.set()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(engine) for engine in self.engines))

    async def run_checks(self) -> None:
        """Check every engine every health_interval_s, forever."""
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_all()

    def reports(self) -> list[EngineReport]:
        now = time.monotonic()
        return [
            EngineReport(
                url=engine.url,
                healthy=engine.admitted(now),
                models=dict(engine.models),
                outstanding=engine.outstanding,
                drained=engine.drained,
            )
            for engine in self.engines
        ]

    async def wait_changed(self, timeout_s: float) -> None:
        """Wait until an engine is admitted or ejected, or timeout_s passes."""
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout_s)
