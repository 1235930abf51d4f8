"""What the plots draw: the state's series (syncs, teacher, GPUs) and the figures made of them."""

import pytest

from gkd_core.state import RunState, decode_state, encode_state
from gkd_core.state.series import GPU_DEVICES_DRAWN, SERIES_KEEP
from gkd_core.telemetry import events as ev
from gkd_tui import figures


def gpu(node, index, util, used, ts, total=100):
    return ev.GpuEvent(src=f"agent/{node}", node=node, index=index, util=util, mem_used=used, mem_total=total, ts=ts)


def test_each_finished_sync_is_a_point_once_with_its_step_time_and_timeout():
    st = RunState()
    for i, (state, elapsed) in enumerate([("done", 0.2), ("done", 0.4), ("timed_out", 60.0)], 1):
        st.apply(ev.SyncEvent(src="driver", sync_id=i, state="started", step=i, timeout_s=60, ts=100.0 * i))
        st.apply(ev.SyncEvent(src="driver", sync_id=i, state="progress", step=i, elapsed_s=elapsed / 2,
                              ts=100.0 * i + 1))
        st.apply(ev.SyncEvent(src="driver", sync_id=i, state=state, step=i, elapsed_s=elapsed, ts=100.0 * i + 2))
    assert [(p.sync_id, p.step, p.elapsed_s, p.timeout_s, p.state) for p in st.series.syncs] == [
        (1, 1, 0.2, 60, "done"), (2, 2, 0.4, 60, "done"), (3, 3, 60.0, 60, "timed_out")]
    against, to_scale = figures.syncs(st.series.syncs)
    assert against.lines[-1].label == "timeout 1m00s" and against.lines[-1].y == (60.0, 60.0)
    assert against.ylim == (0.0, 63.0)
    assert "the longest 1m00s, 100.0 % of 1m00s" in against.title
    failed = next(line for line in against.lines if line.label == "failed")
    assert failed.x == (3.0,) and failed.kind == "points"
    assert to_scale.lines[0].y == (0.2, 0.4, 60.0) and to_scale.ylim == (0.0, None)


def test_a_sync_still_open_is_not_a_point_and_one_superseded_is():
    st = RunState()
    st.apply(ev.SyncEvent(src="driver", sync_id=1, state="started", timeout_s=60, ts=10.0))
    assert st.series.syncs == []
    st.apply(ev.SyncEvent(src="driver", sync_id=2, state="started", timeout_s=60, ts=12.0))
    assert [p.sync_id for p in st.series.syncs] == [1]


def test_gpu_series_keep_a_line_for_the_first_devices_and_a_mean_over_all_of_them():
    st = RunState()
    n = GPU_DEVICES_DRAWN + 4
    for t in range(3):  # three rounds of readings, 2 s apart
        for i in range(n):
            st.apply(gpu(f"n{i // 8}", i % 8, util=10.0 * t + i, used=50, ts=100.0 + 2 * t))
    s = st.series
    assert len(s.gpus) == GPU_DEVICES_DRAWN
    assert [p.util for p in s.gpus["n0/0"]] == [0.0, 10.0, 20.0]
    mean_now = sum(20.0 + i for i in range(n)) / n
    assert [round(p.util, 6) for p in s.gpu_mean] == [round(sum(range(n)) / n, 6), round(mean_now - 10, 6),
                                                       round(mean_now, 6)]
    assert all(p.mem == 0.5 for p in s.gpu_mean)
    util, memory = figures.gpus(s.gpus, s.gpu_mean, t0=100.0)
    assert len(util.lines) == GPU_DEVICES_DRAWN + 1 and util.lines[-1].label == "mean of every GPU"
    assert util.lines[-1].x == (0.0, 2.0, 4.0) and memory.lines[-1].y == (50.0, 50.0, 50.0)
    assert util.title == f"GPU utilisation: {mean_now:.0f} % on average now"


def test_absurd_gpu_readings_keep_the_state_finite_and_round_trip():
    st = RunState()
    st.apply(gpu("n", 0, util=1e308, used=1 << 62, total=1, ts=1.0))
    st.apply(gpu("n", 1, util=1e308, used=5, ts=1.5))
    st.apply(gpu("n", 0, util=-1e308, used=0, ts=4.0))
    assert [p.util for p in st.series.gpu_mean] == [100.0, 50.0]
    assert decode_state(encode_state(st)) == st


