"""The memory readers: cgroup v1 and v2 found from /proc's files and read up their trees (fixture files, as a
cluster's nodes have them), and this machine's own."""

from __future__ import annotations

import os

from gkd_core import memory

# a v2 host (a Slurm job's step under its job's cgroup), as /proc/self/cgroup and mountinfo say it
V2_CGROUP = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"
V2_MOUNTS = ("24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
             "rw,nsdelegate,memory_recursiveprot\n")
# a v1 host in a container whose memory cgroup is mounted at its own root
V1_CGROUP = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n"
V1_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
             "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
             "36 31 0:33 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
MEMINFO = "MemTotal:       16384000 kB\nMemFree:          100000 kB\nMemAvailable:    4096000 kB\n"


def reader(files: dict[str, str]):
    return files.get


def test_v2_the_nearest_finite_limit_up_the_tree_with_its_use_and_oom_kills():
    cg = memory.find_cgroup(V2_CGROUP, V2_MOUNTS)
    assert cg == memory.Cgroup(2, "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/user/task_0",
                               "/sys/fs/cgroup")
    job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42"
    files = {f"{cg.dir}/memory.max": "max\n", f"{os.path.dirname(cg.dir)}/memory.max": "max\n",
             f"{job}/step_0/memory.max": "max\n", f"{job}/memory.max": "3221225472\n",
             f"{job}/memory.current": "2254857830\n",
             f"{job}/memory.events": "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"}
    assert memory.cgroup_limit(cg, reader(files)) == memory.Limit(job, 3221225472, 2254857830, 1)
    # none finite up to the root: no cgroup limit (the node's, from the probe)
    files[f"{job}/memory.max"] = "max\n"
    assert memory.cgroup_limit(cg, reader(files)) is None


def test_v1_in_a_container_its_own_cgroup_at_the_mounts_root():
    cg = memory.find_cgroup(V1_CGROUP, V1_MOUNTS)
    assert cg == memory.Cgroup(1, "/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory")
    files = {"/sys/fs/cgroup/memory/memory.limit_in_bytes": "3221225472\n",
             "/sys/fs/cgroup/memory/memory.usage_in_bytes": "1073741824\n",
             "/sys/fs/cgroup/memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"}
    assert memory.cgroup_limit(cg, reader(files)) == memory.Limit("/sys/fs/cgroup/memory", 3221225472, 1073741824, 2)
    # v1's "no limit" is a number: PAGE_COUNTER_MAX
    files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712\n"
    assert memory.cgroup_limit(cg, reader(files)) is None


def test_a_v1_memory_controller_wins_on_a_hybrid_host_and_no_memory_cgroup_is_none():
    hybrid = memory.find_cgroup("4:memory:/a\n0::/b\n", V1_MOUNTS.replace("/docker/abc", "/") +
                                "40 31 0:40 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    assert hybrid is not None and hybrid.version == 1 and hybrid.dir == "/sys/fs/cgroup/memory/a"
    assert memory.find_cgroup("0::/b\n", "31 23 0:28 / /proc rw - proc proc rw\n") is None


def test_the_probe_says_the_cgroup_or_else_the_node_and_a_limit_past_the_node_is_the_nodes():
    files = {"/proc/self/cgroup": V2_CGROUP, "/proc/self/mountinfo": V2_MOUNTS, "/proc/meminfo": MEMINFO}
    job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42"
    files.update({f"{job}/memory.max": "3221225472", f"{job}/memory.current": "1000",
                  f"{job}/memory.events": "oom_kill 0"})
    limit, available = memory.MemoryProbe(read=reader(files)).sample()
    assert limit == memory.Limit(job, 3221225472, 1000, 0) and available == 4096000 * 1024
    files[f"{job}/memory.max"] = str(1 << 40)  # 1 TiB on a 16 GB node: the node limits it
    files["/proc/vmstat"] = "pgfault 10\noom_kill 3\n"
    limit, _ = memory.MemoryProbe(read=reader(files)).sample()
    assert limit == memory.Limit("node", 16384000 * 1024, (16384000 - 4096000) * 1024, 3)
    assert memory.oom_kills("node", reader(files)) == 3 and memory.oom_kills(job, reader(files)) == 0
    # nothing readable: unknown, never an error
    assert memory.MemoryProbe(read=reader({})).sample() == (None, 0)


def test_this_machines_own_memory_reads():
    limit, available = memory.MemoryProbe().sample()
    assert limit is not None and 0 < limit.used <= limit.limit and available > 0
