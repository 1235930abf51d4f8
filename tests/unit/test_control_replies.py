"""A control request acts once: the supervisor's memory of the answers it gave, and the ids clients send."""

from __future__ import annotations

import msgspec

from gkd_core.supervisor.control_ops import RecentReplies
from gkd_core.telemetry import control


def body(req_id: int, op: str = "restart", **args) -> bytes:
    return msgspec.json.encode({"op": op, "args": args, "id": req_id, "by": "alice/cli"})


def test_a_repeat_gets_the_first_answer_and_is_counted():
    recent = RecentReplies()
    first = body(7, shrink=True)
    assert recent.answer(7, first) is None  # never seen: not a repeat
    recent.remember(7, first, b'{"ok":true,"id":7,"result":{"restart":1}}')
    assert recent.answer(7, first) == b'{"ok":true,"id":7,"result":{"restart":1}}'
    assert recent.answer(7, first) == b'{"ok":true,"id":7,"result":{"restart":1}}'
    assert recent.repeats == 2


def test_the_same_id_with_other_bytes_is_another_request():
    recent = RecentReplies()
    recent.remember(7, body(7, shrink=True), b"first")
    # two clients whose ids met by chance: the second's request is its own, not a repeat of the first
    assert recent.answer(7, body(7, shrink=False)) is None
    recent.remember(7, body(7, shrink=False), b"second")
    assert recent.answer(7, body(7, shrink=True)) == b"first"
    assert recent.answer(7, body(7, shrink=False)) == b"second"


def test_a_request_without_an_id_is_not_kept():
    recent = RecentReplies()
    recent.remember(0, body(0), b"answer")
    assert len(recent) == 0 and recent.answer(0, body(0)) is None


def test_the_memory_is_bounded_and_forgets_the_least_recently_asked_first():
    recent = RecentReplies(size=3)
    for i in (1, 2, 3):
        recent.remember(i, body(i), b"answer %d" % i)
    assert recent.answer(1, body(1)) == b"answer 1"  # asked again: now the most recent
    recent.remember(4, body(4), b"answer 4")
    assert len(recent) == 3
    assert recent.answer(2, body(2)) is None  # the least recently asked, forgotten
    assert [recent.answer(i, body(i)) for i in (1, 3, 4)] == [b"answer 1", b"answer 3", b"answer 4"]


def test_request_ids_are_distinct_positive_int64_with_a_prefix_per_process():
    ids = [control.new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(0 < i < 2**63 for i in ids)
    prefixes = {i >> 32 for i in ids}
    assert len(prefixes) == 1 and prefixes != {0}  # one process, one random prefix above the counter
    # what a forked child does first (os.register_at_fork): a prefix of its own, its counter from 1 again
    control._reseed_ids()
    child = control.new_request_id()
    assert child & 0xFFFFFFFF == 1 and child >> 32 not in (0, *prefixes)