def test_the_teacher_point_is_the_slowest_clients_latency_and_the_servers_queue_once_a_second():
    st = RunState()
    st.apply(ev.TeacherEvent(src="rollout/0", side="client", sent=5, completed=4, in_flight=1,
                             latency_ms={"p50": 3.0, "p99": 9.0}, ts=10.0))
    st.apply(ev.TeacherEvent(src="rollout/1", side="client", sent=5, completed=3, in_flight=2,
                             latency_ms={"p50": 4.0, "p99": 7.0}, ts=10.2))  # within the second: no point
    st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=9, served=7, queue_depth=2, ts=11.0))
    pts = st.series.teacher
    assert [(p.ts, p.p50_ms, p.p99_ms, p.queue, p.in_flight) for p in pts] == [
        (10.0, 3.0, 9.0, 0, 1), (11.0, 4.0, 9.0, 2, 3)]
    latency, queue = figures.teacher(pts, t0=10.0)
    assert latency.title.endswith("p50 4.0 ms, p99 9.0 ms")
    assert queue.lines[0].y == (0.0, 2.0) and queue.lines[1].y == (1.0, 3.0)


def test_series_are_bounded():
    st = RunState()
    for i in range(SERIES_KEEP + 10):
        st.apply(ev.SyncEvent(src="driver", sync_id=i, state="done", elapsed_s=0.1, ts=float(i)))
        st.apply(gpu("n", 0, util=1.0, used=1, ts=3.0 * i))
    assert len(st.series.syncs) == SERIES_KEEP and st.series.syncs[0].sync_id == 10
    assert len(st.series.gpus["n/0"]) == SERIES_KEEP and len(st.series.gpu_mean) == SERIES_KEEP


def test_step_time_stacks_the_phases_in_the_order_they_happen():
    ms = [ev.MetricsEvent(src="driver", step=s, timing={"train": 0.3, "generate": 0.1, "sync": 0.05, "teacher": 0.2},
                          ts=float(s)) for s in (1, 2)]
    st = RunState()
    for m in ms:
        st.apply(m)
    fig = figures.step_time(st.metrics)
    # the legend lists them top down, as they stack
    assert [line.label for line in fig.lines] == ["sync", "train", "teacher", "generate"]
    assert [line.y for line in fig.lines] == [pytest.approx((0.65, 0.65)), pytest.approx((0.6, 0.6)),
                                              pytest.approx((0.3, 0.3)), (0.1, 0.1)]
    assert fig.title.endswith("step 2 took 650 ms")


def test_training_figures_skip_steps_without_the_value_and_say_the_last():
    st = RunState()
    st.apply(ev.MetricsEvent(src="driver", step=1, loss=2.0, kl=1.0, agreement=0.1, ts=1.0))
    st.apply(ev.MetricsEvent(src="driver", step=2, loss=1.5, kl=0.8, ts=2.0))
    st.apply(ev.MetricsEvent(src="driver", step=3, loss=float("nan"), kl=1e308, agreement=0.4, ts=3.0))
    loss, kl, agreement = figures.training(st.metrics)
    assert loss.lines[0].x == (1.0, 2.0)  # a NaN is not drawn
    assert kl.lines[0].y == (1.0, 0.8, figures.LIMIT)  # nor an axis made infinite
    assert agreement.lines[0].x == (1.0, 3.0) and agreement.lines[0].kind == "points"
    assert agreement.title.endswith("0.4 at step 3") and agreement.ylim == (0.0, figures.AGREEMENT_TOP)


@pytest.mark.parametrize("tab", figures.TABS)
def test_every_tab_of_an_empty_run_says_why_it_has_nothing(tab):
    figs = figures.figures(tab, RunState())
    assert figs and all(not f.drawn and f.empty for f in figs)


def test_an_unknown_tab_is_an_error_naming_the_tabs():
    with pytest.raises(ValueError, match="training, sync, step time, teacher, GPU"):
        figures.figures("nope", RunState())


def test_an_axis_is_never_narrower_than_a_plotting_library_can_divide_by():
    """One step, a flat line, two subnormal values: the span would be 0 (textual-plot takes its log)."""
    def fig(xs, ys, ylim=(None, None)):
        return figures.Figure("t", "x", "y", (figures.Line("a", tuple(xs), tuple(ys), "series-kl"),), ylim)

    assert fig([1, 2], [5e-324, 0.0], (0.0, None)).limits() == ((1.0, 2.0), (0.0, 0.2))
    assert fig([7], [3.0]).limits() == ((6.3, 7.7), (2.7, 3.3))
    assert fig([1, 2], [-1e15, 1e15]).limits() == ((1.0, 2.0), (-1e15, 1e15))
    assert fig([], []).limits() == ((0.0, 1.0), (0.0, 1.0))
    assert fig([1, 2], [0.5, 0.7], (0.0, 1.0)).limits() == ((1.0, 2.0), (0.0, 1.0))


