"""What each plot shows, as data: a ``Figure`` of lines, made from the run's state by a pure function.

The plots view (``screens/plots.py``) draws them; keeping them apart from the widget means the
tests read what a plot says without a terminal, and the view redraws a plot only when its figure
changed. Colours are the names of theme variables (``theme.py``), resolved when drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal, NamedTuple

from gkd_core.state import MetricsPoint, RunState
from gkd_core.state.series import DepthPoint, GpuPoint, SyncPoint, TeacherPoint
from gkd_core.units import compact
from gkd_core.vocab import SYNC_FAILED, SYNC_PARTS

# a step's phases in the order they happen (each a theme colour, series-phase-NAME); others go after them
PHASES = ("generate", "wait", "teacher", "train", "sync", "eval")
MINUTES_AFTER_S = 600.0  # a time axis longer than this is in minutes
GB = float(1 << 30)  # as gkd_core.units.size writes it
# a plot's axis takes the span of its values: two extreme floats (a diverged loss of 1e308, a sender's clock
# at the float's end) would make it infinite; this is far past anything worth reading off a plot
LIMIT = 1e15
_MIN_SPAN = 1e-9  # of the larger end (or of 1): an axis narrower than this is widened
AGREEMENT_TOP = 1.05  # textual-plot draws a value at the axis' very top a row low: 1.0 a little under it


class Line(NamedTuple):
    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    colour: str  # a theme variable
    kind: Literal["line", "points"] = "line"


class Figure(NamedTuple):
    title: str
    xlabel: str
    ylabel: str
    lines: tuple[Line, ...]
    ylim: tuple[float | None, float | None] = (None, None)
    empty: str = ""  # what to say when there is nothing to draw yet

    @property
    def drawn(self) -> bool:
        return any(line.x for line in self.lines)

    def limits(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """The axes' ranges: the data's, within ``ylim`` where it is set, never wider than ``LIMIT`` and
        never narrower than ``_MIN_SPAN`` (a plotting library divides by the span: one step, a flat line
        or two subnormal values would make it 0)."""
        xs = [x for line in self.lines for x in line.x]
        ys = [y for line in self.lines for y in line.y]
        low, high = self.ylim
        return _span(_clip(min(xs, default=0.0)), _clip(max(xs, default=1.0))), _span(
            _clip(low if low is not None else min(ys, default=0.0)),
            _clip(high if high is not None else max(ys, default=1.0)), keep_low=low is not None)


TABS = ("training", "sync", "step time", "teacher", "GPU", "memory", "pipeline")
MEMORY_DRAWN = 6  # the processes of most memory, a line each
# their colours: not the magentas, which read as the limits' red on most terminals' palettes
MEMORY_COLOURS = ("series-1", "series-2", "series-4", "series-5", "series-6", "series-7")


def figures(tab: str, st: RunState) -> tuple[Figure, ...]:
    """The figures of one tab of the plots view, from ``st`` as it is now."""
    if tab == "training":
        return training(st.metrics)
    if tab == "sync":
        return syncs(st.series.syncs)
    if tab == "step time":
        return (step_time(st.metrics),)
    if tab == "teacher":
        return teacher(st.series.teacher, _origin(st, st.series.teacher))
    if tab == "GPU":
        return gpus(st.series.gpus, st.series.gpu_mean, _origin(st, st.series.gpu_mean))
    if tab == "pipeline":
        return queues(st.series.queues, st.started), staleness(st.series.queues, st.started)
    if tab == "memory":
        return (memory(st),)
    raise ValueError(f"no plot tab {tab!r}; the tabs are {', '.join(TABS)}")


def by_step(metrics: list[MetricsPoint]) -> list[MetricsPoint]:
    """A point per step, in step order: a resumed driver trains steps again (and says its checkpoint's
    again), and a line drawn in arrival order would run back and retrace them. The newest of a step wins."""
    return sorted({m.step: m for m in metrics}.values(), key=lambda m: m.step)


def training(metrics: list[MetricsPoint]) -> tuple[Figure, ...]:
    metrics = by_step(metrics)
    out = []
    for name, title, ylim in (("loss", "loss", (None, None)), ("kl", "KL(teacher‖student)", (0.0, None)),
                              ("agreement", "agreement with the teacher (held-out prompts)", (0.0, AGREEMENT_TOP))):
        pts = [(m.step, getattr(m, name)) for m in metrics if getattr(m, name) is not None]
        last = f": {pts[-1][1]:.4g} at step {pts[-1][0]}" if pts else ""
        # agreement is measured at evaluations only: points, so that few of them still show
        kind: Literal["line", "points"] = "points" if name == "agreement" and len(pts) < 30 else "line"
        out.append(Figure(title + last, "", "", (_line(name, pts, f"series-{name}", kind),), ylim,
                          empty=f"no {name} reported yet"))
    return tuple(out)


def syncs(points: list[SyncPoint]) -> tuple[Figure, Figure]:
    """Each sync's time against its timeout (the headroom), then to its own scale (the trend)."""
    # a point per step, in step order (a resumed driver syncs its steps again): the newest of a step wins
    points = sorted({_sync_x(p): p for p in points}.values(), key=_sync_x)
    pts = [(_sync_x(p), p.elapsed_s) for p in points]
    # ended badly (a sync cut short by the next, still open when archived, is not a failure)
    failed = [(x, y) for (x, y), p in zip(pts, points, strict=True) if p.state in SYNC_FAILED]
    timeout = _clip(max((p.timeout_s for p in points), default=0.0))
    longest = max((y for _, y in pts), default=0.0)
    xlabel = "" if any(p.step is not None for p in points) or not points else "sync"
    lines = [_line("sync", pts, "series-sync")]
    if failed:
        lines.append(_line("failed", failed, "severity-critical", "points"))
    title = "each step's sync against its timeout"
    against = list(lines)
    if timeout and pts:
        xs = (pts[0][0], pts[-1][0])
        against.append(Line(f"timeout {_secs(timeout)}", xs, (timeout, timeout), "series-timeout"))
        title += f": the longest {_secs(longest)}, {100 * longest / timeout:.1f} % of {_secs(timeout)}"
    scale_title = f"each step's sync, to scale{f': the last {_secs(pts[-1][1])}' if pts else ''}"
    parts = _sync_parts(points)
    if parts:
        scale_title += " (its parts stacked: each line the time to the end of that part, the slowest member's)"
    return (Figure(title, xlabel, "seconds", tuple(against), (0.0, timeout * 1.05 if timeout else None),
                   empty="no sync finished yet"),
            Figure(scale_title, xlabel, "seconds", tuple(parts) + tuple(lines), (0.0, None),
                   empty="no sync finished yet"))


