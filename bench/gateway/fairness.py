"""``python -m bench fairness`` (or ``python -m bench.gateway.fairness``): who waits when
the replicas are full, with the gateway's queue and without it (FIFO at the engines, the
behaviour before the queue), in the same run.

Real processes: a ``llmgw serve`` on a fresh SQLite file, client tokens issued with the
real ``llmgw token new --priority-class --share``, two ``llmgw gateway``s (``--gateways``;
each its own gateway token; each replica's slots dealt among them, or each
``--slot-share`` when given: a tree before the deal needs ``--slot-share 0.5``) and sim
engines with slots (``python -m agent.sim --slots S
--token-delay D``), two replicas a model. Two models are served by identical engines:
``queued``, whose profile says ``--slots`` (so the gateways know when a replica is full
and queue the rest), and ``fifo``, whose profile does not (the gateways send everything
at once and each engine queues first come first served, as before the queue). The
replicas' endpoints are reported through the agent API (bench.gateway.control), so the
engines are the ones this script started.

Scenarios, each for ``--duration`` seconds on each model (requests alternate between the
two gateways; a request is one chat completion of ``--tokens`` tokens):

1. ``light alone``: one client at ``--rate`` requests a second: its time to first token
   (TTFT) alone, and one request's service time (its whole latency alone).
2. ``flood vs light``: a flooding client at 10x the light client's rate, same class and
   share, both over the replicas' capacity together. Target: the light client's p95 TTFT
   at most its figure alone plus one service time (with the queue), against FIFO.
3. ``4 flooders``: four clients of equal share, each asking more than a quarter of
   capacity (1.2x to 2.4x of it, so that FIFO, which serves in proportion to demand, and
   fair queuing, which serves in proportion to shares, differ). Jain's fairness index over
   the tokens each was served within the scenario (target at least 0.95).
4. ``critical during batch flood``: a ``critical`` client at the light rate while a
   ``batch`` client floods: the critical client's p95 TTFT against the same bound.

``--engine llamacpp``: the engines are llama.cpp's ``llama-server`` (the one ``make
llamacpp`` installs, or ``--server PATH``) on the tiny random-weight model
(``engine_check.tiny_gguf``), each with ``--parallel S`` (``--slots``); requests ask
``ignore_eos`` so each answers exactly ``--tokens`` tokens. ``queued``'s profile is a
``llamacpp`` profile with no ``slots`` and no args: the gateways read each replica's
slots from its ``/props`` (``total_slots``); ``fifo``'s profile names no engine the
gateways ask (``sim``, no args), so they know no slots and send everything at once, as
before. A llama.cpp slot's speed is the CPU's, not a setting: the replicas' capacity is
measured first (``REPLICAS x S`` closed-loop clients for ``--calibrate`` seconds) and the
rates follow from it.

Every answer's status is counted: 429 ``queue_full`` is the queue's refusal of the flood
beyond ``queue_max_length`` (the bound is there to be hit); any 5xx is a failure of the
target. Prints markdown tables; stderr has progress.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import httpx

from bench.gateway.control import ControlPlane, Unavailable, stop_process
from bench.shared.common import Table, emit, progress
from bench.shared.processes import LLMGW, free_port, wait_for

NODE = "bench-node"
MODELS = ("queued", "fifo")
REPLICAS = 2


ENGINES = ("sim", "llamacpp")


@dataclass
class Options:
    duration: float = 60.0
    rate: float = 0.0  # the light client's requests a second (0: an eighth of capacity)
    tokens: int = 16
    token_delay: float = 0.02
    slots: int = 2
    queue_max_length: int = 64
    engine: str = "sim"
    server: str = ""  # llama-server (llamacpp): "" for the one make llamacpp installs
    calibrate: float = 15.0  # seconds measuring a llama.cpp replica's capacity
    capacity: float = 0.0  # llama.cpp: the replicas' requests/s as given (0: measured)
    gateways: int = 2  # gateways in front of the replicas (requests alternate between them)
    # "": each gateway divides the slots among the live gateways itself; else its
    # --slot-share (a tree before that needs "0.5" for two)
    slot_share: str = ""
    models: tuple[str, ...] = ("queued", "fifo")
    no_borrow: bool = False  # the gateways with --no-borrow (the deal alone)
    log_level: str = "WARNING"  # the gateways' (INFO: a line per request, queued_ms)


@dataclass
class Cluster(ControlPlane):
    """The control plane of bench.gateway.control, serving two sim models whose replicas
    are engines this script started (``endpoints``: (model, replica index) -> URL)."""

    slots: int = 2
    engine: str = "sim"
    # model -> its engines' URLs, given to its placed replicas in turn
    engines: dict[str, list[str]] = field(default_factory=dict)
    _given: dict[tuple[str, str], str] = field(default_factory=dict)

    def _endpoint(self, model: str, replica: str) -> str | None:
        key = (model, replica)
        if key not in self._given:
            taken = {u for (m, _), u in self._given.items() if m == model}
            free = [u for u in self.engines.get(model, ()) if u not in taken]
            if not free:
                return None
            self._given[key] = free[0]
        return self._given[key]

    def _add_model(self, client: httpx.Client) -> None:
        for name in MODELS:
            if self.engine == "llamacpp":
                # queued: a llamacpp profile with no slots, read from the engines' /props;
                # fifo: a profile of no engine the gateways ask, and no args: no slots.
                engine, args = ("llamacpp" if name == "queued" else "sim"), []
            else:
                engine, args = "sim", ["--slots", str(self.slots)] if name == "queued" else []
            definition = {
                "name": name,
                "source": f"sim/{name}",
                "context_length": 8192 if self.engine == "sim" else 512,
                "max_output": 1024 if self.engine == "sim" else 256,
                "scaling": {"min": REPLICAS, "max": REPLICAS},
                "profiles": [{"name": "p", "engine": engine, "gpu_class": "SIM", "args": args}],
            }
            answer = client.post(
                "/v1/catalog/models", json=definition, headers=self._auth("operator")
            )
            if answer.status_code != 201:
                raise Unavailable(f"adding {name}: {answer.status_code} {answer.text[:300]}")

    def _report(self, client: httpx.Client) -> None:
        placed = client.get(
            "/v1/placements", params={"node": NODE}, headers=self._auth("agent")
        ).json()
        replicas = []
        for p in placed:
            url = self._endpoint(str(p["model"]), str(p["replica"]))
            if url is not None:
                replicas.append(
                    {
                        "model": p["model"],
                        "replica": p["replica"],
                        "state": "ready",
                        "endpoint": url,
                    }
                )
        answer = client.put(
            f"/v1/nodes/{NODE}",
            json={
                "gpu_class": "SIM",
                "gpus": 8,
                "memory_gb": 64,
                "address": "127.0.0.1",
                "replicas": replicas,
            },
            headers=self._auth("agent"),
        )
        if answer.status_code != 200:
            raise Unavailable(f"reporting {NODE}: {answer.status_code} {answer.text[:300]}")

    def client_token(self, name: str, *extra: str) -> str:
        """A client token in the database (with its class and share)."""
        out = self._llmgw("token", "new", name, "--role", "client", "--actor", "bench", *extra)
        return out.splitlines()[0].strip()


@dataclass
class Samples:
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    tokens: int = 0
    statuses: Counter[int] = field(default_factory=Counter)


async def one(
    session: aiohttp.ClientSession,
    url: str,
    *,
    token: str,
    model: str,
    n: int,
    out: Samples,
    until: float,
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "fair?"}],
        "max_tokens": n,
        "stream": True,
        "stream_options": {"include_usage": True},
        # llama.cpp: exactly the tokens asked (the random model may end early); the sim
        # answers exactly them anyway.
        "ignore_eos": True,
    }
    started = time.monotonic()
    try:
        async with session.post(
            url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as resp:
            # The gateway holds a stream's headers until its first content token: their
            # arrival is the time to first token.
            first = time.monotonic()
            data = await resp.read()
            out.statuses[resp.status] += 1
            if resp.status != 200:
                return
            out.ttft.append(first - started)
            out.latency.append(time.monotonic() - started)
            # Both engines answer exactly the tokens asked (a broken stream is short).
            # Counted only within the scenario: the backlog drained after it says nothing
            # of who was served while all wanted more than their share.
            if b"[DONE]" in data and time.monotonic() <= until:
                out.tokens += n
    except aiohttp.ClientError:
        out.statuses[0] += 1


async def client_loop(
    gateways: list[str],
    *,
    token: str,
    model: str,
    rate: float,
    until: float,
    opts: Options,
    out: Samples,
) -> None:
    """Open loop: a request every 1/rate seconds, alternating gateways, whatever the
    answers take (a flood does not slow down because it is served slowly)."""
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        i = 0
        start = time.monotonic()
        while time.monotonic() < until:
            task = asyncio.create_task(
                one(
                    session,
                    gateways[i % len(gateways)],
                    token=token,
                    model=model,
                    n=opts.tokens,
                    out=out,
                    until=until,
                )
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        if tasks:
            await asyncio.gather(*tasks)


async def scenario(
    gateways: list[str], model: str, clients: dict[str, tuple[str, float]], opts: Options
) -> dict[str, Samples]:
    until = time.monotonic() + opts.duration
    out = {name: Samples() for name in clients}
    await asyncio.gather(
        *(
            client_loop(
                gateways, token=token, model=model, rate=rate, until=until, opts=opts, out=out[name]
            )
            for name, (token, rate) in clients.items()
        )
    )
    return out


def p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def jain(values: list[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else float("nan")


def statuses(samples: dict[str, Samples]) -> str:
    merged: Counter[int] = Counter()
    for s in samples.values():
        merged.update(s.statuses)
    return ", ".join(f"{k}: {v}" for k, v in sorted(merged.items()))


def engine_argv(opts: Options, work: Path, model: str, port: int) -> list[str]:
    """One engine's command line: the sim with --slots, or llama-server with --parallel."""
    if opts.engine == "llamacpp":
        from engine_check.tiny_gguf import write

        gguf = work / "tiny.gguf"
        if not gguf.exists():
            write(gguf)
        return [
            llama_server(opts), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--alias", model, "--parallel", str(opts.slots), "--ctx-size",
            str(512 * opts.slots), "--threads", "1",
            # (its /metrics counts the requests it holds back: the gateways borrow idle
            # slots on it; without it, on /slots, where a full engine lends nothing)
            "--metrics",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "agent.sim", "--port", str(port), "--model", model,
        "--slots", str(opts.slots), "--token-delay", str(opts.token_delay),
    ]  # fmt: skip