def test_a_resumed_run_is_drawn_a_point_per_step_and_absurd_timeouts_keep_the_axes_finite():
    st = RunState()
    for step in (1, 2, 3, 4, 2, 3):  # killed after 4, resumed from the checkpoint of 1: 2 and 3 trained again
        st.apply(ev.MetricsEvent(src="driver", step=step, loss=float(step), timing={"train": 0.1}, ts=float(step)))
    loss = figures.training(st.metrics)[0]
    assert loss.lines[0].x == (1.0, 2.0, 3.0, 4.0)
    assert figures.step_time(st.metrics).lines[0].x == (1.0, 2.0, 3.0, 4.0)
    st.apply(ev.SyncEvent(src="driver", sync_id=1, state="done", step=1, elapsed_s=0.1, timeout_s=1.7e308, ts=5.0))
    st.apply(ev.SyncEvent(src="driver", sync_id=2, state="started", step=2, timeout_s=60, ts=6.0))
    st.apply(ev.SyncEvent(src="driver", sync_id=3, state="started", step=3, timeout_s=60, ts=7.0))  # cut 2 short
    against, _ = figures.syncs(st.series.syncs)
    (x0, x1), (y0, y1) = against.limits()
    assert all(abs(v) <= figures.LIMIT for v in (x0, x1, y0, y1))
    assert [line.label for line in against.lines if line.label == "failed"] == []  # cut short is not failed
    for step, sync_id in ((4, 4), (5, 5), (6, 6), (3, 3), (4, 4)):  # killed after 6, resumed from 2's checkpoint
        st.apply(ev.SyncEvent(src="driver", sync_id=sync_id, state="done", step=step, elapsed_s=step / 10,
                              timeout_s=60, ts=10.0 + step))
    against, scaled = figures.syncs(st.series.syncs)
    assert scaled.lines[0].x == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert against.lines[-1].label.startswith("timeout") and against.lines[-1].x == (1.0, 6.0)  # the whole run


def test_a_sender_clock_that_went_back_does_not_stop_a_series():
    st = RunState()
    st.apply(gpu("n", 0, util=10.0, used=1, ts=1e12))  # one reading from the far future
    st.apply(gpu("n", 0, util=20.0, used=1, ts=100.0))
    st.apply(gpu("n", 0, util=30.0, used=1, ts=103.0))
    assert [p.util for p in st.series.gpus["n/0"]] == [10.0, 20.0, 30.0]


def test_senders_whose_clocks_differ_by_seconds_take_a_teacher_point_a_second_not_one_each():
    st = RunState()
    for k in range(10):  # two clients, 1.5 s apart in their clocks, 20 events in one second
        st.apply(ev.TeacherEvent(src="rollout/0", side="client", sent=k, ts=100.0 + 0.1 * k))
        st.apply(ev.TeacherEvent(src="rollout/1", side="client", sent=k, ts=98.5 + 0.1 * k))
    assert [p.ts for p in st.series.teacher] == [100.0]
    st.apply(ev.TeacherEvent(src="rollout/0", side="client", sent=10, ts=101.0))  # a second on: the next point
    assert [p.ts for p in st.series.teacher] == [100.0, 101.0]


def test_the_memory_plot_draws_the_largest_processes_phase_peaks_against_their_limits():
    gb, mb, t0 = 1 << 30, 1 << 20, 1000.0
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=t0))
    for i, src in enumerate(("Grower/0", "Flat/0", "Gone/0")):
        st.apply(ev.WorkerEvent(src=src, role=src[:-2], rank=0, node="n0", pid=10 + i, ts=t0))
    for i in range(1, 5):  # the grower's phases, each peaking higher
        st.apply(ev.PhaseEvent(src="Grower/0", phase=("step", "sync_weights")[i % 2], started=t0 + 5 * i,
                               ts=t0 + 5 * i, peak_rss=i * 500 * mb))
    cg = ev.MemoryBeat("/sys/fs/cgroup/memory/job_42", 2 * gb, 3 * gb, 8 * gb, 0)
    st.apply(ev.HeartbeatEvent(src="Grower/0", ts=t0 + 22, phase="step", rss=2 * gb + 512 * mb, cpu=90.0, mem=cg))
    st.apply(ev.HeartbeatEvent(src="Flat/0", ts=t0 + 22, phase="run", rss=gb, cpu=9.0,
                               mem=ev.MemoryBeat("node", 6 * gb, 16 * gb, 10 * gb, 0)))
    st.apply(ev.HeartbeatEvent(src="Gone/0", ts=t0 + 2, phase="run", rss=4 * gb, cpu=9.0))
    st.apply(ev.PhaseEvent(src="Gone/0", phase="exited", ts=t0 + 3))
    (fig,) = figures.figures("memory", st)
    assert fig.title.endswith("; Grower/0 2.50 GB now of 3.0")
    grower, flat, *limits = fig.lines
    assert grower.label == "Grower/0 (step)" and grower.y == (0.48828125, 0.9765625, 1.46484375, 1.953125, 2.5)
    assert grower.x == (5.0, 10.0, 15.0, 20.0, 22.0)
    assert flat.label == "Flat/0 (init)" and flat.y == (1.0,)  # no phase said its peak: its newest reading only
    assert [(line.label, line.y) for line in limits] == [("limit: cgroup job_42", (3.0, 3.0)),
                                                        ("limit: the node's memory", (16.0, 16.0))]
