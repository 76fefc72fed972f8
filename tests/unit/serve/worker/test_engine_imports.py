"""The engine call knows no Redis: engine.py talks HTTP to engines, job.py takes the job through the queue.

What a call must tell the queue while it runs (chunks, engine deaths) goes
through the Reporter it is given (issue 33), so the two stay apart.
"""

from __future__ import annotations

import ast

from llmfleet.paths import REPO_ROOT

ENGINE = REPO_ROOT / "llmfleet" / "serve" / "worker" / "engine.py"
QUEUE_SIDE = {"llmfleet.serve.queue.consumer", "llmfleet.serve.worker.job", "llmfleet.serve.worker.outage"}


def test_the_engine_call_imports_neither_redis_nor_the_queue_side_of_the_worker() -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(ENGINE.read_text())):  # imports inside functions too
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    forbidden = {name for name in imported if name.split(".")[0] == "redis" or name in QUEUE_SIDE}
    assert forbidden == set(), f"engine.py imports {sorted(forbidden)}"
