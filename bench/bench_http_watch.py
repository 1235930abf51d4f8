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

Each round runs cycles of four blocks of N requests, in an order that turns each cycle: the libraries' own
methods in every process of the job (their ``__wrapped__``: nothing of ours at the places below, the Ray hooks
and the watcher going on either way), our HTTP wrappers alone (http_calls': the requests sent and served),
all our wrappers (http_calls' and data_waits'), and all of them again: a control, the method's own spread. A
block's cost is the CPU time its requests took in the job's three processes (every thread: the loop's, Ray's,
the watcher's, ZeroMQ's), per request; a cycle's ratio is its block's against the libraries' own, a round's
the median of its cycles', and the table the median of the rounds with min and max. A local request here
is a couple of milliseconds of CPU: the most the watching can weigh on a request; a generation takes seconds.
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
CYCLES = 6  # cycles of blocks a round
# where http_calls and data_waits patch: (module, class, method)
HTTP_PLACES = [("aiohttp.client", "ClientSession", "_request"), ("aiohttp.web_app", "Application", "_handle")]
DATA_PLACES = [("asyncio", "Event", "wait"), ("asyncio", "Event", "set"), ("asyncio", "Condition", "wait"),
               ("asyncio", "Condition", "notify"), ("asyncio", "Queue", "get"), ("asyncio", "Queue", "put_nowait"),
               ("threading", "Condition", "wait"), ("threading", "Condition", "notify")]
# a block's arm: which of our wrappers are in place
ARMS = {"none": [], "http": HTTP_PLACES, "all": HTTP_PLACES + DATA_PLACES, "control": HTTP_PLACES + DATA_PLACES}
_ours: dict[tuple[str, str, str], object] = {}


def our_wrappers(arm: str) -> int:
    """In a watched process: our wrappers at the places of ``arm``, the libraries' own methods they wrap at the
    others. The first call must find them all ours. Returns how many places were ours."""
    for place in HTTP_PLACES + DATA_PLACES:
        module, cls, name = place
        owner = getattr(sys.modules[module], cls, None) if module in sys.modules else None
        if owner is None:
            continue
        wrapper = _ours.setdefault(place, owner.__dict__.get(name))
        if getattr(wrapper, "__wrapped__", None) is not None:
            setattr(owner, name, wrapper if place in ARMS[arm] else wrapper.__wrapped__)
    return sum(getattr(w, "__wrapped__", None) is not None for w in _ours.values())


def cpu_s() -> float:
    return time.process_time()  # this process's, every thread's


def job(n: int, cycles: int) -> None:
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

        def wrappers(self, arm: str) -> int:
            return our_wrappers(arm)

        def cpu(self) -> float:
            return cpu_s()

    @ray.remote(num_cpus=0)
    class MessageQueue:
        def __init__(self):
            self.samples, self.ready = [], asyncio.Condition()

        async def put_sample(self, sample) -> None:
            async with self.ready:
                self.samples.append(sample)
                self.ready.notify()

        def wrappers(self, arm: str) -> int:
            return our_wrappers(arm)

        def cpu(self) -> float:
            return cpu_s()

    @ray.remote(num_cpus=0)
    class Rollouter:
        async def run(self, url: str, queue, n: int) -> float:
            async with aiohttp.ClientSession() as session:
                t0 = time.perf_counter()
                for i in range(n):
                    async with session.post(url, json={"n": i}) as answer:
                        await queue.put_sample.remote(await answer.json())
                return time.perf_counter() - t0

        def wrappers(self, arm: str) -> int:
            return our_wrappers(arm)

        def cpu(self) -> float:
            return cpu_s()

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    server, queue, rollouter = InferenceServer.remote(), MessageQueue.remote(), Rollouter.remote()
    url = f"http://127.0.0.1:{ray.get(server.start.remote(), timeout=90)}/generate"
    actors = (server, queue, rollouter)
    ray.get(rollouter.run.remote(url, queue, 20), timeout=LIMIT_S)  # every actor up, every library imported
    ours = ray.get([a.wrappers.remote("all") for a in actors], timeout=60)
    print(f"PLACES {sum(ours)}", flush=True)

    def block(arm: str) -> tuple[float, float]:
        """A block of ``n`` requests with ``arm``'s wrappers: (CPU, wall) a request, in ms."""
        ray.get([a.wrappers.remote(arm) for a in actors], timeout=60)
        before = sum(ray.get([a.cpu.remote() for a in actors], timeout=60))
        wall = ray.get(rollouter.run.remote(url, queue, n), timeout=LIMIT_S)
        cpu = sum(ray.get([a.cpu.remote() for a in actors], timeout=60)) - before
        return 1000 * cpu / n, 1000 * wall / n

    arms = list(ARMS)
    for k in range(cycles):  # each arm first in turn: drift lands on all
        took = {arm: block(arm) for arm in arms[k % 4:] + arms[:k % 4]}
        print("BLOCK " + " ".join(f"{took[arm][0]:.4f} {took[arm][1]:.4f}" for arm in arms), flush=True)
    ray.shutdown()


def watched(n: int, cycles: int, home: Path) -> dict[str, list[list[float]]]:
    env = dict(os.environ, GKD_HOME=str(home))
    got = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "launch", "--detach", "--linger", "0", "--",
                          sys.executable, __file__, "--job", str(n), "--cycles", str(cycles)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=120)
    if got.returncode != 0:
        sys.exit(f"bench_http_watch: launch failed: {got.stderr[-2000:]}")
    run = home / "runs" / "latest"
    log = run / "logs" / "driver.log"
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline and len(_said(log).get("BLOCK", [])) < cycles:
        time.sleep(1.0)
    subprocess.run([sys.executable, "-m", "gkd_tui.cli", "stop", str(run.resolve())], capture_output=True, env=env,
                   cwd=ROOT, timeout=120)
    out = _said(log)
    if len(out.get("BLOCK", [])) < cycles:
        sys.exit(f"bench_http_watch: the job said {len(out.get('BLOCK', []))} of {cycles} cycles within {LIMIT_S} s; "
                 f"its log:\n{log.read_text()[-3000:]}")
    return out


