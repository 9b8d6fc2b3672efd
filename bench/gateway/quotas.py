"""``python -m bench quotas``: client token limits held across two gateways, one of them
SIGKILLed mid-window (``docs/benchmarks/quotas.md`` has a run and what it means).

Real processes: ``llmgw serve`` with a declared catalog of one sim model (two replicas),
one ``llmgw agent`` running its sim engines, two ``llmgw gateway``s. Four client tokens
limited with ``llmgw token new --tpm`` (each its own limit) stream chat requests as fast
as they can (``--threads`` each, ``stream_options.include_usage``), each request to the
next gateway in turn (a round-robin load balancer; a gateway that does not answer is
skipped). Two windows of ``--window`` seconds, each with fresh tokens:

1. both gateways alive throughout;
2. the second gateway SIGKILLed half-way through.

Printed per window and client: the tokens served (the engines' own ``usage`` of every
answered stream) against what its ``tpm`` allows over the window (one bucket: the limit,
full at the start, plus its refill), the ratio (each gateway counting the whole limit on
its own, as LiteLLM's replicas do, would approach the number of gateways: 2), and the
bound ``docs/operator/tenants.md`` derives (the allowance plus each gateway's chunks, 5%
of the limit, and one request's reservation; plus what the killed gateway held). Then the
engines' usage against the gateways' own counts (``llmgw_gateway_tokens_total``: the
killed gateway's as read just before it was killed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx

from bench.shared.processes import LLMGW, wait_for
from catalog.forms.allowance import CHUNK_SHARE
from gateway.stages import admission
from llmgw.api.guards.tokens import issue_token

MODEL = "bench-quota"
PROMPT = "Write as much as you may about shared limits."


@dataclass
class Client:
    name: str
    tpm: int
    token: str
    served: int = 0
    prompt: int = 0
    completion: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Cluster:
    env: dict[str, str]
    gateways: list[str]
    procs: dict[str, subprocess.Popen[bytes]]
    reader: str
    server: str = ""
    llmgw: list[str] = field(default_factory=lambda: [LLMGW])
    work: Path = Path()


@contextmanager
def cluster(work: Path, engine_args: list[str], tree: str | None = None) -> Iterator[Cluster]:
    """serve + one agent (sim engines) + two gateways (``tree``: another version's
    processes, its packages first on the path). Every process is stopped on the way
    out."""
    tokens = {
        "reader": issue_token("bench-reader", "reader"),
        "agent": issue_token("bench-agent", "agent", nodes=["n1"]),
        "gateway": issue_token("bench-gw", "gateway"),
        "gateway2": issue_token("bench-gw2", "gateway"),
    }
    model = {
        "name": MODEL,
        "source": f"sim/{MODEL}",
        "scaling": {"min": 2, "max": 2},
        "context_length": 4096,
        "max_output": 64,
        "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": engine_args}],
    }
    (work / "catalog.yaml").write_text(json.dumps({"models": [model]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env |= {
        "LLMGW_DATABASE_URL": f"sqlite:///{work / 'llmgw.db'}",
        "LLMGW_CONFIG": str(work / "catalog.yaml"),
        "LLMGW_TOKENS": ";".join(t.entry.to_env() for t in tokens.values()),
        "LLMGW_LOG_LEVEL": os.environ.get("LLMGW_LOG_LEVEL", "WARNING"),
    }
    llmgw = [LLMGW]
    if tree is not None:
        env["PYTHONPATH"] = tree
        llmgw = [sys.executable, "-m", "llmgw"]
    # (Run from the work directory: ``python -m`` puts the current one first on the path.)
    subprocess.run([*llmgw, "db", "upgrade"], env=env, check=True, capture_output=True, cwd=work)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (work / f"{name}.log").open("ab") as err:
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, cwd=work)
        procs[name] = p
        return p

    def url_of(p: subprocess.Popen[bytes]) -> str:
        assert p.stdout is not None
        line = p.stdout.readline().decode()
        if "listening on " not in line:
            raise SystemExit(f"did not start: {line!r}; see {work}")
        return line.split("listening on ", 1)[1].strip()

    try:
        serve = [*llmgw, "serve", "--host", "127.0.0.1", "--port", "0", "--with-scheduler"]
        server = url_of(start("serve", [*serve, "--interval", "0.3"]))
        (work / "agent.token").write_text(tokens["agent"].token + "\n")
        start(
            "agent",
            [*llmgw, "agent", "--server", server, "--token-file", str(work / "agent.token"),
             "--node", "n1", "--interval", "0.3", "--state-dir", str(work / "agent"),
             "--engine-host", "127.0.0.1", "--advertise", "127.0.0.1", "--gpus", "SIM:8"],
        )  # fmt: skip
        urls = []
        for name in ("gateway", "gateway2"):
            (work / f"{name}.token").write_text(tokens[name].token + "\n")
            gw = start(
                name,
                [*llmgw, "gateway", "--server", server, "--token-file",
                 str(work / f"{name}.token"), "--port", "0", "--gateway-id", name],
            )  # fmt: skip
            urls.append(url_of(gw))
        reader = tokens["reader"].token

        def ready() -> bool:
            for u in urls:
                table = httpx.get(
                    u + "/routing", headers={"Authorization": f"Bearer {reader}"}, timeout=5
                ).json()
                replicas = table.get("models", {}).get(MODEL, {}).get("replicas", [])
                if len(replicas) != 2 or any(r.get("slow_start") for r in replicas):
                    return False
            return True

        wait_for(ready, 180)
        yield Cluster(env, urls, procs, reader, server, llmgw, work)
    finally:
        for p in reversed(procs.values()):
            if p.poll() is None:
                p.terminate()
        for p in reversed(procs.values()):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def issue(c: Cluster, name: str, tpm: int) -> Client:
    done = subprocess.run(
        [*c.llmgw, "token", "new", name, "--role", "client", "--tpm", str(tpm)],
        env=c.env,
        capture_output=True,
        text=True,
        check=True,
        cwd=c.work,
    )
    return Client(name, tpm, done.stdout.splitlines()[0].strip())


def taken(c: Cluster, client: Client) -> bool:
    return all(
        httpx.get(
            u + "/v1/models", headers={"Authorization": f"Bearer {client.token}"}, timeout=5
        ).status_code
        == 200
        for u in c.gateways
    )


def stream_once(http: httpx.Client, url: str, client: Client, max_tokens: int) -> str:
    """One streamed request; its outcome ("200", "429", "503", "refused")."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with http.stream(
            "POST",
            url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {client.token}"},
        ) as resp:
            if resp.status_code != 200:
                resp.read()
                return str(resp.status_code)
            usage = None
            for line in resp.iter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    found = json.loads(line[6:]).get("usage")
                    if found:
                        usage = found
    except httpx.TransportError:
        return "refused"
    if usage is None:
        return "cut"
    with client.lock:
        client.prompt += usage["prompt_tokens"]
        client.completion += usage["completion_tokens"]
        client.served += usage["prompt_tokens"] + usage["completion_tokens"]
    return "200"


