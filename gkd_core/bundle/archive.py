"""Writing the archive: the run's files and the bug report's own, with every known secret scrubbed.

Taken from the run: the config, the event log, the logs, every stack dump and restart config. Never
``keys/`` (the control socket's secret), never checkpoints (gigabytes, and the model is not the
question). Every text that goes in is scrubbed of the secrets this machine knows: the values of
secret-looking variables (here and in the driver's environment, while it runs), Ray's auth token
(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH's file, ~/.ray/auth_token) and the run's keys, in case a log
printed one.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import msgspec

from gkd_core.bundle import environment, probe, report, targets
from gkd_core.bundle.report import StacksTaken
from gkd_core.stack_text import grouped_report
from gkd_core.state import RunState

INCLUDE = ("config.yaml", "events.jsonl", "logs", "stacks", "restarts", "driver.json")
MAX_FILE = 256 << 20  # a runaway log is cut, not bundled whole
PROBE_TIMEOUT_S = 60.0  # importing torch and asking NVML; a wedged driver is said, not waited for
SCRUB_CHUNK = 1 << 20
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where gkd_core is: the probe's python may not have it
CURVE_KEY = re.compile(r'(?:secret|public)-key\s*=\s*"([^"]+)"')  # a CurveZMQ certificate's keys (z85)


def run_probe(python: str, ray: bool, driver_pid: int = 0, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """``gkd_core/bundle/probe.py`` in a process of its own with ``python`` (the driver's), under a deadline;
    with ours when the driver's cannot run it; ``ray``: Ray's view too (of the cluster ``driver_pid`` started,
    where it started one). Never raises: what went wrong is the answer's "error"."""
    tried = []
    args = ["--ray", str(driver_pid)] if ray else []
    # by its file, our package found after the driver's own (its torch and ray are the ones to read, and its
    # python need not have gkd-tui installed: the probe needs only gkd_core.memory, of the standard library)
    start = (f"import runpy, sys; sys.path.append({PACKAGE_ROOT!r}); sys.argv = [{str(Path(probe.__file__))!r}, "
             f"*{args!r}]; runpy.run_path(sys.argv[0], run_name='__main__')")
    for exe in dict.fromkeys([python, sys.executable]):
        argv = [exe, "-c", start]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            tried.append(f"{exe}: {e}")
            continue
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # killed, waited for briefly and else left: a process in an NVML call on a wedged driver cannot
            # die until the driver lets it (seed 001: nvidia-smi itself hangs), and the report must not wait
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2.0)
            return {"error": f"the probe ({exe}) did not answer within {timeout_s:g} s (a wedged GPU driver?)"}
        if proc.returncode == 0:
            try:  # its last line: whatever an import printed before it is not the answer
                facts = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
            except (ValueError, IndexError) as e:
                tried.append(f"{exe}: its answer is not JSON ({e})")
                continue
            if tried:
                facts["note"] = "read with the bundle's python: " + "; ".join(tried)
            return facts
        tried.append(f"{exe} exited {proc.returncode}: {err.decode(errors='replace').strip()[-300:]}")
    return {"error": "; ".join(tried)}


def known_secrets(run: Path, driver: environment.DriverRecord | None) -> set[str]:
    """Every secret value this machine can name for the run (see the module's docstring)."""
    found = environment.secret_values(os.environ)
    token_files = {os.environ.get("RAY_AUTH_TOKEN_PATH", ""), str(Path.home() / ".ray" / "auth_token")}
    if driver is not None:
        token_files.add(driver.env.get("RAY_AUTH_TOKEN_PATH", ""))
        if driver.pid:  # while it runs: its whole environment and command line, whatever their names
            found |= environment.secret_values(environment.process_environ(driver.pid))
            found |= environment.redact_argv(environment.process_argv(driver.pid))[1]
    for path in sorted(Path(p) for p in token_files if p and p != environment.REDACTED):
        with contextlib.suppress(OSError):
            found.add(path.read_text(errors="replace").strip())
    for path in sorted((run / "keys").glob("*")):  # CurveZMQ certificates: their keys, not their other lines
        with contextlib.suppress(OSError):
            found.update(CURVE_KEY.findall(path.read_text(errors="replace")))
    if os.environ.get("RAY_AUTH_TOKEN"):
        found.add(os.environ["RAY_AUTH_TOKEN"])
    return {s for s in found if len(s) >= 6}


class Scrubber:
    """Replaces each secret, and anything that looks like a token (environment.SECRET_VALUE's known prefixes,
    a JWT, a URL's password; not its long-run rule, which a log's hashes would trip), with ``<redacted>`` in a
    stream, a chunk at a time: a match that may go on past a chunk's end is held back and read again."""

    HOLD = 512  # bytes held back at a chunk's end: longer than any secret or token it looks for

    def __init__(self, secrets: set[str]):
        literal = [re.escape(s.encode()) for s in sorted(secrets, key=len, reverse=True)]
        self.pattern = re.compile(b"|".join([*literal, *(t.encode() for t in environment.TOKEN_LOOKS)]))
        self.hold = max([self.HOLD, *(len(s) + 1 for s in secrets)])

    def bytes(self, data: bytes) -> bytes:
        return self.pattern.sub(environment.REDACTED.encode(), data)

    # (builtins.bytes below: in this class, ``bytes`` names the method above)
    def _part(self, buf: builtins.bytes, final: bool) -> tuple[builtins.bytes, builtins.bytes]:
        """(what can be written now, scrubbed; what must wait for the next chunk)."""
        cut = len(buf) if final else max(0, len(buf) - self.hold)
        out, pos = bytearray(), 0
        for m in self.pattern.finditer(buf):
            if m.start() >= cut:
                break
            if not final and m.end() >= len(buf):
                cut = m.start()  # it may go on in the next chunk
                break
            out += buf[pos:m.start()] + environment.REDACTED.encode()
            pos = m.end()
        cut = max(cut, pos)
        out += buf[pos:cut]
        return bytes(out), buf[cut:]

    def file(self, path: Path, limit: int) -> tuple[IO[builtins.bytes], int]:
        """A scrubbed copy of ``path``'s last ``limit`` bytes, as a temporary file and its size."""
        out = tempfile.TemporaryFile()
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            carry = b""
            while chunk := f.read(SCRUB_CHUNK):
                done, carry = self._part(carry + chunk, final=False)
                out.write(done)
            out.write(self._part(carry, final=True)[0])
        size = out.tell()
        out.seek(0)
        return out, size