def _sync_parts(points: list[SyncPoint]) -> list[Line]:
    """The parts of each sync (vocab.SYNC_PARTS, in the order a sync runs them), stacked as the step time's
    phases are, top down for the legend: which part grew, when a sync grows."""
    names = [k for k in SYNC_PARTS if any(k in p.parts for p in points)]
    lines = []
    for i, name in enumerate(names):
        upto = names[: i + 1]
        lines.append(_line(SYNC_PARTS[name], [(_sync_x(p), sum(p.parts.get(k, 0.0) for k in upto))
                                              for p in points if p.parts], f"series-{i % 8 + 1}"))
    return list(reversed(lines))


def _sync_x(p: SyncPoint) -> int:
    return p.step if p.step is not None else p.sync_id


def step_time(metrics: list[MetricsPoint]) -> Figure:
    """A step's time split by phase, stacked: each line is the time up to the end of its phase, so
    the band under it (down to the line before) is that phase. Lines, not bars: textual-plot fills a
    bar a pixel at a time in Python, and six phases' bars over a whole plot took about ten times as
    long to draw as the lines (bench/bench_plots.py on an early version, one run)."""
    timed = [m for m in by_step(metrics) if m.timing]
    names = sorted({k for m in timed for k in m.timing}, key=lambda k: (PHASES.index(k) if k in PHASES else 99, k))
    lines = []
    for i, name in enumerate(names):
        upto = names[: i + 1]
        lines.append(_line(name, [(m.step, sum(m.timing.get(k, 0.0) for k in upto)) for m in timed],
                           f"series-phase-{name}" if name in PHASES else "series-phase-other"))
    last = timed[-1] if timed else None
    title = "a step's time by phase, stacked (each line: the time to the end of that phase)"
    if last is not None:
        title += f": step {last.step} took {_secs(sum(last.timing.values()))}"
    # the legend lists the phases top down, as they stack
    return Figure(title, "", "seconds", tuple(reversed(lines)), (0.0, None), empty="no step timed yet")