def window(
    c: Cluster,
    clients: list[Client],
    seconds: float,
    *,
    threads: int,
    max_tokens: int,
    kill_at: float | None,
) -> dict[str, str]:
    """Every client's threads streaming for ``seconds``; the second gateway SIGKILLed
    after ``kill_at`` seconds (None: never). The gateways' /metrics: the killed one's
    as read just before."""
    deadline = time.monotonic() + seconds
    turn = [0]
    turn_lock = threading.Lock()
    alive = list(c.gateways)
    metrics: dict[str, str] = {}

    def loop(client: Client) -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < deadline:
                with turn_lock:
                    turn[0] += 1
                    url = alive[turn[0] % len(alive)] if alive else c.gateways[0]
                outcome = stream_once(http, url, client, max_tokens)
                with client.lock:
                    client.statuses[outcome] += 1
                if outcome in ("429", "503"):
                    time.sleep(0.01)  # as fast as it can, without spinning on refusals

    workers = [threading.Thread(target=loop, args=(cl,)) for cl in clients for _ in range(threads)]
    for w in workers:
        w.start()
    if kill_at is not None:
        time.sleep(kill_at)
        metrics[c.gateways[1]] = scrape(c, c.gateways[1])
        c.procs["gateway2"].send_signal(signal.SIGKILL)
        with turn_lock:
            alive.remove(c.gateways[1])
    for w in workers:
        w.join()
    for u in alive:
        metrics[u] = scrape(c, u)
    return metrics


def scrape(c: Cluster, url: str) -> str:
    return httpx.get(
        url + "/metrics", headers={"Authorization": f"Bearer {c.reader}"}, timeout=10
    ).text


def counted(metrics: dict[str, str], client: str) -> int:
    """Prompt and completion tokens of ``client`` in every gateway's counters."""
    total = 0.0
    for text in metrics.values():
        for kind in ("prompt", "completion"):
            for m in re.finditer(
                rf'llmgw_gateway_tokens_total{{client="{re.escape(client)}",kind="{kind}",'
                rf'model="[^"]*"}} (\S+)',
                text,
            ):
                total += float(m.group(1))
    return int(total)


def ledger_total(c: Cluster, client: str) -> int | None:
    """The usage ledger's tokens for ``client`` (``GET /v1/usage``); None: no ledger (a
    control plane from before it)."""
    answer = httpx.get(
        c.server + "/v1/usage",
        params={"client": client},
        headers={"Authorization": f"Bearer {c.reader}"},
        timeout=30,
    )
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    return int(answer.json()["total"]["total_tokens"])


