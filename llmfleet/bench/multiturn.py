"""`llmfleet bench multiturn`: many conversations of several turns, each turn replaying the last answers.

    llmfleet bench multiturn --engine-url http://127.0.0.1:8001 --engine-url http://127.0.0.1:8002 \\
        --gateway-url http://127.0.0.1:8080 --token-file T --gateway-policy prefix_affinity --rates 2,4,8

What prefix-aware routing is for: vLLM keeps the KV blocks of the prompts it
has served (automatic prefix caching), and turn n + 1 of a conversation starts
with all of turn n. An engine that served turn n prefills only the new part;
any other engine prefills the whole history again.

The workload (`Workload`, `plan_conversation`), deterministic from --seed:
- TENANTS tenants, each with a system prompt of --system-words words, shared
  by that tenant's conversations (an application's fixed instructions);
- each conversation opens with a document of --document-words words of its
  own (the text the user asks about: nothing else shares it) and a question;
  each later turn replays every earlier message, the answers as the engine
  gave them, and adds a question of QUESTION_WORDS words;
- --turns turns, each answer --max-tokens tokens (ignore_eos), streamed, so
  the time to first token is measured.
Words come from the tiny model's tokenizer corpus (about two tokens a
word); at the defaults a turn's prompt holds about 1,000 tokens on average
and the last turn's about 1,200, within the lab's max_model_len of 2048 (each
row reports the mean and the largest).
A run's documents carry a fresh nonce, so one path's run does not warm the
engines' caches for the next; the tenants' system prompts are the same in
every run, as a real application's are warm.

The load is an open loop of conversations (llmfleet.bench.loadgen.open_loop,
each of its requests a conversation): one starts every 1/rate s
(--rates, conversations per second, a ladder, then --saturate more rates
each SATURATE_STEP times the last until the path falls behind), and each
sends its next turn as soon as its last answer is in. A turn sent in the
measured window counts in the latency percentiles; an answer that arrived in
it counts in the throughput (llmfleet.bench.loadgen.summarize). Conversations
go on starting after the window until every one started in it is done, so
the window's edges see the same load as its middle.

Paths, one after another on the same engines:
- direct: each turn to the next engine in turn, round robin (the floor: a
  conversation's turn finds its history with chance about 1/N);
- vllm-router: vLLM's router with --policy round_robin;
- vllm-router-cache-aware: vLLM's router with --policy cache_aware (its
  default: a prefix tree of the text each engine was sent, with load
  balancing past its thresholds);
- gateway: our gateway, queue and workers, labelled `gateway-<policy>` with
  the engine-choice policy the workers run (--gateway-policy: the bench
  cannot switch it; scripts/bench.sh runs this command twice, with the lab's
  workers switched by playbooks/gateway.yml in between, and --append).

Each row also reads every engine's prefix-cache counters (vllm:
prefix_cache_queries and prefix_cache_hits, prompt tokens, per release as
files/engine_metrics lists them) at the window's edges: the hit rate is the
share of the window's prompt tokens served from the cache, over all engines.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import re
import sys
import time
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.bench import compare, loadgen, peers, plots
from llmfleet.errors import LlmfleetError
from llmfleet.lab.tiny import CORPUS

DIRECT = compare.DIRECT
ROUTER = peers.VLLM_ROUTER
ROUTER_CACHE_AWARE = f"{peers.VLLM_ROUTER}-cache-aware"
GATEWAY = compare.GATEWAY
PATHS = (DIRECT, ROUTER, ROUTER_CACHE_AWARE, GATEWAY)
GATEWAY_POLICIES = ("least_outstanding", "prefix_affinity")
DEFAULT_RATES = "1,2,4"
TENANTS = 8
QUESTION_WORDS = 5
# Words of the tiny model's corpus (letters only): one token each, mostly.
WORDS = tuple(sorted({word for line in CORPUS for word in re.findall(r"[A-Za-z]{2,}", line)}))
# The counters of prompt tokens looked up in, and found in, the prefix cache: the
# current releases' names first, then 0.9.2's (which exports both spellings).
CACHE_COUNTERS = (
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
)
METRICS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Workload:
    """What every conversation of a run looks like (the same for every path of a run)."""

    turns: int = 6
    system_words: int = 100
    document_words: int = 300
    max_tokens: int = 16
    model: str = "tiny"
    seed: int = 0


@dataclass(frozen=True)
class Conversation:
    system: str
    document: str
    questions: tuple[str, ...]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def tenant_prompt(workload: Workload, tenant: int) -> str:
    """Tenant `tenant`'s system prompt: the same in every run with the same seed."""
    rng = random.Random(f"{workload.seed}-tenant-{tenant}")  # noqa: S311  # workload text, repeatable by design
    return f"You are assistant {tenant} of this service. {_words(rng, workload.system_words)}"


