"""Diagnosis in seconds: the real trainer with its shipped defaults, one run per injected fault.

    python bench/bench_diagnosis.py [--healthy-s 600] [--slow-s 120] [--only hang_sync ...]
    python bench/bench_diagnosis.py --smoke   # for CI: hang_sync once

Every run is the default config (`examples/tiny_cpu.yaml`, whose deadlines are the shipped
defaults: sync 60 s, step 300 s, heartbeat stall 10 s, teacher request 30 s, NVML 3 s, read from
the config's schema) through `python -m gkd_core run`, the supervisor's own diagnosis and nothing
else. Per fault: seconds from the fault to the first alert, at or after the fault, that names the
right worker with the one right case; the workers named by any other warn or critical alert from
the run's start (false alarms: one before the fault counts too); seconds until that worker's stack
is on record; the stuck-or-slow verdict; and when the shipped default deadline that would catch the
fault without this diagnosis runs out, as a ratio. Then a healthy run and a run with one rollout
worker 30 % slower: every alert they raised, of any severity (the goal is none). ``--smoke`` fails
if its fault was not injected or not named with its case.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.config import load_config  # noqa: E402

BASE = ["examples/tiny_cpu.yaml", "trainer.total_steps=100000"]
SHIPPED = load_config(None)  # the deadlines a run has unless its config says otherwise
STEP = 6  # the faults fire at this step: the peers' times and each worker's own history are there

# name, the fault, the worker to name, the one code that names it, the verdict, the shipped deadline that
# would catch it without the diagnosis (s, what)
FAULTS = [
    ("hang_sync", {"kind": "hang_sync", "target": "rollout/1"}, "rollout/1", "straggler", "stuck",
     (SHIPPED.trainer.sync_timeout_s, "trainer.sync_timeout_s")),
    ("hang_generate", {"kind": "hang_generate", "target": "rollout/1"}, "rollout/1", "straggler", "stuck",
     (SHIPPED.trainer.step_timeout_s, "trainer.step_timeout_s")),
    ("hold_gil", {"kind": "hold_gil", "target": "rollout/1", "seconds": 40}, "rollout/1", "heartbeat_stale", "frozen",
     (SHIPPED.telemetry.stall_s, "telemetry.stall_s (the heartbeat rule alone)")),
    ("kill_worker", {"kind": "kill_worker", "target": "rollout/1"}, "rollout/1", "driver_failed", "dead",
     (None, "the driver's wait, at once")),
    ("kill_teacher", {"kind": "kill_teacher", "seconds": 0}, "teacher/0", "actor_dead", "dead",
     (SHIPPED.teacher.request_timeout_s, "teacher.request_timeout_s")),
    ("delay_teacher", {"kind": "delay_teacher", "seconds": 12}, "teacher/0", "teacher_not_serving", "stuck",
     (SHIPPED.teacher.request_timeout_s, "teacher.request_timeout_s (never, for a 12 s delay)")),
    ("hang_nvml", {"kind": "hang_nvml"}, "agent/", "gpu_probe_hung", "",
     (SHIPPED.agent.nvml_deadline_s, "agent.nvml_deadline_s, the same rule")),
    ("oom", {"kind": "oom", "target": "rollout/1"}, "rollout/1", "out_of_memory", "",
     (None, "a failed run, no cause named")),
]


def events(run: Path) -> list[dict]:
    path = run / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the last line, half written
    return out


def start(home: Path, run_id: str, extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ, GKD_HOME=str(home))
    return subprocess.Popen([sys.executable, "-m", "gkd_core", "run", *BASE, *extra, "--run-id", run_id, "--quiet"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def keep_log(run: Path, home: Path, out: Path) -> None:
    """The run's event log for the screenshots of each case (screenshots/make_screenshots.py), gzipped,
    with no path of this machine in it."""
    text = (run / "events.jsonl").read_text().replace(str(home), "~/.gkd").replace(str(ROOT), ".")
    text = text.replace(sys.base_prefix, "<python>").replace(sys.prefix, "<venv>").replace(str(Path.home()), "~")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(text.encode(), mtime=0))


def names(a: dict, target: str) -> bool:
    return any(t == target or (target.endswith("/") and t.startswith(target)) for t in a.get("targets") or [])


def fault_time(evs: list[dict], name: str) -> float | None:
    if name == "hang_nvml":  # the sample that never returns began nvml_hung_s before its first report
        hung = [e for e in evs if e["kind"] == "gpu" and e.get("nvml_hung_s")]
        return hung[0]["ts"] - hung[0]["nvml_hung_s"] if hung else None
    marks = [e for e in evs if e["kind"] == "log" and "fault injected" in e.get("message", "")
             and "nvml" not in e.get("message", "")]
    return marks[0]["ts"] if marks else None


def measure(name, fault, target, code, want_verdict, timeout_only, home: Path, budget_s: float,
            attempt: int = 0, keep: Path | None = None) -> dict:
    run_id = f"bench-{name}-{attempt}"
    f = dict(fault, step=STEP) if fault["kind"] != "hang_nvml" else dict(fault, step=8)
    extra = [f"faults=[{json.dumps(f)}]", "agent.gpu_interval_s=0.5"]
    proc = start(home, run_id, extra)
    run = home / "runs" / run_id
    t_end = time.monotonic() + budget_s
    hit = stack = None
    t0 = None
    settle_until = None
    while time.monotonic() < t_end:
        time.sleep(1.0)
        evs = events(run)
        t0 = t0 or fault_time(evs, name)
        if t0 is None:
            continue
        if hit is None:
            hit = next((e for e in evs if e["kind"] == "alert" and not e.get("cleared") and e["code"] == code
                        and names(e, target) and e["ts"] >= t0), None)
        if stack is None and not target.endswith("/"):
            stack = next((e for e in evs if e["kind"] == "stack" and e.get("target") == target and e.get("text")
                          and e["ts"] >= t0), None)
        if hit is not None and settle_until is None:
            settle_until = time.monotonic() + 8  # a few seconds more: the second stack, the verdict, anyone else
        if settle_until is not None and time.monotonic() > settle_until:
            break
        if proc.poll() is not None and hit is None and time.monotonic() > t_end - budget_s + 30:
            break
    stop(proc)
    if keep is not None and attempt == 0:
        keep_log(run, home, keep / f"{name}.events.jsonl.gz")
    evs = events(run)
    raised = [e for e in evs
              if e["kind"] == "alert" and not e.get("cleared") and e.get("severity") in ("warn", "critical")]
    mine = [e for e in raised if names(e, target) and t0 and e["ts"] >= t0]
    # a false alarm: any other worker named, or the right one named before its fault
    others = sorted({t for e in raised for t in e.get("targets") or []
                     if not names({"targets": [t]}, target) or not t0 or e["ts"] < t0})
    verdicts = [e.get("evidence", {}).get("verdict") for e in mine if e.get("evidence", {}).get("verdict")]
    dt = hit["ts"] - t0 if hit and t0 else None
    limit, rule = timeout_only
    return {"fault": name, "injected": t0 is not None, "named": target if hit else "-",
            "case": hit["code"] if hit else "-",
            "seconds": dt, "others": others, "stack_s": stack["ts"] - t0 if stack and t0 else None,
            "verdict": verdicts[-1] if verdicts else "", "want": want_verdict,
            "timeout_only_s": limit, "timeout_rule": rule,
            "ratio": (limit / dt) if (limit and dt) else None}


def alert_count(name: str, extra: list[str], seconds: float, home: Path) -> dict:
    run_id = f"bench-{name}"
    proc = start(home, run_id, extra)
    time.sleep(seconds)
    stop(proc)
    evs = events(home / "runs" / run_id)
    alerts = [e for e in evs if e["kind"] == "alert" and not e.get("cleared")]  # every one, of any severity
    stuck = [e for e in alerts if (e.get("evidence") or {}).get("verdict") == "stuck" or "stuck:" in e["message"]]
    steps = max((e["step"] for e in evs if e["kind"] == "metrics"), default=0)
    return {"run": name, "seconds": seconds, "steps": steps, "alerts": len(alerts), "stuck": len(stuck),
            "codes": sorted({e["code"] for e in alerts})}


def fmt(v, spec="{:.1f}") -> str:
    return "-" if v is None else spec.format(v)


def spread(values: list, spec: str = "{:.1f}") -> str:
    """The median of the rounds' values, with min-max when there were several; "-" for none."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return "-"
    mid = spec.format(statistics.median(vals))
    return mid if len(vals) == 1 else f"{mid} ({spec.format(vals[0])}-{spec.format(vals[-1])})"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--healthy-s", type=float, default=600.0)
    p.add_argument("--slow-s", type=float, default=120.0)
    p.add_argument("--budget-s", type=float, default=150.0, help="per fault run, from the start")
    p.add_argument("--rounds", type=int, default=1, help="runs of each fault; the table gives their median (min-max)")
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--keep", type=Path, help="keep each fault's first run's event log here, gzipped (the screenshots' "
                                             "recordings: screenshots/seeds)")
    p.add_argument("--smoke", action="store_true", help="hang_sync once: for CI (no healthy or slow run: their "
                                                        "minutes are what they measure)")
    a = p.parse_args()
    if a.smoke:
        a.only, a.rounds = ["hang_sync"], 1
    with tempfile.TemporaryDirectory(prefix="gkd-bench-diag-") as tmp:
        home = Path(tmp)
        cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
        if cache.is_dir():
            (home / "cache").symlink_to(cache)  # reuse a prepared teacher
        with records.kept("diagnosis", smoke=a.smoke):
            rounds, runs = measure_all(a, home)
    if a.smoke:
        missed = [f"{r['fault']} {'named by no alert' if r['injected'] else 'never injected'}"
                  for r in rounds[0] if r["named"] == "-"]
        if missed:
            sys.exit(f"bench_diagnosis: {', '.join(missed)} within {a.budget_s:g} s of the run's start")


