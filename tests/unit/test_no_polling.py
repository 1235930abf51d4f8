"""No loop polls the state for an answer: a wait for a dump's answer (or any change of a run's state) wakes when
events are applied (``sources.wait_for``, ``RunSubscriber.pump_until``, the supervisor's hand-over on its loop),
never by sleeping and looking again. A ``while`` loop that sleeps and reads a ``state`` is one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHERE = ("gkd_tui", "gkd_core/supervisor", "gkd_core/subscriber.py")


def sleep_loops_over_state(source: str) -> list[int]:
    """The lines of the ``while`` loops in ``source`` that call ``time.sleep`` and read a ``state``."""
    found = []
    for loop in ast.walk(ast.parse(source)):
        if not isinstance(loop, ast.While):
            continue
        inside = list(ast.walk(loop))
        sleeps = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "sleep"
                     for n in inside)
        reads_state = any(isinstance(n, ast.Attribute) and n.attr == "state" or isinstance(n, ast.Name)
                          and n.id == "state" for n in inside)
        if sleeps and reads_state:
            found.append(loop.lineno)
    return found


def test_the_finder_finds_a_sleep_loop_over_state():
    # (a finder that finds nothing would prove nothing: the loop app.py had)
    assert sleep_loops_over_state(
        "while time.monotonic() < deadline:\n"
        "    with self.source.lock:\n"
        "        answer = self.source.state.dump_answer(dump_id)\n"
        "    if answer is not None:\n"
        "        return answer\n"
        "    time.sleep(0.1)\n") == [1]
    assert sleep_loops_over_state("while not stop.is_set():\n    time.sleep(1.0)\n") == []


def test_no_loop_in_the_dashboard_the_commands_or_the_supervisor_sleeps_over_a_state():
    files = [p for w in WHERE for p in ([ROOT / w] if w.endswith(".py") else sorted((ROOT / w).rglob("*.py")))]
    assert len(files) > 20
    found = {str(p.relative_to(ROOT)): lines for p in files if (lines := sleep_loops_over_state(p.read_text()))}
    assert found == {}
