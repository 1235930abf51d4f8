"""Stacks of local processes that may not cooperate: stuck in C, holding the GIL, stopped, or gone.

Three ways in, the best first, and the answer says which one was used:

- ``py-spy dump --native`` reads the process from outside: Python and native frames (NCCL,
  CUDA), whether or not the process holds the GIL. It needs ptrace, which some containers deny.
- ``faulthandler``: a process that called :func:`install_faulthandler` writes all its threads to
  a file on SIGUSR1, from the signal handler, even while another thread holds the GIL.
- in-process (a thread of the worker answers): the driver's fallback, not this module's.

Besides its threads, a process with asyncio calls in flight (an async Ray actor: a server with many
requests at once) has coroutines waiting that are on no thread's stack: the event loop's thread shows
only its idle ``select``. A watched process offers those (``task_stack_files``: it keeps a ``ready``
file in the stacks folder); a capture asks it beside py-spy, and its watcher thread writes each call's
chain of awaits, down to the ``await`` that has not returned (integrations/task_stacks.py).

Every capture runs under a hard timeout and never waits on a process that will not die: a
stopped or vanished process gets a note that says so, within the timeout.

A process's children are read with it, after its own threads (proctree: an inference engine works
in child processes, and the worker's own stack only waits on them).
"""

from __future__ import annotations

import faulthandler
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import msgspec

from gkd_core import proctree

TIMEOUT_S = 4.0
FAULTHANDLER_SIGNAL = signal.SIGUSR1
TASKS_WAIT_S = 1.5  # a process's watcher thread answers within a tick or two, unless it cannot run at all


class Capture(msgspec.Struct, kw_only=True):
    pid: int
    method: str = ""  # py-spy, faulthandler, or "" when nothing could be read
    text: str = ""
    error: str = ""  # why there is no text, or a note beside it (a stopped process)
    seconds: float = 0.0


def py_spy_path() -> str | None:
    """py-spy on PATH, or beside this Python (a venv that is not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else None


def process_state(pid: int) -> str | None:
    """The one-letter state from /proc (R, S, D, T, Z...), or None when there is no such process."""
    fields = proctree.stat_fields(pid)
    return fields[0] if fields else None


def faulthandler_file(folder: Path, pid: int) -> Path:
    return folder / f"faulthandler-{pid}.txt"


def install_faulthandler(folder: Path) -> Path | None:
    """Make this process write every thread's stack to a file on SIGUSR1 (when nobody else uses it)."""
    if signal.getsignal(FAULTHANDLER_SIGNAL) not in (signal.SIG_DFL, None):
        return None  # someone else's handler: leave it alone
    folder.mkdir(parents=True, exist_ok=True)
    path = faulthandler_file(folder, os.getpid())
    f = open(path, "a", buffering=1)  # kept open for the life of the process, as faulthandler needs
    faulthandler.register(FAULTHANDLER_SIGNAL, file=f, all_threads=True, chain=False)
    return path


class TaskStackFiles(NamedTuple):
    """A process's offer to write its asyncio calls' stacks, a request for them, and its answer."""

    ready: Path
    asked: Path
    answer: Path


def task_stack_files(folder: Path, pid: int) -> TaskStackFiles:
    return TaskStackFiles(*(folder / f"tasks-{pid}.{kind}" for kind in ("ready", "asked", "txt")))