def measure_all(a: argparse.Namespace, home: Path) -> tuple[list[list[dict]], list[dict]]:
    """Every fault's rounds, then the alert-counting runs; prints their tables."""
    faults = [f for f in FAULTS if a.only is None or f[0] in a.only]
    rounds = [[measure(*f, home=home, budget_s=a.budget_s, attempt=i, keep=a.keep) for f in faults]
              for i in range(a.rounds)]
    print(f"{a.rounds} round(s) of each fault; times are the median (min-max) of the rounds, 'named' counts the "
          f"rounds in which the right worker was named with the right case")
    print(f"{'fault':14s} {'named':>6s} {'case':20s} {'named in':>16s} {'stack in':>16s} {'verdict':>8s} "
          f"{'others named':14s} {'shipped default':>15s} {'ratio':>7s}  the deadline")
    for i, f in enumerate(faults):
        rs = [r[i] for r in rounds]
        r0 = rs[0]
        named = sum(r["named"] != "-" for r in rs)
        verdicts = sorted({r["verdict"] for r in rs if r["verdict"]})
        ok = "" if verdicts == [r0["want"]] or not r0["want"] else f" (want {r0['want']})"
        seconds = [r["seconds"] for r in rs]
        limit = r0["timeout_only_s"]
        ratio = spread([limit / s for s in seconds if s], "{:.0f}x") if limit else "-"
        others = sorted({t for r in rs for t in r["others"]})
        print(f"{f[0]:14s} {named:>3d}/{len(rs):<2d} {f[3]:20s} {spread(seconds) + ' s':>16s} "
              f"{spread([r['stack_s'] for r in rs]) + ' s':>16s} {('/'.join(verdicts) or '-') + ok:>8s} "
              f"{', '.join(others) or 'none':14s} {fmt(limit, '{:.0f}') + ' s':>15s} {ratio:>7s}  {r0['timeout_rule']}")
    print()
    runs = []
    if a.only is None or "healthy" in a.only:
        runs.append(alert_count("healthy", [], a.healthy_s, home))
    if a.only is None or "slow_worker" in a.only:
        runs.append(alert_count("slow_worker", ['faults=[{"kind": "slow_worker", "target": "rollout/1", "step": 1, '
                                                '"factor": 0.3}]'], a.slow_s, home))
    print(f"{'run':12s} {'seconds':>8s} {'steps':>7s} {'alerts (any severity)':>22s} {'said stuck':>11s}  codes")
    for r in runs:
        print(f"{r['run']:12s} {r['seconds']:8.0f} {r['steps']:7d} {r['alerts']:22d} {r['stuck']:11d}  "
              f"{', '.join(r['codes']) or '-'}")
    print(f"\n{os.cpu_count()} cores, Python {sys.version.split()[0]}")
    return rounds, runs


if __name__ == "__main__":
    main()
