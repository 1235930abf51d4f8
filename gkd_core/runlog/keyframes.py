"""``RUN/keyframes/``: the supervisor's state now and then, each at a line of ``events.jsonl``.

A replay rebuilds the state by applying the log's lines in order. At 65,536 workers that is
0.9 MB of log a second, and the 10-minute soak's 521 MB took 42 s to open at its end. A replay
that can start from the newest keyframe before the moment it is asked for reads only the lines
after it (``gkd_tui.sources.replay``), as a video player starts from a keyframe.

- **When**: each time the log has grown by ``telemetry.keyframe_mb`` (32 MB; 0: never) since the
  last one, or by the last one's own size if that is larger, one at a time, not in a burst of events (up
  to ``DEFER_MAX_S`` later); the newest ``KEEP`` are kept. A run of 8 workers logs 20 to 200 MB a day: a
  keyframe of a few KB every few hours. A keyframe's cost is its size, so keyframes cost no more than the
  log they save a replay from reading (as Redis rewrites its append-only file when it has grown by its own
  size): at 131,072 workers the state is 190 MB of JSON, and one every 32 MB of log (10 s) wrote six times
  the log's bytes. And at the run's end, when the log grew by an ``END_SHARE``th of ``keyframe_mb`` since
  the last: a finished run opens at its end at once.
- **How**: from a forked child, the way Redis writes its snapshots (BGSAVE). The supervisor forks
  between two events with the log's buffer flushed, so the child's copy of the state is the state
  at that line, and the child encodes and writes it (0.4 s and 84 MB of JSON at 65,536 workers)
  beside the supervisor, whose ingest never waits for it, at the lowest CPU priority. The child
  touches none of the sockets and ends with ``os._exit``: nothing of the parent's (the ZeroMQ
  context, the driver) is torn down by it, and it dies with the supervisor.
- **What**: ``seq-<seq>.jsonl``, two lines: a ``Header``, then the state as a snapshot encodes it
  (JSON, as everything else; no pickle; ``head -1`` shows the header). Not compressed: gzip took
  0.5 s of the child's 0.7 s at 65,536 workers, and while the child lives, every page the
  supervisor writes is copied (copy-on-write), which is what a dashboard waits for. Written under a
  temporary name and renamed; not fsynced (a keyframe is a convenience, and its fsync would hold up
  the log's): one that a crash of the machine cut short does not decode, and is passed over.
- **Trust**: a replay uses a keyframe only if the log's line before its offset is the one it names
  (its length and SHA-256); one of another log, or of a log cut short by a crash, is passed over,
  with a warning that names it.

The state is the live one, so it holds the heartbeats the log left out (``runlog.heartbeats``): a
replay from a keyframe reads as the dashboard did live at that line.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Annotated

import msgspec

from gkd_core.errors import GkdError
from gkd_core.lifeline import die_with_parent
from gkd_core.runlog.eventlog import EventLog
from gkd_core.state import RunState, decode_state, encode_state

# 2: the state carries its plots' series, whose GPU sums a keyframe without them would start wrong (a
# reading's predecessor taken away that was never added): a keyframe of 1 is passed over, the log read
# 3: a state's actions are the action events, their answers typed, and its log lines records (source, level,
# text, time): a keyframe of 2 is passed over, the log read (which reads an older log's answers as such)
FORMAT = 3
KEEP = 8  # keyframes kept: a seek before the oldest reads the log from its start
DEADLINE_S = 120.0  # a child not done by then is killed, and says so
# at the run's end, one more keyframe when the log grew by this share of keyframe_mb since the last: a finished
# run opens at its end from it (less than a second at 65,536 workers), not from up to keyframe_mb of lines
END_SHARE = 8
END_DEADLINE_S = 15.0  # that one is waited for (0.4 s at 65,536 workers): the supervisor's exit, not 2 minutes
# a keyframe that falls due in a burst of events (a step's phase changes at 65,536 workers: 20,000 a second) waits
# until a second after it, for at most DEFER_MAX_S: while the child lives, every page the supervisor writes is
# copied, which the burst's events would wait for on their way to the screen (bench/bench_dashboard.py)
BURST_PER_S = 5000
DEFER_MAX_S = 10.0
HEADER_MAX = 64 * 1024
LINE_MAX = 4 << 20  # the longest line of a log (an event is at most 1 MiB)
GLOB = "seq-*.jsonl"


class Header(msgspec.Struct, kw_only=True):
    format: int
    seq: int  # the supervisor's seq at the fork
    offset: Annotated[int, msgspec.Meta(ge=1)]  # bytes of events.jsonl the state is of: a replay reads on from here
    lines: Annotated[int, msgspec.Meta(ge=0)]  # lines of the log before ``offset`` (the next one is lines + 1)
    # the newest ts in the state (its lines, and the heartbeats the log left out): a replay to a moment at
    # or after it may start here
    max_ts: float
    last_line_len: Annotated[int, msgspec.Meta(ge=0)]  # the line before ``offset``, without its newline: which log
    last_line_sha256: str
    written: float  # wall clock at the fork


class KeyframeError(GkdError):
    """A keyframe that cannot be used: the message says which file, and why."""


def frames(folder: Path) -> list[Path]:
    """The keyframe files in ``folder``, oldest first."""
    def seq(p: Path) -> int:
        digits = p.name[len("seq-"):-len(".jsonl")]
        return int(digits) if digits.isdigit() else -1
    return sorted((p for p in folder.glob(GLOB) if seq(p) >= 0), key=seq) if folder.is_dir() else []


def read_header(path: Path) -> Header:
    try:
        with open(path, "rb") as f:
            line = f.readline(HEADER_MAX)
        return msgspec.json.decode(line, type=Header)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise KeyframeError(f"{path}: unreadable header ({e})") from None


def mismatch(h: Header, log: Path, size: int) -> str:
    """Why keyframe ``h`` is not of ``log`` (whose first ``size`` bytes are read), "" when it is."""
    if h.format != FORMAT:
        return f"format {h.format}, this reader knows {FORMAT}"
    start = h.offset - h.last_line_len - 1  # where the line before the offset begins
    if not (0 < h.offset <= size and 0 <= start):
        return f"its offset {h.offset} is not inside the log's {size} bytes"
    if h.last_line_len > LINE_MAX:
        return f"it names a line of {h.last_line_len} bytes, and no line of a log is over {LINE_MAX}"
    with open(log, "rb") as f:
        f.seek(max(0, start - 1))
        got = f.read(h.offset - max(0, start - 1))
    before, line = (got[:1], got[1:]) if start > 0 else (b"\n", got)
    if not (before == b"\n" and line.endswith(b"\n")
            and hashlib.sha256(line[:-1]).hexdigest() == h.last_line_sha256):
        return f"the log's line before byte {h.offset} is not the one it was written at"
    return ""


def load(path: Path) -> RunState:
    try:
        with open(path, "rb") as f:
            f.readline(HEADER_MAX)
            return decode_state(f.read())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise KeyframeError(f"{path}: unreadable state ({e})") from None


class KeyframeWriter:
    """The supervisor's side: ``tick`` at each flush of the log starts a child when one is due and
    reaps it when done; a child that fails or overruns is reported (the message to log)."""

    def __init__(self, folder: Path, every_mb: float, keep: int = KEEP, deadline_s: float = DEADLINE_S):
        self.folder = folder
        self.every = int(every_mb * (1 << 20))
        self.keep = keep
        self.deadline_s = deadline_s
        self.pid = 0  # the child writing one, 0 when none
        self._header: Header | None = None
        self._errors = -1  # the read end of the child's pipe for its error
        self._started = 0.0
        self._killed = False
        for tmp in folder.glob(".seq-*.jsonl.tmp") if folder.is_dir() else ():
            tmp.unlink(missing_ok=True)  # of a supervisor killed while its child wrote (this one writes none yet)
        done = frames(folder)  # a run taken over: count from its newest
        self.last_offset = 0
        if done:
            try:
                self.last_offset = read_header(done[-1]).offset
            except KeyframeError:
                pass
        self.written_offset = self.last_offset  # the newest one written (a started one may yet fail)
        self.last_size = _size(done[-1]) if done else 0  # the newest one's bytes: the next is due no sooner
        self.written = 0
        self._rate_from: tuple[int, float] | None = None  # (seq, when): the events counted since
        self._burst_until = 0.0  # (monotonic) a due keyframe waits until then
        self._due_since: float | None = None

    def tick(self, state: RunState, log: EventLog, seq: int, now: float | None = None) -> str:
        """Call with the log flushed. "" or a line that says what went wrong with a keyframe. ``now``: the
        monotonic clock (a test's)."""
        now = time.monotonic() if now is None else now
        in_burst = self._in_burst(seq, now)
        if self.pid:
            return self._reap()
        if self.every and log.offset - self.last_offset >= max(self.every, self.last_size) and log.offset:
            if self._due_since is None:
                self._due_since = now
            if in_burst and now - self._due_since < DEFER_MAX_S:
                return ""
            self._due_since = None
            return self._start(state, log, seq)
        return ""

    def _in_burst(self, seq: int, now: float) -> bool:
        """Whether the events have come at BURST_PER_S or more in the last second, counted a quarter second at
        a time."""
        if self._rate_from is None:
            self._rate_from = (seq, now)
        elif now - self._rate_from[1] >= 0.25:
            if (seq - self._rate_from[0]) / (now - self._rate_from[1]) >= BURST_PER_S:
                self._burst_until = now + 1.0
            self._rate_from = (seq, now)
        return now < self._burst_until

    def _start(self, state: RunState, log: EventLog, seq: int) -> str:
        h = Header(format=FORMAT, seq=seq, offset=log.offset, lines=log.line_no, max_ts=log.max_ts,
                   last_line_len=len(log.last_line), last_line_sha256="", written=time.time())
        self.last_offset = log.offset  # a failed one is not retried at once: at the next keyframe_mb
        self.folder.mkdir(mode=0o700, exist_ok=True)
        r, w = os.pipe()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            os.close(r)
            os.close(w)
            return f"keyframe at seq {seq} not written: fork failed ({e}); replays read more of the log"
        if pid == 0:  # the child: never returns
            _write_and_exit(self.folder, h, log.last_line, state, self.keep, w, parent)
        os.close(w)
        self.pid, self._header, self._errors, self._started, self._killed = pid, h, r, time.monotonic(), False
        return ""

    def _reap(self) -> str:
        h = self._header
        assert h is not None  # (set with the pid)
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: whether it was written, the folder says
            pid, status = self.pid, -1
        if pid == 0:
            if not self._killed and time.monotonic() - self._started > self.deadline_s:
                os.kill(self.pid, signal.SIGKILL)
                self._killed = True
                return (f"keyframe at seq {h.seq} not written within {self.deadline_s:g} s: its writer (pid "
                        f"{self.pid}) killed; replays read more of the log")
            return ""
        err = os.read(self._errors, 4096).decode(errors="replace").strip()
        os.close(self._errors)
        self.pid = 0
        code = os.waitstatus_to_exitcode(status) if status >= 0 else None
        if code is None:
            return ""
        if code == 0:
            self.written += 1
            self.written_offset = h.offset
            self.last_size = _size(self.folder / _name(h.seq))
            return ""
        _remove_temporary(self.folder, h.seq)
        if self._killed:
            return ""  # said when it was killed
        return f"keyframe at seq {h.seq} not written (exit {code}): {err or 'no error given'}"

    def close(self, wait_s: float = 5.0, end_of: tuple[RunState, EventLog, int] | None = None) -> str:
        """At the end of the run: wait a little for a child at work, else kill it. ``end_of``: the state, the
        log (flushed) and the seq at the run's end, for one more keyframe there when the log grew by an
        ``END_SHARE``th of keyframe_mb since the last one written; waited for up to ``END_DEADLINE_S``, then
        killed as any other."""
        said = [self._finish(wait_s)]
        if end_of is not None and self.every and end_of[1].offset - self.written_offset >= self.every // END_SHARE:
            said.append(self._start(*end_of))
            said.append(self._finish(min(self.deadline_s, END_DEADLINE_S)))
        return "; ".join(filter(None, said))

    def _finish(self, wait_s: float) -> str:
        """The child at work (if any) done within ``wait_s``, else killed."""
        end = time.monotonic() + wait_s
        said = ""
        while self.pid and time.monotonic() < end:
            said = self._reap() or said
            if not self.pid:
                return said
            time.sleep(0.02)
        if not self.pid:
            return said
        assert self._header is not None  # (set with the pid)
        os.kill(self.pid, signal.SIGKILL)
        self._killed = True
        end = time.monotonic() + 2.0  # gone at once, unless stuck in the kernel (then init reaps it)
        while self.pid and time.monotonic() < end:
            self._reap()
            time.sleep(0.01)
        if self.pid:
            os.close(self._errors)
            self.pid = 0
        _remove_temporary(self.folder, self._header.seq)
        return f"keyframe at seq {self._header.seq} abandoned: the run ended while it was being written"


def _name(seq: int) -> str:
    return f"seq-{seq:012d}.jsonl"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # (let go since: the next is due at keyframe_mb)
        return 0


def _remove_temporary(folder: Path, seq: int) -> None:
    try:
        (folder / f".{_name(seq)}.tmp").unlink()
    except FileNotFoundError:
        pass


def _write_and_exit(folder: Path, h: Header, last_line: bytes, state: RunState, keep: int, err_fd: int,
                    parent: int) -> None:
    """In the forked child: write the keyframe, keep the newest ``keep``, and exit without running
    anything of the parent's (atexit handlers, the ZeroMQ context's teardown); never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handlers only set a flag its loop reads
        for sig in (signal.SIGINT, signal.SIGHUP):  # a Ctrl-C or a closed terminal is the supervisor's to act on
            signal.signal(sig, signal.SIG_IGN)
        die_with_parent(signal.SIGKILL, parent)
        os.nice(19)  # the supervisor, its dashboards and the run come first: this is a convenience for replays
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # short of memory, the kernel takes this child, not the supervisor
        except OSError:
            pass
        # the heartbeats the log left out are in the state, and may be newer than its lines
        h.max_ts = max(h.max_ts, state.last_ts, max((w.last_heartbeat for w in state.workers.values()), default=0.0),
                       max((ts for _, ts in state.relay_clocks.values()), default=0.0))
        h.last_line_sha256 = hashlib.sha256(last_line).hexdigest()
        tmp, final = folder / f".{_name(h.seq)}.tmp", folder / _name(h.seq)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(h) + b"\n")
            f.write(encode_state(state))
            f.write(b"\n")
        # no fsync: it would queue the supervisor's own fsync of the log behind tens of MB; a keyframe a
        # crash of the machine cut short does not decode, and is passed over for the one before
        os.rename(tmp, final)
        for old in frames(folder)[:-keep]:
            old.unlink(missing_ok=True)
        code = 0
    except BaseException as e:  # noqa: BLE001 - the child reports anything, and exits
        try:
            os.write(err_fd, f"{type(e).__name__}: {e}".encode()[:4000])
        except OSError:
            pass
    finally:
        os._exit(code)  # no atexit, no finalizers, no flush of the parent's buffers
