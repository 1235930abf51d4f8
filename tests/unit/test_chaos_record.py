"""The random trials' fault matrix (tests/chaos/chaos_table.py), rendered from records written here: a cell's precision
counts every naming of the diagnosis in its trials, recall every trial of it the driver did not report first, the
overall precision the healthy windows' false alarms too; a trial started and never ended is in the table; older
runners' rows are left out, said so."""

from __future__ import annotations

import importlib.util
import sys

from conftest import ROOT

sys.path[:0] = [str(ROOT / "tests" / "chaos")]
_spec = importlib.util.spec_from_file_location("chaos_table", ROOT / "tests" / "chaos" / "chaos_table.py")
chaos_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chaos_table)

COMMAND = "python bench/chaos_trials.py --trials 2"


def fault(seed, kind, target, named, after_s=2.0, by="diagnosis", code="heartbeat_stale", moment="after_step",
          phase="idle", student_phase="train", what="stop", runner=3):
    right = bool(named) and target in named and after_s <= chaos_table.within_s(what)
    return [{"runner": runner, "command": COMMAND, "seed": seed, "kind": kind, "status": "started"},
            {"runner": runner, "command": COMMAND, "seed": seed, "kind": kind, "status": "done", "target": target,
             "fault": what, "moment": moment, "phase": phase, "student_phase": student_phase, "named": named,
             "code": code if named else "", "by": by if named else "", "message": "", "after_s": after_s if named
             else None, "right": right}]


def row_of(table: str, kind: str, what: str = "signal") -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {what} | {kind} |" if kind != "**all**" else
                                                               "| **all** |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_matrix_counts_every_naming_against_the_kind_it_names():
    record = [
        {"seed": "25/0", "kind": "student", "right": True, "command": "old"},  # the first runner's: left out
        {"runner": 2, "command": "older", "seed": "38/0", "kind": "student", "status": "started"},  # so are runner 2's
        {"runner": 2, "command": "older", "seed": "38/0", "kind": "student", "status": "done", "right": False},
        *fault("1/0", "student", "student/0", ["student/0"], 4.0),
        *fault("1/1", "student", "student/0", ["student/0"], 1.0, by="driver", code="driver_failed",
               moment="in_sync", phase="sync_weights"),
        *fault("1/2", "rollout", "rollout/1", ["student/0"], 3.0),  # the wrong process: against the student's precision
        *fault("1/3", "rollout", "rollout/0", ["rollout/0"], 12.0),  # right, but too late: a miss
        *fault("1/4", "agent", "agent/vm", []),  # nothing named
        {"runner": 3, "command": COMMAND, "seed": "1/5", "kind": "healthy", "status": "started"},
        {"runner": 3, "command": COMMAND, "seed": "1/5", "kind": "healthy", "status": "done", "window_s": 60.0,
         "steps": 100,
         "alarms": [{"code": "heartbeat_stale", "targets": ["rollout/0"], "message": "", "after_s": 3.0}],
         "warnings": {"slower_than_usual": 2, "heartbeat_stale": 1}},
        # the runner died in it
        {"runner": 3, "command": COMMAND, "seed": "1/6", "kind": "driver", "status": "started"},
        {"runner": 3, "command": COMMAND, "seed": "1/7", "kind": "proxy", "status": "started"},
        {"runner": 3, "command": COMMAND, "seed": "1/7", "kind": "proxy", "status": "crashed",
         "error": "TimeoutError: x"},
    ]
    table = chaos_table.render(record)
    student = row_of(table, "student")
    # the driver's report (1/1) is its own column, out of the diagnosis's trials, recall and times
    assert student[2:14] == ["2", "0 / 2", "1 / 1", "1 / 1, 1.0 s", "1", "1", "0", "0", "1.00", "1.00", "1.00",
                             "4.0 s, 4.0 s"]
    # two namings in the rollouts' trials: the wrong process, and the right one too late (precision's, not recall's)
    rollout = row_of(table, "rollout")
    assert rollout[2:13] == ["2", "0 / 2", "0 / 0", "0 / 0, -", "2", "0", "1", "1", "0.50", "0.00", "0.00"]
    agent = row_of(table, "agent")
    assert agent[8:12] == ["0", "1", "-", "0.00"]
    everyone = row_of(table, "**all**")
    # the diagnosis's own: 2 of its 4 namings on target (a false alarm among them); 1 of its 4 trials right
    assert everyone[5:7] == ["1 / 1, 1.0 s", "4"]
    assert everyone[10:14] == ["**0.50**", "**0.25**", "**0.33**", "**4.0 s, 4.0 s**"]
    assert "8 trials started" in table and "2 did not end" in table
    assert "`1/6` driver: no end: the runner died in it" in table and "`1/7` proxy: crashed: TimeoutError: x" in table
    assert "Left out: the 1 trials of runner 1 (`--seed` 25)" in table
    assert "Left out: the 1 trials of runner 2 (`--seed` 38). It ran against the diagnosis before" in table
    assert ("false alarms (a critical alert, or a warning that names a fault by its nature, with no fault): 1; "
            "warnings: heartbeat_stale 1, "
            "slower_than_usual 2.") in table
    assert "`1/5` heartbeat_stale on rollout/0, 3.0 s into the window" in table
    assert "`1/2` stop of rollout/1 (after_step, in idle; student in train): heartbeat_stale named student/0" in table
    assert "Here: not met (recall under 0.9, or under 20 trials: signal on student (2 trials), signal on rollout, " \
           "signal on teacher (no trials)" in table


