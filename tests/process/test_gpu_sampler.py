"""The GPU sampler: readings through a child process, a hung call flagged within its deadline."""

from __future__ import annotations

import threading
import time

from conftest import nvml_library_loads

from gkd_core.node.gpu_sampler import GpuSampler
from gkd_core.state import RunState
from gkd_core.state.gpu_cases import event_of
from gkd_core.telemetry import events as ev


class Recorder:
    def __init__(self):
        self.events: list[tuple[float, ev.Event]] = []
        self.lock = threading.Lock()

    def __call__(self, e: ev.Event) -> None:
        e.ts = e.ts or time.time()  # as the Reporter does
        with self.lock:
            self.events.append((time.monotonic(), e))

    def gpu(self):
        """Every GPU's reading and every note, as ``gpu`` events: a node's batch's readings at its node and time."""
        with self.lock:
            events = list(self.events)
        return [(t, g) for t, e in events for g in ([e] if isinstance(e, ev.GpuEvent) else
                                                    [event_of(r, e.node, e.ts) for r in e.readings]
                                                    if isinstance(e, ev.GpusEvent) else [])]

    def wait_for(self, pred, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hits = [(t, e) for t, e in self.gpu() if pred(e)]
            if hits:
                return hits
            time.sleep(0.05)
        raise AssertionError(f"no such gpu event within {timeout_s} s; got {[e for _, e in self.gpu()][-5:]}")


def test_a_hang_on_the_third_sample_is_flagged_within_the_deadline_and_the_parent_goes_on():
    rec = Recorder()
    deadline_s, interval_s = 3.0, 0.5
    s = GpuSampler("n0", rec, backend="fake:gpus=2,hang_at=3", interval_s=interval_s, deadline_s=deadline_s,
                   smi=None, full_every_s=0).start()  # (every reading sent: their times are measured)
    try:
        rec.wait_for(lambda e: e.index == 1 and e.util is not None, 10)
        deadline = time.monotonic() + 5
        while len(seconds := [t for t, e in rec.gpu() if e.index == 1]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        t_second = seconds[1]  # the third request goes out one interval after the second answer
        hung = rec.wait_for(lambda e: e.nvml_hung_s is not None, deadline_s + interval_s + 3)
        t_hung, first = hung[0]
        assert t_hung - (t_second + interval_s) <= deadline_s + 1.0
        assert first.nvml_hung_s >= deadline_s and "has not returned" in first.error
        # growing, reported while it lasts (every half second; a busy 2-core machine's scheduling can hold the
        # sampler's loop a second, so it gets the time for three reports and must have sent one)
        time.sleep(3.2)
        latest = [e for _, e in rec.gpu() if e.nvml_hung_s is not None]
        assert latest[-1].nvml_hung_s > first.nvml_hung_s + 1.5
        assert s.samples == 2 and s.child is not None and s.child.poll() is None  # never respawned
    finally:
        t0 = time.monotonic()
        s.stop()
        assert time.monotonic() - t0 < 2.5  # the parent never blocks on the hung child
    st = RunState()
    for _, e in rec.events:
        st.apply(e)
    node, probe, seconds = st.hung_probes(time.time() + 10)[0]
    assert (node, probe) == ("n0", "nvml") and 13 < seconds < 20  # what was reported, plus the time since


def test_no_driver_is_a_state_not_an_error():
    rec = Recorder()
    s = GpuSampler("cpu-node", rec, backend="fake:no_driver=1", interval_s=0.2, smi=None).start()
    try:
        note = rec.wait_for(lambda e: e.index == -1, 10)[0][1]
    finally:
        s.stop()
    assert "no NVIDIA driver on this node" in note.error and s.no_driver
    st = RunState()
    st.apply(note)
    assert st.gpu_notes == {"cpu-node": note.error} and st.gpu_rows() == []


def test_the_real_nvml_backend_reads_the_gpus_or_says_exactly_why_not():
    rec = Recorder()
    s = GpuSampler("here", rec, backend="nvml", interval_s=0.2, smi=None).start()
    try:
        first = rec.wait_for(lambda e: True, 15)[0][1]
        time.sleep(1.0)  # a few more periods: a machine without a driver gets the note once, nothing else
        said = [e for _, e in rec.gpu()]
    finally:
        s.stop()
    if nvml_library_loads():  # a GPU machine: a reading of a real device
        assert first.index >= 0 and first.mem_total > 0 and not first.error, first
    else:
        assert (first.index, first.error) == (-1, "no NVIDIA driver on this node (NVML Shared Library Not Found)")
        assert said == [first]


def test_an_nvml_error_is_reported_and_sampling_goes_on():
    rec = Recorder()
    s = GpuSampler("n0", rec, backend="fake:gpus=1,error_at=2", interval_s=0.2, smi=None).start()
    try:
        err = rec.wait_for(lambda e: e.index == -1, 10)[0][1]
        rec.wait_for(lambda e: e.index == 0 and e.ts > err.ts, 10)
    finally:
        s.stop()
    assert "NVML error" in err.error


def test_a_frozen_nvidia_smi_is_flagged_and_not_retried(tmp_path):
    fake_smi = tmp_path / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\nexec sleep 60\n")
    fake_smi.chmod(0o755)
    rec = Recorder()
    s = GpuSampler("n0", rec, backend="fake:gpus=1", interval_s=0.5, smi=str(fake_smi), smi_timeout_s=1.0,
                   smi_every_s=0.5).start()
    try:
        hung = rec.wait_for(lambda e: e.probe == "nvidia-smi" and e.nvml_hung_s is not None, 5)[0][1]
        # killed (it was only sleep) and reported: the next probe clears the banner
        rec.wait_for(lambda e: e.probe == "nvidia-smi" and e.nvml_hung_s is None, 5)
    finally:
        s.stop()
    assert hung.nvml_hung_s >= 1.0 and "nvidia-smi has not exited" in hung.error
