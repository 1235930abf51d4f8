"""A bundle's texts: ``summary.md`` (the issue a user would file), Ray's view, the tracebacks in the logs.

The summary is written the way a maintainer asks for it (seed 004's checklist; verl #7180's `ray
status`, `ray list actors --detail`, `py-spy dump` of every worker): what is wrong and on which worker,
at which line; what was tried; the command; the versions and hardware; the variables in effect;
Ray's view; the tracebacks. Every part names the file of the bundle that holds all of it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gkd_core.bundle.environment import DriverRecord
from gkd_core.stack_text import where
from gkd_core.state import RunState
from gkd_core.units import compact, size

TRACEBACK_START = re.compile(r"Traceback \(most recent call last\):")
CHAINED = ("During handling", "The above exception")
TRACEBACK_SCAN = 8 << 20  # bytes at the end of each log read for them
TRACEBACKS_KEEP = 20  # the newest, over every log
TRACEBACK_LINES = 60  # a traceback's lines past this are cut (a chained one can run to hundreds)
SUMMARY_TRACEBACKS = 2


@dataclass(frozen=True)
class UnreportedActor:
    """An actor alive in Ray's view that the run's state does not hold (not reported to the run, or not yet)."""

    target: str  # its name in the bundle: its class, its Ray name if it has one, and its pid
    cls: str
    name: str
    actor_id: str
    pid: int
    node: str  # its node's address in Ray's view ("" when Ray's view does not say)


@dataclass
class StacksTaken:
    """The stacks taken for this bundle (the same fan-out as `D`, then what it missed: bundle/targets.py):
    target -> text, or why there is none."""

    dump_id: str = ""
    folder: str = ""  # RUN/stacks/<folder>, where the driver saved them
    taken: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # target -> what its stack's reader said beside it
    note: str = ""  # why none were taken (the run is over, nobody answered)
    unreported: list[UnreportedActor] = field(default_factory=list)  # targets from Ray's view alone


def tracebacks(logs: Path) -> list[tuple[str, str]]:
    """(log file, traceback text) of every Python traceback in RUN/logs, newest TRACEBACKS_KEEP. A line's
    prefix before ``Traceback`` (Ray's "(Trainer pid=12) ") is on each of its lines, and taken off them."""
    found: list[tuple[float, int, str, str]] = []
    for path in sorted(p for p in logs.rglob("*") if p.is_file()) if logs.is_dir() else []:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - TRACEBACK_SCAN))  # the newest: a log of gigabytes is not read whole
                lines = f.read().decode(errors="replace").splitlines()
            mtime = path.stat().st_mtime
        except OSError:  # gone since it was listed
            continue
        i = 0
        while i < len(lines):
            start = TRACEBACK_START.search(lines[i])
            if not start:
                i += 1
                continue
            prefix = lines[i][:start.start()]
            block = [lines[i][start.start():]]
            i += 1
            # its frames are indented; its last line (the exception) is not, and ends it
            while i < len(lines) and lines[i].startswith(prefix):
                line = lines[i][len(prefix):]
                i += 1
                block.append(line)
                if not line.startswith((" ", "\t")) and not TRACEBACK_START.search(line) and line.strip() and \
                        not line.startswith(CHAINED) and not _chain_follows(lines, i, prefix):
                    break
            if len(block) > TRACEBACK_LINES:
                block = block[:TRACEBACK_LINES // 2] + [f"  ... ({len(block) - TRACEBACK_LINES} lines)"] + \
                    block[-TRACEBACK_LINES // 2:]
            found.append((mtime, i, str(path.relative_to(logs.parent)), "\n".join(block)))
    return [(f, t) for _, _, f, t in sorted(found)[-TRACEBACKS_KEEP:]]


def _chain_follows(lines: list[str], i: int, prefix: str) -> bool:
    """Whether an exception's line at ``i - 1`` is followed (past blank lines) by a chained one's header."""
    while i < len(lines) and not lines[i][len(prefix):].strip():
        i += 1
    return i < len(lines) and lines[i][len(prefix):].startswith(CHAINED)


def ray_view_of_state(st: RunState) -> dict[str, Any]:
    """Ray's view as the run saw it (the state API and the control store, polled every 2 s by the driver):
    nodes with their resources and state, actors with their state and node, placement groups' demand."""
    nodes = [{"node": ip, "state": n.state, "resources": n.resources} for ip, n in sorted(st.ray_nodes.items())]
    actors = [{"worker": w.src, "actor_id": w.actor_id, "state": w.ray_state or ("DEAD" if w.phase == "exited"
                                                                                 else "ALIVE"),
               "node": w.node, "pid": w.pid, "phase": w.phase, "running": w.ray_task,
               "death_cause": w.ray_death_cause, "waiting_for": w.ray_required}
              for w in sorted(st.workers.values(), key=lambda w: w.src) if w.actor_id]
    pgs = [{"pg_id": pid, "name": pg.name, "state": pg.state, "strategy": pg.strategy, "bundles": pg.bundles,
            "scheduling": pg.scheduling} for pid, pg in sorted(st.ray_pgs.items())]
    return {"nodes": nodes, "actors": actors, "placement_groups": pgs}


def summary(run: Path, st: RunState, now: float, driver: DriverRecord | None, facts: dict[str, Any],
            stacks: StacksTaken, traces: list[tuple[str, str]], files: list[str]) -> str:
    """``summary.md``: the bug report, as a person would file it."""
    alerts = st.active_alerts()
    title = alerts[0].message if alerts else f"run {st.state or 'unknown'}, no alert active"
    out = [f"# {run.name}: {title}", ""]
    step = f", step {st.step}" + (f" of {st.total_steps}" if st.total_steps else "") if st.step is not None else ""
    out += [f"**State**: {st.state or 'unknown'}{step}; {st.restarts} restart(s); bundle written "
            f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(now))}"
            + (f"; exit code {st.exit_code}: {st.reason}" if st.exit_code is not None else ""), ""]
    out += _what_is_wrong(st, now, stacks) + _tried(st) + _command(driver) + _environment(facts, driver, st)
    out += _ray(st, facts) + _traces(traces)
    out += ["## Files in this bundle", "", *[f"- `{f}`" for f in files], ""]
    return "\n".join(out)


