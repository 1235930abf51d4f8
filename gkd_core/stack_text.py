"""Stack text as a person reads it: the threads running your code first, and what a stack says.

A py-spy dump of a Ray actor lists the main thread first, and that thread is Ray's own task
loop; the thread stuck in ``sync_rollout_weights`` comes fourth or fifth. ``user_threads_first``
moves the threads with frames outside the libraries to the top (keeping every thread, in their
order otherwise). ``signature`` and ``where`` reduce a stack to the frames of its user thread, so
two dumps can be compared ("the same stack twice") and named in one line. They read the three
formats the capture methods produce: py-spy, faulthandler and Python's own traceback.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# frames from these are plumbing: Ray's loops, torch and its kin (py-spy writes their files as
# ray/..., torch/..., relative to site-packages), thread pools, our own reporter thread and the wrappers
# around a watched job's methods (integrations). An RL
# framework's own code (verl, OpenRLHF) is what a person looks for, so it is not listed.
LIBRARY = re.compile(r"site-packages|(?:^|[\s/(\"])(?:ray|torch|transformers|numpy|safetensors|tokenizers|zmq)/|"
                     r"_raylet|threading\.py|concurrent/futures|selectors\.py|queue\.py|socket\.py|asyncio/|"
                     r"gkd_core/telemetry|gkd_core/node|gkd_core/integrations|\(libc|\(libpython")
# a thread's first line, in py-spy's and faulthandler's words; or an asyncio call's (integrations/task_stacks)
THREAD_START = re.compile(r"^(Thread \S+|Current thread \S+|Task \S+)")
FRAME = re.compile(r"\.py[:\"]|\.py, line")
PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]+?)(?::(?P<line>\d+))?\)\s*$")
FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
TRACEBACK_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def is_user_frame(line: str) -> bool:
    return bool(FRAME.search(line)) and not LIBRARY.search(line)


def _blocks(text: str) -> tuple[list[str], list[list[str]]]:
    head: list[str] = []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if THREAD_START.match(line):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            head.append(line)
    return head, blocks


def user_threads_first(text: str) -> str:
    head, blocks = _blocks(text)
    if len(blocks) < 2:
        return text
    ranked = sorted(blocks, key=lambda b: not any(is_user_frame(line) for line in b[1:]))
    return "\n".join(head + [line for b in ranked for line in b])


def frames(block: list[str]) -> list[tuple[str, str, str]]:
    """(function, file, line) of a thread's frames, innermost first, whatever the format."""
    out = []
    for line in block[1:]:
        m = TRACEBACK_FRAME.match(line) or FAULTHANDLER_FRAME.match(line) or PYSPY_FRAME.match(line)
        if m:
            out.append((m["func"], m["file"], m["line"] or ""))
    if block and "most recent call last" in block[0]:  # Python's traceback: outermost first
        out.reverse()
    return out


def user_thread(text: str) -> list[tuple[str, str, str]]:
    """The frames of the first thread that runs code outside the libraries (or of the only one)."""
    head, blocks = _blocks(text)
    if not blocks and head:
        blocks = [["Thread ?"] + head]
    for b in blocks:
        fs = frames(b)
        if any(_is_user(f) for f in fs):
            return fs
    return frames(blocks[0]) if blocks else []


def _is_user(frame: tuple[str, str, str]) -> bool:
    func, file, _ = frame
    return ".py" in file and not LIBRARY.search(f"({file}")


def signature(text: str) -> tuple[str, ...]:
    """The user thread's functions, innermost first: equal for two dumps of a thread that has not
    moved (line numbers inside a waiting loop may differ; the calls do not)."""
    return tuple(func for func, _, _ in user_thread(text) if not func.startswith("0x"))


def where(text: str) -> str:
    """One line: the outermost and innermost user frames and what the thread is inside, e.g.
    "`RolloutWorker.sync_rollout_weights` (workers.py:334) → `WorkerBase._hang` (workers.py:117) → time_sleep"."""
    fs = [f for f in user_thread(text) if not f[0].startswith("0x")]
    users = [f for f in fs if _is_user(f)]
    if not users:
        return f"in {fs[0][0]}" if fs else ""

    def name(f: tuple[str, str, str]) -> str:
        return f"`{f[0]}` ({f[1].rsplit('/', 1)[-1]}{':' + f[2] if f[2] else ''})"

    parts = [name(users[-1])]
    if users[0] is not users[-1]:
        parts.append(name(users[0]))
    if fs[0] is not users[0]:
        parts.append(fs[0][0])
    return " → ".join(parts)


class StackGroup(NamedTuple):
    signature: tuple[str, ...]
    targets: list[str]
    where: str
    text: str  # one member's user thread, outermost call first


def user_thread_text(text: str) -> str:
    """The user thread's frames as lines, outermost call first (the way a person reads a call path),
    from its first frame of user code on."""
    fs = [f for f in reversed(user_thread(text)) if not f[0].startswith("0x")]
    first = next((i for i, f in enumerate(fs) if _is_user(f)), 0)
    lines = ["  …"] if first else []
    lines += [f"  {func} ({file}{':' + line if line else ''})" for func, file, line in fs[first:]]
    return "\n".join(lines)


def group(stacks: dict[str, str], lead: frozenset[str] | set[str] = frozenset()) -> list[StackGroup]:
    """Identical stacks together (the user thread's calls, as LLNL's STAT merges ranks), the odd ones
    out first: groups holding a worker in ``lead`` (those an alert names), then the smallest."""
    by_sig: dict[tuple[str, ...], list[str]] = {}
    for target in sorted(stacks, key=_natural):
        by_sig.setdefault(signature(stacks[target]), []).append(target)
    groups = [StackGroup(sig, members, where(stacks[members[0]]), user_thread_text(stacks[members[0]]))
              for sig, members in by_sig.items()]
    return sorted(groups, key=lambda g: (not set(g.targets) & set(lead), len(g.targets), _natural(g.targets[0])))


def grouped_report(stacks: dict[str, str], lead: frozenset[str] | set[str] = frozenset(),
                   notes: dict[str, str] | None = None) -> str:
    """The summary first (a line per group: how many, who, where), then each group's stack, then the
    workers whose stack could not be read and why."""
    groups = group(stacks, lead)
    notes = notes or {}
    out = [describe_group(g) for g in groups]
    out += [f"{t}: no stack: {why}" for t, why in sorted(notes.items()) if t not in stacks]
    for g in groups:
        out.append("")
        out.append(describe_group(g))
        out.append(g.text)
        out += [f"  # {t}: {notes[t]}" for t in g.targets if t in notes]
    return "\n".join(out)


def describe_group(g: StackGroup) -> str:
    n = len(g.targets)
    names = ", ".join(g.targets[:8]) + (f" … (+{n - 8})" if n > 8 else "")
    return f"{n} worker{'s' if n > 1 else ''} ({names}): {g.where or 'no frames read'}"


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