def _said(log: Path) -> dict[str, list[list[float]]]:
    """The figures the job printed, by their first word: a list of numbers a line."""
    out: dict[str, list[list[float]]] = {}
    for line in (log.read_text() if log.exists() else "").splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PLACES", "BLOCK"):
            out.setdefault(word, []).append([float(x) for x in rest.split()])
    return out


def spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cycles", type=int, default=CYCLES, help="cycles of the four blocks a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=1000, help="requests a block")
    p.add_argument("--smoke", action="store_true", help="one round of 2 cycles of 100-request blocks: for CI")
    a = p.parse_args()
    if a.job is not None:
        job(a.job, a.cycles)
        return
    if a.smoke:
        a.rounds, a.requests, a.cycles = 1, 100, 2
    rounds = []
    with records.kept("http_watch", smoke=a.smoke) as kept_run:
        with tempfile.TemporaryDirectory(prefix="gkd-bench-") as tmp:
            for r in range(a.rounds):
                rounds.append(watched(a.requests, a.cycles, Path(tmp)))
                print(f"round {r + 1}/{a.rounds}: {rounds[-1]}", file=sys.stderr, flush=True)
        places = sorted({int(x["PLACES"][0][0]) for x in rounds})
        if places == [0]:
            sys.exit("bench_http_watch: no wrapper of ours in the job's processes: is the run's Ray hook installed?")
        arms = list(ARMS)

        def per_round(arm: str, what: int) -> list[float]:  # what: 0 CPU, 1 wall; a round's median of its cycles
            return [statistics.median(c[2 * arms.index(arm) + what] for c in x["BLOCK"]) for x in rounds]

        def ratio(arm: str, to: str, what: int = 0) -> list[float]:
            return [statistics.median(c[2 * arms.index(arm) + what] / c[2 * arms.index(to) + what] for c in x["BLOCK"])
                    for x in rounds]

        rows = [("a request's CPU, nothing of ours", spread(per_round("none", 0)) + " ms"),
                ("  with our HTTP wrappers", spread(per_round("http", 0)) + " ms"),
                ("  with all our wrappers", spread(per_round("all", 0)) + " ms"),
                ("HTTP wrappers / none, CPU", spread(ratio("http", "none"), "{:.3f}x")),
                ("all wrappers / none, CPU", spread(ratio("all", "none"), "{:.3f}x")),
                ("control: all / all, CPU", spread(ratio("control", "all"), "{:.3f}x")),
                ("all wrappers / none, wall", spread(ratio("all", "none", 1), "{:.3f}x"))]
        print(f"{'':30s} {'median (min-max) of rounds':>30s}")
        for name, value in rows:
            print(f"{name:30s} {value:>30s}")
        print(f"\n{a.rounds} round(s) of {a.cycles} cycles of four {a.requests}-request blocks; our wrappers at "
              f"{'/'.join(map(str, places))} places in the job's three processes; {os.cpu_count()} cores, "
              f"Python {sys.version.split()[0]}")
        kept_run.figure("a request's CPU with our HTTP wrappers against none", statistics.median(ratio("http", "none")),
                        "x")
        kept_run.figure("a request's CPU with all our wrappers against none", statistics.median(ratio("all", "none")),
                        "x")
        kept_run.figure("the control: all against all", statistics.median(ratio("control", "all")), "x")


if __name__ == "__main__":
    main()
