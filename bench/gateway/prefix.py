"""``python -m bench prefix``: the routing profiles against the engines' own prefix-cache
counts (``docs/benchmarks/prefix-routing.md`` has a run and what it means).

Real processes: ``llmgw serve`` with a declared catalog, agents starting the engines,
one or two ``llmgw gateway``s. Routers compared: ``round-robin``, ``least-loaded``,
``session`` with the conversation as its key and without one, ``prefix``.

- ``--engine sim`` (default): one model per router, each with ``--replicas`` sim engines
  of its own (its own caches: ``--prefix-cache-blocks`` blocks of 16 words, reporting
  ``usage.prompt_tokens_details.cached_tokens``; ``--prefill-delay`` seconds per prompt
  word not cached before the first token, so TTFT shows a hit).
- ``--engine llamacpp``: per router and count of gateways, a fresh cluster of two
  llama-servers (``--threads 1``, one per agent) serving a random GGUF of ``--model-mb``
  generated at run time; the engines' counts from each answer's ``timings``.

Workloads, each built from a seed with text of its own (a workload finds nothing another
left in the caches), turns interleaved across conversations (``replay``):

- (a) K shared system prompts x M multi-turn conversations resending their history;
- (b) the same, with one system prompt taking 80% of the conversations (hot);
- (c) unrelated prompts (nothing to gain);
- (d) the mooncake trace (``--trace``), in order, each 512-token block id made a fixed
  block of generated words (16 for the sim: one sim cache block), the first
  ``--trace-requests``.

Printed per workload, router and gateways: the fraction of prompt tokens the engines
recomputed (1 - their cached / prompt tokens), TTFT p50/p95, requests/s, the busiest
replica's share of requests, and how often a conversation's turn went to the replica of
its previous turn; then, for ``prefix``, what a gateway restart costs in hit rate (one
gateway) and how often two gateways send the same request to the same replica (two).
``--cost``: the routing decision's cost instead (``bench/gateway/prefix_cost.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.shared.processes import LLMGW, wait_for
from llmgw.api.guards.tokens import issue_token


@dataclass(frozen=True)
class Variant:
    """A row's router: the catalog's routing profile, and whether clients send a session
    key (``user``: the conversation)."""

    label: str
    profile: str
    key: bool = True


VARIANTS = (
    Variant("round-robin", "round-robin"),
    Variant("least-loaded", "least-loaded"),
    Variant("session", "session"),
    Variant("session (no key)", "session", key=False),
    Variant("prefix", "prefix"),
)
PROFILES = tuple(v.label for v in VARIANTS)
MODEL = {v.label: "bench-" + v.label.replace(" (no key)", "-nokey") for v in VARIANTS}
# The shared data directory beside the checkout (``../shared``), else the machine's.
_DATA = "shared/data/mooncake_conversation_trace.jsonl"
TRACE = next(
    (
        p
        for p in (Path(__file__).resolve().parents[2].parent / _DATA, Path("/work") / _DATA)
        if p.exists()
    ),
    Path("..") / _DATA,
)
WORDS = [f"w{i:03d}" for i in range(1000)]


@dataclass
class Req:
    conv: str  # the conversation (for session's key and stickiness); "" for none
    kind: str  # chat | completions
    payload: Any  # messages, or the prompt


@dataclass
class Result:
    replica: str
    conv: str
    ttft: float
    prompt: int
    cached: int
    turn: int = 0
    gateway: int = 0


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0


@dataclass(frozen=True)
class Sizes:
    """A workload's sizes, in words (the sim: a word a token; the test GGUF's byte-level
    vocabulary: about five tokens a word)."""

    systems: int
    conversations: int
    turns: int
    system_words: int
    question_words: int
    answer_words: int
    unrelated: int
    unrelated_words: int
    trace_requests: int
    trace_block_words: int


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversations(seed: int, z: Sizes, hot: float | None) -> list[list[Req]]:
    """M conversations over K system prompts (one taking ``hot`` of them, if given), each a
    list of turns resending the history (the assistant's turns are made up here: the
    same for every profile, so the prompts are too)."""
    rng = random.Random(seed)
    systems = [f"system {seed}-{i}: " + text(rng, z.system_words) for i in range(z.systems)]
    out = []
    for c in range(z.conversations):
        hot_one = hot is not None and rng.random() < hot
        system = systems[0] if hot_one else systems[rng.randrange(z.systems)]
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        conv = []
        for _ in range(z.turns):
            messages = [*messages, {"role": "user", "content": text(rng, z.question_words)}]
            conv.append(Req(f"c{seed}-{c}", "chat", messages))
            messages = [*messages, {"role": "assistant", "content": text(rng, z.answer_words)}]
        out.append(conv)
    return out


def unrelated(seed: int, z: Sizes) -> list[list[Req]]:
    rng = random.Random(seed)
    return [
        [Req("", "completions", f"{seed}-{i} " + text(rng, z.unrelated_words))]
        for i in range(z.unrelated)
    ]


def mooncake(path: Path, n: int, seed: int, block_words: int) -> tuple[list[list[Req]], float]:
    """The trace's first ``n`` requests, in order (each its own one-turn 'conversation',
    keyed by the trace's first block id, its conversation's opening), and the limit: the
    share of prompt blocks that are a leading prefix seen earlier."""
    rng = random.Random(seed)
    block: dict[int, str] = {}
    seen: set[tuple[int, ...]] = set()
    reusable = total = 0
    reqs = []
    with path.open() as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            ids = json.loads(line)["hash_ids"]
            lead = 0
            while lead < len(ids) and tuple(ids[: lead + 1]) in seen:
                lead += 1
            reusable += lead
            total += len(ids)
            for j in range(len(ids)):
                seen.add(tuple(ids[: j + 1]))
            for h in ids:
                if h not in block:
                    block[h] = text(rng, block_words)
            key = f"t{ids[1] if len(ids) > 1 else ids[0]}"
            reqs.append([Req(key, "completions", " ".join(block[h] for h in ids))])
    return reqs, reusable / max(total, 1)


def _one(client: httpx.Client, url: str, token: str, model: str, r: Req, *, key: bool) -> Result:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    path = "/v1/chat/completions" if r.kind == "chat" else "/v1/completions"
    if r.kind == "chat":
        body["messages"] = r.payload
    else:
        body["prompt"] = r.payload
    if r.conv and key:
        body["user"] = r.conv
    started = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    with client.stream(
        "POST", url + path, json=body, headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        resp.raise_for_status()
        replica = resp.headers.get("x-llmgw-replica", "?")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - started
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
    if "cache_n" in timings:
        # llama.cpp's own count: the prompt's tokens reused (cache_n) and computed.
        prompt, cached = int(timings["prompt_n"]) + int(timings["cache_n"]), int(timings["cache_n"])
    else:
        details = usage.get("prompt_tokens_details") or {}
        prompt, cached = int(usage.get("prompt_tokens", 0)), int(details.get("cached_tokens", 0))
    return Result(
        replica, r.conv, ttft if ttft is not None else time.perf_counter() - started, prompt, cached
    )


def replay(
    urls: list[str],
    token: str,
    model: str,
    work: list[list[Req]],
    clients: int,
    *,
    key: bool = True,
    turns: range | None = None,
) -> Run:
    """The conversations' turns interleaved, as many users' are: the first turn of
    every conversation (in a shuffled order), then the second of each, and so on,
    ``clients`` requests at a time, a turn never sent before its conversation's
    previous one is answered (a client takes the first request whose conversation is
    free). Each request goes to gateway (conversation + turn) % len(urls): with two, a
    conversation's turns alternate between them, and one-turn requests (the trace) are
    shared out. ``turns``: only those turns of each conversation."""
    run = Run()
    cond = threading.Condition()
    span = turns if turns is not None else range(max((len(c) for c in work), default=0))
    # Each round in an order of its own (seeded): users do not take turns in a fixed
    # order (a fixed order with an even number of conversations kept round-robin's
    # every turn on the replica of the conversation's first).
    rng = random.Random(len(work))
    pending = []
    for t in span:
        order = [c for c in range(len(work)) if t < len(work[c])]
        rng.shuffle(order)
        pending += [(c, t) for c in order]
    done = dict.fromkeys(range(len(work)), span.start)
    busy: set[int] = set()

    def take() -> tuple[int, int] | None:
        with cond:
            while pending:
                for i, (c, t) in enumerate(pending):
                    if c not in busy and done[c] == t:
                        del pending[i]
                        busy.add(c)
                        return c, t
                cond.wait()
            return None

    def client_loop() -> None:
        with httpx.Client(timeout=600) as client:
            while (item := take()) is not None:
                c, t = item
                g = (c + t) % len(urls)
                res = _one(client, urls[g], token, model, work[c][t], key=key)
                res.turn, res.gateway = t, g
                with cond:
                    run.results.append(res)
                    busy.discard(c)
                    done[c] = t + 1
                    cond.notify_all()

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    run.wall = time.perf_counter() - started
    return run


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def stayed(rs: list[Result]) -> float | None:
    """How often a conversation's turn went to the replica of its previous turn."""
    last: dict[str, tuple[int, str]] = {}
    same = moved = 0
    for r in sorted(rs, key=lambda r: r.turn):
        if r.conv and r.conv in last and last[r.conv][0] == r.turn - 1:
            same += last[r.conv][1] == r.replica
            moved += last[r.conv][1] != r.replica
        if r.conv:
            last[r.conv] = (r.turn, r.replica)
    return same / (same + moved) if same + moved else None


