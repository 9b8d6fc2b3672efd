"""``python -m bench.gateway.queue_cost``: the queue stage's cost on the common path.

The common path: a model whose replicas' slots are known, none full, nobody waiting.
``gateway/proxy.py`` then calls ``Proxy._at_once`` (for ``prefix`` with a prompt and
``session`` with a key: the profile's choice among all the replicas and one comparison
for the replica chosen; for the other profiles ``open_replicas``, a comparison per
replica against its deal of the slots) and then, unless ``_at_once`` chose, the
routing profile's ``choose``; a model without slots skips the stage (out: ``choose``
alone). Each request below is that decision, the choice included, in two versions:

- ``out``: the stage out (``choose`` alone);
- ``in``: this tree's: ``Proxy._at_once`` (its own code) for ``prefix`` and ``session``,
  then ``choose`` when it did not choose; the other profiles' block, inline in
  ``Proxy._attempts``, copied.

No older version of the block is kept here: against an older tree, run this bench in
each tree and compare the ``in - out`` column, or measure the whole request path of both
with ``LLMGW_BENCH_BASE=TREE python -m bench.gateway.instructions`` (docs/benchmarks).

By default it times them (``timeit``, least of 7 repeats: moved by the machine's load);
``--callgrind`` counts their instructions under valgrind instead (not moved by it), as
the difference of a run of ``--iterations`` requests and a run of none. Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

from gateway.proxy import FOR_CACHE, Proxy
from gateway.settings import GatewaySettings
from gateway.stages.prefix import prompt_of
from gateway.stages.queue import ModelQueue, open_replicas
from gateway.stages.routing import Load, choose
from gateway.stages.slotshare import Members, deal
from gateway.state import State
from gateway.table import ModelEntry, Replica, stable_hash

VERSIONS = ("out", "in")
_SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


def common_path(version: str, replicas: int, profile: str = "least-loaded") -> Callable[[], None]:
    """One request's routing decision on a model with slots, none full (``version``: the
    stage out, or in: this tree's ``Proxy._at_once``)."""
    ready = [
        Replica(f"m/{i}", "m", f"http://h:{i}", 1.0, "p", stable_hash(f"m/{i}"), slots=4096)
        for i in range(replicas)
    ]
    loads = {r.key: Load(inflight=3) for r in ready}
    queues: dict[str, ModelQueue] = {}
    slotted = frozenset({"m"} if version != "out" else ())
    state = State("bench")
    state.loads = loads
    proxy = Proxy(state, None, GatewaySettings(server="", token=""))  # type: ignore[arg-type]
    state.dealt = deal({"m": ready}, Members())  # (one gateway: every slot its own)
    m = ModelEntry("m", (), (), profile, 8192, 512, False, False, False, 0.0, 0.0, 60.0)
    body = {"messages": [_SYSTEM, {"role": "user", "content": "a question " * 20}]}
    prompt = prompt_of(body, "chat") if profile == "prefix" else None
    session = "conversation-1" if profile == "session" else None
    table = state.prefix
    if prompt is not None:  # held by one replica: the conversation's
        table.record(ready[-1].key, prompt, 0)

    def pick(candidates: list[Replica]) -> None:
        choose(profile, candidates, loads, session=session, prompt=prompt, prefixes=table)

    def out() -> None:
        pick(ready)

    def stage_in() -> None:
        # (gateway/proxy.py's Proxy._attempts: _at_once for the profiles that choose for
        # the cache, else the block inline as before)
        candidates = ready
        if candidates and (queues or "m" in slotted):
            if profile in FOR_CACHE:
                free, picked, _prefer = proxy._at_once(m, candidates, session, prompt, 0.0)
                if picked is not None:
                    return
            else:
                q = queues.get("m")
                busy = q is not None and (q.length or q.granted)
                free = [] if busy else open_replicas(candidates, loads, state.dealt)
            candidates = free
        pick(candidates)

    return {"out": out, "in": stage_in}[version]


def _instructions(version: str, replicas: int, iterations: int, profile: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             "-m", "bench.gateway.queue_cost", "--once", version, str(replicas),
             str(iterations), profile],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway.queue_cost", description=__doc__)
    p.add_argument("--replicas", default="1,2,8", help="ready replicas, comma separated")
    p.add_argument(
        "--profiles",
        default="least-loaded",
        help="routing profiles, comma separated (least-loaded, round-robin, session, prefix)",
    )
    p.add_argument("--callgrind", action="store_true", help="count instructions instead")
    p.add_argument("--iterations", type=int, default=20_000)
    p.add_argument("--once", nargs=4, metavar=("V", "REPLICAS", "N", "P"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.once:
        check = common_path(args.once[0], int(args.once[1]), args.once[3])
        for _ in range(int(args.once[2])):
            check()
        return 0
    unit = "instructions" if args.callgrind else "us"
    print(f"| profile | replicas | stage out ({unit}) | stage in ({unit}) | in - out |")
    print("|---|---:|---:|---:|---:|")
    for profile in args.profiles.split(","):
        for n in (int(x) for x in args.replicas.split(",")):
            if args.callgrind:
                # (The start-up is the same for both: measured once.)
                base = _instructions("out", n, 0, profile)
                got = [
                    (_instructions(v, n, args.iterations, profile) - base) / args.iterations
                    for v in VERSIONS
                ]
                fmt = "{:,.0f}"
            else:
                number = 20_000
                got = [
                    min(timeit.repeat(common_path(v, n, profile), number=number, repeat=7))
                    / number
                    * 1e6
                    for v in VERSIONS
                ]
                fmt = "{:.3f}"
            cells = " | ".join(fmt.format(x) for x in got)
            print(f"| {profile} | {n} | {cells} | {fmt.format(got[1] - got[0])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