def teacher(points: list[TeacherPoint], t0: float) -> tuple[Figure, Figure]:
    scale, unit = _time_axis(points, t0)
    p50 = [((p.ts - t0) / scale, p.p50_ms) for p in points if p.p50_ms is not None]
    p99 = [((p.ts - t0) / scale, p.p99_ms) for p in points if p.p99_ms is not None]
    queue = [((p.ts - t0) / scale, float(p.queue)) for p in points]
    flight = [((p.ts - t0) / scale, float(p.in_flight)) for p in points]
    last = points[-1] if points else None
    lat_title = "teacher latency (the slowest client)"
    if last is not None and last.p50_ms is not None:
        lat_title += f": p50 {last.p50_ms:.1f} ms" + (f", p99 {last.p99_ms:.1f} ms" if last.p99_ms is not None else "")
    q_title = "requests waiting at the teacher (queue) and not answered yet (in flight)"
    if last is not None:
        q_title += f": {last.queue} queued, {last.in_flight} in flight"
    return (Figure(lat_title, unit, "ms", (_line("p50", p50, "series-p50"), _line("p99", p99, "series-p99")),
                   (0.0, None), empty="no teacher latency reported yet"),
            Figure(q_title, unit, "requests", (_line("queue", queue, "series-queue"),
                                               _line("in flight", flight, "series-rate")),
                   (0.0, None), empty="no teacher traffic yet"))


def gpus(by_device: dict[str, list[GpuPoint]], mean: list[GpuPoint], t0: float) -> tuple[Figure, Figure]:
    scale, unit = _time_axis(mean, t0)
    out = []
    for _, title, top, pick in (("util", "GPU utilisation", 100.0, lambda p: p.util),
                                   ("memory", "GPU memory used", 100.0,
                                    lambda p: None if p.mem is None else 100 * p.mem)):
        lines = [_line(f"GPU {key}", _timed(pts, t0, scale, pick), f"series-{i % 8 + 1}")
                 for i, (key, pts) in enumerate(sorted(by_device.items()))]
        if len(by_device) > 1 or not by_device:
            lines.append(_line("mean of every GPU", _timed(mean, t0, scale, pick), "series-mean"))
        now = pick(mean[-1]) if mean else None
        out.append(Figure(title + (f": {now:.0f} % on average now" if now is not None else ""), unit, "%",
                          tuple(lines), (0.0, top), empty="no GPU readings (NVML has not answered on any node)"))
    return out[0], out[1]


def memory(st: RunState) -> Figure:
    """The processes of most memory now, each a line of its phases' peaks (the phase history) ending at its
    newest heartbeat, against the limits they live under (their cgroup's, or the node's memory): what grows,
    in which phase, and how near the OOM killer's line."""
    top = sorted((w for w in st.workers.values() if w.rss and w.phase != "exited"), key=lambda w: -w.rss)
    top = top[:MEMORY_DRAWN]
    t0 = st.started or min((w.last_heartbeat for w in top), default=0.0)
    last = max((w.last_heartbeat for w in top), default=t0)
    scale, unit = _axis_over(last - t0)
    lines, limits = [], {}
    for i, w in enumerate(top):
        pts = [((span.ended - t0) / scale, span.peak_rss / GB) for span in w.spans if span.peak_rss]
        pts.append(((w.last_heartbeat - t0) / scale, w.rss / GB))
        lines.append(_line(f"{w.src} ({w.phase})", pts, MEMORY_COLOURS[i % len(MEMORY_COLOURS)]))
        if w.mem is not None and w.mem.limit:
            limits[(w.node, w.mem.scope)] = w.mem.limit
    ends = (0.0, max((last - t0) / scale, 1.0))
    nodes = {node for node, _ in limits}
    for (node, scope), limit in sorted(limits.items()):
        name = "the node's memory" if scope == "node" else f"cgroup {scope.rstrip('/').rsplit('/', 1)[-1]}"
        name += f" ({node})" if len(nodes) > 1 else ""
        lines.append(Line(f"limit: {name}", ends, (limit / GB, limit / GB), "series-timeout"))
    title = "memory (GB): the largest processes, each phase's peak, against their limits"
    if top:
        w = top[0]
        title += f"; {w.src} {w.rss / GB:.2f} GB now" + (f" of {w.mem.limit / GB:.1f}" if w.mem and w.mem.limit else "")
    return Figure(title, unit, "GB", tuple(lines), (0.0, None), empty="no memory readings yet (heartbeats carry them)")


