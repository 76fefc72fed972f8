"""GET and DELETE /v1/tasks/{id}: a request's status and, once finished, its result (for the retention period).

Any request can be read back this way, not only those queued with
`Prefer: respond-async`: a client whose connection dropped can still fetch
its answer. Only the subject that made the request can see it; for anyone
else it does not exist (404).

A task this gateway process admitted whose job record and result are both
gone before its deadline was lost by Redis (a restart that lost the last
writes): it reads as failed, with a retryable 503 `request_lost` as its
result (ADMITTED remembers the process's tasks until their deadline).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, Path

from llmfleet.serve.gateway.deps import AppState, PrincipalDep, StateDep
from llmfleet.serve.gateway.errors import APIError, queue_errors_as_503
from llmfleet.serve.gateway.routes import errors
from llmfleet.serve.gateway.schemas import TaskState, TaskStatus
from llmfleet.serve.queue.jobs import Result, error_body, now_ms

router = APIRouter(tags=["tasks"])

# Retry-After (s) of a request Redis lost: nothing of it is left, so sending it again is all there is to do.
LOST_RETRY_AFTER_S = 1


def lost_body() -> dict[str, Any]:
    message = "the queue lost this request (its Redis restarted without the latest writes); send it again"
    return error_body(message, "server_error", "request_lost", param=None)


def lost_result() -> Result:
    return Result(503, lost_body())


class AdmittedTasks:
    """Task ids this process admitted, with their subject, until their deadline (at most `limit`, oldest dropped)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._tasks: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.reported: set[str] = set()

    def add(self, task_id: str, subject: str, deadline_ms: int) -> None:
        self._prune()
        self._tasks[task_id] = (subject, deadline_ms)
        while len(self._tasks) > self.limit:
            self.reported.discard(self._tasks.popitem(last=False)[0])

    def known(self, task_id: str, subject: str) -> bool:
        """Admitted here for this subject, and its deadline not past (its job record must still exist)."""
        entry = self._tasks.get(task_id)
        return entry is not None and entry[0] == subject and entry[1] >= now_ms()

    def _prune(self) -> None:
        now = now_ms()
        # Deadlines grow with admission time (one timeout for all), so the oldest go first.
        while self._tasks and next(iter(self._tasks.values()))[1] < now:
            self.reported.discard(self._tasks.popitem(last=False)[0])


ADMITTED = AdmittedTasks()

TaskId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the id from the 202 (or x-request-id)")]


async def task_status(task_id: str, subject: str, state: AppState) -> TaskStatus:
    """The task's status and, once finished, its result; 404 for anyone but its subject."""
    with queue_errors_as_503():
        job = await state.producer.job_state(task_id)
        result = await state.producer.result(task_id)
    if "sub" not in job and ADMITTED.known(task_id, subject):
        # ADMIT's job record is gone: Redis lost the task's writes. A worker still holding it may finish it and
        # store a result (with a bare record) later; once reported lost, it stays lost, so the client's answer
        # does not change under it.
        if result is None or task_id in ADMITTED.reported:
            if task_id not in ADMITTED.reported:
                ADMITTED.reported.add(task_id)
                state.metrics.lost.labels("task").inc()
            return TaskStatus(id=task_id, status="failed", http_status=503, result=lost_body())
        job = {**job, "sub": subject}
    if not job or job.get("sub") != subject:
        raise APIError(
            404,
            f"no task {task_id} (finished tasks are kept for the retention period)",
            "not_found_error",
            "task_not_found",
        )
    attempts = int(job.get("attempts") or 0)
    if result is not None:
        status: TaskState = "completed" if result.ok else ("cancelled" if result.status == 499 else "failed")
        return TaskStatus(id=task_id, status=status, attempts=attempts, http_status=result.status, result=result.body)
    if job.get("state") == "running":
        return TaskStatus(id=task_id, status="running", attempts=attempts)
    return TaskStatus(id=task_id, status="queued", attempts=attempts)


@router.get(
    "/v1/tasks/{task_id}",
    response_model=TaskStatus,
    responses=errors(400, 401, 404, 503),
    summary="A request's status and result",
)
async def get_task(task_id: TaskId, principal: PrincipalDep, state: StateDep) -> TaskStatus:
    return await task_status(task_id, principal.subject, state)


@router.delete(
    "/v1/tasks/{task_id}",
    response_model=TaskStatus,
    responses=errors(400, 401, 404, 503),
    summary="Cancel a request (queued: never starts; running: its engine request stops)",
)
async def cancel_task(task_id: TaskId, principal: PrincipalDep, state: StateDep) -> TaskStatus:
    status = await task_status(task_id, principal.subject, state)
    if status.status in ("queued", "running"):
        with queue_errors_as_503():
            await state.producer.cancel(task_id, principal.subject)
    return status
