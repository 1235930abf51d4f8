"""``gkd-tui doctor``: the preflight the seeds' users ran by hand, one line per check.

Each check says pass, warn or fail, what it saw, and for anything but a pass a one-line fix.
Nothing here waits without a deadline: the GPU check runs NVML in the sampler's child process
(a wedged driver cannot freeze the doctor), Ray is looked for without connecting to it, and the
teacher address gets a two-second connect. The whole run takes a few seconds (torch's import is
most of it).
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from gkd_core import config as config_mod
from gkd_core.node.stacks import py_spy_path

NVML_DEADLINE_S = 3.0

# what each variable does, and when a value is a trap (value -> why)
ENV_DOCS = {
    "CUDA_VISIBLE_DEVICES": ("which GPUs this process (and Ray, unless it overrides) may use", {"": "hides every GPU"}),
    "NCCL_DEBUG": ("NCCL's own logging; WARN or INFO names the peer and the op when a collective fails", {}),
    "NCCL_SOCKET_IFNAME": ("the network interface NCCL uses; a wrong one makes the first collective hang", {}),
    "NCCL_IB_DISABLE": ("1 turns InfiniBand off (falls back to sockets: slow, but rules IB out)", {}),
    "NCCL_P2P_DISABLE": ("1 turns GPU peer-to-peer off (a known fix for hangs on some PCIe boards)", {}),
    "NCCL_TIMEOUT": ("not read by NCCL itself; torch's timeout is the process group's `timeout=`", {}),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1 or 3: a timed-out collective raises instead of hanging forever",
                                        {"0": "a timed-out NCCL collective hangs instead of raising"}),
    "TORCH_NCCL_BLOCKING_WAIT": ("1: wait() blocks and raises on timeout (the older way to get timeouts)", {}),
    "TORCH_NCCL_ENABLE_MONITORING": ("the watchdog that kills a process stuck in a collective",
                                     {"0": "a stuck collective is never reported by torch's watchdog"}),
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": ("how long the watchdog waits before it aborts a stuck process", {}),
    "TORCH_NCCL_TRACE_BUFFER_SIZE": ("> 0 records recent collectives for a flight-recorder dump on timeout", {}),
    "CUDA_LAUNCH_BLOCKING": ("1 makes every kernel launch synchronous: errors point at the right line, "
                             "but everything is slower", {"1": "every CUDA launch is synchronous (slow)"}),
    "RAY_ADDRESS": ("the Ray cluster `ray.init()` joins; unset, the run starts a local one", {}),
}


class Check(msgspec.Struct):
    name: str
    status: str  # pass, warn, fail
    detail: str
    fix: str = ""


def check_python() -> Check:
    v = sys.version_info
    ok = v >= (3, 10)
    return Check("python", "pass" if ok else "fail", f"{platform.python_version()} ({sys.executable})",
                 "" if ok else "use Python 3.10 or newer")


def check_torch() -> list[Check]:
    try:
        import torch
    except Exception as e:
        return [Check("torch", "fail", f"cannot import torch: {e}",
                      "pip install torch==2.13.0 (CPU) or the CUDA build matching your driver")]
    out = [Check("torch", "pass", str(torch.__version__))]
    if torch.version.cuda is None:
        out.append(Check("cuda", "warn", "this torch is a CPU build: no CUDA, no NCCL",
                         "fine for the tiny demo; on a GPU node install torch's CUDA build"))
        return out
    if not torch.cuda.is_available():
        out.append(Check("cuda", "warn", f"torch built for CUDA {torch.version.cuda}, but no GPU is usable",
                         "check the driver (`nvidia-smi`) and CUDA_VISIBLE_DEVICES"))
        return out
    out.append(Check("cuda", "pass", f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s) visible to torch"))
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        out.append(Check("nccl", "pass", f"NCCL {nccl}"))
    except Exception as e:
        out.append(Check("nccl", "warn", f"NCCL version unknown ({e})", "weight sync on GPU needs NCCL"))
    return out


def probe_nvml(backend: str = "nvml", deadline_s: float = NVML_DEADLINE_S) -> dict:
    """One NVML sample in the sampler's child process: {"kind": ...} as it answers, or a hang."""
    proc = subprocess.Popen([sys.executable, "-m", "gkd_core.node.gpu_child", backend, str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None  # (pipes)
    try:
        proc.stdin.write(b"sample\n")
        proc.stdin.flush()
    except OSError:
        pass
    deadline = time.monotonic() + deadline_s
    import select

    buf = b""
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if not ready:
                break
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return {"kind": "error", "error": f"the probe exited (code {proc.poll()})"}
            buf += chunk
            for line in buf.split(b"\n")[:-1]:
                msg = msgspec.json.decode(line)
                if msg.get("kind") != "beat":
                    return msg
        return {"kind": "hung"}
    finally:
        if proc.poll() is None:
            proc.kill()  # not waited for: one stuck in the driver would hold the doctor too


def check_gpus(backend: str = "nvml") -> tuple[Check, int]:
    """The check, and how many GPUs NVML sees (0 when it cannot tell)."""
    msg = probe_nvml(backend)
    kind = msg.get("kind")
    if kind == "no_driver":
        return Check("gpus", "warn", f"no GPU: {msg.get('error')}",
                     "expected on a CPU machine (the tiny demo runs here); on a GPU node, install or load "
                     "the NVIDIA driver"), 0
    if kind == "hung":
        return Check("gpus", "fail", f"NVML did not answer within {NVML_DEADLINE_S:g} s: the driver is wedged",
                     "check `dmesg` for Xid errors; a node whose driver hangs needs a reset, not a retry"), 0
    if kind == "error":
        return Check("gpus", "fail", f"NVML error: {msg.get('error')}",
                     "check `nvidia-smi` and the driver version"), 0
    gpus = msg.get("gpus") or []
    busy = [g for g in gpus if g.get("pids")]
    detail = f"{len(gpus)} GPU(s) through NVML" + (f"; {len(busy)} already in use by other processes" if busy else "")
    return Check("gpus", "warn" if busy else "pass", detail,
                 "free the busy GPUs or set CUDA_VISIBLE_DEVICES to the idle ones" if busy else ""), len(gpus)


def check_env() -> list[Check]:
    out = []
    names = sorted(set(ENV_DOCS) | {k for k in os.environ if k.startswith(("NCCL_", "TORCH_NCCL_"))})
    for name in names:
        if name not in os.environ:
            continue
        value = os.environ[name]
        what, traps = ENV_DOCS.get(name, ("an NCCL setting (see NCCL's environment variable docs)", {}))
        if value in traps:
            out.append(Check(f"env {name}", "warn", f"={value!r}: {traps[value]}", f"unset {name}, or: {what}"))
        else:
            out.append(Check(f"env {name}", "pass", f"={value!r}: {what}"))
    if not out:
        out.append(Check("env", "pass", "no NCCL_*, TORCH_NCCL_*, CUDA_VISIBLE_DEVICES or RAY_ADDRESS set"))
    return out


def check_ray(cfg: config_mod.Config | None, gpus: int) -> list[Check]:
    try:
        import ray
    except Exception as e:
        return [Check("ray", "fail", f"cannot import ray: {e}", "pip install 'ray[default]'")]
    out = [Check("ray", "pass", f"ray {ray.__version__}")]
    address = os.environ.get("RAY_ADDRESS", "")
    current = Path("/tmp/ray/ray_current_cluster")
    if address:
        host, _, port = address.removeprefix("ray://").partition(":")
        reachable = _connects(host, int(port or 6379))
        out.append(Check("ray cluster", "pass" if reachable else "fail", f"RAY_ADDRESS={address} "
                         + ("answers" if reachable else "does not answer"),
                         "" if reachable else "start the cluster (`ray start --head`) or unset RAY_ADDRESS"))
    elif current.exists():
        out.append(Check("ray cluster", "pass", f"a local cluster is running ({current.read_text().strip()}); "
                         "the run joins it"))
    else:
        out.append(Check("ray cluster", "pass", "none running: the run starts a local one (about 7 s)"))
    if cfg is not None:
        device = cfg.trainer.device
        need = 1 + cfg.rollout.n_workers
        if device == "cuda" and gpus < need:
            out.append(Check("resources", "fail", f"device=cuda asks for {need} GPUs (a student and "
                             f"{cfg.rollout.n_workers} rollout workers); this node has {gpus}",
                             f"rollout.n_workers={max(0, gpus - 1)}, or add nodes to the Ray cluster"))
        elif device == "auto" and 0 < gpus < need:
            out.append(Check("resources", "warn", f"{gpus} GPU(s) for {need} GPU workers: device=auto will use CUDA "
                             "and Ray will wait for GPUs that do not exist", f"rollout.n_workers={max(1, gpus - 1)}"))
        else:
            where = f"{gpus} GPU(s)" if gpus else f"CPU ({os.cpu_count()} cores)"
            out.append(Check("resources", "pass", f"{need} workers on {where}"))
    return out


def check_config(path: str | None, overrides: list[str]) -> tuple[Check, config_mod.Config | None]:
    try:
        cfg = config_mod.load_config(path, overrides)
    except config_mod.ConfigError as e:
        return Check("config", "fail", str(e).splitlines()[0][:300], "fix the key it names (see examples/)"), None
    with_overrides = f" with {', '.join(overrides)}" if overrides else ""
    return Check("config", "pass", f"{path or 'the embedded default'}{with_overrides} is valid"), cfg


def check_batches(cfg: config_mod.Config) -> list[Check]:
    out = []
    d, a, r, t = cfg.data, cfg.actor, cfg.rollout, cfg.teacher
    if d.batch_size < r.n_workers:
        out.append(Check("batches", "fail", f"data.batch_size {d.batch_size} < rollout.n_workers {r.n_workers}: "
                         "some workers get no prompts", f"data.batch_size={r.n_workers * 4}"))
    elif d.batch_size % r.n_workers:
        out.append(Check("batches", "warn", f"data.batch_size {d.batch_size} is not a multiple of rollout.n_workers "
                         f"{r.n_workers}: uneven shards, the largest sets every step's pace",
                         f"data.batch_size={d.batch_size - d.batch_size % r.n_workers}"))
    if a.micro_batch_size > d.batch_size:
        out.append(Check("batches", "warn", f"actor.micro_batch_size {a.micro_batch_size} > data.batch_size "
                         f"{d.batch_size}: one micro batch per step", f"actor.micro_batch_size={d.batch_size}"))
    if t.num_microbatches > d.batch_size:
        out.append(Check("batches", "warn", f"teacher.num_microbatches {t.num_microbatches} > data.batch_size "
                         f"{d.batch_size}: empty teacher requests", f"teacher.num_microbatches={d.batch_size}"))
    if cfg.trainer.sync_timeout_s < 5:
        out.append(Check("timeouts", "warn", f"trainer.sync_timeout_s {cfg.trainer.sync_timeout_s:g} s is very "
                         "short: a healthy sync of a real model can take longer", "trainer.sync_timeout_s=60"))
    if not out:
        out.append(Check("batches", "pass", f"batch {d.batch_size} over {r.n_workers} rollout workers, micro batch "
                         f"{a.micro_batch_size}, {t.num_microbatches} teacher microbatches"))
    return out


def check_teacher(cfg: config_mod.Config) -> Check:
    if cfg.teacher.launch and not cfg.teacher.address:
        return Check("teacher", "pass", "launched with the run (teacher.launch=true)")
    if not cfg.teacher.address:
        return Check("teacher", "fail", "teacher.launch=false and no teacher.address",
                     "set teacher.address=tcp://HOST:PORT or teacher.launch=true")
    u = urlparse(cfg.teacher.address)
    ok = bool(u.hostname and u.port and _connects(u.hostname, u.port))
    return Check("teacher", "pass" if ok else "fail", f"{cfg.teacher.address} " + ("accepts connections" if ok else
                 "does not accept connections"), "" if ok else "start the teacher proxy, or check host, port, firewall")


def check_other_nodes(cfg: config_mod.Config) -> Check:
    """Where workers on other nodes will push their events, and whether that can work from here.

    A run opens that ingest only when its Ray cluster has more than one node, on a port chosen
    then; so this names the address and checks what can be checked before: that it is one of this
    node's addresses (on the head), or that the head answers (on a worker node)."""
    import ipaddress

    import psutil

    host = cfg.telemetry.bind_host
    loopback = host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback)
    address = os.environ.get("RAY_ADDRESS", "").removeprefix("ray://")
    ours = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    head, _, port = address.partition(":")
    if head and head not in ours and head not in ("auto", "localhost", "127.0.0.1"):
        # a worker node: its workers push to the head's ingest, on the head's Ray address
        target = head if loopback else host
        ok = _connects(head, int(port or 6379))
        return Check("other nodes", "pass" if ok else "fail",
                     f"workers here push their events to tcp://{target}:(a port the run picks), CurveZMQ with the "
                     f"run's key; the head {head} " + ("answers" if ok else "does not answer"),
                     "" if ok else f"a route and an open firewall from this node to {head}, all tcp ports")
    try:
        import ray

        node_ip = ray.util.get_node_ip_address()
    except Exception as e:
        return Check("other nodes", "warn", f"the node's address is unknown ({type(e).__name__}: {e})",
                     "set telemetry.bind_host to this node's address on the cluster network")
    target = node_ip if loopback else host
    if target not in ours and not loopback:
        return Check("other nodes", "fail", f"telemetry.bind_host={host} is not an address of this node",
                     f"telemetry.bind_host={node_ip} (this node's Ray address), or one of {', '.join(sorted(ours))}")
    if _is_ip(target) and ipaddress.ip_address(target).is_loopback:
        return Check("other nodes", "warn", f"this node's Ray address is {target}: other nodes cannot reach it",
                     "on a cluster, start Ray with --node-ip-address=THIS_NODE_IP")
    return Check("other nodes", "pass",
                 f"with more than one Ray node, workers elsewhere push their events to tcp://{target}:(a port "
                 f"the run picks), CurveZMQ with the run's key; the other nodes must reach {target}, all tcp "
                 "ports, as Ray's own traffic does")


def _is_ip(host: str) -> bool:
    try:
        socket.inet_aton(host)
        return host.count(".") == 3
    except OSError:
        return False


def check_data(cfg: config_mod.Config) -> Check:
    from gkd_core.trainer.data import DataError, read_rows

    if not cfg.data.files:
        return Check("data", "pass", "the built-in synthetic task")
    counts = []
    for f in [*cfg.data.files, *cfg.data.val_files]:
        try:
            counts.append(f"{len(read_rows(f, cfg.data.prompt_key))} in {Path(f).name}")
        except DataError as e:
            return Check("data", "fail", str(e), "fix data.files, data.val_files or data.prompt_key")
    return Check("data", "pass", "prompts: " + ", ".join(counts))


def check_stack_tools() -> Check:
    exe = py_spy_path()
    if exe is None:
        return Check("stacks", "warn", "py-spy not found: stacks of a process stuck in C are unavailable",
                     "pip install py-spy (faulthandler still works for Python frames)")
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    level = scope.read_text().strip() if scope.exists() else "0"
    if level not in ("0",) and os.geteuid() != 0:
        return Check("stacks", "warn", f"py-spy found, but ptrace_scope={level} lets it read only its children",
                     "sudo sysctl kernel.yama.ptrace_scope=0, or run the agent with CAP_SYS_PTRACE")
    return Check("stacks", "pass", f"py-spy at {Path(exe).name}, ptrace allowed (native frames available)")


def checkpoint_estimate(cfg: config_mod.Config) -> int:
    """About what one checkpoint takes: the weights, plus AdamW's two float32 moments per parameter."""
    per = 2 if cfg.model.dtype in ("bfloat16", "float16") else 4
    if cfg.model.path and Path(cfg.model.path).is_dir():
        files = list(Path(cfg.model.path).glob("*.safetensors")) or list(Path(cfg.model.path).glob("*.bin"))
        params = sum(f.stat().st_size for f in files) / per
    else:  # the built-in GPT-2 student: blocks, position and token embeddings (a small vocabulary)
        m = cfg.model
        params = 12 * m.n_layer * m.n_embd ** 2 + (64 + 64) * m.n_embd
    return int(params * (per + 8))


def check_home(cfg: config_mod.Config | None = None) -> Check:
    from gkd_core.rundir import gkd_home
    from gkd_core.units import size

    home = gkd_home()
    home.mkdir(parents=True, exist_ok=True)
    if not os.access(home, os.W_OK):
        return Check("disk", "fail", "GKD_HOME is not writable", "set GKD_HOME to a writable folder")
    free = shutil.disk_usage(home).free
    if cfg is not None:
        one = checkpoint_estimate(cfg)
        keep = cfg.trainer.keep_checkpoints
        kept = keep or max(1, cfg.trainer.total_steps // cfg.trainer.checkpoint_every)
        need = one * (kept + 1)  # the kept ones, and the next being written before the oldest goes
        detail = (f"{size(free)} free under GKD_HOME; a checkpoint takes about {size(one)}, "
                  f"{'all ' if not keep else ''}{kept} kept + 1 being written = {size(need)}")
        if free < need:
            return Check("disk", "fail" if free < 2 * one else "warn", detail,
                         "lower trainer.keep_checkpoints, raise trainer.checkpoint_every, or free space; a save that "
                         "does not fit is skipped with a disk_low alert")
        return Check("disk", "pass", detail)
    if free < 1 << 30:
        return Check("disk", "warn", f"{free >> 20} MiB free under GKD_HOME", "checkpoints need room: free some, "
                     "or point GKD_HOME elsewhere")
    return Check("disk", "pass", f"GKD_HOME writable, {free >> 30} GiB free")


def run_checks(path: str | None = None, overrides: list[str] | None = None, gpu_backend: str = "nvml") -> list[Check]:
    checks = [check_python()]
    cfg_check, cfg = check_config(path, list(overrides or []))
    checks.append(cfg_check)
    checks += check_torch()
    gpu, gpus = check_gpus(gpu_backend)
    checks.append(gpu)
    checks += check_env()
    checks += check_ray(cfg, gpus)
    if cfg is not None:
        checks += check_batches(cfg)
        checks.append(check_teacher(cfg))
        checks.append(check_other_nodes(cfg))
        checks.append(check_data(cfg))
    checks.append(check_stack_tools())
    checks.append(check_home(cfg))
    return checks


def _connects(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
