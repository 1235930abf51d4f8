"""What watching a plain Ray job costs it: a job of many small calls, with and without `gkd-tui launch --`.

    python bench/bench_ray_watch.py [--rounds 3] [--calls 2000]
    python bench/bench_ray_watch.py --smoke   # for CI: one round each way, 200 calls; nothing recorded

The job (this file, ``--job``) makes two Caller and two Callee actors; each Caller makes CALLS calls, one
at a time, each a ``ray.get`` on a Callee's method that returns at once, while the driver waits on the
Callers; then the driver itself makes CALLS calls of its own the same way. Every call is a phase and every
``ray.get`` a wait with its edge in the wait-for graph (the phase event's ``waits_on``), in every process
of the job: the most the watching can cost a job, whose calls are usually far longer.

The job times three things of its own:
- up: ``ray.init`` and its actors' start (where the watching sets itself up in every worker, once);
- then it waits for the machine to fall quiet (every process's CPU, read from /proc, under a fifth of a
  core for a second; at most SETTLE_MAX_S): what Ray and the watching still start after the actors
  answer (Ray's idle workers, its agents, the supervisor's first work) would otherwise fall inside the
  loop and be counted as the cost of each call;
- loop: the calls, by its clock, and every process's CPU seconds over it (the job's, Ray's, ours).

Watched, the job then times the wrappers alone (``our_wrappers``): blocks of calls with them and with Ray's own
calls put back in every process, in turn, in the same processes beside the same threads and supervisor, so
that what drifts between two separate runs (a 2-core machine's ±15 % a round) lands on both sides of a pair.
After each such pair, a control: a pair of the same blocks both with the wrappers, taken apart the same way.
What it reads is the method's own spread and lean where there is nothing to find (a pair's ratio moves by
several percent here); the wrappers' cost is what the pairs read over it.

Then it times each wrapper where it runs (``timed_places``): a timer around it and one around what it wraps,
in blocks of calls in turn with a block whose outer timer calls the inner one directly. That reads what a
few percent of spread hides from the ratios: our wrappers' microseconds a call, on the caches the job leaves
them (several times what the same lines cost in a loop of their own), which with our threads' and the
supervisor's CPU is the watching's own work against the job's.

Without: ``python bench_ray_watch.py --job CALLS``. With: the same under ``gkd-tui launch --detach --linger 0
--``: the supervisor, Ray's hooks in every worker, the diagnosis. Each round runs both, so that both see
the same machine, and the rounds take turns at which goes first (without then with, with then without),
so that whatever favours the first or the second of two runs in a row (caches warm, a file read again)
lands on both sides. Each ratio is the median of each round's with/without.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import records  # bench/records.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 600  # a round is well under a minute here; one still going after this is stuck


SETTLE_MAX_S = 30.0  # a machine still busy after this is busy with something else: timed as it is
QUIET_CORES = 0.2


def cpu_by_pid() -> dict[int, tuple[float, str]]:
    """Every process's CPU seconds so far and its command line, from /proc (Ray's, ours, the job's)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone between the listing and the read
                continue
            out[int(pid)] = ((int(fields[11]) + int(fields[12])) / tick, cmdline)
    return out


def cpu_seconds() -> float:
    return sum(t for t, _ in cpu_by_pid().values())


def settle() -> float:
    """Wait for the machine to fall quiet; the seconds it took."""
    t0 = time.monotonic()
    was, quiet_since = cpu_seconds(), None
    while time.monotonic() - t0 < SETTLE_MAX_S:
        time.sleep(0.25)
        now = cpu_seconds()
        busy = (now - was) / 0.25 > QUIET_CORES
        was = now
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= 1.0:
            break
    return time.monotonic() - t0