def test_each_fault_is_its_cell_and_a_cell_of_its_own_bound_is_out_of_the_p90_goal():
    """The widened matrix: a row per fault and kind of process it strikes; memory growth is named right within its own
    bound (15 s) and its times stay out of the p90 goal's; a cell whose recall is under 0.9 fails the goal, named."""
    record = [
        *fault("2/0", "rollout", "rollout/1", ["rollout/1"], 5.5, code="collective_not_joined", moment="armed",
               what="never_joins", runner=4),
        *fault("2/1", "rollout", "rollout/0", ["rollout/0"], 5.0, code="collective_not_joined", moment="armed",
               what="never_joins", runner=4),
        *fault("2/2", "teacher", "teacher/0", ["teacher/0"], 12.5, code="memory_growing", moment="armed", what="oom",
               runner=4),
        *fault("2/3", "teacher", "teacher/0", [], what="teacher_errors", moment="armed", runner=4),
        *fault("2/4", "ray_actors", "Trainer/0", ["Inference/0", "Trainer/0"], 5.5, code="deadlock",
               moment="after_healthy", what="deadlock", runner=4),
    ]
    record[-1]["how"] = "calls"
    record += fault("2/5", "ray_actors", "Learner/0", ["Learner/0"], 5.5, code="deadlock", moment="after_healthy",
                    what="deadlock", runner=4)  # one member of the cycle named: the wrong naming, not on target
    record[-1].update(how="collective", members=["Learner/0", "Rollout/0"], right=False)
    table = chaos_table.render(record)
    assert row_of(table, "ray_actors", "deadlock")[2:11] == ["2", "1 / 1", "0 / 0", "0 / 0, -", "2", "1", "1", "0",
                                                             "0.50"]
    assert row_of(table, "rollout", "never_joins")[2:14] == ["2", "-", "0 / 0", "0 / 0, -", "2", "2", "0", "0",
                                                             "1.00", "1.00", "1.00", "5.0 s, 5.5 s"]
    assert row_of(table, "teacher", "oom")[7:14] == ["1", "0", "0", "1.00", "1.00", "1.00",
                                                     "12.5 s, 12.5 s (15 s bound)"]
    assert row_of(table, "teacher", "teacher_errors")[7:12] == ["0", "0", "1", "-", "0.00"]
    assert row_of(table, "**all**")[13] == "**5.5 s, 5.5 s**"  # the oom cell's 12.5 s is under its own bound
    assert "| signal | student | 0 | no trials yet |" in table  # a cell with none is there, and not met
    assert ", teacher_errors on teacher, " in table.split("Here: not met")[1]
    assert "`2/3` teacher_errors of teacher/0 (armed, in idle; student in train): nothing named in 15 s" in table
    assert "Runner 3's rows" not in table  # said only where the matrix holds them


