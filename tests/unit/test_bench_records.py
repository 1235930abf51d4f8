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
    monkeypatch.setattr(records, "README", tmp_path / "README.md")
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
    assert "`python bench/bench_stacks.py --workers 16`: 3 runs recorded" in text
    assert "gkd agent 0.70s 7.0x" in text and "gkd agent 0.76s" not in text  # the newest table, as printed
    assert "- a node's stacks: 0.760 s (0.700-0.800), 3 runs" in text
    assert "- against sequential: 6.70x (6.10-7.00), 3 runs" in text
    assert "gkd agent 0.70s 7.0x" in capsys.readouterr().out  # printed as usual too
    # README's summary: each figure with its command and its count of runs
    assert ("| a node's stacks | 0.760 s (0.700-0.800), 3 runs | `python bench/bench_stacks.py --workers 16` |"
            in (bench_dir / "README.md").read_text())


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
    readme = (ROOT / "README.md").read_text()
    assert records.with_summary(readme, text) == readme, "README's summary: run `python bench/records.py`"
