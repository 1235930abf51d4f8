"""Every alert code is defined once (gkd_core/vocab.py): each code raised anywhere is in the table, raised
where the table says, and each code in the table is raised somewhere or marked reserved."""

from __future__ import annotations

import ast
from pathlib import Path

from gkd_core import vocab

ROOT = Path(__file__).resolve().parents[2]
WHERE = {"rules": "gkd_core/diagnosis/", "supervisor": "gkd_core/supervisor/", "driver": "gkd_core/trainer/",
         "ray_state": "gkd_core/node/ray_cluster.py"}


def spelled() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(code -> the files that raise it, code -> the files that compare with it): an ``AlertEvent(code="x")``
    or ``code = "x"`` raises; ``….code == "x"`` compares."""
    raised: dict[str, set[str]] = {}
    compared: dict[str, set[str]] = {}
    for path in sorted([*ROOT.glob("gkd_core/**/*.py"), *ROOT.glob("gkd_tui/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            found, into = [], raised
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "AlertEvent":
                found = [k.value for k in node.keywords if k.arg == "code"]
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "code" for t in node.targets):
                found = [node.value]
            elif isinstance(node, ast.Compare) and getattr(node.left, "attr", "") == "code":
                found, into = node.comparators, compared
            for value in found:
                # (an exit code's variable is called `code` too: its text is no identifier)
                if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.isidentifier():
                    into.setdefault(value.value, set()).add(rel)
    return raised, compared


def test_every_code_raised_is_in_the_table_and_raised_where_it_says():
    raised, compared = spelled()
    assert len(raised) >= 20  # the scan finds them (a scan that finds nothing would pass the rest)
    assert sorted(set(raised) - set(vocab.ALERTS)) == []
    assert sorted(set(compared) - set(vocab.ALERTS)) == []
    for code, files in raised.items():
        where = WHERE[vocab.ALERTS[code].by]
        assert all(f.startswith(where) for f in files), (code, vocab.ALERTS[code].by, sorted(files))


def test_every_code_in_the_table_is_raised_somewhere():
    raised, _ = spelled()
    unraised = [c for c, k in vocab.ALERTS.items() if c not in raised and not k.reserved]
    assert unraised == []


def test_the_lists_the_project_reads_come_from_the_table():
    from gkd_core import diagnosis
    from gkd_core.diagnosis import cascade, plan, rules
    from gkd_tui.widgets import worker_groups

    assert set(rules.CODES) == {c for c, k in vocab.ALERTS.items() if k.by == "rules"}
    assert set(diagnosis.AUTO_STACK_CODES) == set(vocab.codes(stacks=True)) >= {"straggler", "collective_stuck"}
    assert set(cascade.CAUSE_CODES) == set(vocab.codes(cause=True)) >= {"actor_dead", "teacher_not_serving"}
    assert set(plan.LATE) == set(vocab.codes(late=True))
    assert worker_groups.CODE_WORD["heartbeat_stale"] == "stale" and "disk_low" not in worker_groups.CODE_WORD
