"""Nothing of ours listens on every interface: ``ss -ltnp`` during a default run."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest
from conftest import wait_until

pytestmark = pytest.mark.slow
TRAINER = "gkd_core.trainer.driver"


def listeners() -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket, from ``ss -ltnpH``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=True).stdout
    found = []
    for line in out.splitlines():
        cols = line.split()
        local, procs = cols[3], " ".join(cols[5:])
        address, _, port = local.rpartition(":")
        for part in procs.split("pid=")[1:]:
            found.append((address.strip("[]"), int(port), int(part.split(",")[0])))
    return found


def on_every_interface(address: str) -> bool:
    if address in ("*", ""):
        return True
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_unspecified
    except ValueError:
        return False


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is not installed")
def test_a_default_run_binds_nothing_of_ours_on_every_interface(start_supervisor):
    sup = start_supervisor("trainer.total_steps=400", driver=TRAINER)
    wait_until(lambda: any(e["kind"] == "metrics" and e["step"] >= 2 for e in sup.events()), 180,
               "two training steps")
    ours = {e["pid"]: e["src"] for e in sup.events() if e["kind"] == "worker" and e.get("pid")}
    ours[sup.proc.pid] = "supervisor"
    ours[sup.wait_driver()] = "driver"
    assert {"student/0", "rollout/0", "teacher/proxy"} <= set(ours.values())

    seen = listeners()
    by_pid: dict[int, list[tuple[str, int]]] = {}
    for address, port, pid in seen:
        by_pid.setdefault(pid, []).append((address, port))
    # the supervisor speaks only over its private ipc sockets
    assert sup.proc.pid not in by_pid, by_pid.get(sup.proc.pid)
    for pid, src in ours.items():
        wide = [(a, p) for a, p in by_pid.get(pid, []) if on_every_interface(a)]
        # Ray 2.60 serves each of its processes' core-worker gRPC on every interface (token
        # authenticated): one such listener per Ray process is Ray's; a second one is ours (torch's
        # TCPStore served every interface before the group met at a private file)
        allowed = 0 if src == "supervisor" else 1
        assert len(wide) <= allowed, f"{src} (pid {pid}) listens on every interface: {wide}"
    teacher = [pid for pid, src in ours.items() if src == "teacher/proxy"]
    assert any(not on_every_interface(a) for pid in teacher for a, _ in by_pid.get(pid, [])), \
        "the teacher proxy listens on its bind_host (loopback)"
