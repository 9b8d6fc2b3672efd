"""``python -m bench prefix``: the routing profiles against the engines' own prefix-cache
counts (``docs/benchmarks/prefix-routing.md`` has a run and what it means).

Real processes: ``llmgw serve`` with a declared catalog of four models, one per profile
compared (``round-robin``, ``least-loaded``, ``session``, ``prefix``), each with two
replicas; one ``llmgw agent`` starting sim engines for them (each engine with its own
simulated prefix cache, ``--prefix-cache-blocks`` blocks of 16 words, reporting
``usage.prompt_tokens_details.cached_tokens``); one or two ``llmgw gateway``s. Each
workload is built from a seed, with text of its own (so a workload finds nothing another
left in the caches), and replayed by ``--clients`` threads, streamed with
``stream_options.include_usage``:

- (a) K shared system prompts x M multi-turn conversations resending their history;
- (b) the same, with one system prompt taking 80% of the conversations (hot);
- (c) unrelated prompts (nothing to gain);
- (d) the mooncake trace (``--trace``), in order, each 512-token block id made a fixed
  block of 16 generated words (one sim cache block), the first ``--trace-requests``.

Printed per workload, profile and gateways: the fraction of prompt tokens the engines
recomputed (1 - their cached / prompt tokens), TTFT p50/p95, requests/s, the busiest
replica's share of requests, and how often a conversation's turn went to the replica of
its previous turn. With two gateways a conversation's turns alternate between them.

The sim engine does not model prefill time (its first token waits only for a slot), so
its TTFT shows queueing, not the prefill saved: the recomputed share is the figure.
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

PROFILES = ("round-robin", "least-loaded", "session", "prefix")
MODEL = {p: f"bench-{p}" for p in PROFILES}
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


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversations(seed: int, k: int, m: int, turns: int, hot: float | None) -> list[list[Req]]:
    """M conversations over K system prompts (one taking ``hot`` of them, if given), each a
    list of turns resending the history (the assistant's turns are made up here: the
    same for every profile, so the prompts are too)."""
    rng = random.Random(seed)
    systems = [f"system {seed}-{i}: " + text(rng, 300) for i in range(k)]
    out = []
    for c in range(m):
        hot_one = hot is not None and rng.random() < hot
        system = systems[0] if hot_one else systems[rng.randrange(k)]
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        conv = []
        for _ in range(turns):
            messages = [*messages, {"role": "user", "content": text(rng, 40)}]
            conv.append(Req(f"c{seed}-{c}", "chat", messages))
            messages = [*messages, {"role": "assistant", "content": text(rng, 20)}]
        out.append(conv)
    return out


def unrelated(seed: int, n: int) -> list[list[Req]]:
    rng = random.Random(seed)
    return [[Req("", "completions", f"{seed}-{i} " + text(rng, 340))] for i in range(n)]


def mooncake(path: Path, n: int, seed: int) -> tuple[list[list[Req]], float]:
    """The trace's first ``n`` requests, in order (one stream: each is its own
    'conversation' of one turn, so order is kept by one client... replayed by all
    clients in order of arrival), and the limit: the share of prompt blocks that are a
    leading prefix seen earlier."""
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
                    block[h] = text(rng, 16)
            reqs.append([Req("", "completions", " ".join(block[h] for h in ids))])
    return reqs, reusable / max(total, 1)


def _one(client: httpx.Client, url: str, token: str, model: str, r: Req) -> Result:
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
    if r.conv:
        body["user"] = r.conv
    started = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
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
            if event.get("usage"):
                usage = event["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return Result(
        replica,
        r.conv,
        ttft if ttft is not None else time.perf_counter() - started,
        int(usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens", 0)),
    )


def replay(urls: list[str], token: str, model: str, work: list[list[Req]], clients: int) -> Run:
    """Each conversation's turns in order, by one client; conversations shared out among
    the clients in order. Turn t goes to gateway t % len(urls)."""
    run = Run()
    lock = threading.Lock()
    queue = list(reversed(work))

    def client_loop() -> None:
        with httpx.Client(timeout=120) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    conv = queue.pop()
                for t, r in enumerate(conv):
                    res = _one(client, urls[t % len(urls)], token, model, r)
                    with lock:
                        run.results.append(res)

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


def row(workload: str, profile: str, gateways: int, run: Run) -> str:
    rs = run.results
    prompt = sum(r.prompt for r in rs)
    cached = sum(r.cached for r in rs)
    busiest = max(Counter(r.replica for r in rs).values()) / len(rs)
    last: dict[str, str] = {}
    stayed = moved = 0
    for r in rs:  # in completion order: a conversation's turns are in order within it
        if r.conv and r.conv in last:
            stayed += last[r.conv] == r.replica
            moved += last[r.conv] != r.replica
        if r.conv:
            last[r.conv] = r.replica
    stay = f"{stayed / (stayed + moved):.2f}" if stayed + moved else "-"
    ttfts = [r.ttft * 1e3 for r in rs]
    return (
        f"| {workload} | {profile} | {gateways} | {1 - cached / max(prompt, 1):.3f} | "
        f"{_pct(ttfts, 0.5):.1f} | {_pct(ttfts, 0.95):.1f} | {len(rs) / run.wall:.1f} | "
        f"{busiest:.2f} | {stay} |"
    )


@contextmanager
def cluster(work: Path, engine_args: list[str], gateways: int) -> Iterator[tuple[list[str], str]]:
    """serve + one agent (sim engines) + ``gateways`` gateways; their URLs and a client
    token. Every process is stopped on the way out."""
    tokens = {
        "operator": issue_token("bench-op", "operator"),
        "reader": issue_token("bench-reader", "reader"),
        "agent": issue_token("bench-agent", "agent", nodes=["n1"]),
        "gateway": issue_token("bench-gw", "gateway"),
        "gateway2": issue_token("bench-gw2", "gateway"),
        "client": issue_token("bench-app", "client"),
    }
    models = [
        {
            "name": MODEL[p],
            "source": f"sim/{MODEL[p]}",
            "scaling": {"min": 2, "max": 2},
            "context_length": 65536,
            "max_output": 64,
            "routing_profile": p,
            "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": engine_args}],
        }
        for p in PROFILES
    ]
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
        start(
            [LLMGW, "agent", "--server", server, "--token-file", str(work / "agent.token"),
             "--node", "n1", "--interval", "0.3", "--state-dir", str(work / "agent"),
             "--engine-host", "127.0.0.1", "--advertise", "127.0.0.1", "--gpus", "SIM:8"],
            "agent.log",
        )  # fmt: skip
        urls = []
        for i in range(gateways):
            name = "gateway" if i == 0 else "gateway2"
            (work / f"{name}.token").write_text(tokens[name].token + "\n")
            gw = start(
                [LLMGW, "gateway", "--server", server, "--token-file",
                 str(work / f"{name}.token"), "--port", "0", "--admin-open",
                 "--gateway-id", name],
                f"{name}.log",
            )  # fmt: skip
            urls.append(url_of(gw))

        def ready() -> bool:
            for u in urls:
                table = httpx.get(u + "/routing", timeout=5).json()
                for m in MODEL.values():
                    replicas = table.get("models", {}).get(m, {}).get("replicas", [])
                    # Both ready, and out of slow start (a replica ramping up takes
                    # fewer requests: round-robin's first rows were skewed to 0.9).
                    if len(replicas) != 2 or any(r.get("slow_start") for r in replicas):
                        return False
            return True

        wait_for(ready, 180)
        yield urls, tokens["client"].token
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench prefix", description=__doc__)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--systems", type=int, default=4, help="K shared system prompts")
    p.add_argument("--conversations", type=int, default=24, help="M conversations")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--unrelated", type=int, default=64)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--trace-requests", type=int, default=300)
    p.add_argument("--gateways", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--engine-args",
        default="--slots 2 --token-delay 0.01 --prefix-cache-blocks 1024",
        help="the sim engines' flags",
    )
    args = p.parse_args(argv)
    work_dir = Path(tempfile.mkdtemp(prefix="llmgw-prefix-"))
    trace, limit = (
        mooncake(args.trace, args.trace_requests, args.seed) if args.trace.exists() else ([], 0.0)
    )
    print(f"engine: sim {args.engine_args}; clients {args.clients}; seed {args.seed}\n")
    print(
        "| workload | profile | gateways | recomputed | TTFT p50 ms | TTFT p95 ms | req/s "
        "| busiest share | same replica as last turn |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for gateways in args.gateways:
        if gateways:
            work = work_dir / f"g{gateways}"
            work.mkdir()
            with cluster(work, args.engine_args.split(), gateways) as (urls, token):
                # A fresh cluster per count of gateways: the same workloads in each.
                seed = args.seed * 100
                loads: dict[str, Callable[[int], list[list[Req]]]] = {
                    "(a) shared prompts x conversations": lambda s: conversations(
                        s, args.systems, args.conversations, args.turns, None
                    ),
                    "(b) one hot prefix at 80%": lambda s: conversations(
                        s, args.systems, args.conversations, args.turns, 0.8
                    ),
                    "(c) unrelated prompts": lambda s: unrelated(s, args.unrelated),
                }
                for i, (name, make) in enumerate(loads.items()):
                    for profile in PROFILES:
                        # The same workload for every profile (each model's engines and
                        # caches are its own).
                        work_load = make(seed + i)
                        run = replay(urls, token, MODEL[profile], work_load, args.clients)
                        print(row(name, profile, gateways, run), flush=True)
                if trace:
                    for profile in PROFILES:
                        run = replay(urls, token, MODEL[profile], trace, args.clients)
                        print(row("(d) mooncake", profile, gateways, run), flush=True)
    # (kept when a process failed: its logs are there)
    shutil.rmtree(work_dir, ignore_errors=True)
    if trace:
        print(
            f"\n(d): the first {args.trace_requests} requests of the trace; leading blocks "
            f"seen earlier (the most any cache could save): {limit:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
