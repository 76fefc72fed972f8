"""A Locust file that sends the requests `llmfleet bench` sends, for operators who measure with Locust.

    llmfleet bench locust --url http://10.77.0.10:8080 --token-file T --concurrency 32 --duration 30

runs it headless from Locust's pinned venv (llmfleet.bench.locustrun). By hand,
with the same venv and Locust's own options (its web UI, say):

    LLMFLEET_BENCH_TOKEN_FILE=T <venv>/bin/locust -f llmfleet/bench/locustfile.py --host URL

The request is llmfleet.bench.loadgen's, imported, not copied: the same path
(--bench-endpoint: chat or completions), the same JSON body (model, the prompt,
max_tokens, ignore_eos) byte for byte, and the bearer token read by the same
function from the file named by $LLMFLEET_BENCH_TOKEN_FILE (the token is never
on a command line; unset, no Authorization header is sent). An answer counts as
it does for `llmfleet bench`: status 200 and a body with usage.completion_tokens;
anything else is a failure.

The load is Locust's: each user sends its next request when its last one is
answered (`llmfleet bench --concurrency`), or, with --bench-rate R, each of the
-u users keeps a schedule of R/users requests per second. That is not bench's
open loop: a user whose answer comes after its next request was due sends that
one late (as soon as the answer is in), and Locust counts latency from the
send, not from when the request was due; give enough users that each answer
comes within users/R seconds.

Only Locust runs this file; nothing in the llmfleet package imports it.
"""

# mypy: allow-subclassing-any, allow-untyped-decorators
# (Locust lives in its own venv, not in the one mypy checks the package from: its
# import is unresolved there, and its classes and decorators untyped.)

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from locust import FastHttpUser, events, task  # type: ignore[import-not-found]

# Locust's venv holds Locust only: llmfleet is imported from the checkout (or
# the installed package) this file belongs to, two levels up.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmfleet.bench import loadgen
from llmfleet.errors import LlmfleetError

TOKEN_FILE_ENV = "LLMFLEET_BENCH_TOKEN_FILE"  # noqa: S105 (the name of a variable holding a path)


def _token_headers() -> dict[str, str]:
    try:
        return loadgen.read_token(os.environ.get(TOKEN_FILE_ENV) or None)
    except LlmfleetError as error:
        raise SystemExit(f"locustfile: the token file in ${TOKEN_FILE_ENV}: {error}") from None


# Read once, when Locust loads the file: a missing or empty token file stops it before any load.
HEADERS = {"Content-Type": "application/json", **_token_headers()}


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--bench-model", default="tiny", help="served model name (default tiny)")
    parser.add_argument(
        "--bench-endpoint", choices=sorted(loadgen.PATHS), default="chat", help="API to call (default chat)"
    )
    parser.add_argument("--bench-max-tokens", type=int, default=16, help="tokens per answer (default 16)")
    parser.add_argument(
        "--bench-rate",
        type=float,
        default=0.0,
        help="requests per second over all -u users, each keeping a schedule of its share (default 0: back to back)",
    )


class BenchUser(FastHttpUser):
    """One client sending loadgen's request again and again."""

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.path = loadgen.PATHS[options.bench_endpoint]
        self.body = loadgen.request_body(options.bench_model, options.bench_endpoint, options.bench_max_tokens)
        # With --bench-rate each user keeps a schedule: a request due every interval_s, the
        # first at a random point of the first interval (so the users do not all start at once).
        self.interval_s = 0.0
        if options.bench_rate > 0:
            self.interval_s = max(1, int(options.num_users or 1)) / options.bench_rate
            self.next_due = time.monotonic() + random.uniform(0, self.interval_s)  # noqa: S311 (not a secret)
            time.sleep(max(0.0, self.next_due - time.monotonic()))

    def wait_time(self) -> float:
        """Back to back; or until the next request is due, none if it is late (sent once the last is answered)."""
        if not self.interval_s:
            return 0.0
        self.next_due += self.interval_s
        return max(0.0, self.next_due - time.monotonic())

    @task
    def completion(self) -> None:
        with self.client.post(self.path, data=self.body, headers=HEADERS, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}")
                return
            try:
                int(json.loads(response.content)["usage"]["completion_tokens"])
            except (ValueError, KeyError, TypeError):
                response.failure("bad-body: no usage.completion_tokens")