def _what_is_wrong(st: RunState, now: float, stacks: StacksTaken) -> list[str]:
    out = ["## What the dashboard says", ""]
    alerts = st.active_alerts()
    if not alerts:
        out += ["No alert is active.", ""]
    for a in alerts:
        out.append(f"- **{a.severity}** `{a.code}`: {a.message}" + (f" — {a.hint}" if a.hint else ""))
    named = sorted({t for a in alerts for t in a.targets if t in st.workers}) or \
        sorted(t for t, w in st.workers.items() if w.phase not in ("", "idle", "exited"))[:8]
    if named or stacks.unreported:
        out += ["", "| worker | phase | for | node | pid | memory | stack (this bundle's dump) |",
                "|---|---|---|---|---|---|---|"]
        for t in named:
            w = st.workers[t]
            since = compact(now - w.phase_since) if w.phase_since else ""
            mem = size(w.rss) if w.rss else ""
            out.append(f"| {t} | {_cell(w.phase)} | {since} | {w.node} | {w.pid or ''} | {mem} | "
                       f"`{_cell(_stack_at(t, stacks, w.phase))}` |")
        # alive in Ray's view, unknown to the run: each said, so that none is missed by whoever reads this
        for actor in stacks.unreported:
            out.append(f"| {_cell(actor.target)} | (not reported to the run) | | {actor.node} | {actor.pid or ''} | | "
                       f"`{_cell(_stack_at(actor.target, stacks, ''))}` |")
    if stacks.note:
        out += ["", f"Stacks: {stacks.note}"]
    elif stacks.taken or stacks.missing:
        unread = "; ".join(f"{t}: {why}" for t, why in sorted(stacks.missing.items())[:6])
        unknown = (f" {len(stacks.unreported)} actor(s) alive in Ray's view had not reported to the run: asked for "
                   "by their pid, beside the run's workers (the rows `(not reported to the run)` above)."
                   if stacks.unreported else "")
        out += ["", f"Stacks of {len(stacks.taken)} worker(s) and their child processes taken for this bundle "
                    f"(`stacks.txt`, grouped; each in `{stacks.folder or 'stacks/'}`)"
                + (f"; {len(stacks.missing)} could not be read: {unread}." if stacks.missing else ".") + unknown]
    return out + [""]


def _stack_at(target: str, stacks: StacksTaken, phase: str) -> str:
    """Where ``target``'s stack stands, or why it was not taken."""
    if target in stacks.taken:
        return where(stacks.taken[target])
    if target in stacks.missing:
        return f"not taken: {stacks.missing[target]}"
    return "not taken: it had exited" if phase == "exited" else "not taken: not in this bundle's dump"


def _tried(st: RunState) -> list[str]:
    out = ["## What was tried", ""]
    # a request passed on to the driver is on record twice: the supervisor's receipt, then the driver's answer
    acts = [a for a in st.actions if not a.is_receipt]
    if not acts:
        return out + ["Nothing from the dashboard or the command line (no control action on record).", ""]
    for a in acts:
        when = time.strftime("%H:%M:%S", time.localtime(a.ts or 0))
        said = a.result_said.replace("\n", "; ")[:200]
        out.append(f"- {when} `{a.op}` by {a.by or '?'}: {'ok' if a.ok else 'failed'}" + (f" — {said}" if said else ""))
    return out + [""]


