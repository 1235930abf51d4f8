"""Where GPU readings come from: NVML (nvidia-ml-py), or a test backend behind the same interface.

Both run inside the sampler's child process (``gpu_child``), never in the agent itself: an NVML
call on a wedged driver can block forever in the kernel, and only a process can be left behind.
A backend is named by a string, so the child builds its own and nothing is pickled across.

    nvml                                  the real one
    fake:gpus=2,hang_at=3,error_at=5      readings made up; the third sample never returns,
                                          the fifth raises; no_driver=1 is a node without GPUs
"""

from __future__ import annotations

import logging
import math
import time

from gkd_core.errors import GkdError
from gkd_core.telemetry.events import GpuEvent as GpuReading  # a reading is the event, less its node

log = logging.getLogger(__name__)  # what a broad except let go, said at debug level


class NoDriver(GkdError):
    """No NVIDIA driver on this node: a state to show, not an error."""


class NvmlBackend:
    """The real readings, through nvidia-ml-py."""

    def open(self) -> None:
        import pynvml

        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            if isinstance(e, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded)):
                raise NoDriver(f"no NVIDIA driver on this node ({e})") from e
            raise

    def read(self) -> list[GpuReading]:
        nv, out = self.nv, []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            r = GpuReading(index=i, uuid=_str(nv.nvmlDeviceGetUUID(h)), mem_used=int(mem.used),
                           mem_total=int(mem.total))
            r.util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            r.temp = _optional(lambda h=h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
            r.power = _optional(lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)  # milliwatts
            procs = _optional(lambda h=h: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []
            r.pids = sorted({int(p.pid) for p in procs})
            r.proc_mem = process_memory(procs)
            out.append(r)
        return out


# NVML's "not available" is all ones in 64 bits: nvidia-ml-py makes it None, and should a binding pass it on
# raw, no figure at or past 2**63 is real (and the event's integers must fit in 64 signed bits)
_NO_FIGURE = 1 << 63


def process_memory(procs) -> dict[str, int]:
    """The GPU memory each process holds, in bytes, by pid (as text); a process without a figure is left
    out (None, or NVML's "not available")."""
    held: dict[str, int] = {}
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        if used is None or not 0 <= int(used) < _NO_FIGURE:
            continue
        # a pid listed more than once (a context on each of several MIG compute instances) holds the sum
        pid = str(int(p.pid))
        held[pid] = held.get(pid, 0) + int(used)
    return held


class FakeBackend:
    """Readings made up from the sample number; a hang or an error on the sample asked for."""

    def __init__(self, gpus: int = 2, hang_at: int = 0, error_at: int = 0, no_driver: int = 0):
        self.gpus, self.hang_at, self.error_at, self.no_driver = gpus, hang_at, error_at, no_driver
        self.n = 0

    def open(self) -> None:
        if self.no_driver:
            raise NoDriver("no NVIDIA driver on this node (test backend)")

    def read(self) -> list[GpuReading]:
        self.n += 1
        if self.n == self.hang_at:
            while True:  # a call that never returns, as on a wedged driver
                time.sleep(3600)
        if self.n == self.error_at:
            raise RuntimeError("NVML_ERROR_UNKNOWN (test backend)")
        return [GpuReading(index=i, uuid=f"GPU-fake-{i}", util=50 + 40 * math.sin(self.n + i),
                           mem_used=(20 + i) << 30, mem_total=80 << 30, temp=60.0 + i, power=300.0 + 10 * i)
                for i in range(self.gpus)]


def backend_from_spec(spec: str):
    """``nvml``, or ``fake:key=int,...`` (see the module's docstring)."""
    name, _, args = spec.partition(":")
    if name == "nvml":
        return NvmlBackend()
    if name == "fake":
        kwargs = {}
        for item in filter(None, args.split(",")):
            key, _, value = item.partition("=")
            kwargs[key.strip()] = int(value)
        try:
            return FakeBackend(**kwargs)
        except TypeError as e:
            raise ValueError(f"GPU backend '{spec}': {e}; keys are gpus, hang_at, error_at, no_driver") from None
    raise ValueError(f"GPU backend '{spec}': unknown; use 'nvml' or 'fake:gpus=2,hang_at=3'")


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _optional(fn):
    """Some readings are not supported on some boards (power on a few, processes in MIG)."""
    try:
        return fn()
    except Exception as e:  # NVMLError_NotSupported mostly; whatever it is, one reading is not the sample's end
        log.debug("an optional NVML reading failed: %s", e)
        return None
