"""Reading ``RUN/events.jsonl``: the one place where its lines become events, and events a state.

Three readers go through here, and so agree on the state a log leads to (tests/process/test_runlog.py):
``replay`` (a whole log: `gkd-tui status` of a run whose supervisor is gone, the tests, the soak
bench), ``take_over`` (a supervisor that carries on such a run) and ``timeline.Timeline`` (the
dashboard's replay: from a keyframe, a few MB at a time, with the heartbeats the log left out put
back).

A line that is no event (the torn last line of a crashed run, a hand edit) is skipped and said:
its number, as an editor numbers it, and why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from gkd_core import rundir
from gkd_core.runlog import eventlog
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire

EVENTS = "events.jsonl"  # a run directory's log
CHUNK = 4 << 20  # bytes read at a time, cut at a line's end
PERIODS_IN = 1000  # the run event with the heartbeat periods is looked for among the log's first lines
MAX_FILL = 1000  # heartbeats a replay puts back per gap at most (a real run's periods give 10 to 50)

OnBad = Callable[[int, str], None]  # (line number, why) of a line that is no event


def read_chunk(path: Path, pos: int, size: int) -> bytes:
    """The log's bytes from ``pos``, about ``CHUNK`` of them, cut after a newline (the last piece
    of a log read up to ``size`` may end without one)."""
    with open(path, "rb") as f:
        f.seek(pos)
        data = f.read(min(CHUNK, size - pos))
        while pos + len(data) < size and b"\n" not in data:  # a line longer than a chunk
            data += f.read(min(CHUNK, size - pos - len(data)))
    if pos + len(data) < size:
        data = data[:data.rfind(b"\n") + 1]
    return data


def split_lines(data: bytes) -> list[bytes]:
    # at newlines only, as the writer does: splitlines would split at a stray \r too, and the
    # numbers would not be the ones an editor shows
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # after the last newline: nothing
    return lines


def decode_lines(lines: Iterable[bytes | str], first: int,
                 on_bad: OnBad | None) -> Iterator[tuple[int, ev.Event | ev.UnknownEvent]]:
    """(line number, event) of each line of ``lines`` that is an event, numbered from ``first``;
    the others are skipped, and told to ``on_bad``."""
    for n, line in enumerate(lines, first):
        if isinstance(line, str):
            line = line.encode()
        if not line.strip():
            continue
        try:
            e = wire.decode(line.strip())
        except wire.Rejected as r:
            if on_bad is not None:
                on_bad(n, str(r))
            continue
        yield n, e


def lines_of(path: Path) -> Iterator[bytes]:
    """Every line of a log, read a chunk at a time (a long run's log is GBs)."""
    size, pos = path.stat().st_size, 0
    while pos < size:
        data = read_chunk(path, pos, size)
        pos += len(data)
        yield from split_lines(data)


def replay(log: Path | Iterable[bytes | str], skipped: list[tuple[int, str]] | None = None) -> RunState:
    """The state a log leads to: ``log`` is its path, or its lines (an open file streams). With
    ``skipped``, the (line number, why) of each line that is no event is added to it."""
    st = RunState()
    lines = lines_of(Path(log)) if isinstance(log, (str, os.PathLike)) else log
    for _, e in decode_lines(lines, 1, (lambda n, why: skipped.append((n, why))) if skipped is not None else None):
        st.apply(e)
    return st


def take_over(path: Path) -> RunState:
    """The state of a run whose supervisor is gone, for the one that carries it on. Its log's torn
    last line (a supervisor killed while writing) is cut off first, so that new lines start on a
    line of their own (``eventlog.recover``)."""
    return replay(eventlog.recover(path))


class TakenOver(NamedTuple):
    state: RunState  # from its log (``take_over``): its ``last_seq`` is where the new supervisor goes on
    next_restart: int  # after every restart its log or its restarts/ folder knows of
    gone_pid: int  # the supervisor that was gone (0: unknown)


def take_over_run(run_dir: Path) -> TakenOver:
    """A run whose supervisor is gone, as the one that carries it on finds it."""
    gone_pid = rundir.supervisor_pid(run_dir)
    state = take_over(run_dir / EVENTS)
    made = [int(f.stem) for f in (run_dir / "restarts").glob("*.yaml") if f.stem.isdigit()]
    return TakenOver(state, max([state.restarts, *made]) + 1, gone_pid)


def periods(path: Path) -> tuple[float, float]:
    """(the heartbeat period, the log's period for a quiet worker's) of the first ``run`` event that
    has both, among the log's first lines (a supervisor's log begins with it); (1.0, 0.0) when there
    is none, or they are periods no run has (a hand-made or damaged log): nothing is filled."""
    with open(path, "rb") as f:
        head = f.read(CHUNK)
    for _, e in decode_lines(head.split(b"\n")[:PERIODS_IN], 1, None):
        if type(e) is ev.RunEvent and e.heartbeat_s and e.heartbeat_log_s:
            hb, every = e.heartbeat_s, e.heartbeat_log_s
            return (hb, every) if hb > 0 and 0 < every <= MAX_FILL * hb else (1.0, 0.0)
    return 1.0, 0.0


def skipped_note(path: Path, skipped: list[tuple[int, str]]) -> str:
    """One line on the lines of ``path`` that are no events ("" when none): how many, and the first
    one's number and why, so that `sed -n Np` shows it."""
    if not skipped:
        return ""
    n, why = skipped[0]
    why = " ".join(why.split())  # a kind or a message of the file's own may hold line breaks
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return f"{path}: skipped {len(skipped)} line(s) that are not events: line {n}: {why[:160]}{more}"