def test_the_table_check_says_no_when_the_file_is_not_the_record(tmp_path):
    record = fault("1/0", "student", "student/0", ["student/0"])
    path = tmp_path / "CHAOS.md"
    path.write_text("# head\n")
    chaos_table.write_table(path, record)
    assert chaos_table.table_in(path.read_text()) == chaos_table.block(record)
    chaos_table.write_table(path, record + fault("1/1", "rollout", "rollout/0", []))  # written again: replaced
    assert path.read_text().count(chaos_table.MARK[0]) == 1 and path.read_text().startswith("# head\n")
    assert chaos_table.table_in(path.read_text()) != chaos_table.block(record)


def test_p90_is_a_time_that_was_measured():
    assert chaos_table.nearest_rank(list(range(1, 21)), 0.9) == 18
    assert chaos_table.nearest_rank([5.0], 0.9) == 5.0


def documents() -> str:
    """README and docs/, their white space made single (a sentence may be wrapped anywhere)."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return " ".join(" ".join(p.read_text().split()) for p in docs)


def test_the_docs_figures_are_the_records():
    """The docs quote the matrix's totals: they must be what the committed record renders."""
    table = chaos_table.render(chaos_table.read_record(ROOT / "bench" / "chaos_trials.jsonl"))
    everyone = row_of(table, "**all**")
    precision, recall, f1 = (x.strip("*") for x in everyone[10:13])
    p50, p90 = everyone[13].strip("*").split(", ")
    reported_right, reported = everyone[5].split(",")[0].split(" / ")
    report_p50 = everyone[5].split(", ")[1]
    readme = documents()
    faults, diagnosed = everyone[2], everyone[6]
    alarms = table.split("by its nature, with no fault): ")[1].split(";")[0]
    said = (f"Over {faults} faults",
            f"the diagnosis's own {diagnosed}: precision {precision}, recall {recall}, F1 {f1}",
            f"time to name p50 {p50} and p90 {p90}", f"{alarms} false alarms",
            f"the driver reported the other {reported} first ({reported_right} right, p50 {report_p50})")
    assert all(s in readme for s in said), f"the docs' random-trial figures are not the record's: {said}"


def test_the_docs_frozen_times_are_the_suites_table():
    """The docs quote the chaos suite's table (tests/chaos/CHAOS.md) for how soon a frozen process is named: each
    component's seconds, their range and the supervisor's, as the committed table has them."""
    rows = {row[0]: row for row in (row_of_line(x) for x in (ROOT / "tests" / "chaos" / "CHAOS.md").read_text()
                                    .splitlines() if x.startswith("| ") and "| SIGSTOP" in x)}

    def seconds(component: str) -> str:
        return rows[component][3].rsplit("; ", 1)[-1].rsplit(", ", 1)[-1].removesuffix(" s")

    said = {c: seconds(c) for c in ("driver", "student/0", "rollout/0", "teacher/proxy", "teacher/0", "node agent")}
    low, high = min(said.values(), key=float), max(said.values(), key=float)
    readme = documents()
    sentence = (f"in {low}–{high} s over the six processes of the run (CHAOS.md's table, one run of the suite: "
                "the driver "
                f"{said['driver']} s, the student {said['student/0']}, a rollout {said['rollout/0']}, the teacher's "
                f"proxy {said['teacher/proxy']} and worker {said['teacher/0']}, the node agent {said['node agent']}:")
    assert sentence in readme, f"the docs' frozen-process times are not tests/chaos/CHAOS.md's: want {sentence!r}"
    supervisor = seconds("supervisor")
    assert f"a frozen supervisor is said by `gkd-tui status` in {supervisor} s" in readme


def row_of_line(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]