def recomputed(rs: list[Result]) -> float:
    prompt = sum(r.prompt for r in rs)
    return 1 - sum(r.cached for r in rs) / max(prompt, 1)


def row(workload: str, profile: str, gateways: int, run: Run) -> str:
    rs = run.results
    busiest = max(Counter(r.replica for r in rs).values()) / len(rs)
    stay = stayed(rs)
    ttfts = [r.ttft * 1e3 for r in rs]
    return (
        f"| {workload} | {profile} | {gateways} | {recomputed(rs):.3f} | "
        f"{_pct(ttfts, 0.5):.1f} | {_pct(ttfts, 0.95):.1f} | {len(rs) / run.wall:.2f} | "
        f"{busiest:.2f} | {'-' if stay is None else f'{stay:.2f}'} |"
    )


def sim_models(engine_args: list[str], replicas: int) -> list[dict[str, Any]]:
    """One model per variant (its own engines, so its own caches)."""
    return [
        {
            "name": MODEL[v.label],
            "source": f"sim/{MODEL[v.label]}",
            "scaling": {"min": replicas, "max": replicas},
            "context_length": 65536,
            "max_output": 64,
            "routing_profile": v.profile,
            "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": engine_args}],
        }
        for v in VARIANTS
    ]


def llama_model(gguf: Path, v: Variant, engine_args: list[str], context: int) -> dict[str, Any]:
    """The one model of a llama.cpp run: two CPU replicas, one per agent."""
    return {
        "name": MODEL[v.label],
        "source": str(gguf),
        "context_length": context,
        "max_output": 64,
        "routing_profile": v.profile,
        "scaling": {"min": 2, "max": 2},
        "profiles": [{"name": "cpu", "engine": "llamacpp", "args": engine_args}],
    }