def our_threads_cpu() -> dict[str, float]:
    """This process's CPU seconds in each of the watching's own threads (named gkd-…: the call watcher, the
    heartbeat, the driver's command inbox and cluster watch), read from /proc by each thread's native id."""
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t.name.startswith("gkd-") and t.native_id is not None:
            try:
                with open(f"/proc/self/task/{t.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kind = t.name.split("[")[0]  # gkd-reporter[src]: one kind
            out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def our_wrappers(on: bool) -> None:
    """In a watched process: the watching's wrappers around Ray's calls, waits and actor methods (ray_hook)
    put back (on) or bypassed (off): Ray's own ``ray.get``, ``ray.wait``, actor call and method executors, which
    the wrappers name as ``__wrapped__``. Its threads and the supervisor go on either way. The first call must
    find them on."""
    import ray
    from ray._private.worker import global_worker
    from ray.actor import ActorMethod

    kept = _WRAPPED.setdefault("wrappers", {"get": ray.get, "wait": ray.wait, "remote": ActorMethod._remote})
    if on:
        ray.get, ray.wait, ActorMethod._remote = kept["get"], kept["wait"], kept["remote"]
    else:
        ray.get, ray.wait = kept["get"].__wrapped__, kept["wait"].__wrapped__
        ActorMethod._remote = kept["remote"].__wrapped__
    # an actor's methods: Ray keeps each one's executor in two tables (the second, once it has run)
    manager = global_worker.function_actor_manager
    ours = _WRAPPED.setdefault("executors", {})  # Ray's executor -> ours around it
    for table in (manager._function_execution_info, manager.execution_infos):
        for key, info in list(table.items()):
            wrapped = getattr(info.function, "__wrapped__", None)
            if not on and wrapped is not None:
                ours[wrapped] = info.function
                table[key] = info._replace(function=wrapped)
            elif on and info.function in ours:
                table[key] = info._replace(function=ours[info.function])


_WRAPPED: dict[str, dict] = {}


# --- our wrappers timed in place ------------------------------------------------------------------------
# Timed alone, in a loop of its own, a wrapper runs on hot caches; in the job, between two of its calls Ray's own code
# (its serializer, its gRPC threads) has run and evicted ours, and the same lines cost several times as much.
# So each wrapper is timed where it runs, as the job calls it: a timer around it (outer) and one around what it
# wraps (inner), the wrapper's part being outer - inner; in turn with a block where outer calls inner directly,
# whose outer - inner is the timers' own part, taken off. A call preempted between the two readings (a 2-core
# machine runs 5 busy processes) reads milliseconds: such a call (over PREEMPTED_S) is left out of both.
PLACES = ("call", "wait", "run")
PLACE_SAID = {"call": "around the actor call where it is made", "wait": "around its ray.get",
              "run": "around the method where it runs"}
PREEMPTED_S = 0.0005
_TIMED: dict = {}


def timed_places(ours: bool) -> dict[str, list[float]]:
    """In a watched process: the timers around our wrappers put in (the first time), and the next calls timed
    with them (``ours``) or without them (outer straight to inner). Returns each place's sums so far: [seconds
    and calls with ours, seconds and calls without, calls left out]."""
    if not _TIMED:
        _install_timers()
    _TIMED["ours"] = ours
    return _TIMED["sums"]


def _install_timers() -> None:
    import ray
    from ray._private.worker import global_worker
    from ray.actor import ActorMethod

    clock, state = time.perf_counter, _TIMED
    state["sums"] = {}

    def timers(place: str, wrapper, cell_of, real):
        """An outer and an inner timer for ``wrapper``, whose call of ``real`` (Ray's) is set to the inner."""
        sums = state["sums"][place] = [0.0, 0, 0.0, 0, 0]
        inner_s = [0.0]

        def inner(*args, **kwargs):
            t0 = clock()
            out = real(*args, **kwargs)
            inner_s[0] = clock() - t0
            return out

        cell_of(inner)

        def outer(*args, **kwargs):
            ours = state["ours"]
            t0 = clock()
            out = (wrapper if ours else inner)(*args, **kwargs)
            ours_s = clock() - t0 - inner_s[0]
            if ours_s > PREEMPTED_S:
                sums[4] += 1
            elif ours:
                sums[0] += ours_s
                sums[1] += 1
            else:
                sums[2] += ours_s
                sums[3] += 1
            return out

        return outer

    def cell(function, name: str):
        """The cell of ``function``'s closure that holds ``name`` (what a wrapper of ray_hook's calls)."""
        return function.__closure__[function.__code__.co_freevars.index(name)]

    call = ActorMethod._remote  # ray_hook's _call, around Ray's (its closure's ``call``)
    ActorMethod._remote = timers("call", call, lambda inner: setattr(cell(call, "call"), "cell_contents", inner),
                                 cell(call, "call").cell_contents)
    get = ray.get  # ray_hook's waiting, around Ray's (its keyword default ``_original``)
    ray.get = timers("wait", get, lambda inner: get.__kwdefaults__.update(_original=inner),
                     get.__kwdefaults__["_original"])
    # a Callee's method, ray_hook's run around Ray's executor: Ray keeps it in two tables (the second, once run)
    manager = global_worker.function_actor_manager
    tables = (manager._function_execution_info, manager.execution_infos)
    kept: dict[int, Any] = {}  # (the same info in both tables: one pair of timers)
    for table in tables:
        for key, info in list(table.items()):
            if info.function_name == "answer":
                if id(info) not in kept:
                    run, executor = info.function, cell(info.function, "executor")
                    outer = timers("run", run, lambda inner, held=executor: setattr(held, "cell_contents", inner),
                                   executor.cell_contents)
                    outer.name, outer.method = run.name, run.method  # what Ray's task executor reads
                    kept[id(info)] = info._replace(function=outer)
                table[key] = kept[id(info)]

IN_PLACE_PAIRS = 8  # blocks with the wrappers and without, in turn, in one watched job (and as many controls)
TIMED_PAIRS = 4  # blocks with the timers around our wrappers, and around nothing, in turn


def job(calls: int) -> None:
    import ray

    @ray.remote(num_cpus=0)
    class Callee:
        def answer(self, i: int) -> int:
            return i

        def pid(self) -> int:
            return os.getpid()

        def threads_cpu(self) -> dict[str, float]:
            return our_threads_cpu()

        def wrappers(self, on: bool) -> None:
            our_wrappers(on)

        def timed(self, ours: bool) -> dict[str, list[float]]:
            return timed_places(ours)

    @ray.remote(num_cpus=0)
    class Caller:
        def __init__(self, callee):
            self.callee = callee

        def run(self, n: int) -> int:
            return sum(ray.get(self.callee.answer.remote(i), timeout=60) for i in range(n))

        def pid(self) -> int:
            return os.getpid()

        def threads_cpu(self) -> dict[str, float]:
            return our_threads_cpu()

        def wrappers(self, on: bool) -> None:
            our_wrappers(on)

        def timed(self, ours: bool) -> dict[str, list[float]]:
            return timed_places(ours)

    def threads_cpu() -> collections.Counter:
        total = collections.Counter(our_threads_cpu())
        for each in ray.get([a.threads_cpu.remote() for a in callers + callees], timeout=60):
            total.update(each)
        return total

    t_up = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    callees = [Callee.remote() for _ in range(2)]
    callers = [Caller.remote(c) for c in callees]
    ray.get([c.run.remote(1) for c in callers], timeout=LIMIT_S)  # every actor up
    print(f"UP_S {time.perf_counter() - t_up:.4f}", flush=True)
    job_pids = [os.getpid(), *ray.get([a.pid.remote() for a in callers + callees], timeout=60)]
    print(f"SETTLE_S {settle():.2f}", flush=True)
    threads0 = threads_cpu()
    cpu0, t0 = cpu_by_pid(), time.perf_counter()
    ray.get([c.run.remote(calls) for c in callers], timeout=LIMIT_S)
    for i in range(calls):
        ray.get(callees[i % 2].answer.remote(i), timeout=60)
    print(f"LOOP_S {time.perf_counter() - t0:.4f}", flush=True)
    cpu1 = cpu_by_pid()
    threads = {k: v - threads0.get(k, 0.0) for k, v in threads_cpu().items()}
    print(f"THREADS_CPU_S {sum(threads.values()):.3f}", flush=True)
    print("THREADS " + " ".join(f"{k}={v:.2f}" for k, v in sorted(threads.items())), flush=True)
    used = {pid: t - cpu0.get(pid, (0.0, ""))[0] for pid, (t, _) in cpu1.items()}
    print(f"LOOP_CPU_S {sum(used.values()):.2f}", flush=True)
    print(f"JOB_CPU_S {sum(used.get(pid, 0.0) for pid in job_pids):.2f}", flush=True)
    # the supervisor, beside the job (its command line: `python -m gkd_core run ...`)
    print(f"SUPERVISOR_CPU_S {sum(u for pid, u in used.items() if 'gkd_core run' in cpu1[pid][1]):.2f}", flush=True)
    if os.environ.get("RAY_RUNTIME_ENV_HOOK"):  # watched: the wrappers' part alone, in the same processes
        def block(on: bool, n: int) -> float:
            ray.get([a.wrappers.remote(on) for a in callers + callees], timeout=60)
            our_wrappers(on)
            t0 = time.perf_counter()
            running = [c.run.remote(n) for c in callers]
            for i in range(n):
                ray.get(callees[i % 2].answer.remote(i), timeout=60)
            ray.get(running, timeout=LIMIT_S)
            return time.perf_counter() - t0

        n = max(50, calls // 4)
        ratios, control = [], []
        for k in range(IN_PLACE_PAIRS):  # each pair in turn with and without first: drift lands on both
            first = k % 2 == 0
            a, b = block(first, n), block(not first, n)
            on, off = (a, b) if first else (b, a)
            ratios.append(on / off)
            # and the control: a pair of the same blocks both with them, taken apart the same way (the block in
            # the place the pair's "with" had, over the other): the method's own spread and lean
            a, b = block(True, n), block(True, n)
            control.append(a / b if first else b / a)
        print(f"IN_PLACE_RATIO {statistics.median(ratios):.4f}", flush=True)
        print(f"IN_PLACE_CONTROL {statistics.median(control):.4f}", flush=True)

        def timed_block(ours: bool, n: int) -> list[dict[str, list[float]]]:
            sums = ray.get([a.timed.remote(ours) for a in callers + callees], timeout=60)
            sums.append(timed_places(ours))
            running = [c.run.remote(n) for c in callers]
            for i in range(n):
                ray.get(callees[i % 2].answer.remote(i), timeout=60)
            ray.get(running, timeout=LIMIT_S)
            return sums

        for k in range(TIMED_PAIRS):  # each pair in turn with ours first and without first
            timed_block(k % 2 == 0, n)
            timed_block(k % 2 == 1, n)
        each = timed_block(True, 0)  # (the sums: each process's, its places' so far)
        for place in PLACES:
            sums = [sum(process[place][i] for process in each if place in process) for i in range(5)]
            ours_us = 1e6 * (sums[0] / max(sums[1], 1) - sums[2] / max(sums[3], 1))
            print(f"PLACE_US {place} {ours_us:.2f} {sums[1]:.0f} {sums[3]:.0f} {sums[4]:.0f}", flush=True)
    ray.shutdown()


MEASURES = ("UP_S", "LOOP_S", "LOOP_CPU_S")  # compared, with against without
SAID = (*MEASURES, "JOB_CPU_S", "SUPERVISOR_CPU_S", "THREADS_CPU_S")


def measured(output: str, what: str) -> dict[str, float]:
    got = {m: re.search(rf"^{m} ([\d.]+)$", output, re.M) for m in SAID}
    missing = [m for m, found in got.items() if not found]
    if missing:
        raise SystemExit(f"bench_ray_watch: the job {what} printed no {', '.join(missing)}: {output[-2000:]}")
    return {m: float(found[1]) for m, found in got.items()}


def ended(run: Path) -> bool:
    """Whether the run's log says it ended (its command exited, or failed to start)."""
    log = run / "events.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return any('"kind":"run"' in line and any(f'"state":"{s}"' in line for s in ("finished", "failed", "stopped"))
               for line in lines)


def without(calls: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GKD_") and k != "RAY_RUNTIME_ENV_HOOK"}
    got = subprocess.run([sys.executable, __file__, "--job", str(calls)], capture_output=True, text=True, env=env,
                         timeout=LIMIT_S, cwd=ROOT)
    return measured(got.stdout + got.stderr, "unwatched")


def watched(calls: int, home: Path) -> dict[str, float]:
    env = dict(os.environ, GKD_HOME=str(home))
    got = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "launch", "--detach", "--linger", "0", "--",
                          sys.executable, __file__, "--job", str(calls)], capture_output=True, text=True, env=env,
                         timeout=60, cwd=ROOT)
    if got.returncode != 0:
        raise SystemExit(f"bench_ray_watch: launch failed: {got.stderr[-2000:]}")
    run = (home / "runs" / "latest").resolve()  # the run launch just made
    log = run / "logs" / "driver.log"
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline and "PLACE_US run" not in (log.read_text() if log.exists() else ""):
        if ended(run):
            break  # the job ended without its time: said below, with its output
        time.sleep(0.5)
    # the run ends with its command (the job shuts its Ray down): waited for, so that the next round has the
    # cores; then stopped, in case it did not
    finish = time.monotonic() + 60
    while time.monotonic() < finish and not ended(run):
        time.sleep(0.5)
    subprocess.run([sys.executable, "-m", "gkd_tui.cli", "stop", str(run)], capture_output=True, env=env, timeout=60,
                   cwd=ROOT)
    output = log.read_text() if log.exists() else ""
    got = measured(output, f"under launch ({run.name})")
    in_place = re.search(r"^IN_PLACE_RATIO ([\d.]+)$", output, re.M)
    if not in_place:
        raise SystemExit(f"bench_ray_watch: the job under launch ({run.name}) printed no IN_PLACE_RATIO: "
                         f"{output[-2000:]}")
    got["IN_PLACE_RATIO"] = float(in_place[1])
    control = re.search(r"^IN_PLACE_CONTROL ([\d.]+)$", output, re.M)
    if not control:
        raise SystemExit(f"bench_ray_watch: the job under launch ({run.name}) printed no IN_PLACE_CONTROL: "
                         f"{output[-2000:]}")
    got["IN_PLACE_CONTROL"] = float(control[1])
    for place in PLACES:
        timed = re.search(rf"^PLACE_US {place} (-?[\d.]+) ", output, re.M)
        if not timed:
            raise SystemExit(f"bench_ray_watch: the job under launch ({run.name}) printed no PLACE_US {place}: "
                             f"{output[-2000:]}")
        got[f"PLACE_US_{place}"] = float(timed[1])
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000, help="calls by each Caller, and by the driver")
    p.add_argument("--smoke", action="store_true", help="one round each way of 200 calls: for CI; nothing recorded")
    a = p.parse_args()
    if a.job is not None:
        job(a.job)
        return
    if a.smoke:
        a.rounds, a.calls = 1, 200
    rows = []
    with tempfile.TemporaryDirectory(prefix="gkd-bench-watch-") as tmp:
        for i in range(a.rounds):
            if i % 2 == 0:
                plain = without(a.calls)
                seen = watched(a.calls, Path(tmp))
            else:  # the other order: neither side is always the one that runs second
                seen = watched(a.calls, Path(tmp))
                plain = without(a.calls)
            rows.append((plain, seen))
            print(f"round {i + 1}: " + ", ".join(f"{m} {plain[m]:.2f} -> {seen[m]:.2f}" for m in MEASURES), flush=True)
    with records.kept("ray_watch", smoke=a.smoke) as kept_run:
        print(f"\n{a.calls} calls by each of 2 actors, then {a.calls} by the driver, each a ray.get on an actor call "
              f"that returns at once; {a.rounds} round(s), each order in turn; the loop timed once the machine "
              "is quiet")
        labels = {"UP_S": "up (s)", "LOOP_S": "loop (s)", "LOOP_CPU_S": "loop CPU (s)"}
        print(f"{'':8s}" + "".join(f"{labels[m] + ' without':>22s} {'with':>7s} {'ratio':>7s}" for m in MEASURES))
        for i, (plain, seen) in enumerate(rows, 1):
            print(f"{'round ' + str(i):8s}" + "".join(f"{plain[m]:22.2f} {seen[m]:7.2f} {seen[m] / plain[m]:6.3f}x"
                                                      for m in MEASURES))
        ratios = {m: [s[m] / p[m] for p, s in rows] for m in MEASURES}
        print(f"{'median':8s}" + "".join(f"{statistics.median(p[m] for p, _ in rows):22.2f} "
                                         f"{statistics.median(s[m] for _, s in rows):7.2f} "
                                         f"{statistics.median(ratios[m]):6.3f}x" for m in MEASURES))
        print(f"{'min-max':8s}" + "".join(f"{'':30s}{min(ratios[m]):.2f}-{max(ratios[m]):.2f}" for m in MEASURES))
        # the watching's own work, each part measured where it runs (the difference of two times above is
        # within the machine's spread from round to round)
        calls = 3 * a.calls  # each Caller's, and the driver's
        share: dict[str, list[float]] = {"threads": [], "wrappers": [], "supervisor": []}
        ours_us = {place: [seen[f"PLACE_US_{place}"] for _, seen in rows] for place in PLACES}
        for _, seen in rows:
            share["threads"].append(100 * seen["THREADS_CPU_S"] / seen["JOB_CPU_S"])
            a_call_us = sum(seen[f"PLACE_US_{place}"] for place in PLACES)  # each call passes all three
            share["wrappers"].append(100 * calls * a_call_us / 1e6 / seen["JOB_CPU_S"])
            share["supervisor"].append(100 * seen["SUPERVISOR_CPU_S"] / seen["JOB_CPU_S"])
        total = [sum(parts) for parts in zip(*share.values(), strict=True)]
        print("\nthe watching's own work over the loop, as a share of the job's CPU seconds (its 5 processes; "
              "median of the rounds, min-max):")
        said = ", ".join(f"{statistics.median(us):.1f} us ({min(us):.1f}-{max(us):.1f}) {PLACE_SAID[place]}"
                         for place, us in ours_us.items())
        what = {"threads": "our threads in the job's processes (call watcher, heartbeat, command inbox), their CPU",
                "wrappers": f"our wrappers, timed in place: {said}; x {calls} calls",
                "supervisor": "the supervisor beside the job, its CPU"}
        for part, pcts in share.items():
            print(f"  {statistics.median(pcts):5.2f} % ({min(pcts):.2f}-{max(pcts):.2f})  {what[part]}")
        print(f"  {statistics.median(total):5.2f} % ({min(total):.2f}-{max(total):.2f})  in all")
        in_place = [seen["IN_PLACE_RATIO"] for _, seen in rows]
        print(f"\nour wrappers in place: in the watched job, {IN_PLACE_PAIRS} pairs of blocks of "
              f"{max(50, a.calls // 4)} calls each way, with the wrappers and with Ray's own calls put back, in turn "
              "(the same processes, threads and supervisor; drift lands on both): with / without, the median of each "
              "round's pairs")
        print(f"  {statistics.median(in_place):.3f}x ({min(in_place):.3f}-{max(in_place):.3f}) "
              f"over {len(rows)} round(s)")
        control = [seen["IN_PLACE_CONTROL"] for _, seen in rows]
        over_control = [r / c for r, c in zip(in_place, control, strict=True)]
        print("the control, a pair of the same blocks both with the wrappers after each of those pairs, taken apart "
              "the same way (what the method reads where there is nothing to find):")
        print(f"  {statistics.median(control):.3f}x ({min(control):.3f}-{max(control):.3f}); with / without over "
              f"the control, each round's: {statistics.median(over_control):.3f}x "
              f"({min(over_control):.3f}-{max(over_control):.3f})")
        print(f"\n{os.cpu_count()} cores, Python {sys.version.split()[0]}")
        kept_run.figure("the loop of small calls, watched against not (median of the rounds)",
                        statistics.median(ratios["LOOP_S"]), "x")
        kept_run.figure("every process's CPU over that loop, watched against not",
                        statistics.median(ratios["LOOP_CPU_S"]), "x")
        kept_run.figure("ray.init and the actors' start, watched against not", statistics.median(ratios["UP_S"]), "x")
        kept_run.figure("the watching's own work, against the job's CPU over the loop", statistics.median(total), " %")
        kept_run.figure("our wrappers timed in place, microseconds a call (its three places)",
                        statistics.median(sum(us) for us in zip(*ours_us.values(), strict=True)), " us")
        kept_run.figure("the wrappers in place, with against without in one watched job (median of the rounds)",
                        statistics.median(in_place), "x")
        kept_run.figure("the wrappers in place, the control: with against with (median of the rounds)",
                        statistics.median(control), "x")
        kept_run.figure("the wrappers in place over the control (median of the rounds)",
                        statistics.median(over_control), "x")


if __name__ == "__main__":
    main()
