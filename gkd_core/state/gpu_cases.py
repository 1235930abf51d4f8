"""The reducer's cases of the GPUs: a GPU's reading (``gpu``), a node's readings of one sample (``gpus``), a
note about a node, a probe that hangs."""

from __future__ import annotations

import math

from gkd_core.state.records import GPU_FULL, UTIL_AVG_S, GpuRow, ProbeHang
from gkd_core.state.run_record import RunRecord
from gkd_core.state.series import mem_share
from gkd_core.telemetry import events as ev


def on_gpu(st: RunRecord, e: ev.GpuEvent) -> None:
    """A GPU's reading (its row, made or replaced), a note about its node, or a probe that hangs."""
    node = e.node or e.src
    key = f"{node}/{e.probe or 'nvml'}"
    if e.nvml_hung_s is not None:
        st.probe_hangs[key] = ProbeHang(node=node, probe=e.probe or "nvml", seconds=e.nvml_hung_s, at=e.ts,
                                          detail=e.error)
        return
    st.probe_hangs.pop(key, None)
    if e.index < 0:  # a note about the node (no driver, an NVML error), or one taken back
        if e.error:
            st.gpu_notes[node] = e.error
        else:
            st.gpu_notes.pop(node, None)
        return
    st.gpu_notes.pop(node, None)
    _reading(st, node, e.ts, e)


def on_gpus(st: RunRecord, e: ev.GpusEvent) -> None:
    """A node's readings of one sample, each a GPU's as a ``gpu`` event of its own would be, at the batch's node
    and time (its NVML answered: the node's hung probe and note are taken down as a ``gpu`` event's would be)."""
    node = e.node or e.src
    if e.readings:
        st.probe_hangs.pop(f"{node}/nvml", None)
        st.gpu_notes.pop(node, None)
    for r in e.readings:
        if r.index >= 0:  # (a sender's note in a batch is no GPU's)
            _reading(st, node, e.ts, r)


def _reading(st: RunRecord, node: str, ts: float, r: ev.GpuEvent | ev.GpuReading) -> None:
    """A GPU's reading at ``ts``: its row made or replaced, its minute's average, the plots' sums, the feed."""
    key = f"{node}/{r.index}"
    old = st.gpus.get(key)
    row = st.gpus[key] = GpuRow(
        node=node, index=r.index, uuid=r.uuid, util=r.util, mem_used=r.mem_used, mem_total=r.mem_total,
        temp=r.temp, power=r.power, pids=list(r.pids), proc_mem=dict(r.proc_mem), ts=ts, error=r.error,
    )
    full = bool(r.mem_used and r.mem_total and r.mem_used >= GPU_FULL * r.mem_total)
    if full and r.util is not None and r.util <= 0.0:
        row.full_idle_since = old.full_idle_since if old is not None and old.full_idle_since else ts
    # an average over time, whatever the sampling interval: the last reading held until this one (a node's
    # sampler sends a GPU's reading when it moves past a deadband, so the one before held till now)
    if r.util is not None:
        if old is None or old.util_avg is None:
            row.util_avg = r.util
        else:
            weight = min(1.0, max(0.0, ts - old.ts) / UTIL_AVG_S)
            avg = old.util_avg + weight * ((r.util if old.util is None else old.util) - old.util_avg)
            # a sender's absurd readings (+-1e308 in turn) overflow to inf, which a keyframe cannot hold
            row.util_avg = avg if math.isfinite(avg) else r.util
    was = None if old is None else (old.util, mem_share(old.mem_used, old.mem_total))
    st.series.note_gpu(key, ts, was, r.util, mem_share(r.mem_used, r.mem_total))
    st.touch_gpu(key)


def event_of(r: ev.GpuReading, node: str, ts: float, src: str = "") -> ev.GpuEvent:
    """A batch's reading as the ``gpu`` event it stands for (``node.gpu_deadband.reading_of`` the other way)."""
    return ev.GpuEvent(src=src, ts=ts, node=node, index=r.index, uuid=r.uuid, util=r.util, mem_used=r.mem_used,
                       mem_total=r.mem_total, temp=r.temp, power=r.power, pids=r.pids, proc_mem=r.proc_mem,
                       error=r.error)