def queues(by_queue: dict[str, list[DepthPoint]], started: float | None) -> Figure:
    """Each queue of the job's depth over time (its worker's ``flow`` events): one that fills while its
    consumer stalls, or stays empty while its producer does."""
    t0 = started or min((pts[0].ts for pts in by_queue.values() if pts), default=0.0)
    last = max((pts[-1].ts for pts in by_queue.values() if pts), default=t0)
    scale, unit = _axis_over(last - t0)
    drawn = sorted(by_queue.items())
    colours = MEMORY_COLOURS
    lines = tuple(_line(key, (((p.ts - t0) / scale, float(p.depth)) for p in pts), colours[i % len(colours)])
                  for i, (key, pts) in enumerate(drawn))
    title = "queue depth: " + ("; ".join(f"{key} {pts[-1].depth} now" for key, pts in drawn if pts) or "no queue")
    return Figure(title, unit, "items", lines, (0.0, None),
                  empty="no queue of the job's seen yet (a queue is found where a call of the job puts into it)")


def staleness(by_queue: dict[str, list[DepthPoint]], started: float | None) -> Figure:
    """How many versions behind the newest the samples each queue's consumer took were, on average between
    two of its counts: a trainer learning from ever older samples (a gate too wide, rollouts that lag)."""
    drawn = sorted((key, [p for p in pts if p.behind is not None]) for key, pts in by_queue.items())
    drawn = [(key, pts) for key, pts in drawn if pts]
    t0 = started or min((pts[0].ts for _, pts in drawn), default=0.0)
    last = max((pts[-1].ts for _, pts in drawn), default=t0)
    scale, unit = _axis_over(last - t0)
    lines = tuple(_line(key, (((p.ts - t0) / scale, float(p.behind or 0.0)) for p in pts),
                        MEMORY_COLOURS[i % len(MEMORY_COLOURS)]) for i, (key, pts) in enumerate(drawn))
    title = "samples taken, versions behind: " + "; ".join(f"{key} {pts[-1].behind:.1f} lately" for key, pts in drawn)
    return Figure(title if drawn else "samples taken, versions behind", unit, "versions", lines, (0.0, None),
                  empty="no queue's samples say their version (a dict key or attribute: param_version, "
                        "policy_version, weight_version, model_version or version)")


def _clip(v: float) -> float:
    return max(-LIMIT, min(LIMIT, v))


def _span(lo: float, hi: float, keep_low: bool = False) -> tuple[float, float]:
    hi = max(lo, hi)
    if hi - lo >= _MIN_SPAN * max(1.0, abs(lo), abs(hi)):
        return lo, hi
    pad = max(1.0, abs(lo), abs(hi)) * 0.1
    return (lo, lo + 2 * pad) if keep_low else (lo - pad, hi + pad)


def _secs(seconds: float) -> str:
    """A sync or a step is often under a second: in ms then."""
    return f"{1000 * seconds:.0f} ms" if 0 <= seconds < 1 else compact(seconds)


def _origin(st: RunState, points: list) -> float:
    """Where a time axis starts: the run's start, or its first point where the start is not known."""
    return st.started or (points[0].ts if points else 0.0)


def _line(label: str, pts: Iterable[tuple[float, float]], colour: str,
          kind: Literal["line", "points"] = "line") -> Line:
    pts = [(_clip(x), _clip(y)) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
    return Line(label, tuple(float(x) for x, _ in pts), tuple(float(y) for _, y in pts), colour, kind)


def _timed(points: list[GpuPoint], t0: float, scale: float, pick) -> list[tuple[float, float]]:
    return [((p.ts - t0) / scale, v) for p in points if (v := pick(p)) is not None]


def _time_axis(points: list, t0: float) -> tuple[float, str]:
    """Seconds since the run began, or minutes when the series is longer than MINUTES_AFTER_S."""
    return _axis_over(points[-1].ts - t0 if points else 0.0)


def _axis_over(seconds: float) -> tuple[float, str]:
    if seconds > MINUTES_AFTER_S:
        return 60.0, "minutes since the run began"
    return 1.0, "seconds since the run began"