def llama_server(opts: Options) -> str:
    from agent.binaries import find_llamacpp_server

    found, _ = find_llamacpp_server(opts.server or None)
    if found is None:
        raise SystemExit("no llama-server: run make llamacpp, or give --server PATH")
    return found


def start_engines(
    opts: Options, work: Path
) -> tuple[list[subprocess.Popen[bytes]], dict[str, list[str]]]:
    procs: list[subprocess.Popen[bytes]] = []
    endpoints: dict[str, list[str]] = {m: [] for m in MODELS}
    for model in MODELS:
        for i in range(REPLICAS):
            port = free_port()
            log = (work / f"{opts.engine}-{model}-{i}.log").open("wb")
            argv = engine_argv(opts, work, model, port)
            procs.append(subprocess.Popen(argv, stdout=log, stderr=log))
            endpoints[model].append(f"http://127.0.0.1:{port}")
    try:
        for urls in endpoints.values():
            for url in urls:
                wait_for(partial(_healthy, url))
    except BaseException:
        # An engine that never answered (or ^C): none of them is left behind.
        for proc in procs:
            stop_process(proc)
        raise
    return procs, endpoints


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def start_gateway(
    cp: Cluster, opts: Options, n: int, token_file: Path
) -> tuple[subprocess.Popen[bytes], str]:
    argv = [
        LLMGW, "gateway", "--server", cp.url, "--token-file", str(token_file),
        "--port", "0", "--admin-open", "--gateway-id", f"bench-gw{n}",
        "--queue-max-length", str(opts.queue_max_length),
    ]  # fmt: skip
    if opts.slot_share:
        argv += ["--slot-share", opts.slot_share]
    if opts.no_borrow:
        argv.append("--no-borrow")
    env = {**cp.env, "LLMGW_LOG_LEVEL": opts.log_level}
    proc = subprocess.Popen(
        argv,
        cwd=cp.workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=(cp.workdir / f"gateway{n}.log").open("wb"),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening on " not in line:
        raise Unavailable(f"the gateway did not start: {line!r}")
    url = line.split("listening on ", 1)[1].strip()

    def ready() -> bool:
        models = httpx.get(url + "/routing", timeout=5).json()["models"]
        if not all(len(models.get(m, {}).get("replicas", ())) == REPLICAS for m in MODELS):
            return False
        # queued's replicas know their slots (from the profile, or llama.cpp's /props).
        return all(r["slots"] for r in models["queued"]["replicas"])

    wait_for(ready, timeout=120)
    return proc, url


def run_all(opts: Options, work: Path) -> list[Table]:
    engines, endpoints = start_engines(opts, work)
    cp = Cluster(
        LLMGW, work / "cp", upstream="", slots=opts.slots, engine=opts.engine, engines=endpoints
    )
    gws: list[subprocess.Popen[bytes]] = []
    try:
        cp.start()
        tokens = {
            "light": cp.client_token("light"),
            "flood": cp.client_token("flood"),
            **{f"f{i}": cp.client_token(f"f{i}") for i in range(4)},
            "crit": cp.client_token("crit", "--priority-class", "critical"),
            "bulk": cp.client_token("bulk", "--priority-class", "batch"),
        }
        urls = []
        for n in range(opts.gateways):
            # Each gateway its own token: the control plane counts a token (and worker
            # number) as one gateway when it tells them how many there are.
            token_file = cp.gateway_token_file
            if n:
                token_file = work / f"gateway{n}.token"
                out = cp._llmgw("token", "new", f"bench-gw{n}", "--role", "gateway")
                token_file.write_text(out.splitlines()[0].strip() + "\n")
                token_file.chmod(0o600)
            proc, url = start_gateway(cp, opts, n, token_file)
            gws.append(proc)
            urls.append(url)

        def takes_all() -> bool:
            for tok in tokens.values():
                got = httpx.get(
                    urls[0] + "/v1/models", headers={"Authorization": f"Bearer {tok}"}, timeout=5
                )
                if got.status_code != 200:
                    return False
            return True

        wait_for(takes_all)
        return asyncio.run(_scenarios(urls, tokens, opts))
    finally:
        for proc in gws:
            stop_process(proc)
        cp.stop()
        for proc in engines:
            stop_process(proc)


async def measured_capacity(urls: list[str], token: str, opts: Options) -> float:
    """Requests a second the replicas serve with every slot busy: REPLICAS x slots
    closed-loop clients on ``queued`` (which never queues them: one a slot)."""
    out = Samples()
    until = time.monotonic() + opts.calibrate
    clients = REPLICAS * opts.slots

    async def loop(i: int, session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            await one(
                session, urls[i % len(urls)], token=token, model="queued", n=opts.tokens,
                out=out, until=until,
            )  # fmt: skip

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        started = time.monotonic()
        await asyncio.gather(*(loop(i, session) for i in range(clients)))
        took = time.monotonic() - started
    return len(out.latency) / took


async def _scenarios(urls: list[str], tokens: dict[str, str], opts: Options) -> list[Table]:
    if opts.engine == "llamacpp" and opts.capacity > 0:
        capacity = opts.capacity  # (two trees offered the same load: --capacity)
    elif opts.engine == "llamacpp":
        progress(f"fairness: measuring the replicas' capacity ({opts.calibrate:g} s)")
        capacity = await measured_capacity(urls, tokens["light"], opts)
        progress(f"fairness: capacity {capacity:.2f} requests/s")
    else:
        capacity = REPLICAS * opts.slots / (opts.tokens * opts.token_delay)
    # The light client at an eighth of capacity, the flood at ten times that: together
    # 1.4x what the replicas serve, so every slot is busy and a backlog grows.
    light = opts.rate or capacity / 8
    flood = light * 10
    # Four flooders of equal share at different rates, each above its fair quarter of
    # capacity (1.2x to 2.4x of it): FIFO serves them in proportion to their rates, the
    # queue in proportion to their shares.
    flooders = [capacity / 4 * k for k in (1.2, 1.6, 2.0, 2.4)]
    results: dict[str, dict[str, dict[str, Samples]]] = defaultdict(dict)
    for model in opts.models:
        progress(f"fairness: {model}: light alone")
        results[model]["alone"] = await scenario(
            urls, model, {"light": (tokens["light"], light)}, opts
        )
        progress(f"fairness: {model}: flood vs light")
        results[model]["flood"] = await scenario(
            urls,
            model,
            {"light": (tokens["light"], light), "flood": (tokens["flood"], flood)},
            opts,
        )
        progress(f"fairness: {model}: four flooders, equal shares")
        results[model]["four"] = await scenario(
            urls, model, {f"f{i}": (tokens[f"f{i}"], flooders[i]) for i in range(4)}, opts
        )
        progress(f"fairness: {model}: critical during a batch flood")
        results[model]["crit"] = await scenario(
            urls,
            model,
            {"crit": (tokens["crit"], light), "bulk": (tokens["bulk"], flood)},
            opts,
        )
    engines = (
        f"llama.cpp replicas (llama-server --parallel {opts.slots}, tiny random model) x "
        f"{opts.slots} slots, {opts.tokens} tokens a request"
        if opts.engine == "llamacpp"
        else f"sim replicas x {opts.slots} slots, {opts.tokens} tokens a request at "
        f"{opts.token_delay * 1e3:g} ms each"
    )
    measured = "measured" if opts.engine == "llamacpp" and not opts.capacity else "about"
    shares = f"--slot-share {opts.slot_share}" if opts.slot_share else "their slots dealt"
    table = Table(
        f"Fairness when the replicas are full ({REPLICAS} {engines}, {opts.gateways} "
        f"gateway(s), {shares}, {opts.duration:g} s a scenario; capacity {measured} "
        f"{capacity:.2f} requests/s)",
        ["scenario", "figure", "FIFO (no queue)", "queue", "target"],
    )
    # One request's service time when every slot is busy: the slots over the capacity
    # (Little's law; for the sim, its tokens times its token delay, whatever the load).
    busy_service = REPLICAS * opts.slots / capacity
    for model in opts.models:
        alone = results[model]["alone"]["light"]
        service = statistics.median(alone.latency) if alone.latency else float("nan")
        results[model]["bound"] = {"_": Samples(ttft=[p95(alone.ttft) + service])}
        results[model]["bound_busy"] = {"_": Samples(ttft=[p95(alone.ttft) + busy_service])}

    def cell(model: str, what: str, client: str) -> str:
        if model not in results:
            return "-"
        return f"{p95(results[model][what][client].ttft) * 1e3:.0f} ms"

    def bound(model: str, what: str = "bound") -> str:
        if model not in results:
            return "-"
        return f"{results[model][what]['_'].ttft[0] * 1e3:.0f} ms"

    def jain_of(model: str) -> str:
        if model not in results:
            return "-"
        return f"{jain([float(results[model]['four'][f'f{i}'].tokens) for i in range(4)]):.3f}"

    def statuses_of(model: str, what: str) -> str:
        return statuses(results[model][what]) if model in results else "-"

    table.add("light alone", "light p95 TTFT", cell("fifo", "alone", "light"),
              cell("queued", "alone", "light"), "")  # fmt: skip
    table.add("light alone", "bound: alone p95 + one service time alone",
              bound("fifo"), bound("queued"), "")  # fmt: skip
    table.add("light alone",
              f"bound: alone p95 + one service time all slots busy ({busy_service * 1e3:.0f} ms)",
              bound("fifo", "bound_busy"), bound("queued", "bound_busy"), "")  # fmt: skip
    table.add(f"flood ({flood:g}/s) vs light ({light:g}/s)", "light p95 TTFT",
              cell("fifo", "flood", "light"), cell("queued", "flood", "light"),
              "queue <= bound")  # fmt: skip
    table.add(f"flood ({flood:g}/s) vs light ({light:g}/s)", "flood p95 TTFT",
              cell("fifo", "flood", "flood"), cell("queued", "flood", "flood"), "")  # fmt: skip
    table.add("4 flooders, equal shares, "
              f"{', '.join(f'{r:.1f}' for r in flooders)}/s (fair: {capacity / 4:.1f})",
              "Jain's index, tokens served in the window",
              jain_of("fifo"), jain_of("queued"), ">= 0.95")  # fmt: skip
    table.add("critical during batch flood", "critical p95 TTFT",
              cell("fifo", "crit", "crit"), cell("queued", "crit", "crit"),
              "queue <= bound")  # fmt: skip
    for what, label in (("flood", "flood vs light"), ("four", "4 flooders"),
                        ("crit", "critical vs batch")):  # fmt: skip
        table.add(label, "answers by status",
                  statuses_of("fifo", what), statuses_of("queued", what),
                  "no 5xx")  # fmt: skip
    table.notes.append(
        "TTFT is measured at the client (the gateway holds a stream's headers until its "
        "first content token). 429 is the queue's queue_full for the flood past "
        f"queue_max_length {opts.queue_max_length}: the bound doing its job, not a failure."
    )
    return [table]


def run(quick: bool) -> list[Table]:
    opts = Options(duration=15.0 if quick else 60.0)
    with tempfile.TemporaryDirectory(prefix="llmgw-fairness-") as tmp:
        return run_all(opts, Path(tmp))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway.fairness", description=__doc__)
    p.add_argument("--duration", type=float, default=60.0, help="seconds a scenario (60)")
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="the light client's requests/s (an eighth of capacity)",
    )
    p.add_argument("--tokens", type=int, default=16, help="tokens a request")
    p.add_argument(
        "--slots", type=int, default=2, help="slots a replica (sim --slots, llama.cpp --parallel)"
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="sim",
        help="the replicas' engine: the sim, or llama.cpp's llama-server (make llamacpp)",
    )
    p.add_argument(
        "--server", default="", help="llama-server to run (default: as the agent finds it)"
    )
    p.add_argument(
        "--calibrate",
        type=float,
        default=15.0,
        help="seconds measuring a llama.cpp replica's capacity before the scenarios (15)",
    )
    p.add_argument(
        "--capacity",
        type=float,
        default=0.0,
        help="llama.cpp: the replicas' capacity in requests/s, not measured (the same "
        "offered load for two trees run apart)",
    )
    p.add_argument("--gateways", type=int, default=2, help="gateways in front of the replicas (2)")
    p.add_argument(
        "--no-borrow",
        action="store_true",
        help="the gateways with --no-borrow: each its deal of the slots alone",
    )
    p.add_argument(
        "--slot-share",
        default="",
        help="each gateway's --slot-share (default: none given, the gateways deal each "
        "replica's slots among the live ones; a tree before that: 1/N)",
    )
    p.add_argument(
        "--models",
        default=",".join(MODELS),
        help="the models to run the scenarios on: queued (the gateway's queue), fifo "
        "(none); both by default",
    )
    p.add_argument("--log-level", default="WARNING", help="the gateways' (INFO: a line a request)")
    p.add_argument("--keep", type=Path, help="run in this directory and keep the logs")
    args = p.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    if not models or set(models) - set(MODELS):
        p.error(f"--models: of {', '.join(MODELS)}")
    opts = Options(
        duration=args.duration,
        rate=args.rate,
        tokens=args.tokens,
        slots=args.slots,
        engine=args.engine,
        server=args.server,
        calibrate=args.calibrate,
        capacity=args.capacity,
        no_borrow=args.no_borrow,
        gateways=max(args.gateways, 1),
        slot_share=args.slot_share,
        models=models,
        log_level=args.log_level,
    )
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        tables = run_all(opts, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="llmgw-fairness-") as tmp:
            tables = run_all(opts, Path(tmp))
    for table in tables:
        emit(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