def write_bundle(run: Path, out: Path | None = None, status: str = "", state: RunState | None = None,
                 stacks: StacksTaken | None = None, live: bool = False,
                 probe_timeout_s: float = PROBE_TIMEOUT_S, reread: Callable[[], RunState | None] | None = None,
                 live_taken: Callable[[], None] | None = None) -> Path:
    """Write ``run``'s bundle (default: RUN/bundles/bundle-<time>.tar.gz); returns its path. ``state``: the
    run's state (live, or replayed from its log); ``stacks``: those taken for this bundle; ``live``: the run
    is going on here, so Ray's state API is asked too, and, where stacks were taken, those of every process
    of the job the dump missed (targets.py); ``reread``: the run's state again, once the rest is gathered
    (None when it does not answer); ``live_taken``: called once what only the running job can give is taken
    (stacks, Ray's view), before the run's files are archived."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = out or run / "bundles" / f"bundle-{stamp}.tar.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    root = f"{run.name}-{stamp}"
    state = state if state is not None else RunState()
    stacks = stacks or StacksTaken(note="none were taken for this bundle")
    driver = environment.read_driver(run)
    facts = run_probe(driver.python if driver else sys.executable, ray=live, driver_pid=driver.pid if driver else 0,
                      timeout_s=probe_timeout_s)
    traces = report.tracebacks(run / "logs")
    scrub = Scrubber(known_secrets(run, driver))
    if live and not stacks.note:  # stacks were taken: of every live process of the job there is now
        try:
            state = (reread() if reread is not None else None) or state  # with the workers that joined meanwhile
            stacks = targets.take_missed(run, stacks, state, facts.get("ray"))
        except Exception as e:  # the report is wanted most when things fail: it goes out with what it has
            stacks.missing["(the processes the dump missed)"] = f"not taken: {type(e).__name__}: {e}"
    if live_taken is not None:
        live_taken()
    ours = _our_files(state, driver, facts, stacks, traces, status)
    theirs = _run_files(run)  # (path, its name in the archive)
    text = report.summary(run, state, time.time(), driver, facts, stacks, traces,
                          ["summary.md", *sorted(ours), *(name for _, name in theirs)])
    tmp = out.with_name(out.name + ".part")  # the archive appears whole or not at all
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # private from its first byte, whatever a file left there had
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            _add(tar, f"{root}/summary.md", scrub.bytes(text.encode()))
            for name, data in sorted(ours.items()):
                _add(tar, f"{root}/{name}", scrub.bytes(data))
            unread = []
            for path, name in theirs:
                try:
                    copy, size = scrub.file(path, MAX_FILE)
                except OSError as e:  # gone since it was listed, or not ours to read: said, not fatal
                    unread.append(f"{name}: {e}")
                    continue
                with copy:
                    info = tarfile.TarInfo(f"{root}/{name}")  # a regular file, whatever the run's was (a link)
                    info.size, info.mtime, info.mode = size, int(path.stat().st_mtime), 0o600
                    tar.addfile(info, copy)
            if unread:
                _add(tar, f"{root}/unread.txt", scrub.bytes("\n".join(unread).encode()))
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return out


def _our_files(state: RunState, driver: environment.DriverRecord | None, facts: dict[str, Any],
               stacks: StacksTaken, traces: list[tuple[str, str]], status: str) -> dict[str, bytes]:
    named = frozenset(t for a in state.alerts.values() for t in a.targets)
    env = {"driver": msgspec.to_builtins(driver) if driver else None, **facts}
    ray = {"run": report.ray_view_of_state(state), "live": facts.get("ray")}
    if stacks.taken or stacks.missing:
        stack_text = grouped_report(stacks.taken, named, {**stacks.notes, **stacks.missing})
    else:
        stack_text = f"(no stacks: {stacks.note})\n"
    said = {"alerts": [msgspec.to_builtins(a) for a in state.active_alerts()],
            "actions": [msgspec.to_builtins(a) for a in state.actions]}
    files = {
        "environment.json": json.dumps(env, indent=1, default=str).encode(),
        "ray.json": json.dumps(ray, indent=1, default=str).encode(),
        "stacks.txt": stack_text.encode(),
        "tracebacks.txt": "\n\n".join(f"== {f}\n{t}" for f, t in traces).encode() or b"(none in the logs)\n",
        "alerts_and_actions.json": json.dumps(said, indent=1, default=str).encode(),
    }
    if status:
        files["status.txt"] = status.encode()
    return files


def _run_files(run: Path) -> list[tuple[Path, str]]:
    """The run's own files that go in, each with its name in the archive (one cut to its last MAX_FILE bytes
    says so: ``NAME.tail``)."""
    out = []
    for name in INCLUDE:
        path = run / name
        if not path.exists():
            continue
        for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            rel = str(f.relative_to(run))
            try:
                out.append((f, rel if f.stat().st_size <= MAX_FILE else rel + ".tail"))
            except OSError:
                continue  # gone since it was listed
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
    tar.addfile(info, io.BytesIO(data))
