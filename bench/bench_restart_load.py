"""`gkd-tui restart` on a loaded node: no critical alert while the workers start again, and a worker
that dies while starting still named at once.

Users' nodes run other work (a data loader, another user's evaluation, the inference server), so a
restart's workers may start slowly: their imports and model loads share the cores. Each round runs the
default demo (the embedded config, nothing set) and, from step 15, `gkd-tui restart`, with ``--load`` busy
loops (processes outside the run; by default one per core, holding them all, started at step 15 and 2 s
before the restart, so the run is a few steps further when it comes) or none. Every critical
alert from the restart until the resumed run has trained a step past both the step it was restarted at
and the checkpoint it resumed from, and finished a sync after that training, is a false alarm (the driver
that resumes says its checkpoint's step again at once: that step is not trained, so it does not count).
Then a second restart, and rollout/0 killed -9 as soon as it says ``init_engine``: the seconds until the
first critical alert (or the driver's report) names it.

Each round is a line of ``--record`` (JSON lines, appended when it ends); ``--render-only`` writes their
table into bench/RESULTS.md between its markers, ``--check`` fails when that table is not the record's.

    python bench/bench_restart_load.py --rounds 3   # bench/RESULTS.md's figures: no load, one loop a core
    python bench/bench_restart_load.py --smoke      # one round, no load, a scratch record (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "chaos")]

from chaos_naming import criticals, first_naming  # noqa: E402
from conftest import RunningSupervisor, wait_until  # noqa: E402
from test_chaos import TRAINER, Chaos  # noqa: E402

RESTART_AT = 15  # the step `gkd-tui restart` is sent after (the default demo checkpoints every 10)
PAST_S = 300.0  # a restart whose run has not trained past its step by then is a failure, not slow
NAMED_WITHIN_S = 10.0  # a worker killed while starting must be named within this
RESULTS = ROOT / "bench" / "RESULTS.md"
MARKERS = ("<!-- restart under load -->", "<!-- /restart under load -->")
BUSY = [sys.executable, "-c", "while True: pass"]


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes outside the run, each holding a core (no GKD_RUN_ID: not the run's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GKD_")}
    return [subprocess.Popen(BUSY, env=env) for _ in range(n)]


def restart(chaos: Chaos) -> tuple[float, int]:
    """`gkd-tui restart`; (when it was sent, the newest seq before it)."""
    seq0 = chaos.events()[-1]["seq"]
    t0 = time.time()
    out = chaos.gkd("restart", str(chaos.run), timeout_s=120)
    assert out.returncode == 0, f"gkd-tui restart failed: {out.stdout}{out.stderr}"
    return t0, seq0


def resumed_and_trained(chaos: Chaos, seq0: int, restarted_at: int) -> tuple[int, int] | None:
    """(the checkpoint's step the restarted driver resumed from, the first step it trained past both that
    and ``restarted_at``), once it has also finished a sync after training it; None until then.

    Only what the restarted driver logged counts: events after the run said it is running again following
    ``seq0`` (the driver that was stopped may log a step of its own after the request). The checkpoint's
    own metrics, which the resuming driver says again at once, are not a trained step; a step's metrics
    come after its sync, but a sync is asked for here as well, so a step that skipped it does not end the
    watch before the rollouts have taken new weights."""
    events = [e for e in chaos.events() if e["seq"] > seq0]
    again = next((e["seq"] for e in events if e["kind"] == "run" and e.get("state") == "running"), None)
    if again is None:
        return None
    resumed, trained = chaos.after_restart(again)
    past = next((s for s in trained if s > max(resumed, restarted_at)), None)
    if past is None:
        return None
    # that step's training by the restarted driver, then a sync it finished after it (the one at its start,
    # from the checkpoint's weights, is before it)
    trained_at = next((e["seq"] for e in events if e["seq"] > again and e["kind"] == "phase"
                       and e["src"] == "driver" and e.get("phase") == "train" and e.get("step") == past), None)
    synced = trained_at is not None and any(e["seq"] > trained_at and e["kind"] == "sync" and e.get("state") == "done"
                                            for e in events)
    return (resumed, past) if synced else None


def one_round(load: int, home: Path) -> dict:
    """One run of the default demo: a restart at step 15 watched for false alarms, then a restart whose
    rollout/0 is killed in ``init_engine``."""
    sup = RunningSupervisor(home, ["--linger", "600", "--driver", TRAINER], dict(os.environ, GKD_HOME=str(home)))
    chaos = Chaos(sup, home)
    loops: list[subprocess.Popen] = []
    try:
        chaos.wait_step(RESTART_AT - 1, 300, f"the run's step {RESTART_AT}")
        loops = busy_loops(load)
        time.sleep(2.0 if load else 0.0)  # the loops hold the cores before the restart, as another job's would
        restarted_at = chaos.step()
        t0, seq0 = restart(chaos)
        resumed_from, past = wait_until(lambda: resumed_and_trained(chaos, seq0, restarted_at), PAST_S,
                                        f"the restarted run to train past step {restarted_at} and its "
                                        "checkpoint, and sync", every_s=0.3)
        t1 = time.time()
        window = [e for e in chaos.events() if t0 <= e["ts"] < t1]
        alarms = criticals(window, t0, t1)
        warned = Counter(e["code"] for e in window if e["kind"] == "alert" and not e.get("cleared")
                         and e.get("severity") == "warn")
        row = {"load": load, "cores": os.cpu_count(), "restarted_at": restarted_at, "resumed_from": resumed_from,
               "trained_past": past,
               "past_s": round(t1 - t0, 1), "alarms": [f"{e['code']} {', '.join(e['targets'])}" for e in alarms],
               "warnings": dict(warned)}

        # a worker that really dies while it starts: named as fast as before the set-up deadlines
        t0, seq0 = restart(chaos)
        before = chaos.pid("rollout/0")
        wait_until(lambda: any(e["seq"] > seq0 and e["kind"] == "phase" and e["src"] == "rollout/0"
                               and e["phase"] == "init_engine" for e in chaos.events()),
                   120, "rollout/0 to start its engine", every_s=0.05)
        pid = chaos.pid("rollout/0")
        assert pid != before, "rollout/0 said init_engine under its old pid"
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        naming = wait_until(lambda: first_naming(chaos.events(), killed, "rollout/0"), 60,
                            "rollout/0, killed in init_engine, to be named", every_s=0.1)
        row["init_kill"] = {"after_s": naming.after_s, "code": naming.code, "by": naming.by, "right": naming.right}
        return row
    finally:
        for p in loops:
            p.kill()
            p.wait()
        try:
            chaos.gkd("stop", str(chaos.run))
        except subprocess.TimeoutExpired:
            pass  # the supervisor is stopped below all the same
        sup.kill()
        shutil.rmtree(home, ignore_errors=True)


def spread(values: list[float], unit: str = " s") -> str:
    """The median, with the min and max of the runs."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f}{unit} ({min(values):.1f}-{max(values):.1f})"