def _command(driver: DriverRecord | None) -> list[str]:
    out = ["## Command", ""]
    if driver is None:
        return out + ["(not recorded: RUN/driver.json is missing; a run from an older gkd-tui)", ""]
    return out + [f"{driver.how}, pid {driver.pid}, restart {driver.restart}, in `{driver.cwd}`:", "",
                  "```shell", driver.command, "```", ""]


def _environment(facts: dict[str, Any], driver: DriverRecord | None, st: RunState) -> list[str]:
    out = ["## Environment", "", "| | |", "|---|---|"]
    versions, hw = facts.get("versions", {}), facts.get("hardware", {})
    if "error" in facts:
        out.append(f"| probe | {_cell(facts['error'])} |")
    build = versions.get("torch_build") or {}
    for name in ("python", "torch", "ray", "vllm", "verl", "transformers", "gkd-tui"):
        value = versions.get(name, "not read")
        if name == "torch" and isinstance(build, dict) and build and "error" not in build:
            value += f" (CUDA {build.get('cuda') or 'none'}, NCCL {build.get('nccl')})"
        out.append(f"| {name} | {_cell(value)} |")
    out.append(f"| platform | {versions.get('platform', '')} |")
    if hw and "error" not in hw:
        limit = hw.get("memory_limit") or {}
        out.append(f"| CPUs | {hw.get('cpus')} ({hw.get('cpus_usable')} usable by the run) |")
        out.append(f"| memory | {size(hw.get('memory_total') or 0)}, {size(hw.get('memory_available') or 0)}"
                   f" available; limit {size(limit.get('limit') or 0)} ({limit.get('where', '?')}) |")
        out.append(f"| GPUs | {_cell(_gpus(hw.get('gpus') or {}))} |")
    elif hw:
        out.append(f"| hardware | {_cell(hw.get('error'))} |")
    for node, note in sorted(st.gpu_notes.items()):
        out.append(f"| GPUs of {node} | {_cell(note)} |")
    out.append("")
    if driver is not None:
        out += ["Variables in effect (NCCL_*, TORCH_*, CUDA_*, RAY_*, VLLM_*, GKD_*, ...; secrets shown as "
                "`<redacted>`; all in `environment.json`):", "", "```"]
        out += [f"{k}={v}" for k, v in driver.env.items()] or ["(none set)"]
        out += ["```", ""]
    return out


def _cell(text: object) -> str:
    """A value as one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _gpus(g: dict[str, Any]) -> str:
    if "error" in g:
        return f"not read: {g['error']}"
    devices = g.get("devices") or []
    if not devices:
        return f"none: {g.get('none', 'not said')}"
    names: dict[str, int] = {}
    for d in devices:
        key = f"{d['name']} ({size(d['memory_total'])})"
        names[key] = names.get(key, 0) + 1
    return ", ".join(f"{n} x {k}" for k, n in names.items()) + f"; driver {g.get('driver')}"


def _ray(st: RunState, facts: dict[str, Any]) -> list[str]:
    view = ray_view_of_state(st)
    live = facts.get("ray") or {}
    out = ["## Ray's view", ""]
    if live and "error" not in live:
        nodes, actors, pgs = live["nodes"], live["actors"], live["placement_groups"]
        source = "Ray's state API when the bundle was written (`ray.json`: `live`)"
    else:
        nodes, actors, pgs = view["nodes"], view["actors"], view["placement_groups"]
        source = "as the run last saw it (`ray.json`: `run`)" + \
            (f"; Ray's state API did not answer the bundle: {live['error']}" if live.get("error") else "")
    states: dict[str, int] = {}
    for a in actors:
        states[a["state"]] = states.get(a["state"], 0) + 1
    out.append(f"{source}: {len(nodes)} node(s) ({sum(n['state'] == 'ALIVE' for n in nodes)} alive), "
               f"{len(actors)} actor(s) (" + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + "), "
               f"{len(pgs)} placement group(s)"
               + (f", {sum(p['state'] == 'PENDING' for p in pgs)} pending" if pgs else "") + ".")
    for a in actors:
        if a["state"] not in ("ALIVE",):
            who = a.get("worker") or a.get("class") or a["actor_id"][:8]
            out.append(f"- {who}: {a['state']}" + (f" — {a['death_cause']}" if a.get("death_cause") else ""))
    for p in pgs:
        if p["state"] == "PENDING":
            out.append(f"- placement group {p['name'] or p['pg_id'][:8]} pending ({p.get('scheduling') or '?'}): "
                       f"asks {p['bundles']}")
    return out + [""]


def _traces(traces: list[tuple[str, str]]) -> list[str]:
    out = ["## Tracebacks", ""]
    if not traces:
        return out + ["None in the logs.", ""]
    out.append(f"{len(traces)} in the logs (all in `tracebacks.txt`); the newest:")
    for path, text in traces[-SUMMARY_TRACEBACKS:]:
        out += ["", f"`{path}`:", "```", text, "```"]
    return out + [""]
