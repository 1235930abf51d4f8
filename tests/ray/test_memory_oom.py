"""Memory before the OOM killer and after it, on real processes in a real memory cgroup: a plain Ray job
under `gkd-tui launch --` inside a cgroup of 3 GiB, one actor growing 40 MB a second until the kernel's OOM
killer ends it (tests/jobs/ray_memory_grower.py).

The cgroup is made under this process's own memory cgroup (v1: ``memory.limit_in_bytes``; v2:
``memory.max``), which needs root. Where it cannot be made the test skips, saying why; CI sets
GKD_REQUIRE_CGROUP=1 (it runs as root), under which it fails instead.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import cgroups
import pytest
from conftest import logged_events, status_json, wait_until

from gkd_core import rundir
from gkd_core.units import size

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "ray_memory_grower.py"
LIMIT = 3 << 30
REQUIRE = "GKD_REQUIRE_CGROUP"
pytestmark = pytest.mark.slow


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """tests/cgroups.py's, skipped where none can be made, failed instead under GKD_REQUIRE_CGROUP=1 (CI: root)."""
    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(cgroups.memory_cgroup(limit))
        except cgroups.NoCgroup as e:
            if os.environ.get(REQUIRE) == "1":
                pytest.fail(f"{REQUIRE}=1 but no memory cgroup can be made here: {e}")
            pytest.skip(f"no memory cgroup can be made here ({e}); CI makes one, as root")
        yield path


def alerts(run: Path, code: str) -> list[dict]:
    return [e for e in logged_events(run) if e.get("kind") == "alert" and e["code"] == code]


def test_an_actor_growing_to_its_cgroups_limit_is_warned_before_the_oom_killer_and_named_oom_killed_after(gkd_home):
    with memory_cgroup(LIMIT) as cgroup:
        env = dict(os.environ, RAY_memory_monitor_refresh_ms="0")  # the kernel's OOM killer, not Ray's own
        env.pop("RAY_ADDRESS", None)
        # the launch (and all it starts: the supervisor, the job, its Ray) in the cgroup from its first line
        got = subprocess.run(["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", sys.executable,
                              "-m", "gkd_tui.cli", "launch", "--detach", "--linger", "5", "--", sys.executable,
                              str(JOB), "40"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        run = rundir.resolve_run(None)

        [killed] = wait_until(lambda: alerts(run, "oom_killed"), 300, "the grower named OOM-killed", every_s=1.0)
        assert killed["targets"] == ["Grower/0"], killed
        assert killed["message"].startswith("Grower/0 was killed by the OOM killer (cgroup "), killed["message"]
        assert " in grow" in killed["message"], killed["message"]

        state = wait_until(lambda: (status_json(run) or {}).get("state"), 30, "the run's state")
        grower = state["workers"]["Grower/0"]
        last_beat = grower["last_heartbeat"]
        # its memory at its last heartbeat, against its cgroup's limit: "... at 2.4 GB of 3.0 GB, in grow"
        assert killed["evidence"]["rss"] == grower["rss"] > 1 << 30, (killed, grower["rss"])
        assert f" at {size(grower['rss'])} of 3.0 GB, in grow" in killed["message"], killed["message"]
        growing = alerts(run, "memory_growing")
        assert growing, "no memory_growing alert before the kill"
        first = growing[0]
        assert first["targets"][0] == "Grower/0" and "Flat/0" not in first["targets"], first
        assert "the limit in about" in first["message"] and "of 3.0 GB" in first["message"]
        assert last_beat - first["ts"] >= 10, (last_beat - first["ts"], first)
        # nothing else was said to have been killed (the driver failed on the kill; the flat actor ended with it)
        assert {t for a in alerts(run, "oom_killed") for t in a["targets"]} == {"Grower/0"}
