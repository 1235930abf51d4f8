"""bench/records.py: a bench run kept as a line of its record, RESULTS' block rendered from the record alone
(the runs counted, the newest table as printed, each figure's median (min-max)), and the check that fails on
a block that is not its record's or a figure typed into the prose by hand."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import ROOT

_spec = importlib.util.spec_from_file_location("records", ROOT / "bench" / "records.py")
records = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(records)

RESULTS_TEXT = """# Benchmark results

## Stacks — `python bench/bench_stacks.py --workers 16`

<!-- record: stacks -->
<!-- /record: stacks -->

Reading it: the agent dumps a node's workers at once.
"""


@pytest.fixture
def bench_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(records, "RESULTS", tmp_path / "RESULTS.md")
    monkeypatch.setattr(records, "SUMMARY_DOC", tmp_path / "README.md")  # (a summary document of its own)
    monkeypatch.setattr(records, "prose_docs", lambda: [tmp_path / "README.md"])
    (tmp_path / "RESULTS.md").write_text(RESULTS_TEXT)
    (tmp_path / "README.md").write_text("# gkd-tui\n\n<!-- records: summary -->\n<!-- /records: summary -->\n")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "bench_stacks.py"), "--workers", "16"])
    return tmp_path


def kept_run(seconds: float, ratio: float) -> None:
    with records.kept("stacks") as run:
        print(f"gkd agent {seconds:.2f}s {ratio:.1f}x")
        run.figure("a node's stacks", seconds, " s")
        run.figure("against sequential", ratio, "x")


def test_each_run_is_a_line_and_the_block_counts_them_shows_the_newest_and_the_spread(bench_dir, capsys):
    kept_run(0.76, 6.7)
    kept_run(0.80, 6.1)
    # no median of two
    assert "- a node's stacks: 0.760 s and 0.800 s, 2 runs" in (bench_dir / "RESULTS.md").read_text()
    kept_run(0.70, 7.0)
    lines = (bench_dir / "records" / "stacks.jsonl").read_text().splitlines()
    assert [json.loads(x)["command"] for x in lines] == ["python bench/bench_stacks.py --workers 16"] * 3
    text = (bench_dir / "RESULTS.md").read_text()
    assert "`python bench/bench_stacks.py --workers 16`: 3 runs of its newest code recorded" in text
    assert "gkd agent 0.70s 7.0x" in text and "gkd agent 0.76s" not in text  # the newest table, as printed
    assert "- a node's stacks: 0.760 s (0.700-0.800), 3 runs" in text
    assert "- against sequential: 6.70x (6.10-7.00), 3 runs" in text
    assert "gkd agent 0.70s 7.0x" in capsys.readouterr().out  # printed as usual too
    # README's summary: each figure with its command, its count of runs and their day
    today = json.loads(lines[-1])["when"][:10]
    assert (f"| a node's stacks | 0.760 s (0.700-0.800), 3 runs | {today} "
            "| `python bench/bench_stacks.py --workers 16` |"
            in (bench_dir / "README.md").read_text())


def test_a_figure_is_its_newest_codes_runs_and_older_code_stays_as_history(bench_dir, monkeypatch, capsys):
    """Runs of the code before a change are not pooled with the runs after it: the block's spread and README's
    summary are the newest code's; the older runs are counted as history. The check fails on a summary that
    mixes them."""
    monkeypatch.setattr(records, "STARTED_WITH", "old-code")
    kept_run(2.00, 1.0)
    kept_run(2.20, 1.1)
    monkeypatch.setattr(records, "STARTED_WITH", "new-code")
    kept_run(0.70, 7.0)
    kept_run(0.80, 6.0)
    kept_run(0.90, 6.5)
    text = (bench_dir / "RESULTS.md").read_text()
    assert "3 runs of its newest code recorded" in text and "2 earlier runs of older code kept in the record" in text
    assert "- a node's stacks: 0.800 s (0.700-0.900), 3 runs" in text
    readme = (bench_dir / "README.md").read_text()
    assert "| a node's stacks | 0.800 s (0.700-0.900), 3 runs |" in readme and "2.20" not in readme
    # the summary as a pooling of every run would write it: the check says no
    mixed = records.figures_of(records.read("stacks"))[0][1]
    assert mixed == "0.900 s (0.700-2.200), 5 runs"
    (bench_dir / "README.md").write_text(readme.replace("0.800 s (0.700-0.900), 3 runs", mixed))
    monkeypatch.setattr(sys, "argv", ["records.py", "--check"])
    assert records.main() == 1
    assert "README.md's summary of the records is not theirs" in capsys.readouterr().err
    # an older code's figure is history: prose that quotes it as today's fails the check too
    assert [f for _, f in records.figures_typed_by_hand("`bench_stacks.py`: 2.20 s, 0.900 s.\n",
                                                        records.recorded_figures(), [])] == ["2.20 s"]
    # a run recorded before runs carried their code is a version of its own
    assert records.newest_code([{"when": "x"}, {"when": "y"}]) == [{"when": "y"}]


def test_the_code_version_is_the_measured_source_and_the_bench(tmp_path):
    script = tmp_path / "bench_x.py"
    script.write_text("print(1)\n")
    before = records.code_version(script)
    assert records.code_version(script) == before and len(before) == 12
    script.write_text("print(2)\n")
    assert records.code_version(script) != before


def test_a_figure_typed_into_readmes_prose_fails_the_check_unless_a_record_or_its_day_says_it(bench_dir, monkeypatch,
                                                                                              capsys):
    kept_run(0.76, 6.7)
    monkeypatch.setattr(sys, "argv", ["records.py", "--check"])
    assert records.main() == 0
    readme = bench_dir / "README.md"
    good = readme.read_text()

    def check_with(prose: str) -> str:
        readme.write_text(good + "\n" + prose + "\n")
        records.main()
        return capsys.readouterr().err

    # typed by hand: a measurement no record shows, or one that a record shows only as a bare number ("2", "5")
    err = check_with("The supervisor held 37 % of a core, and the dump took 2 s.")
    assert "README.md:" in err and "'37 %' is in no record" in err and "'2 s' is in no record" in err
    assert "'p99 139' is in no record" in check_with("Its p99 139 over the rounds.")
    assert "'Precision: 0.93' is in no record" in check_with("Precision: 0.93, a measure.")
    err = check_with("Its p99 139 ms, faster by 4.2x.")  # a unit after it: the figure is "139 ms", not "p99 13"
    assert "'139 ms' is in no record" in err and "'4.2x' is in no record" in err and "p99 13'" not in err
    # a record's figure, in a paragraph that cites its bench: quoted, not typed
    assert "README.md:" not in check_with("`python bench/bench_stacks.py --workers 16` read 0.760 s, 6.70x.")
    assert "'0.760 s' is in no record" in check_with("A node's stacks take 0.760 s.")  # cites no bench
    # a one-off observation says its day; settings and bounds, and the product's quoted words, are no figures
    assert "README.md:" not in check_with("Named in 5.2 s (one run, 2026-11-28).")
    assert "README.md:" not in check_with('Every 10 s, at most 2 s, a timeout of 600 s: "held 12 s".')


def test_a_smoke_run_or_a_failed_one_records_nothing(bench_dir):
    with records.kept("stacks", smoke=True):
        print("smallest sizes")
    with pytest.raises(RuntimeError):
        with records.kept("stacks"):
            print("half a table")
            raise RuntimeError("a rank died")
    assert not (bench_dir / "records" / "stacks.jsonl").exists()


def test_the_check_fails_on_a_block_edited_by_hand_and_on_a_figure_typed_into_the_prose(bench_dir, monkeypatch,
                                                                                          capsys):
    kept_run(0.76, 6.7)
    monkeypatch.setattr(sys, "argv", ["records.py", "--check"])
    assert records.main() == 0
    results = bench_dir / "RESULTS.md"
    good = results.read_text()

    results.write_text(good.replace("6.7x", "9.9x"))  # a figure of the block changed by hand
    assert records.main() == 1
    assert "stacks are not what their records render" in capsys.readouterr().err

    results.write_text(good.replace("at once.", "at once, 6.7x faster (and 12x on a bigger node)."))
    assert records.main() == 1
    err = capsys.readouterr().err
    assert "12 is in the prose but in none of the section's tables" in err and "6.7 is" not in err
    assert "bench/RESULTS.md:" in err and "'12x' is in no record" in err and "'6.7x'" not in err

    readme = bench_dir / "README.md"
    summary = readme.read_text()
    readme.write_text(summary.replace("3 runs", "4 runs").replace("one run", "two runs"))  # README's summary edited
    assert records.main() == 1
    assert "README.md's summary of the records is not theirs" in capsys.readouterr().err
    readme.write_text(summary)

    (bench_dir / "records" / "stacks.jsonl").unlink()  # a record lost: the block says there is none, the check fails
    assert records.main() == 1
    assert "No run of this bench is recorded yet" in records.with_blocks(good)


def test_results_md_is_its_records():
    """The committed bench/RESULTS.md against the committed records (CI runs the same in bench/smoke.sh)."""
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    assert records.with_blocks(text) == text, "run `python bench/records.py` and commit the result"
    assert records.typed_figures(text) == [], "figures in RESULTS' prose that no block from a record shows"
    known = records.recorded_figures()
    assert records.figures_typed_by_hand(text, known, [records.BLOCK, *records.OTHER_BLOCKS]) == []
    for doc in records.prose_docs():  # README and docs/
        assert records.figures_typed_by_hand(doc.read_text(), known, [records.SUMMARY_BLOCK]) == [], (
            f"figures in {doc.name}'s prose from no record and not dated: quote a record, or say the day it was seen")
    summary = (ROOT / "docs" / "benchmarks.md").read_text()
    assert records.with_summary(summary, text) == summary, "docs/benchmarks.md's summary: run `python bench/records.py`"


def test_a_records_day_and_time_are_no_figures_the_prose_may_lean_on(bench_dir, monkeypatch, capsys):
    """A run on December 12th at 12:12: its block holds "2026-12-12 12:12", and a "12x" typed into the prose is still
    a figure no table shows (the check once took the date's digits for one, and passed it)."""
    monkeypatch.setattr(records.time, "strftime", lambda fmt, t=None: "2026-12-12 12:12")
    kept_run(0.76, 6.7)
    results = bench_dir / "RESULTS.md"
    assert "2026-12-12" in results.read_text()
    monkeypatch.setattr(sys, "argv", ["records.py", "--check"])
    assert records.main() == 0
    results.write_text(results.read_text().replace("at once.", "at once, and 12x on a bigger node."))
    assert records.main() == 1
    assert "12 is in the prose but in none of the section's tables" in capsys.readouterr().err