def plan_conversation(workload: Workload, nonce: str, number: int) -> Conversation:
    """Conversation `number` of the run `nonce`: its tenant's system prompt, a document of its own, its questions."""
    rng = random.Random(f"{workload.seed}-{nonce}-{number}")  # noqa: S311  # workload text, not a secret
    questions = tuple(f"Question {turn + 1}: {_words(rng, QUESTION_WORDS)}?" for turn in range(workload.turns))
    return Conversation(
        system=tenant_prompt(workload, number % TENANTS),
        document=f"Document {nonce}-{number}: {_words(rng, workload.document_words)}",
        questions=questions,
    )


def opening(conversation: Conversation) -> list[dict[str, str]]:
    """The first turn's messages: the system prompt, then the document with the first question."""
    return [
        {"role": "system", "content": conversation.system},
        {"role": "user", "content": f"{conversation.document}\n\n{conversation.questions[0]}"},
    ]


def turn_body(workload: Workload, messages: list[dict[str, str]]) -> bytes:
    """A turn's request: the conversation so far, streamed, with the usage in the last event."""
    return json.dumps(
        {
            "model": workload.model,
            "messages": messages,
            "max_tokens": workload.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def streamed_answer(body: bytes) -> tuple[str, int, int]:
    """(the answer's text, prompt tokens, completion tokens) of a streamed chat answer.

    ValueError for a stream that is not a whole answer: an error event, or no usage event.
    """
    text: list[str] = []
    usage = None
    for line in body.splitlines():
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        event = json.loads(line[5:])
        if "error" in event:
            raise ValueError(f"the stream ended with an error: {event['error']}")
        for choice in event.get("choices") or ():
            text.append((choice.get("delta") or {}).get("content") or "")
        usage = event.get("usage") or usage
    if not usage:
        raise ValueError("the stream holds no usage event")
    return "".join(text), int(usage["prompt_tokens"]), int(usage["completion_tokens"])


@dataclass(frozen=True)
class Turn:
    number: int  # 0 for the opening turn
    sample: loadgen.Sample
    prompt_tokens: int = 0


Pick = Callable[[], loadgen.Target]


async def send_turn(target: loadgen.Target, body: bytes, due: float, number: int) -> tuple[Turn, str | None]:
    """One turn: its record, and the answer's text (None when it failed)."""
    sample, answer = await loadgen.exchange(target, due, target.framed(body))
    if sample.outcome != "ok":
        return Turn(number, sample), None
    try:
        text, prompt_tokens, completion_tokens = streamed_answer(answer)
    except (ValueError, KeyError, TypeError):
        return Turn(number, loadgen.Sample(due, sample.done, "bad-body")), None
    answered = loadgen.Sample(due, sample.done, "ok", completion_tokens, sample.first_token)
    return Turn(number, answered, prompt_tokens), text


async def converse(workload: Workload, conversation: Conversation, pick: Pick, due: float) -> list[Turn]:
    """Every turn of one conversation, each sent when the last was answered; it stops at a failed turn."""
    messages = opening(conversation)
    turns: list[Turn] = []
    for number in range(workload.turns):
        if number:
            messages.append({"role": "user", "content": conversation.questions[number]})
        turn, text = await send_turn(pick(), turn_body(workload, messages), due, number)
        turns.append(turn)
        if text is None:
            break
        messages.append({"role": "assistant", "content": text})
        due = time.perf_counter()
    return turns


def cache_counters(text: str) -> tuple[float, float] | None:
    """(prompt tokens looked up, found) in an engine's /metrics text, summed over its series; None without them."""
    for queries_name, hits_name in CACHE_COUNTERS:
        totals = {queries_name: 0.0, hits_name: 0.0}
        seen = False
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
                seen = True
        if seen:
            return totals[queries_name], totals[hits_name]
    return None


def read_cache_counters(engine: str, headers: dict[str, str]) -> tuple[float, float]:
    """The engine's prefix-cache counters from its /metrics; a clear error when it has none."""
    if not engine.startswith("http://"):
        raise LlmfleetError(f"--engine-url {engine}: give an http:// URL (the benchmark speaks plain HTTP/1.1)")
    request = urllib.request.Request(engine.rstrip("/") + "/metrics", headers=headers)  # noqa: S310  # http:// only
    try:
        with urllib.request.urlopen(request, timeout=METRICS_TIMEOUT_S) as response:  # noqa: S310  # http:// only
            text = response.read().decode()
    except OSError as error:
        raise LlmfleetError(f"{engine}/metrics: {error}") from None
    counters = cache_counters(text)
    if counters is None:
        names = ", ".join(queries for queries, _ in CACHE_COUNTERS)
        raise LlmfleetError(f"{engine}/metrics has none of {names}: is prefix caching on (the vllm role's check)?")
    return counters


@dataclass
class Row:
    """One path at one offered rate of conversations."""

    path: str
    rate: float  # conversations started per second
    report: loadgen.Report  # of the turns: throughput in turns per second, TTFT and end-to-end latency
    conversations: int = 0  # started in the window
    later_ttft_p50_ms: float | None = None  # turns after the first: those that can find their history
    later_ttft_p95_ms: float | None = None
    prompt_tokens_mean: float = 0.0
    prompt_tokens_max: int = 0
    # Prompt tokens the engines looked up in, and found in, their prefix caches in the window.
    cache_queries: float = 0.0
    cache_hits: float = 0.0
    hit_rate: float | None = None
    # Each engine's share of the window's prompt tokens: how evenly the path spread the load.
    engine_shares: dict[str, float] = field(default_factory=dict)


def summarize(
    path: str,
    rate: float,
    turns: list[Turn],
    window: tuple[float, float],
    started: int,
    caches: dict[str, tuple[tuple[float, float], tuple[float, float]]],
) -> Row:
    """The row of one run: the turns' report over the window, later turns' TTFT, prompt sizes, the caches' figures.

    caches: engine -> ((queries, hits) at the window's start, (queries, hits) at its end).
    """
    report = loadgen.summarize(path, "", "rate", rate, [turn.sample for turn in turns], *window)
    measured = [turn for turn in turns if window[0] <= turn.sample.due < window[1] and turn.sample.outcome == "ok"]
    later = sorted(
        (turn.sample.first_token - turn.sample.due) * 1000
        for turn in measured
        if turn.number and turn.sample.first_token is not None
    )
    prompts = [turn.prompt_tokens for turn in measured]
    queried = {engine: end[0] - begin[0] for engine, (begin, end) in caches.items()}
    queries = sum(queried.values())
    hits = sum(end[1] - begin[1] for begin, end in caches.values())
    return Row(
        path=path,
        rate=rate,
        report=report,
        conversations=started,
        later_ttft_p50_ms=round(loadgen.percentile(later, 50), 1) if later else None,
        later_ttft_p95_ms=round(loadgen.percentile(later, 95), 1) if later else None,
        prompt_tokens_mean=round(sum(prompts) / len(prompts), 1) if prompts else 0.0,
        prompt_tokens_max=max(prompts, default=0),
        cache_queries=queries,
        cache_hits=hits,
        hit_rate=round(hits / queries, 3) if queries > 0 else None,
        engine_shares={engine: round(count / queries, 3) for engine, count in queried.items()} if queries > 0 else {},
    )


async def measure(
    args: argparse.Namespace,
    workload: Workload,
    path: str,
    rate: float,
    bases: list[str],
    headers: dict[str, str],
    engine_headers: dict[str, str],
) -> Row:
    """One open-loop run of conversations at `rate` through `bases` (each turn to the next in turn)."""
    connections = max(64, math.ceil(rate * workload.turns * 4))
    per_target = math.ceil(connections / len(bases))
    url = loadgen.PATHS["chat"]
    targets = [loadgen.Target(base.rstrip("/") + url, b"", headers, per_target, stream=True) for base in bases]
    turn = itertools.cycle(targets)
    nonce = f"{time.time_ns():x}"
    numbers = itertools.count()
    started_in_window = 0
    window_start = time.perf_counter() + args.warmup
    window = (window_start, window_start + args.duration)

    def start(due: float) -> Coroutine[Any, Any, list[Turn]]:
        """Conversation number n, the n-th the open loop starts."""
        nonlocal started_in_window
        if window[0] <= due < window[1]:
            started_in_window += 1
        return converse(workload, plan_conversation(workload, nonce, next(numbers)), lambda: next(turn), due)

    async def caches_at(moment: float) -> dict[str, tuple[float, float]]:
        await loadgen.sleep_until(moment)
        read = [asyncio.to_thread(read_cache_counters, engine, engine_headers) for engine in args.engine_url]
        return dict(zip(args.engine_url, await asyncio.gather(*read), strict=True))

    try:
        async with asyncio.TaskGroup() as group:
            before = group.create_task(caches_at(window[0]))
            after = group.create_task(caches_at(window[1]))
            turns = [turn for turns in await loadgen.open_loop(start, rate, *window) for turn in turns]
    finally:
        for target in targets:
            target.close()
    caches = {engine: (before.result()[engine], after.result()[engine]) for engine in args.engine_url}
    return summarize(path, rate, turns, window, started_in_window, caches)


def saturated(row: Row, turns: int) -> bool:
    """Whether the path fell behind: fewer turns answered in the window than the rate asks for, or any error."""
    return row.report.throughput_rps < compare.SATURATED * row.rate * turns or bool(row.report.errors)


def row_label(path: str, args: argparse.Namespace) -> str:
    """A path's label in the rows: the gateway's names the workers' policy."""
    return f"{GATEWAY}-{args.gateway_policy}" if path == GATEWAY else path


def run_path(args: argparse.Namespace, workload: Workload, path: str, rates: list[float]) -> list[Row]:
    """Every rate of the ladder (and past it under --saturate) through one path; a peer is started first."""
    engines = [url.rstrip("/") for url in args.engine_url]
    engine_key = loadgen.read_engine_key(args.engine_key_file, "--engine-key-file")
    engine_auth = loadgen.bearer(engine_key)

    def ladder(bases: list[str], headers: dict[str, str], label: str) -> list[Row]:
        return compare.run_ladder(
            args,
            rates,
            lambda rate: asyncio.run(measure(args, workload, label, rate, bases, headers, engine_auth)),
            lambda row: saturated(row, workload.turns),
        )

    if path == DIRECT:
        return ladder(engines, engine_auth, path)
    if path == GATEWAY:
        return ladder([args.gateway_url], loadgen.read_token(args.token_file), row_label(path, args))
    policy = peers.CACHE_AWARE if path == ROUTER_CACHE_AWARE else peers.ROUND_ROBIN
    peer = peers.start_peer(
        peers.VLLM_ROUTER,
        engines,
        workload.model,
        Path(args.workdir) / path,
        cpus=args.cpus,
        engine_key=engine_key,
        router_policy=policy,
    )
    try:
        print(f"multiturn: {path} up at {peer.url} after {peer.startup_s:.1f} s (pid {peer.pid})", flush=True)
        return ladder([peer.url], peer.headers, path)
    finally:
        peer.stop()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def table(rows: Sequence[Row], turns: int) -> str:
    """The printed table, in Markdown, as docs/benchmarks.md shows it."""
    lines = [
        "| path | conversations/s | turns answered | throughput | TTFT p50 | TTFT p95 | later turns' TTFT p50"
        " | end to end p50 | p95 | errors | prefix-cache hit rate | engines' shares of prompt tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        report = row.report
        errors = ", ".join(f"{kind} x{count}" for kind, count in report.errors.items()) or "0"
        shares = " / ".join(f"{share:.2f}" for share in row.engine_shares.values()) or "-"
        hit_rate = "-" if row.hit_rate is None else f"{row.hit_rate:.2f}"
        answered = report.ok > 0
        lines.append(
            f"| {row.path} | {row.rate:g} ({row.rate * turns:g} turns/s) | {report.ok}/{report.requests}"
            f" | {report.throughput_rps:.1f} turns/s | {_ms(report.ttft_p50_ms)} | {_ms(report.ttft_p95_ms)}"
            f" | {_ms(row.later_ttft_p50_ms)} | {_ms(report.p50_ms if answered else None)}"
            f" | {_ms(report.p95_ms if answered else None)} | {errors} | {hit_rate} | {shares} |"
        )
    return "\n".join(lines)


def document(args: argparse.Namespace, workload: Workload, rows: list[Row], argv: Sequence[str]) -> dict[str, Any]:
    return {
        "commands": [["llmfleet", *argv]],
        "workload": asdict(workload),
        "window": {"warmup_s": args.warmup, "duration_s": args.duration},
        "engines": list(args.engine_url),
        "versions": {ROUTER: peers.version(peers.PEERS[ROUTER])},
        "saturated_share": compare.SATURATED,
        "rows": [{**asdict(row), "saturated": saturated(row, workload.turns)} for row in rows],
    }


def check_appendable(earlier: dict[str, Any], later: dict[str, Any], labels: Sequence[str], source: Path) -> None:
    """Refuse to add rows labelled `labels` of the run `later` to `earlier`: another workload, window or engines,
    or a label it already holds."""
    for key in ("workload", "window", "engines"):
        if earlier.get(key) != later[key]:
            raise LlmfleetError(
                f"--append: {source} was run with another {key} ({earlier.get(key)}, this run {later[key]});"
                " rows of different runs would not compare: write to another --out"
            )
    again = sorted({row["path"] for row in earlier.get("rows", [])} & set(labels))
    if again:
        raise LlmfleetError(f"--append: {source} already holds rows of {', '.join(again)}")


def appended(earlier: dict[str, Any], later: dict[str, Any], source: Path) -> dict[str, Any]:
    """The earlier run's document with the later run's rows added: only for the same workload and engines."""
    check_appendable(earlier, later, [row["path"] for row in later["rows"]], source)
    return {
        **later,
        "commands": [*earlier.get("commands", []), *later["commands"]],
        "rows": [*earlier["rows"], *later["rows"]],
    }


def read_appendable(args: argparse.Namespace, workload: Workload, paths: Sequence[str], out: Path) -> dict[str, Any]:
    """--append's earlier document, checked before any load: a run that could not be added would be lost."""
    try:
        earlier: dict[str, Any] = json.loads(out.read_text())
    except FileNotFoundError:
        raise LlmfleetError(f"--append: {out} does not exist; run without --append first") from None
    except (OSError, json.JSONDecodeError) as error:
        raise LlmfleetError(f"--append: cannot read {out} ({error}): give the file bench multiturn wrote") from None
    check_appendable(earlier, document(args, workload, [], []), [row_label(path, args) for path in paths], out)
    return earlier


def rows_of(saved: dict[str, Any]) -> list[Row]:
    """The Row objects of a saved document (for the table after --append)."""
    rows = []
    for entry in saved["rows"]:
        fields = {name: value for name, value in entry.items() if name != "saturated"}
        rows.append(Row(**{**fields, "report": loadgen.Report(**fields["report"])}))
    return rows


# The figure's panels: what each plots against the offered rate of conversations.
PANELS: tuple[tuple[str, Callable[[Row], float | None]], ...] = (
    ("TTFT p50, every turn (ms)", lambda row: row.report.ttft_p50_ms),
    ("TTFT p50, turns after the first (ms)", lambda row: row.later_ttft_p50_ms),
    ("prefix-cache hit rate", lambda row: row.hit_rate),
)


def write_figure(rows: Sequence[Row], workload: Workload, out_dir: Path) -> Path:
    """multiturn.png in out_dir: one panel per PANELS entry, a line per path, against conversations per second."""
    plots.require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(plots.WIDTH_IN, plots.HEIGHT_IN), dpi=plots.DPI, layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(
        f"Multi-turn conversations: {workload.turns} turns, {workload.max_tokens} tokens an answer", fontsize=11
    )
    labels = list(dict.fromkeys(row.path for row in rows))
    for axes, (title, value) in zip(figure.subplots(1, len(PANELS)), PANELS, strict=True):
        for index, label in enumerate(labels):
            mine = [row for row in rows if row.path == label]
            figures = [value(row) for row in mine]
            axes.plot(
                [row.rate for row in mine],
                [math.nan if point is None else point for point in figures],
                label=label,
                marker=plots.MARKERS[index % len(plots.MARKERS)],
                fillstyle="none",
            )
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("conversations started per second")
    handles, names = figure.axes[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="outside right upper")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "multiturn.png"
    figure.savefig(target)
    return target


def parse_paths(text: str, args: argparse.Namespace) -> list[str]:
    paths = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [path for path in paths if path not in PATHS]
    if unknown or not paths or len(set(paths)) != len(paths):
        raise LlmfleetError(f"--paths {text!r}: choose from {', '.join(PATHS)}, each at most once")
    if GATEWAY in paths and not (args.gateway_url and args.token_file and args.gateway_policy):
        raise LlmfleetError(
            "--paths gateway needs --gateway-url, --token-file and --gateway-policy (the policy the workers run:"
            f" {' or '.join(GATEWAY_POLICIES)})"
        )
    return paths


def run(args: argparse.Namespace) -> int:
    rates = compare.parse_rates(args.rates)
    if not args.engine_url:
        raise LlmfleetError("give the engines with --engine-url (repeat it for each)")
    paths = parse_paths(args.paths, args)
    if args.turns < 2 or args.system_words < 1 or args.document_words < 1 or args.max_tokens < 1:
        raise LlmfleetError("--turns must be at least 2, and --system-words, --document-words, --max-tokens above 0")
    if args.duration <= 0 or args.warmup < 0 or args.saturate < 0:
        raise LlmfleetError("--duration must be above 0 seconds, --warmup and --saturate 0 or more")
    if args.cpus is not None:
        peers.parse_cpus(args.cpus)
    out = Path(args.out)
    workload = Workload(args.turns, args.system_words, args.document_words, args.max_tokens, args.model, args.seed)
    earlier = read_appendable(args, workload, paths, out) if args.append else None
    if ROUTER in paths or ROUTER_CACHE_AWARE in paths:
        peers.ensure_peer_venv(peers.PEERS[ROUTER])  # before any load, so a failed build costs no run
    rows: list[Row] = []
    for path in paths:
        print(f"multiturn: {path} at {', '.join(f'{rate:g}' for rate in rates)} conversations/s", flush=True)
        rows.extend(run_path(args, workload, path, rates))
    result = document(args, workload, rows, sys.argv[1:])
    if earlier is not None:
        result = appended(earlier, result, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    saved = rows_of(result)  # this run's rows, and an earlier run's under --append
    print(table(saved, workload.turns))
    print(f"multiturn: written to {out}")
    if args.plots:
        print(f"multiturn: figure {write_figure(saved, workload, Path(args.plots))}")
    if all(row.report.ok == 0 for row in rows):
        raise LlmfleetError("no turn was answered on any path: are the engines up? (see the errors above)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "multiturn",
        help="multi-turn conversations through direct round robin, vllm-router (round robin and cache_aware)"
        " and our gateway: TTFT, latency and the engines' prefix-cache hit rate",
        description=(
            "An open loop of conversations (--rates per second), each of --turns turns replaying the earlier"
            " answers, through each path in turn on the same engines; per path and rate: time to first token,"
            " end-to-end latency, throughput in turns per second and the share of prompt tokens the engines"
            " served from their prefix caches."
        ),
    )
    parser.add_argument("--engine-url", action="append", help="an engine's base URL; repeat for each")
    parser.add_argument(
        "--paths", default=",".join(PATHS), help=f"paths to run, in order, from {', '.join(PATHS)} (default: all)"
    )
    parser.add_argument("--gateway-url", help="our gateway's base URL, for the gateway path")
    parser.add_argument("--token-file", help="a file holding the bearer token for --gateway-url")
    parser.add_argument(
        "--gateway-policy",
        choices=GATEWAY_POLICIES,
        help="the engine-choice policy the gateway's workers run now (the row's label; this command does not set it)",
    )
    parser.add_argument("--engine-key-file", help="a file holding the engines' API key, for direct and the router")
    parser.add_argument("--cpus", help="run the router under `taskset -c CPUS` (default: all cores)")
    parser.add_argument(
        "--rates", default=DEFAULT_RATES, help=f"conversations started per second, rising (default {DEFAULT_RATES})"
    )
    parser.add_argument(
        "--saturate",
        type=int,
        default=0,
        help=f"after the ladder, up to this many more rates, each {compare.SATURATE_STEP:g} x the last, until the"
        " path falls behind (default 0)",
    )
    parser.add_argument("--turns", type=int, default=Workload.turns, help="turns per conversation (default 6)")
    parser.add_argument(
        "--system-words", type=int, default=Workload.system_words, help="words of each tenant's system prompt (100)"
    )
    parser.add_argument(
        "--document-words",
        type=int,
        default=Workload.document_words,
        help="words of each conversation's document (300)",
    )
    parser.add_argument("--max-tokens", type=int, default=Workload.max_tokens, help="tokens per answer (default 16)")
    parser.add_argument("--model", default=Workload.model, help="served model name (default tiny)")
    parser.add_argument("--seed", type=int, default=Workload.seed, help="the tenants' prompts' seed (default 0)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of each measured window (default 30)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before each window (default 5)")
    parser.add_argument(
        "--workdir", default="out/bench/multiturn", help="the router's logs (default out/bench/multiturn)"
    )
    parser.add_argument(
        "--out", default="out/bench/multiturn.json", help="the JSON result (default out/bench/multiturn.json)"
    )
    parser.add_argument("--plots", help="also draw the rows of --out (all of them) into this folder's multiturn.png")
    parser.add_argument(
        "--append", action="store_true", help="add this run's rows to --out (same workload and engines) instead"
    )
    parser.set_defaults(handler=run)
