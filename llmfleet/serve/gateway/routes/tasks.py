"""GET and DELETE /v1/tasks/{id}: a request's status and, once finished, its result (for the retention period).

Any request can be read back this way, not only those queued with
`Prefer: respond-async`: a client whose connection dropped can still fetch
its answer. Only the subject that made the request can see it; for anyone
else it does not exist (404).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from llmfleet.serve.gateway.deps import AppState, PrincipalDep, StateDep
from llmfleet.serve.gateway.errors import APIError, queue_errors_as_503
from llmfleet.serve.gateway.routes import errors
from llmfleet.serve.gateway.schemas import TaskState, TaskStatus

router = APIRouter(tags=["tasks"])

TaskId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the id from the 202 (or x-request-id)")]


async def task_status(task_id: str, subject: str, state: AppState) -> TaskStatus:
    """The task's status and, once finished, its result; 404 for anyone but its subject."""
    with queue_errors_as_503():
        job = await state.producer.job_state(task_id)
        result = await state.producer.result(task_id)
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
