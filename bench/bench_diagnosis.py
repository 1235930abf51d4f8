"""Diagnosis in seconds: the real trainer with real-world deadlines, one run per injected fault.

    python bench/bench_diagnosis.py [--healthy-s 600] [--slow-s 120] [--only hang_sync ...]

Every run is the default config (`examples/tiny_cpu.yaml`) with the timeouts real runs use (sync
and step 600 s), through `python -m gkd_core run`, the supervisor's own diagnosis and nothing
else. Per fault: seconds from the fault to the first alert that names the right worker with the
right case, the other workers named (false alarms), seconds until that worker's stack is on
record, the stuck-or-slow verdict, and what the timeout-only rules (the deadlines before this
diagnosis) would have taken, as a ratio. Then a healthy run and a run with one rollout worker 30 %
slower: how many warn or critical alerts, and how many said stuck (the goal is none).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ["examples/tiny_cpu.yaml", "trainer.sync_timeout_s=600", "trainer.step_timeout_s=600",
        "trainer.total_steps=100000"]
STEP = 6  # the faults fire at this step: the peers' times and each worker's own history are there

# name, the fault, the worker to name, the codes that name it, the verdict, the timeout-only rule (s, what)
FAULTS = [
    ("hang_sync", {"kind": "hang_sync", "target": "rollout/1"}, "rollout/1", {"straggler"}, "stuck",
     (600, "sync timeout")),
    ("hang_generate", {"kind": "hang_generate", "target": "rollout/1"}, "rollout/1", {"straggler"}, "stuck",
     (600, "step timeout")),
    ("hold_gil", {"kind": "hold_gil", "target": "rollout/1", "seconds": 40}, "rollout/1",
     {"straggler", "heartbeat_stale"}, "frozen", (10, "heartbeat stall_s")),
    ("kill_worker", {"kind": "kill_worker", "target": "rollout/1"}, "rollout/1",
     {"driver_failed", "actor_dead", "straggler", "heartbeat_stale"}, "dead", (None, "the driver's wait, at once")),
    ("kill_teacher", {"kind": "kill_teacher", "seconds": 0}, "teacher/0",
     {"teacher_not_serving", "actor_dead", "heartbeat_stale"}, "dead", (30, "teacher request timeout")),
    ("delay_teacher", {"kind": "delay_teacher", "seconds": 12}, "teacher/0", {"teacher_not_serving"}, "stuck",
     (30, "teacher request timeout (never, for a 12 s delay)")),
    ("hang_nvml", {"kind": "hang_nvml"}, "agent/", {"gpu_probe_hung"}, "", (3, "NVML deadline, the same rule")),
    ("oom", {"kind": "oom", "target": "rollout/1"}, "rollout/1", {"out_of_memory"}, "",
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


def names(a: dict, target: str) -> bool:
    return any(t == target or (target.endswith("/") and t.startswith(target)) for t in a.get("targets") or [])


def fault_time(evs: list[dict], name: str) -> float | None:
    if name == "hang_nvml":  # the sample that never returns began nvml_hung_s before its first report
        hung = [e for e in evs if e["kind"] == "gpu" and e.get("nvml_hung_s")]
        return hung[0]["ts"] - hung[0]["nvml_hung_s"] if hung else None
    marks = [e for e in evs if e["kind"] == "log" and "fault injected" in e.get("message", "")
             and "nvml" not in e.get("message", "")]
    return marks[0]["ts"] if marks else None


def measure(name, fault, target, codes, want_verdict, timeout_only, home: Path, budget_s: float) -> dict:
    run_id = f"bench-{name}"
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
            hit = next((e for e in evs if e["kind"] == "alert" and not e.get("cleared") and e["code"] in codes
                        and names(e, target) and e["ts"] >= t0 - 1), None)
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
    evs = events(run)
    after = [e for e in evs if e["kind"] == "alert" and not e.get("cleared") and t0 and e["ts"] >= t0
             and e.get("severity") in ("warn", "critical")]
    mine = [e for e in after if names(e, target)]
    others = sorted({t for e in after for t in e.get("targets") or [] if not names({"targets": [t]}, target)})
    verdicts = [e.get("evidence", {}).get("verdict") for e in mine if e.get("evidence", {}).get("verdict")]
    dt = hit["ts"] - t0 if hit and t0 else None
    limit, rule = timeout_only
    return {"fault": name, "named": target if hit else "-", "case": hit["code"] if hit else "-",
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
    alerts = [e for e in evs if e["kind"] == "alert" and not e.get("cleared") and e.get("severity") in ("warn", "critical")
              and e["code"] not in ("driver_failed",)]
    stuck = [e for e in alerts if (e.get("evidence") or {}).get("verdict") == "stuck" or "stuck:" in e["message"]]
    steps = max((e["step"] for e in evs if e["kind"] == "metrics"), default=0)
    return {"run": name, "seconds": seconds, "steps": steps, "alerts": len(alerts), "stuck": len(stuck),
            "codes": sorted({e["code"] for e in alerts})}


def fmt(v, spec="{:.1f}") -> str:
    return "-" if v is None else spec.format(v)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--healthy-s", type=float, default=600.0)
    p.add_argument("--slow-s", type=float, default=120.0)
    p.add_argument("--budget-s", type=float, default=150.0, help="per fault run, from the start")
    p.add_argument("--only", nargs="*", default=None)
    a = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gkd-bench-diag-"))
    rows = [measure(*f, home=home, budget_s=a.budget_s) for f in FAULTS if a.only is None or f[0] in a.only]
    print(f"{'fault':14s} {'named':10s} {'case':20s} {'named in':>9s} {'stack in':>9s} {'verdict':>8s} "
          f"{'others named':14s} {'timeout-only':>13s} {'ratio':>7s}  timeout-only rule")
    for r in rows:
        ok = "" if r["verdict"] == r["want"] or not r["want"] else f" (want {r['want']})"
        print(f"{r['fault']:14s} {r['named']:10s} {r['case']:20s} {fmt(r['seconds']) + ' s':>9s} "
              f"{fmt(r['stack_s']) + ' s':>9s} {(r['verdict'] or '-') + ok:>8s} {', '.join(r['others']) or 'none':14s} "
              f"{fmt(r['timeout_only_s'], '{:.0f}') + ' s':>13s} {fmt(r['ratio'], '{:.0f}x'):>7s}  {r['timeout_rule']}")
    print()
    runs = []
    if a.only is None or "healthy" in a.only:
        runs.append(alert_count("healthy", [], a.healthy_s, home))
    if a.only is None or "slow_worker" in a.only:
        runs.append(alert_count("slow_worker", ['faults=[{"kind": "slow_worker", "target": "rollout/1", "step": 1, '
                                                '"factor": 0.3}]'], a.slow_s, home))
    print(f"{'run':12s} {'seconds':>8s} {'steps':>7s} {'warn/critical alerts':>21s} {'said stuck':>11s}  codes")
    for r in runs:
        print(f"{r['run']:12s} {r['seconds']:8.0f} {r['steps']:7d} {r['alerts']:21d} {r['stuck']:11d}  "
              f"{', '.join(r['codes']) or '-'}")
    print(f"\n{os.cpu_count()} cores, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
