"""Rules on the GPUs and memory: a GPU probe that does not answer, a GPU full but idle or far behind the
others, a step skipped for a non-finite value, out of memory."""

from __future__ import annotations

from gkd_core.diagnosis import plan
from gkd_core.diagnosis.gpu_index import GPU_FRESH_S, GpuIndex
from gkd_core.diagnosis.marks import marked
from gkd_core.diagnosis.rules.common import BAD_STEP_SHOWN, FAILED_WORKER, Settings
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import spoken
from gkd_core.vocab import WORKER_ENDED, src_of


def gpu_probe_hung(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    out = []
    for node, probe, seconds in state.hung_probes(now):
        name = "NVML" if probe == "nvml" else probe
        out.append(AlertEvent(
            severity="critical", code="gpu_probe_hung",
            message=f"{name} on {node} has not answered for {spoken(seconds)}",
            hint="the GPU driver is wedged (nvidia-smi would freeze too): check `dmesg` for Xid errors; "
                 "a worker stuck in CUDA will not come back, restart (r) on healthy nodes",
            targets=[src_of("agent", node)] if probe == "nvml" else [src_of("agent", node), probe],
            evidence={"probe": probe, "seconds": round(seconds, 1)},
        ))
    return out


GPU_IDLE_FULL_S = 60.0  # memory full, nothing computed, for this long


GPU_SPREAD = 50.0  # utilisation points between the busiest and the idlest GPU of the run


def gpu_danger(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """The danger signs of a GPU run: a GPU full of memory at 0 % utilisation for a minute (a process
    that holds it and waits: a hung collective, a leftover process), and GPUs badly unbalanced. Read from
    what the GPU index keeps (``gpu_index``): the GPUs full and idle, the nodes' spreads."""
    if state.state not in ("running", ""):
        return []
    index = state.kept("gpu_index", lambda: GpuIndex(state))
    index.keep_up(state)
    out = []
    by_pid: dict[int, str] | None = None  # (made when a GPU is named: a walk over every worker)
    for key in sorted(index.full_idle):
        g = state.gpus[key]
        if g.full_idle_since is None or now - g.ts >= GPU_FRESH_S or now - g.full_idle_since < GPU_IDLE_FULL_S:
            continue
        if by_pid is None:
            by_pid = {w.pid: w.src for w in state.workers.values() if w.pid}
        holders = [by_pid.get(p, f"pid {p}") for p in g.pids]
        out.append(AlertEvent(
            severity="warn", code="gpu_idle_full", targets=[f"gpu {g.node}/{g.index}", *holders],
            message=f"GPU {g.index} on {g.node}: {100 * (g.mem_used or 0) / (g.mem_total or 1):.0f} % of its "
                    f"memory used at 0 % utilisation for {spoken(now - g.full_idle_since)}"
                    + (f" (held by {', '.join(holders)})" if holders else ""),
            hint="a process holds the GPU and computes nothing: a hung collective or a leftover process; its "
                 "stack (d); `nvidia-smi` lists the pids",
            evidence={"elapsed_s": round(now - g.full_idle_since, 1), "util": g.util, "mem_used": g.mem_used,
                      "mem_total": g.mem_total}))
    if not state.running_since or now - state.running_since <= GPU_IDLE_FULL_S:
        return out
    spread = index.spread_at(state, now, GPU_SPREAD)
    if spread is not None and spread.idle:
        lo, hi = spread.low.util_avg or 0.0, spread.high.util_avg or 0.0
        g_lo, g_hi = spread.low, spread.high
        idle = [f"gpu {g.node}/{g.index}" for g in spread.idle]
        out.append(AlertEvent(
            severity="warn", code="gpu_unbalanced", targets=idle,
            message=f"GPUs unbalanced: {g_hi.node}/{g_hi.index} at {hi:.0f} %, {g_lo.node}/{g_lo.index} at "
                    f"{lo:.0f} % (averaged over the last minute); {len(idle)} of {spread.gpus} far below the "
                    "busiest",
            hint="an uneven split of the work (batch sizes not divisible by the workers) or a straggler on the "
                 "idle ones; compare their phases in the workers table",
            evidence={"max_util": round(hi, 1), "min_util": round(lo, 1)}))
    return out


def bad_step(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Seed 004's NaN loss: a step skipped because its loss or gradient norm was not finite."""
    if not state.bad_steps or state.step is None or state.step - state.bad_steps[-1] >= BAD_STEP_SHOWN:
        return []
    last, n = state.bad_steps[-1], len(state.bad_steps)
    return [AlertEvent(
        severity="warn", code="bad_step", targets=["student/0"],
        message=f"step {last} skipped: its loss or gradient norm was not finite ({n} skipped so far); the "
                "weights, the rollouts and the checkpoints kept the last good values",
        hint="for a NaN loss: lower actor.lr, keep clipping on (actor.max_grad_norm 1.0), bfloat16 rather than "
             "float16 (model.dtype)",
        evidence={"step": last, "bad_steps": n},
    )]



def out_of_memory(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """An out-of-memory error in a worker's log or in Ray's death cause of its actor (this driver's
    workers only: a restart starts afresh)."""
    hits = list(state.oom) + [(w.last_seen, w.src, w.ray_death_cause) for w in marked(state, "oom_death")
                              if w.phase not in WORKER_ENDED]
    if not hits:
        return []
    ts, src, line = max(hits)
    m = FAILED_WORKER.search(line.removeprefix("gkd driver: "))
    target, where = (m.group(1), f" in {m.group(2)}") if m else (src, "")
    return [AlertEvent(
        severity="critical", code="out_of_memory", targets=[target],
        message=f"{target} ran out of memory{where}: {line[:220]}",
        hint=plan.ladder_hint(), evidence={"worker": target, "line": line[:300], "ts": ts},
    )]