@dataclass
class Cluster:
    urls: list[str]
    token: str
    restart: Callable[[int], None]  # a gateway stopped and started again (its table lost)


@contextmanager
def cluster(  # noqa: PLR0915 (the processes' start, readiness and stop, together)
    work: Path, models: list[dict[str, Any]], gateways: int, agents: list[tuple[str, str]]
) -> Iterator[Cluster]:
    """serve + ``agents`` ((node, --gpus)) + ``gateways`` gateways, once every model has
    all its replicas ready and out of slow start. Every process is stopped on the way out."""
    tokens = {
        "operator": issue_token("bench-op", "operator"),
        "reader": issue_token("bench-reader", "reader"),
        "agent": issue_token("bench-agent", "agent", nodes=[n for n, _ in agents]),
        "gateway": issue_token("bench-gw", "gateway"),
        "gateway2": issue_token("bench-gw2", "gateway"),
        "client": issue_token("bench-app", "client"),
    }
    # JSON is YAML, and has no aliases (the catalog refuses them).
    (work / "catalog.yaml").write_text(json.dumps({"models": models}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env |= {
        "LLMGW_DATABASE_URL": f"sqlite:///{work / 'llmgw.db'}",
        "LLMGW_CONFIG": str(work / "catalog.yaml"),
        "LLMGW_TOKENS": ";".join(t.entry.to_env() for t in tokens.values()),
        "LLMGW_LOG_LEVEL": "WARNING",
    }
    subprocess.run([LLMGW, "db", "upgrade"], env=env, check=True, capture_output=True)
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with (work / log).open("ab") as err:
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err)
        procs.append(p)
        return p

    def url_of(p: subprocess.Popen[bytes]) -> str:
        assert p.stdout is not None
        line = p.stdout.readline().decode()
        if "listening on " not in line:
            raise SystemExit(f"did not start: {line!r}; see {work}")
        return line.split("listening on ", 1)[1].strip()

    try:
        serve = start(
            [LLMGW, "serve", "--host", "127.0.0.1", "--port", "0", "--with-scheduler",
             "--interval", "0.3"],
            "serve.log",
        )  # fmt: skip
        server = url_of(serve)
        (work / "agent.token").write_text(tokens["agent"].token + "\n")
        for node, gpus in agents:
            start(
                [LLMGW, "agent", "--server", server, "--token-file", str(work / "agent.token"),
                 "--node", node, "--interval", "0.3", "--state-dir", str(work / f"agent-{node}"),
                 "--engine-host", "127.0.0.1", "--advertise", "127.0.0.1", "--gpus", gpus],
                f"agent-{node}.log",
            )  # fmt: skip
        gws: list[subprocess.Popen[bytes]] = []
        urls: list[str] = []

        def gateway(i: int, port: str = "0") -> tuple[subprocess.Popen[bytes], str]:
            name = "gateway" if i == 0 else "gateway2"
            (work / f"{name}.token").write_text(tokens[name].token + "\n")
            gw = start(
                [LLMGW, "gateway", "--server", server, "--token-file",
                 str(work / f"{name}.token"), "--port", port, "--admin-open",
                 "--gateway-id", name],
                f"{name}.log",
            )  # fmt: skip
            return gw, url_of(gw)

        for i in range(gateways):
            gw, url = gateway(i)
            gws.append(gw)
            urls.append(url)
        names = [m["name"] for m in models]
        m_replicas = {m["name"]: m["scaling"]["min"] for m in models}

        def ready() -> bool:
            for u in urls:
                table = httpx.get(u + "/routing", timeout=5).json()
                for m in names:
                    replicas = table.get("models", {}).get(m, {}).get("replicas", [])
                    # Both ready, and out of slow start (a replica ramping up takes
                    # fewer requests: round-robin's first rows were skewed to 0.9).
                    want = m_replicas[m]
                    if len(replicas) != want or any(r.get("slow_start") for r in replicas):
                        return False
            return True

        def restart(i: int) -> None:
            gws[i].terminate()
            gws[i].wait(30)
            port = urls[i].rsplit(":", 1)[1]
            gws[i], urls[i] = gateway(i, port)
            wait_for(ready, 120)

        wait_for(ready, 300)
        yield Cluster(urls, tokens["client"].token, restart)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


Workloads = dict[str, Callable[[], list[list[Req]]]]


def workloads(seed: int, z: Sizes, trace: Path | None) -> tuple[Workloads, float]:
    """(a)-(d), each built from its own seed (text of its own: a workload finds nothing
    another left in the caches); the trace's limit (0 without it)."""
    loads: Workloads = {
        "(a) shared prompts x conversations": lambda: conversations(seed, z, None),
        "(b) one hot prefix at 80%": lambda: conversations(seed + 1, z, 0.8),
        "(c) unrelated prompts": lambda: unrelated(seed + 2, z),
    }
    limit = 0.0
    if trace is not None and trace.exists():
        reqs, limit = mooncake(trace, z.trace_requests, seed + 3, z.trace_block_words)
        loads["(d) mooncake"] = lambda: reqs
    return loads, limit


def restart_cost(c: Cluster, model: str, z: Sizes, seed: int, clients: int) -> tuple[float, float]:
    """Workload (a)'s shape twice (texts of their own): its first half of turns, then
    the second half; once straight on, once with the (first) gateway restarted between
    the halves (its table lost). The engines' cached share of the second halves."""
    half = range(z.turns // 2, z.turns)
    out = []
    for i, restart in enumerate((False, True)):
        work = conversations(seed + 10 + i, z, None)
        replay(c.urls, c.token, model, work, clients, turns=range(z.turns // 2))
        if restart:
            c.restart(0)
        out.append(
            1 - recomputed(replay(c.urls, c.token, model, work, clients, turns=half).results)
        )
    return out[0], out[1]


# The paced agreement's longest wait for every replica to be open to both gateways.
OPEN_WAIT_S = 10.0


def _all_open(client: httpx.Client, urls: list[str], model: str) -> bool:
    """Whether every gateway may send to every replica of ``model`` now (``GET /routing``:
    its deal of the replica's slots and those it may borrow cover them all)."""
    for url in urls:
        for r in client.get(url + "/routing").json()["models"][model]["replicas"]:
            dealt = r.get("slots_dealt")
            if dealt is not None and dealt + (r.get("slots_borrowable") or 0) < r["slots"]:
                return False
    return True


def agreement(
    c: Cluster, model: str, z: Sizes, seed: int, *, paced: bool = False
) -> tuple[float, float]:
    """Two gateways, each its own table: every turn of workload (a)'s shape sent through
    one gateway, then the same request through the other (a prefix each has seen part
    of); the share sent to the same replica by both, and the mean wait before a request.
    One request at a time.

    Not ``paced``: the second follows the first at once. With slots dealt between the
    gateways (one-slot replicas: a whole replica each), a gateway may fill the other's
    replica only once its readings of that engine showed it idle over
    ``gateway.stages.borrow.SPAN_S`` (1 s, read every ``IDLE_POLL_S``, 1 s, while the
    gateway is idle): until then a new conversation whose rendezvous replica is the
    other's goes to its own, and each gateway's table keeps the conversation where it
    sent it (both replicas hold it: every turn went to both), so the whole conversation
    is counted apart. ``paced``: before each request, wait (``OPEN_WAIT_S`` at most) until
    both gateways may send to every replica: the choice is the tables' and the
    rendezvous hash's alone. (A fixed 0.5 s pause was within that horizon: 0.75-0.88.)"""
    work = conversations(seed + 20, z, None)
    same = total = 0
    waited = 0.0
    with httpx.Client(timeout=600) as client:

        def ready() -> None:
            nonlocal waited
            if not paced:
                return
            started = time.monotonic()
            while not _all_open(client, c.urls, model):
                if time.monotonic() - started > OPEN_WAIT_S:
                    break
                time.sleep(0.05)
            waited += time.monotonic() - started

        for t in range(z.turns):
            for ci, conv in enumerate(work):
                if t >= len(conv):
                    continue
                g = (ci + t) % 2
                ready()
                a = _one(client, c.urls[g], c.token, model, conv[t], key=True)
                ready()
                b = _one(client, c.urls[1 - g], c.token, model, conv[t], key=True)
                same += a.replica == b.replica
                total += 1
    return same / max(total, 1), waited / max(2 * total, 1)


HEADER = (
    "| workload | profile | gateways | recomputed | TTFT p50 ms | TTFT p95 ms | req/s "
    "| busiest share | same replica as last turn |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915 (options and the runs)
    p = argparse.ArgumentParser(prog="python -m bench prefix", description=__doc__)
    p.add_argument("--engine", choices=("sim", "llamacpp"), default="sim")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--clients", type=int, default=None, help="default: sim 8, llamacpp 4")
    p.add_argument("--systems", type=int, default=None, help="K shared system prompts")
    p.add_argument("--conversations", type=int, default=None, help="M conversations")
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--answer-words", type=int, default=None, help="an assistant turn's words")
    p.add_argument("--replicas", type=int, default=4, help="sim: replicas per model")
    p.add_argument("--unrelated", type=int, default=None)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--trace-requests", type=int, default=None)
    p.add_argument("--gateways", type=int, nargs="+", default=[1, 2])
    p.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    p.add_argument("--only", nargs="+", default=["a", "b", "c", "d"], help="workloads")
    p.add_argument(
        "--engine-args",
        default=None,
        help="the engines' flags (sim default: --token-delay 0.01 "
        "--prefix-cache-blocks 1024 --prefill-delay 0.0005; llamacpp: --parallel 1 "
        "--threads 1 --ctx-size 4096)",
    )
    p.add_argument("--model-mb", type=int, default=30, help="llamacpp: the generated GGUF's size")
    p.add_argument("--cost", action="store_true", help="the routing decision's cost only")
    args, rest = p.parse_known_args(argv)
    if args.cost:
        from bench.gateway import prefix_cost

        return prefix_cost.main(rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    llama = args.engine == "llamacpp"
    z = Sizes(
        systems=args.systems or 4,
        conversations=args.conversations or (8 if llama else 48),
        turns=args.turns or (4 if llama else 8),
        system_words=60 if llama else 300,
        question_words=12 if llama else 40,
        answer_words=args.answer_words or (6 if llama else 80),
        unrelated=args.unrelated or (8 if llama else 64),
        unrelated_words=100 if llama else 340,
        trace_requests=args.trace_requests or (60 if llama else 1000),
        trace_block_words=4 if llama else 16,
    )
    clients = args.clients or (4 if llama else 8)
    engine_args = (
        args.engine_args
        or (
            "--parallel 1 --threads 1 --ctx-size 4096"
            if llama
            else "--token-delay 0.01 --prefix-cache-blocks 1024 --prefill-delay 0.0005"
        )
    ).split()
    work_dir = Path(tempfile.mkdtemp(prefix="llmgw-prefix-"))
    loads, limit = workloads(args.seed * 100, z, args.trace)
    loads = {k: v for k, v in loads.items() if k[1] in args.only}
    variants = [v for v in VARIANTS if v.label in args.profiles]
    gguf = None
    if llama:
        gguf = _gguf(work_dir / "bench.gguf", args.model_mb)
        print(f"model: random GGUF of {gguf.stat().st_size / 1e6:.0f} MB ({_GGUF_SHAPE})")
    print(f"engine: {args.engine} {' '.join(engine_args)}; clients {clients}; seed {args.seed}")
    print(f"sizes: {z}\n")
    print(HEADER, flush=True)
    extras: list[str] = []
    for gateways in args.gateways:
        if llama:
            # A fresh pair of llama-servers per profile: each starts with empty caches.
            assert gguf is not None
            for v in variants:
                work = work_dir / f"g{gateways}-{MODEL[v.label]}"
                work.mkdir()
                model = llama_model(gguf, v, engine_args, 4096)
                nodes = [("n1", "none"), ("n2", "none")]
                with cluster(work, [model], gateways, nodes) as c:
                    for name, make in loads.items():
                        run = replay(c.urls, c.token, MODEL[v.label], make(), clients, key=v.key)
                        print(row(name, v.label, gateways, run), flush=True)
                    extras += _extras(c, v, gateways, z, seed=args.seed * 100, clients=clients)
            continue
        work = work_dir / f"g{gateways}"
        work.mkdir()
        models = sim_models(engine_args, args.replicas)
        gpus = f"SIM:{len(models) * args.replicas}"
        with cluster(work, models, gateways, [("n1", gpus)]) as c:
            for name, make in loads.items():
                for v in variants:
                    # The same workload for every profile (each model's engines and
                    # caches are its own).
                    run = replay(c.urls, c.token, MODEL[v.label], make(), clients, key=v.key)
                    print(row(name, v.label, gateways, run), flush=True)
            for v in variants:
                extras += _extras(c, v, gateways, z, seed=args.seed * 100, clients=clients)
    # (kept when a process failed: its logs are there)
    shutil.rmtree(work_dir, ignore_errors=True)
    if "(d) mooncake" in loads:
        print(
            f"\n(d): the first {z.trace_requests} requests of the trace; leading blocks "
            f"seen earlier (the most any cache could save): {limit:.3f}"
        )
    if extras:
        print("\n" + "\n".join(extras))
    print("\nload average:", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


def _extras(
    c: Cluster, v: Variant, gateways: int, z: Sizes, *, seed: int, clients: int
) -> list[str]:
    """For ``prefix``: what a gateway restart costs (one gateway), how often two agree."""
    if v.label != "prefix":
        return []
    model = MODEL[v.label]
    if gateways == 1:
        kept, restarted = restart_cost(c, model, z, seed, clients)
        return [
            f"gateway restart (prefix, one gateway): cached share of the second half of "
            f"(a)'s turns {kept:.3f} straight on, {restarted:.3f} after a restart between "
            "the halves"
        ]
    at_once, _ = agreement(c, model, z, seed)
    paced, waited = agreement(c, model, z, seed + 1, paced=True)
    return [
        f"two gateways (prefix): the same replica for the same request (a prefix each saw "
        f"part of) {at_once:.3f} of (a)'s turns, one at a time, the second at once; "
        f"{paced:.3f} with every replica open to both gateways before each request "
        f"(waited {waited:.2f} s a request on average)"
    ]


# The generated model's shape for a size: a llama of 8 layers and this width (its
# feed-forward 3x), a byte-level vocabulary (engine_check.tiny_gguf's).
_GGUF_SHAPE = "8 layers, width from the size, feed-forward 3x, f32"


def _gguf(path: Path, mb: int) -> Path:
    from engine_check.tiny_gguf import write

    # Parameters: about 8 x (4 w^2 + 3 w x 3w) = 104 w^2, 4 bytes each.
    width = max(64, int((mb * 1e6 / 4 / 104) ** 0.5) // 64 * 64)
    return write(path, seed=1, layers=8, width=width, heads=max(4, width // 64), ffn=3 * width)


if __name__ == "__main__":
    raise SystemExit(main())