def via_task_stacks(pid: int, folder: Path, timeout_s: float) -> str:
    """The process's asyncio calls in flight, each with its chain of awaits, as it writes them when asked
    (``""`` when it offers none). Each reader adds a token of its own to the request; the answer's first line
    lists the tokens it answers, so two readers at once share one answer and neither takes an old one."""
    files = task_stack_files(folder, pid)
    if not files.ready.exists():
        return ""
    token = f"{os.getpid()}-{time.monotonic_ns()}-{random.getrandbits(32)}"
    with open(files.asked, "a") as f:
        f.write(token + "\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tokens, _, text = files.answer.read_text(errors="replace").partition("\n")
        except FileNotFoundError:
            tokens, text = "", ""
        if token in tokens.split():
            return text
        time.sleep(0.02)
    return (f"Task stacks of process {pid}: not written within {timeout_s:g} s (its watcher thread did not run: "
            "a thread holding the GIL?)\n")


def run_bounded(cmd: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr). Past the timeout the process group is killed
    and not waited for beyond a moment: py-spy on a process in uninterruptible sleep can stick too."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            out, err = proc.communicate(timeout=0.5)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        return None, out or "", err or ""


def py_spy_error(said: str) -> str:
    """py-spy's error in one line: its ``Error:`` line and the causes under it, without the Rust backtrace
    that follows when RUST_BACKTRACE is set (whose last line, ``9: main``, said nothing)."""
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Error:")), None)
    if start is None:
        return lines[-1] if lines else ""
    parts = [lines[start].removeprefix("Error:").strip()]
    for ln in lines[start + 1:]:
        if ln.startswith("Stack backtrace"):
            break
        if ln != "Caused by:":
            parts.append(ln.split(": ", 1)[1] if ln[:1].isdigit() and ": " in ln else ln)
    return ": ".join(dict.fromkeys(parts))  # EPERM said twice, once


def via_py_spy(pid: int, timeout_s: float, stopped: bool = False) -> tuple[str, str]:
    """(text, error or a note beside the text). A stopped process is read without attaching
    (--nonblocking): attaching waits for it to run, which it will not.

    Two readers of one process at once (the dashboard's automatic dump and a user's ``d``, or a node
    agent's): ptrace lets one suspend it, and the other gets EPERM. So a failed suspend is tried again
    while another py-spy holds it (or had just let go), as long as the deadline leaves room for one more
    try; a debugger holding it is named at once, leaving the time to the fallback. Native frames that
    py-spy cannot merge with the Python ones (benfred/py-spy#634) leave the Python frames, read again
    without ``--native``, with a note."""
    exe = py_spy_path()
    if exe is None:
        return "", "py-spy is not installed (pip install py-spy)"
    end = time.monotonic() + timeout_s
    native, note, before, unheld = not stopped, "", "", 0
    while True:
        cmd = [exe, "dump", "--pid", str(pid)] + (["--nonblocking"] if stopped else ["--native"] if native else [])
        t0 = time.monotonic()
        code, out, err = run_bounded(cmd, max(0.5, end - t0))
        if code is None:  # a retry's timeout says less than what the try before it met
            return "", before or f"py-spy did not finish within {timeout_s:g} s"
        if code == 0 and out.strip():
            return out, note
        why = py_spy_error(err) or py_spy_error(out) or f"exit code {code}"
        if "Failed to suspend process" in why:
            holder = proctree.tracer(pid)
            by = proctree.title(holder) if holder else ""
            if holder and "py-spy" not in by:
                why += f" (process {holder}, {by[:60]}, is tracing it: a debugger?)"
            elif (holder or unheld < 3) and time.monotonic() + (time.monotonic() - t0) + 0.15 < end:
                unheld += not holder
                before = f"py-spy failed: {why[:300]}"
                time.sleep(random.uniform(0.05, 0.15))  # apart from the other reader's own retries
                continue
        if native and "merge native" in why:
            native, note = False, f"native frames not read (py-spy: {why[:200]}): Python frames only"
            continue
        hint = " (ptrace is denied here: run with CAP_SYS_PTRACE, or use faulthandler)" if "ermission" in err else ""
        return "", f"py-spy failed: {why[:300]}{hint}"


def via_faulthandler(pid: int, folder: Path, timeout_s: float) -> tuple[str, str]:
    path = faulthandler_file(folder, pid)
    if not path.exists():
        return "", f"process {pid} did not register faulthandler (no {path.name})"
    before = path.stat().st_size
    try:
        os.kill(pid, FAULTHANDLER_SIGNAL)
    except OSError as e:
        return "", f"could not signal process {pid}: {e}"
    deadline = time.monotonic() + timeout_s
    size = before
    while time.monotonic() < deadline:
        time.sleep(0.05)
        size = path.stat().st_size
        if size > before:
            time.sleep(0.1)  # the handler writes thread after thread; let it finish
            if path.stat().st_size == size:
                break
    if size <= before:
        return "", f"faulthandler wrote nothing within {timeout_s:g} s"
    with open(path, "rb") as f:
        f.seek(before)
        return f.read().decode(errors="replace"), ""


def capture(pid: int, timeout_s: float = TIMEOUT_S, faulthandler_dir: Path | None = None) -> Capture:
    """The stack of ``pid`` by the best way available, its asyncio calls' (where it offers them), then its
    children's, all within ``timeout_s``."""
    kids = [c for c in proctree.descendants(pid) if proctree.is_python(c)]
    offers_tasks = faulthandler_dir is not None and task_stack_files(faulthandler_dir, pid).ready.exists()
    if not kids and not offers_tasks:
        return _capture_one(pid, timeout_s, faulthandler_dir)
    with ThreadPoolExecutor(max_workers=2 + len(kids), thread_name_prefix="stack-capture-child") as pool:
        own = pool.submit(_capture_one, pid, timeout_s, faulthandler_dir)
        tasks = (pool.submit(via_task_stacks, pid, faulthandler_dir, min(TASKS_WAIT_S, timeout_s))
                 if offers_tasks and faulthandler_dir is not None else None)  # (it offers them only with one)
        theirs = [(c, pool.submit(_capture_one, c, timeout_s, None)) for c in kids]
        cap = own.result()
        if tasks is not None and (task_text := tasks.result()):
            cap.text = f"{cap.text.rstrip()}\n\n{task_text}" if cap.text else task_text
            cap.method = cap.method or "asyncio tasks"
        for child, f in theirs:
            got = f.result()
            cap.text += (f"\n\nChild process {child} ({proctree.title(child)}) of {pid}:\n"
                         + (got.text or f"  (no stack: {got.error})\n"))
            if got.text and got.error:
                cap.text += f"  # note: {got.error}\n"
        return cap


def _capture_one(pid: int, timeout_s: float, faulthandler_dir: Path | None) -> Capture:
    t0 = time.monotonic()
    state = process_state(pid)
    if state is None:
        return Capture(pid=pid, error=f"process {pid} is gone: it exited or was killed (see its log)")
    if state == "Z":
        return Capture(pid=pid, error=f"process {pid} has exited (a zombie its parent has not reaped)")
    if state in ("T", "t"):
        note = (f"process {pid} is stopped (state {state}: SIGSTOP, Ctrl-Z or a debugger); it cannot run, "
                f"answer or make progress until `kill -CONT {pid}`")
        text, err = via_py_spy(pid, timeout_s, stopped=True)
        return Capture(pid=pid, method="py-spy" if text else "", text=text, error=note if text else f"{note}; {err}",
                       seconds=time.monotonic() - t0)
    text, err = via_py_spy(pid, timeout_s)
    if text:
        return Capture(pid=pid, method="py-spy", text=text, error=err, seconds=time.monotonic() - t0)
    errors = [err]
    if faulthandler_dir is not None:
        left = max(0.5, timeout_s - (time.monotonic() - t0))
        text, fh_err = via_faulthandler(pid, faulthandler_dir, left)
        if text:
            return Capture(pid=pid, method="faulthandler", text=text, error=err, seconds=time.monotonic() - t0)
        errors.append(fh_err)
    if state == "D":
        errors.append(f"process {pid} is in uninterruptible sleep (state D): a driver call (GPU, disk, "
                      "network filesystem) that has not returned")
    return Capture(pid=pid, error="; ".join(errors), seconds=time.monotonic() - t0)


def capture_many(pids: dict[str, int], timeout_s: float = TIMEOUT_S,
                 faulthandler_dir: Path | None = None) -> dict[str, Capture]:
    """Every target at once: the whole dump takes about as long as the slowest one."""
    if not pids:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(pids)), thread_name_prefix="stack-capture") as pool:
        futures = {name: pool.submit(capture, pid, timeout_s, faulthandler_dir) for name, pid in pids.items()}
        return {name: f.result() for name, f in futures.items()}
