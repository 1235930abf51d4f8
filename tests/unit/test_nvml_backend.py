"""The NVML backend's reading of the GPU memory each process holds, through a stand-in for
nvidia-ml-py (no GPU here), and that reading's way to the dashboard: the sampler's child encodes
it, the sampler and the supervisor decode it."""

from __future__ import annotations

import sys
import types

import msgspec

from gkd_core.node.gpu_backends import NvmlBackend
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire

GIB = 1 << 30
NOT_AVAILABLE = (1 << 64) - 1  # NVML's "not available", as bindings older than nvidia-ml-py 12 passed it on


class NVMLError(Exception):
    pass


def fake_pynvml(processes: dict[int, list | Exception]) -> types.ModuleType:
    """nvidia-ml-py as the backend calls it: one GPU a key of ``processes``, with its process list
    (or what listing them raises: not supported on that board)."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (NVMLError,), {})
    nv.NVMLError_DriverNotLoaded = type("NVMLError_DriverNotLoaded", (NVMLError,), {})
    nv.NVML_TEMPERATURE_GPU = 0
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(processes)
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-test-{h}".encode()
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=10 * GIB, total=80 * GIB)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=42)
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 61
    nv.nvmlDeviceGetPowerUsage = lambda h: 301_500  # milliwatts

    def running(h):
        listed = processes[h]
        if isinstance(listed, Exception):
            raise listed
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    nv.nvmlDeviceGetComputeRunningProcesses = running
    return nv


def read_with(monkeypatch, processes) -> list[ev.GpuEvent]:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(processes))
    backend = NvmlBackend()
    backend.open()
    return backend.read()


def test_each_process_memory_is_read_and_one_without_a_figure_is_left_out(monkeypatch):
    gpu0, gpu1 = read_with(monkeypatch, {
        0: [(4121, 3 * GIB), (4122, None), (4123, NOT_AVAILABLE), (4121, GIB)],  # 4121 twice: the sum
        1: NVMLError("NVML_ERROR_NOT_SUPPORTED"),
    })
    assert (gpu0.uuid, gpu0.util, gpu0.temp, gpu0.power) == ("GPU-test-0", 42.0, 61.0, 301.5)
    assert gpu0.pids == [4121, 4122, 4123]  # every process is listed, with a figure or without
    assert gpu0.proc_mem == {"4121": 4 * GIB}
    assert (gpu1.pids, gpu1.proc_mem) == ([], {})  # a board that cannot list them: no processes, no error


def test_the_process_memory_survives_the_way_to_the_dashboard(monkeypatch):
    [reading] = read_with(monkeypatch, {0: [(7, 2 * GIB), (8, 0)]})
    reading.node = "gpu-node"
    assert reading.proc_mem == {"7": 2 * GIB, "8": 0}
    # the sampler's child writes it as builtins in JSON, the sampler converts the decoded dict back
    line = msgspec.json.encode(msgspec.to_builtins(reading))
    assert msgspec.convert(msgspec.json.decode(line), ev.GpuEvent) == reading
    # the supervisor's fast path and its slow one (a dict kept whole, then converted)
    assert wire.decode(wire.encode(reading)) == reading
    obj, typed = wire.decode_dict(wire.encode(reading))
    assert typed == reading and wire.validate_dict(obj) == reading
