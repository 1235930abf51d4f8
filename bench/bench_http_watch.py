"""What watching a pipeline's HTTP and its waits on data costs it: a job of many small HTTP calls, with our
wrappers and with the libraries' own methods put back, in turn, in the same watched processes.

    python bench/bench_http_watch.py [--rounds 3] [--requests 1000]
    python bench/bench_http_watch.py --smoke   # for CI: one round of 100 requests a block

The job (this file, ``--job N``, under `gkd-tui launch --detach --linger 0 --`) is a pipeline's hot path at its
smallest: a Rollouter actor (async) sends requests one after another with aiohttp's client to an inference
server, an async actor serving over aiohttp.web, whose handler hands each request to its engine task through
an asyncio.Queue and awaits the answer on an asyncio.Event (as vLLM's and SGLang's servers hand requests to
their engines); the engine answers at once, and the rollouter puts each answer into a message queue actor
(an asyncio.Condition). Every request is a wait sent (http_calls), a call served, a queue put and got, an Event
set and waited, a Condition notified (data_waits): the most the watching of HTTP and data can cost, per
request, against requests that are usually far longer (a generation takes seconds).

Each round times blocks of N requests in turn, with our wrappers (http_calls' and data_waits') and with the
libraries' own methods put back (their ``__wrapped__``) in every process of the job, the watcher's threads
and the supervisor going on either way; the order within each pair alternates. And a control: a pair of
blocks both with the wrappers, taken apart the same way: the method's own spread. A round's ratio is the
median of its pairs'; the table gives the median of the rounds with min and max. The figure is the
wrappers' cost per request against a real local HTTP request; the watcher's own thread and the supervisor
(which a request that returns within 20 ms barely wakes) are bench_ray_watch's to time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import records  # bench/records.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 600  # a round is a minute or two here; one still going after this is stuck
PAIRS = 6  # pairs of blocks a round (each with its control pair)
# where http_calls and data_waits patch: (module, class, method)
PLACES = [("aiohttp.client", "ClientSession", "_request"), ("aiohttp.web_app", "Application", "_handle"),
          ("asyncio", "Event", "wait"), ("asyncio", "Event", "set"), ("asyncio", "Condition", "wait"),
          ("asyncio", "Condition", "notify"), ("asyncio", "Queue", "get"), ("asyncio", "Queue", "put_nowait"),
          ("threading", "Condition", "wait"), ("threading", "Condition", "notify")]
_ours: dict[tuple[str, str, str], object] = {}


def our_wrappers(on: bool) -> int:
    """In a watched process: our wrappers at each of PLACES (on), or the libraries' own methods they wrap (off).
    The first call must find them on. Returns how many places were ours."""
    for module, cls, name in PLACES:
        owner = getattr(sys.modules[module], cls, None) if module in sys.modules else None
        if owner is None:
            continue
        wrapper = _ours.setdefault((module, cls, name), owner.__dict__.get(name))
        if getattr(wrapper, "__wrapped__", None) is not None:
            setattr(owner, name, wrapper if on else wrapper.__wrapped__)
    return sum(getattr(w, "__wrapped__", None) is not None for w in _ours.values())


def job(n: int, pairs: int) -> None:
    import asyncio

    import aiohttp
    import ray
    from aiohttp import web

    @ray.remote(num_cpus=0)
    class InferenceServer:
        async def start(self) -> int:
            self.requests: asyncio.Queue = asyncio.Queue()
            self.engine = asyncio.get_running_loop().create_task(self._engine())
            app = web.Application()
            app.router.add_post("/generate", self.generate)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", 0).start()
            return self.runner.addresses[0][1]

        async def _engine(self) -> None:
            while True:
                body, done = await self.requests.get()
                done.answer = {"n": body["n"]}
                done.set()

        async def generate(self, request: web.Request) -> web.Response:
            done = asyncio.Event()
            self.requests.put_nowait((await request.json(), done))
            await done.wait()
            return web.json_response(done.answer)

        def wrappers(self, on: bool) -> int:
            return our_wrappers(on)

    @ray.remote(num_cpus=0)
    class MessageQueue:
        def __init__(self):
            self.samples, self.ready = [], asyncio.Condition()

        async def put_sample(self, sample) -> None:
            async with self.ready:
                self.samples.append(sample)
                self.ready.notify()

        def wrappers(self, on: bool) -> int:
            return our_wrappers(on)

    @ray.remote(num_cpus=0)
    class Rollouter:
        async def run(self, url: str, queue, n: int) -> float:
            async with aiohttp.ClientSession() as session:
                t0 = time.perf_counter()
                for i in range(n):
                    async with session.post(url, json={"n": i}) as answer:
                        await queue.put_sample.remote(await answer.json())
                return time.perf_counter() - t0

        def wrappers(self, on: bool) -> int:
            return our_wrappers(on)

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    server, queue, rollouter = InferenceServer.remote(), MessageQueue.remote(), Rollouter.remote()
    url = f"http://127.0.0.1:{ray.get(server.start.remote(), timeout=90)}/generate"
    actors = (server, queue, rollouter)
    ray.get(rollouter.run.remote(url, queue, 20), timeout=LIMIT_S)  # every actor up, every library imported
    ours = ray.get([a.wrappers.remote(True) for a in actors], timeout=60)
    print(f"PLACES {sum(ours)}", flush=True)

    def block(on: bool) -> float:
        ray.get([a.wrappers.remote(on) for a in actors], timeout=60)
        return ray.get(rollouter.run.remote(url, queue, n), timeout=LIMIT_S)

    ratios, control = [], []
    for k in range(pairs):  # each pair in turn with and without first: drift lands on both
        first = k % 2 == 0
        a, b = block(first), block(not first)
        on, off = (a, b) if first else (b, a)
        ratios.append(on / off)
        a, b = block(True), block(True)
        control.append(a / b if first else b / a)
        print(f"BLOCK_MS {1000 * off / n:.4f} {1000 * on / n:.4f}", flush=True)
    print(f"RATIO {statistics.median(ratios):.4f}", flush=True)
    print(f"CONTROL {statistics.median(control):.4f}", flush=True)
    ray.shutdown()


def watched(n: int, pairs: int, home: Path) -> dict[str, list[float]]:
    env = dict(os.environ, GKD_HOME=str(home))
    got = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "launch", "--detach", "--linger", "0", "--",
                          sys.executable, __file__, "--job", str(n), "--pairs", str(pairs)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=120)
    if got.returncode != 0:
        sys.exit(f"bench_http_watch: launch failed: {got.stderr[-2000:]}")
    run = home / "runs" / "latest"
    log = run / "logs" / "driver.log"
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline and "CONTROL" not in (log.read_text() if log.exists() else ""):
        time.sleep(1.0)
    subprocess.run([sys.executable, "-m", "gkd_tui.cli", "stop", str(run.resolve())], capture_output=True, env=env,
                   cwd=ROOT, timeout=120)
    out: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PLACES", "BLOCK_MS", "RATIO", "CONTROL"):
            out.setdefault(word, []).extend(float(x) for x in rest.split())
    if "CONTROL" not in out:
        sys.exit(f"bench_http_watch: the job said no figures within {LIMIT_S} s; its log:\n{log.read_text()[-3000:]}")
    return out


def spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pairs", type=int, default=PAIRS, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=1000, help="requests a block")
    p.add_argument("--smoke", action="store_true", help="one round of 100 requests a block, 2 pairs: for CI")
    a = p.parse_args()
    if a.job is not None:
        job(a.job, a.pairs)
        return
    if a.smoke:
        a.rounds, a.requests, a.pairs = 1, 100, 2
    rounds = []
    with records.kept("http_watch", smoke=a.smoke) as kept_run:
        with tempfile.TemporaryDirectory(prefix="gkd-bench-") as tmp:
            for r in range(a.rounds):
                rounds.append(watched(a.requests, a.pairs, Path(tmp)))
                print(f"round {r + 1}/{a.rounds}: {rounds[-1]}", file=sys.stderr, flush=True)
        places = sorted({int(x["PLACES"][0]) for x in rounds})
        if places == [0]:
            sys.exit("bench_http_watch: no wrapper of ours in the job's processes: is the run's Ray hook installed?")
        offs = [statistics.median(x["BLOCK_MS"][0::2]) for x in rounds]
        ons = [statistics.median(x["BLOCK_MS"][1::2]) for x in rounds]
        ratio = [x["RATIO"][0] for x in rounds]
        control = [x["CONTROL"][0] for x in rounds]
        print(f"{'':34s} {'median (min-max) of rounds':>28s}")
        print(f"{'a request, the libraries alone':34s} {spread(offs, '{:.3f}'):>24s} ms")
        print(f"{'a request, with our wrappers':34s} {spread(ons, '{:.3f}'):>24s} ms")
        print(f"{'with / without, pairs in place':34s} {spread(ratio, '{:.3f}x'):>28s}")
        print(f"{'control: with / with':34s} {spread(control, '{:.3f}x'):>28s}")
        print(f"\n{a.rounds} round(s) of {a.pairs} pairs of {a.requests}-request blocks; our wrappers at "
              f"{'/'.join(map(str, places))} places in the job's three processes; {os.cpu_count()} cores, "
              f"Python {sys.version.split()[0]}")
        kept_run.figure("a request with our wrappers against without, in place",
                        statistics.median(ratio), "x")


if __name__ == "__main__":
    main()