def render(rows: list[dict], command: str) -> str:
    """The table of the rounds watched to the end of the resumed run's first trained step and its sync;
    older rounds (watched only until a step past the restart's was logged) are counted, not shown."""
    older = [r for r in rows if "trained_past" not in r]
    rows = [r for r in rows if "trained_past" in r]
    lines = [f"`{command}`, {len(rows)} round(s). Each: the default demo, `gkd-tui restart` from step {RESTART_AT} "
             "(under load the loops start there and hold the cores 2 s first, while the run trains on), watched until "
             "the resumed run trained a step past both that step and the checkpoint it resumed from, and finished a "
             "sync after it; then a second restart, rollout/0 killed -9 in `init_engine`. Median (min-max) "
             "of the rounds."
             + (f" ({len(older)} older round(s) in the record were watched over a shorter window, until the resumed "
                "driver logged a step past the restart's, its checkpoint's said again included: not shown.)"
                if older else ""), "",
             "| busy loops (cores) | rounds | restarted at step | resumed from checkpoint | trained past it to step "
             "| critical alerts from the restart until then | warnings | restart to then "
             "| killed in init_engine: named after | by |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for load in sorted({r["load"] for r in rows}):
        rs = [r for r in rows if r["load"] == load]
        warned = sum((Counter(r["warnings"]) for r in rs), Counter())
        kills = [r["init_kill"] for r in rs]
        cores = ", ".join(str(c) for c in sorted({r["cores"] for r in rs}))
        lines.append(
            f"| {load} ({cores}) | {len(rs)} | {', '.join(str(r['restarted_at']) for r in rs)}"
            f" | {', '.join(str(r['resumed_from']) for r in rs)} | {', '.join(str(r['trained_past']) for r in rs)}"
            f" | {', '.join(str(len(r['alarms'])) for r in rs)}"
            + "".join(f"; {a}" for r in rs for a in r["alarms"])
            + f" | {', '.join(f'{c} {n}' for c, n in sorted(warned.items())) or 'none'}"
            + f" | {spread([r['past_s'] for r in rs])} | {spread([k['after_s'] for k in kills])}"
            + f"{'' if all(k['right'] and k['after_s'] <= NAMED_WITHIN_S for k in kills) else ' **missed**'}"
            + f" | {', '.join(sorted({k['code'] + ' (' + k['by'] + ')' for k in kills}))} |")
    return "\n".join(lines)


def read_record(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def with_table(text: str, table: str) -> str:
    head, found, rest = text.partition(MARKERS[0])
    if not found:
        raise SystemExit(f"{RESULTS.name} has no {MARKERS[0]} marker: add the two markers where the table goes")
    return f"{head}{MARKERS[0]}\n{table}\n{MARKERS[1]}{rest.partition(MARKERS[1])[2]}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs per load")
    p.add_argument("--load", type=int, nargs="+", default=[0, os.cpu_count() or 1],
                   help="busy loops beside the run, one count per set (default: none, then one per core)")
    p.add_argument("--record", default=str(ROOT / "bench" / "restart_load.jsonl"))
    p.add_argument("--render-only", action="store_true", help="no runs: the table in bench/RESULTS.md from the record")
    p.add_argument("--check", action="store_true", help="with --render-only: fail if the table is not the record's")
    p.add_argument("--smoke", action="store_true", help="one round with no load, into a scratch record")
    a = p.parse_args()
    record = Path(a.record)
    if a.smoke:
        record = Path(tempfile.mkdtemp(prefix="gkd-restart-smoke-")) / "restart_load.jsonl"
        a.rounds, a.load = 1, [0]
    command = "python bench/bench_restart_load.py " + " ".join(sys.argv[1:])
    if not a.render_only:
        for load in a.load:
            for _ in range(a.rounds):
                home = Path(tempfile.mkdtemp(prefix="gkd-restart-"))
                cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
                if cache.is_dir():
                    (home / "cache").symlink_to(cache)  # reuse a prepared teacher
                row = {"command": command, **one_round(load, home)}
                with record.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    rows = read_record(record)
    commands = sorted({r["command"] for r in rows if "trained_past" in r})
    table = render(rows, " and ".join(commands))
    print(table)
    bad = [r for r in rows if "trained_past" in r and (r["alarms"] or not r["init_kill"]["right"]
                                                       or r["init_kill"]["after_s"] > NAMED_WITHIN_S)]
    if a.smoke:
        return 1 if bad else 0
    if a.render_only and a.check:
        if with_table(RESULTS.read_text(), table) != RESULTS.read_text():
            print(f"bench/RESULTS.md: the restart-under-load table is not what {record.name} renders; run "
                  "`python bench/bench_restart_load.py --render-only` and commit the result", file=sys.stderr)
            return 1
        return 0
    RESULTS.write_text(with_table(RESULTS.read_text(), table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
