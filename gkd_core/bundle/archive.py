"""Writing the archive: the run's files and the bug report's own, with every known secret scrubbed.

Taken from the run: the config, the event log, the logs, every stack dump and restart config. Never
``keys/`` (the control socket's secret), never checkpoints (gigabytes, and the model is not the
question). Every text that goes in is scrubbed of the secrets this machine knows: the values of
secret-looking variables (here and in the driver's environment, while it runs), Ray's auth token
(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH's file, ~/.ray/auth_token) and the run's keys, in case a log
printed one.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from gkd_core.bundle import environment, report
from gkd_core.bundle.report import StacksTaken
from gkd_core.stack_text import grouped_report
from gkd_core.state import RunState

INCLUDE = ("config.yaml", "events.jsonl", "logs", "stacks", "restarts", "driver.json")
MAX_FILE = 256 << 20  # a runaway log is cut, not bundled whole
PROBE_TIMEOUT_S = 60.0  # importing torch and asking NVML; a wedged driver is said, not waited for
SCRUB_CHUNK = 1 << 20


def run_probe(python: str, ray: bool, driver_pid: int = 0, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """``gkd_core.bundle.probe`` in a process of its own with ``python`` (the driver's), under a deadline;
    with ours when the driver's cannot run it; ``ray``: Ray's view too (of the cluster ``driver_pid`` started,
    where it started one). Never raises: what went wrong is the answer's "error"."""
    tried = []
    for exe in dict.fromkeys([python, sys.executable]):
        argv = [exe, "-m", "gkd_core.bundle.probe", *(["--ray", str(driver_pid)] if ray else [])]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"error": f"`{' '.join(argv)}` did not answer within {timeout_s:g} s (a wedged GPU driver?)"}
        except OSError as e:
            tried.append(f"{exe}: {e}")
            continue
        if done.returncode == 0:
            try:
                facts = json.loads(done.stdout)
            except ValueError as e:
                tried.append(f"{exe}: its answer is not JSON ({e})")
                continue
            if tried:
                facts["note"] = "read with the bundle's python: " + "; ".join(tried)
            return facts
        tried.append(f"{exe} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return {"error": "; ".join(tried)}


def known_secrets(run: Path, driver: environment.DriverRecord | None) -> set[str]:
    """Every secret value this machine can name for the run (see the module's docstring)."""
    found = environment.secret_values(os.environ)
    if driver is not None and driver.pid:
        found |= environment.secret_values(environment.process_environ(driver.pid))
    token_files = [os.environ.get("RAY_AUTH_TOKEN_PATH", ""), str(Path.home() / ".ray" / "auth_token")]
    for path in [Path(p) for p in token_files if p] + sorted((run / "keys").glob("*")):
        try:
            text = path.read_text(errors="replace").strip()
        except OSError:
            continue
        found.update(line.strip() for line in text.splitlines() if len(line.strip()) >= 6)
        if len(text) >= 6:
            found.add(text)
    if os.environ.get("RAY_AUTH_TOKEN"):
        found.add(os.environ["RAY_AUTH_TOKEN"])
    return {s for s in found if len(s) >= 6}


class Scrubber:
    """Replaces each secret with ``<redacted>`` in a stream, a chunk at a time (a secret across two chunks
    is still found: the last ``longest - 1`` bytes are held back and scanned again)."""

    def __init__(self, secrets: set[str]):
        self.secrets = sorted((s.encode() for s in secrets), key=len, reverse=True)
        self.keep = max((len(s) for s in self.secrets), default=1) - 1

    def bytes(self, data: bytes) -> bytes:
        for s in self.secrets:
            data = data.replace(s, environment.REDACTED.encode())
        return data

    def file(self, path: Path, limit: int) -> tuple[io.BufferedRandom, int]:
        """A scrubbed copy of ``path``'s last ``limit`` bytes, as a temporary file and its size."""
        out = tempfile.TemporaryFile()
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - limit))
            carry = b""
            while chunk := f.read(SCRUB_CHUNK):
                buf = self.bytes(carry + chunk)
                cut = max(0, len(buf) - self.keep)
                out.write(buf[:cut])
                carry = buf[cut:]
            out.write(self.bytes(carry))
        size = out.tell()
        out.seek(0)
        return out, size


def write_bundle(run: Path, out: Path | None = None, status: str = "", state: RunState | None = None,
                 stacks: StacksTaken | None = None, live: bool = False,
                 probe_timeout_s: float = PROBE_TIMEOUT_S) -> Path:
    """Write ``run``'s bundle (default: RUN/bundles/bundle-<time>.tar.gz); returns its path. ``state``: the
    run's state (live, or replayed from its log); ``stacks``: those taken for this bundle; ``live``: the run
    is going on here, so Ray's state API is asked too."""
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
    ours = _our_files(state, driver, facts, stacks, traces, status)
    files = sorted(ours) + _run_files(run)
    text = report.summary(run, state, time.time(), driver, facts, stacks, traces, ["summary.md", *files])
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # private from its first byte
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        _add_text(tar, f"{root}/summary.md", scrub.bytes(text.encode()))
        for name, data in sorted(ours.items()):
            _add_text(tar, f"{root}/{name}", scrub.bytes(data))
        for rel in _run_files(run):
            path = run / rel.removesuffix(".tail")
            copy, size = scrub.file(path, MAX_FILE)
            with copy:
                info = tar.gettarinfo(str(path), arcname=f"{root}/{rel}")
                info.size, info.mode = size, 0o600
                tar.addfile(info, copy)
    return out


def _our_files(state: RunState, driver: environment.DriverRecord | None, facts: dict[str, Any],
               stacks: StacksTaken, traces: list[tuple[str, str]], status: str) -> dict[str, bytes]:
    named = frozenset(t for a in state.alerts.values() for t in a.targets)
    env = {"driver": msgspec.to_builtins(driver) if driver else None, **facts}
    ray = {"run": report.ray_view_of_state(state), "live": facts.get("ray")}
    stack_text = (grouped_report(stacks.taken, named, {**stacks.notes, **stacks.missing}) if stacks.taken or stacks.missing
                  else f"(no stacks: {stacks.note})\n")
    said = {"alerts": [msgspec.to_builtins(a) for a in state.active_alerts()], "actions": state.actions}
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


def _run_files(run: Path) -> list[str]:
    """The run's own files that go in, relative to it (a file cut to its tail says so: ``NAME.tail``)."""
    out = []
    for name in INCLUDE:
        path = run / name
        if not path.exists():
            continue
        for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            rel = str(f.relative_to(run))
            out.append(rel if f.stat().st_size <= MAX_FILE else rel + ".tail")
    return out


def _add_text(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
    tar.addfile(info, io.BytesIO(data))