def report(
    title: str,
    clients: list[Client],
    seconds: float,
    metrics: dict[str, str],
    *,
    killed: bool,
    ledger: dict[str, int | None],
) -> None:
    reserved = admission.estimate(
        admission.parse_request(
            {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}, admission.CHAT
        )
    )
    print(f"\n### {title}\n")
    print(
        "| client | tpm | served (engines' usage) | allowed over the window | ratio "
        "| bound | within | answered | refused 429 | 503 | gateway gone |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for cl in clients:
        allowed = cl.tpm * (1 + seconds / 60)
        # Each gateway's chunks, one request's reservation for all (the account's credit
        # pool), and what a killed gateway held (docs/operator/tenants.md).
        one = reserved + MAX_TOKENS_DEFAULT
        bound = allowed + 2 * CHUNK_SHARE * cl.tpm + one + (CHUNK_SHARE * cl.tpm if killed else 0)
        s = cl.statuses
        print(
            f"| {cl.name} | {cl.tpm} | {cl.served} | {allowed:.0f} | {cl.served / allowed:.3f} "
            f"| {bound:.0f} | {'yes' if cl.served <= bound else 'NO'} | {s['200']} "
            f"| {s['429']} | {s['503']} | {s['refused'] + s['cut']} |"
        )
    print(
        "\n| client | engines' usage (answered streams) | the ledger (GET /v1/usage) "
        "| difference | gateways' counters (llmgw_gateway_tokens_total) | difference |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for cl in clients:
        gw = counted(metrics, cl.name)
        led = ledger.get(cl.name)
        shown = ("-", "-") if led is None else (str(led), str(led - cl.served))
        print(f"| {cl.name} | {cl.served} | {shown[0]} | {shown[1]} | {gw} | {gw - cl.served} |")


MAX_TOKENS_DEFAULT = 32


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench quotas", description=__doc__)
    p.add_argument("--window", type=float, default=60.0, help="seconds of each window")
    p.add_argument(
        "--tpm",
        type=int,
        nargs=4,
        default=[3000, 4000, 6000, 9000],
        metavar="N",
        help="the four clients' tokens a minute",
    )
    p.add_argument("--threads", type=int, default=3, help="streams at once per client")
    p.add_argument("--engine-args", default="--slots 16", help="the sim engines' flags")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument(
        "--base",
        default=os.environ.get("LLMGW_BENCH_BASE"),
        metavar="TREE",
        help="also run another version's processes (a checkout; default "
        "$LLMGW_BENCH_BASE), first, its rows marked (base): e.g. one whose gateways "
        "count each limit on their own",
    )
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmgw-quotas-"))
    print(
        f"two gateways, four clients x {args.threads} streams, max_tokens "
        f"{MAX_TOKENS_DEFAULT}, windows of {args.window:g} s; engine: sim {args.engine_args}; "
        f"load average before: {os.getloadavg()[0]:.1f}"
    )
    for tree in (args.base, None) if args.base else (None,):
        label = " (base)" if tree else ""
        (work / (label.strip(" ()") or "this")).mkdir()
        _windows(work / (label.strip(" ()") or "this"), args, tree, label)
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work directory: {work}")
    return 0


def _all_taken(c: Cluster, clients: list[Client]) -> bool:
    return all(taken(c, cl) for cl in clients)


def _windows(work: Path, args: argparse.Namespace, tree: str | None, label: str) -> None:
    with cluster(work, args.engine_args.split(), tree) as c:
        for phase, kill in (("both gateways alive", None), ("gateway 2 SIGKILLed", 0.5)):
            tag = "alive" if kill is None else "killed"
            clients = [issue(c, f"{tag}-app-{i + 1}", tpm) for i, tpm in enumerate(args.tpm)]
            wait_for(partial(_all_taken, c, clients), 60)
            started = time.monotonic()
            metrics = window(
                c,
                clients,
                args.window,
                threads=args.threads,
                max_tokens=MAX_TOKENS_DEFAULT,
                kill_at=None if kill is None else args.window * kill,
            )
            seconds = time.monotonic() - started
            # The gateways flush the ledger every second: what the survivors counted is
            # in it after two (the killed one's last second is lost with it).
            time.sleep(2.5)
            ledger = {cl.name: ledger_total(c, cl.name) for cl in clients}
            title = f"{phase}{label} ({seconds:.1f} s" + (
                f", killed at {args.window * kill:.0f} s)" if kill is not None else ")"
            )
            report(title, clients, seconds, metrics, killed=kill is not None, ledger=ledger)


if __name__ == "__main__":
    raise SystemExit(main())
