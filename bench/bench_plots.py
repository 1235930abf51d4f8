"""The plots view's widget: textual-plot (what the dashboard uses) against textual-plotext, side by
side in one run, drawing the same figures of a 300-step run. Prints a table.

    pip install textual-plotext   # the alternative; not a dependency of the dashboard
    python bench/bench_plots.py [--steps 300] [--frames 20] [--size 160x48] [--rounds 3]
    python bench/bench_plots.py --smoke   # for CI: 30 steps, 2 redraws, 80x24, one round

For each tab of the plots view (gkd_tui/figures.py: training, sync, step time, teacher, GPU), a
headless app lays its figures out the way the view does (one plot each, stacked) and redraws all of
them ``--frames`` times with new data (one more step each time); measured is the dashboard process's
CPU per redraw, from the data handed over to the screen composed (``pilot.pause()``). The rounds
alternate the two libraries; the table gives the median of the rounds' medians, with min and max.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.state import RunState  # noqa: E402
from gkd_core.telemetry import events as ev  # noqa: E402
from gkd_tui import figures  # noqa: E402


def run_state(steps: int) -> RunState:
    """A run of ``steps`` steps: metrics with a step's phases, a sync a step, the teacher's counts and
    8 GPUs, a second apart."""
    st = RunState(started=1000.0)
    for s in range(1, steps + 1):
        ts = 1000.0 + s
        st.apply(ev.MetricsEvent(src="driver", step=s, loss=2 * math.exp(-s / 80) + 0.05 * math.sin(s),
                                 kl=math.exp(-s / 60), agreement=1 - math.exp(-s / 100) if s % 10 == 0 else None,
                                 timing={"generate": 0.4 + 0.1 * math.sin(s / 7), "teacher": 0.2, "train": 0.3,
                                         "sync": 0.05 + 0.01 * (s % 5)}, ts=ts))
        st.apply(ev.SyncEvent(src="driver", sync_id=s, state="done", step=s, elapsed_s=0.05 + 0.01 * (s % 5),
                              timeout_s=60, ts=ts))
        st.apply(ev.TeacherEvent(src="driver", side="client", sent=6 * s, completed=6 * s,
                                 latency_ms={"p50": 30 + 5 * math.sin(s / 9), "p99": 60 + 10 * math.sin(s / 5)}, ts=ts))
        st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=6 * s, served=6 * s,
                                 queue_depth=s % 4, ts=ts))
        for i in range(8):
            st.apply(ev.GpuEvent(src="agent/n0", node="n0", index=i, util=50 + 40 * math.sin(s / 10 + i),
                                 mem_used=(40 + i) << 30, mem_total=80 << 30, ts=ts * 1.0 + 2 * (s % 2)))
    return st


def draw_plotext(widget, fig: figures.Figure, colour: str = "cyan") -> None:
    plt = widget.plt
    plt.clear_data()
    plt.clear_figure()
    for line in fig.lines:
        if not line.x:
            continue
        if line.kind == "points":
            plt.scatter(line.x, line.y, label=line.label, color=colour, marker="braille")
        else:
            plt.plot(line.x, line.y, label=line.label, color=colour, marker="braille")
    plt.title(fig.title)
    plt.xlabel(fig.xlabel)
    if fig.ylim[0] is not None and fig.ylim[1] is not None:
        plt.ylim(*fig.ylim)
    widget.refresh()


async def redraws(lib: str, tab: str, st: RunState, frames: int, size: tuple[int, int]) -> list[float]:
    """CPU seconds of each of ``frames`` redraws of ``tab``'s figures, a step more each time."""
    from textual.app import App
    from textual.containers import Vertical

    if lib == "textual-plot":
        from textual_plot import PlotWidget as Widget

        from gkd_tui.screens.plots import draw

        def paint(w, fig):
            draw(w, fig, lambda variable: "cyan")
    else:
        from textual_plotext import PlotextPlot as Widget
        paint = draw_plotext
    figs = figures.figures(tab, st)

    class Bench(App):
        CSS = "Widget { height: 1fr; }".replace("Widget", Widget.__name__)

        def compose(self):
            with Vertical():
                for _ in figs:
                    yield Widget()

    app = Bench()
    out = []
    metrics = list(st.metrics)
    async with app.run_test(size=size) as pilot:
        widgets = list(app.query(Widget))
        await pilot.pause()
        for i in range(frames + 1):
            st.metrics = metrics[: len(metrics) - frames + i]  # one step more each frame
            figs = figures.figures(tab, st)
            t0 = time.process_time()
            for w, fig in zip(widgets, figs, strict=False):
                paint(w, fig)
            await pilot.pause()
            if i:  # the first lays the canvases out
                out.append(time.process_time() - t0)
    st.metrics = metrics
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--size", default="160x48")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="30 steps, 2 redraws, 80x24, one round: for CI")
    a = p.parse_args()
    if a.smoke:
        a.steps, a.frames, a.size, a.rounds = 30, 2, "80x24", 1
    size = tuple(int(x) for x in a.size.split("x"))
    if records.other_half("textual_plotext", "textual-plot", "textual-plotext", "bench_plots"):
        libs: tuple[str, ...] = ("textual-plot", "textual-plotext")
    else:
        libs = ("textual-plot",)
    st = run_state(a.steps)
    per: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.rounds):
        for tab in figures.TABS:
            for lib in libs:
                times = asyncio.run(redraws(lib, tab, st, a.frames, size))
                per.setdefault((lib, tab), []).append(statistics.median(times))
    with records.kept("plots", smoke=a.smoke) as kept_run:
        print(f"CPU per redraw of a tab's figures, {a.steps} steps, {size[0]}x{size[1]}, median of {a.rounds} rounds "
              f"(min-max), each the median of {a.frames} redraws")
        print(f"{'tab':10s} {'plots':>5s} " + "".join(f"{lib:>26s}" for lib in libs)
              + ("   plotext/plot" if len(libs) > 1 else ""))
        for tab in figures.TABS:
            n = len(figures.figures(tab, st))
            cells = []
            for lib in libs:
                v = per[(lib, tab)]
                cells.append(f"{1000 * statistics.median(v):7.1f} ms ({1000 * min(v):.1f}-{1000 * max(v):.1f})")
            ratio = ""
            if len(libs) > 1:
                ratio = f"   {statistics.median(per[(libs[1], tab)]) / statistics.median(per[(libs[0], tab)]):.2f}x"
            print(f"{tab:10s} {n:5d} " + "".join(f"{c:>26s}" for c in cells) + ratio)
            kept_run.figure(f"{tab} tab: CPU per redraw with textual-plot",
                            1000 * statistics.median(per[(libs[0], tab)]), " ms")


if __name__ == "__main__":
    main()
