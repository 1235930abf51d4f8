"""What a bench measured, kept, and the tables in bench/RESULTS.md made from it alone.

Every full run of a bench appends one line to ``bench/records/NAME.jsonl``: the command as typed, when,
the machine, the code it ran (a digest of the product's source and the bench's own: runs of the same code
share it, whatever the commit), the table it printed, and the figures it names (numbers, for the spread
over runs). RESULTS shows a record between ``<!-- record: NAME -->`` and ``<!-- /record: NAME -->``: for
each command the runs of the newest code it ran (older runs stay in the record as history, counted), the
newest run's table as printed, and each figure's median (min-max) over those runs; docs/benchmarks.md's summary the
same figures. A run recorded before the code was kept has no digest: it is a version of its own.

``python bench/records.py --check`` renders every block and the summary again and fails on any difference
(a summary that mixes code versions among them), and on a figure typed by hand: a number with a unit
("139 ms", "1.89 %", "23.6x") or a p50/p99/precision/recall/F1 in the prose of RESULTS, README or docs/ that no
record shows, in a paragraph that does not say the day it was seen (a one-off observation, "one run,
2026-11-28"). Settings and bounds are not figures: a number after "every", "within", "at most", "under",
"timeout" and the like, and the product's own words in double quotes. A ``--smoke`` run records nothing:
it is the same code path on sizes nobody should quote.

    python bench/records.py            # write every block from its record
    python bench/records.py --check    # CI: fail where RESULTS is not its records
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "bench" / "records"
RESULTS = ROOT / "bench" / "RESULTS.md"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SUMMARY_DOC = DOCS / "benchmarks.md"  # the summary of every record's figures
CHAOS = ROOT / "tests" / "chaos" / "CHAOS.md"
# the code a bench measures: what its version digest is made of (with the bench's own script)
MEASURED = ("gkd_core", "gkd_tui")
MEASURED_FILES = ("*.py", "*.tcss")  # the dashboard's stylesheet too: the dashboard bench draws with it
# SUMMARY_DOC's summary of every record's figures, between these (written and checked with RESULTS' blocks)
SUMMARY = ("<!-- records: summary -->", "<!-- /records: summary -->")
SUMMARY_BLOCK = re.compile(r"<!-- records: summary -->\n.*?<!-- /records: summary -->", re.S)
BLOCK = re.compile(r"<!-- record: (?P<name>[\w-]+) -->\n.*?<!-- /record: (?P=name) -->", re.S)
# the other generated tables in RESULTS and CHAOS.md (their benches render and check them themselves)
OTHER_BLOCKS = [re.compile(r"<!-- restart under load -->\n.*?<!-- /restart under load -->", re.S),
                re.compile(r"<!-- random trials -->\n.*?<!-- /random trials -->", re.S),
                re.compile(r"<!-- ettr -->\n.*?<!-- /ettr -->", re.S)]


def machine() -> str:
    return f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}"


def command() -> str:
    """The command that is running, as a user types it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script.name
    # the main venv's python is `python` (README: activated); another of the repository's venvs is named
    venv = Path(sys.prefix).resolve()
    python = (f"{venv.relative_to(ROOT)}/bin/python" if venv.is_relative_to(ROOT) and venv.name != ".venv"
              else "python")
    return " ".join([python, str(shown), *sys.argv[1:]])


def code_version(script: Path | None = None) -> str:
    """A digest of the source a bench measures (``MEASURED``'s Python files) and of its own script, as they
    are on disk: two runs share it exactly when they ran the same code, committed or not."""
    script = script or Path(sys.argv[0]).resolve()
    digest = hashlib.sha1()
    files = sorted(f for top in MEASURED for kind in MEASURED_FILES for f in (ROOT / top).rglob(kind))
    for f in [*files, script] if script.is_file() else files:
        digest.update(str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name).encode())
        digest.update(hashlib.sha1(f.read_bytes()).digest())
    return digest.hexdigest()[:12]


# the code a run measures, read as it starts (a bench imports this module first): an edit made while a long run
# goes on does not relabel what it measured
STARTED_WITH = code_version()


def save(name: str, command: str, table: str, figures: dict[str, float] | None = None,
         units: dict[str, str] | None = None) -> Path:
    """One run of bench ``name``: appended to its record, and its block in RESULTS written again.

    ``figures``: label -> number, each summed up over the runs of the same command as median (min-max);
    ``units``: label -> what follows the number ("ms", "x", " %"). The table is kept as printed."""
    RECORDS.mkdir(exist_ok=True)
    path = RECORDS / f"{name}.jsonl"
    row = {"command": command, "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": machine(),
           "code": STARTED_WITH, "table": table.rstrip("\n"), "figures": figures or {}, "units": units or {}}
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    text = RESULTS.read_text()
    if f"<!-- record: {name} -->" in text:
        RESULTS.write_text(with_blocks(text))
        SUMMARY_DOC.write_text(with_summary(SUMMARY_DOC.read_text(), RESULTS.read_text()))
    else:
        print(f"bench/RESULTS.md has no block for {name}: add `<!-- record: {name} -->` and "
              f"`<!-- /record: {name} -->` where its table goes, then run `python bench/records.py`", file=sys.stderr)
    return path


class Kept:
    """What a run prints inside ``with kept(...)``, and the figures it names: saved when the block ends well."""

    def __init__(self):
        self.figures: dict[str, float] = {}
        self.units: dict[str, str] = {}

    def figure(self, label: str, value: float, unit: str = "") -> None:
        self.figures[label] = float(value)
        self.units[label] = unit


class _Tee(io.TextIOBase):
    def __init__(self, out):
        self.out, self.text = out, io.StringIO()

    def write(self, s: str) -> int:
        self.text.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def kept(name: str, smoke: bool = False):
    """Print the table inside this block: it is shown as usual and, unless ``smoke``, saved as a run of ``name``
    with the figures given to ``.figure()``. A run that fails inside the block records nothing."""
    run = Kept()
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield run
    if not smoke:
        path = save(name, command(), tee.text.getvalue().strip("\n"), run.figures, run.units)
        print(f"(recorded in bench/records/{path.name}, and its block in bench/RESULTS.md written again)")


def read(name: str) -> list[dict]:
    path = RECORDS / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def decimals(value: float) -> int:
    """Three significant digits, no more decimals than three, none past the units (1,234 not 1,234.5)."""
    if value == 0:
        return 0
    return max(0, min(3, 2 - math.floor(math.log10(abs(value)))))


def number(value: float, places: int) -> str:
    return f"{value:,.{places}f}"


def newest_code(runs: list[dict]) -> list[dict]:
    """The runs (of one command) of the code its newest run ran: those sharing its digest, or the newest
    alone when it was recorded without one."""
    code = runs[-1].get("code")
    return [r for r in runs if code and r.get("code") == code] or runs[-1:]


def render(name: str, runs: list[dict]) -> str:
    """The block for one record: per command, its newest code's runs, the newest table, and each figure's
    spread over those runs; the older runs counted as history."""
    if not runs:
        return (f"No run of this bench is recorded yet (bench/records/{name}.jsonl): the command in the heading "
                "makes the first.")
    out = []
    for command in dict.fromkeys(r["command"] for r in runs):
        every = [r for r in runs if r["command"] == command]
        mine = newest_code(every)
        newest = mine[-1]
        dates = sorted({r["when"][:10] for r in mine})
        older = len(every) - len(mine)
        history = (f"; {older} earlier run{'s' * (older != 1)} of older code kept in the record as history"
                   if older else "")
        out.append(f"`{command}`: {len(mine)} run{'s' * (len(mine) != 1)} of its newest code recorded "
                   f"(bench/records/{name}.jsonl, {', '.join(dates)}, {newest['machine']}{history})"
                   + ("; the newest, as printed:" if len(mine) > 1 else ", as printed:"))
        out += ["", "```", newest["table"], "```"]
        spreads = [f"- {label}: {said}" for label, said in figures_of(mine)]
        if spreads:
            over = {1: "the run", 2: "the 2 runs, each"}.get(len(mine), f"the {len(mine)} runs, median (min-max)")
            out += ["", f"Over {over}:", *spreads]
        out.append("")
    return "\n".join(out).rstrip("\n")


def figures_of(runs: list[dict]) -> list[tuple[str, str]]:
    """(label, "median unit (min-max), N runs") for each figure the newest of ``runs`` (one command's) names."""
    out = []
    for label in runs[-1]["figures"]:
        values = [r["figures"][label] for r in runs if label in r["figures"]]
        unit = runs[-1]["units"].get(label, "")
        middle = statistics.median(values)
        places = decimals(middle)
        if len(values) == 1:
            out.append((label, f"{number(middle, places)}{unit}, one run"))
        elif len(values) == 2:  # no median of two: both, as they are
            out.append((label, f"{number(values[0], places)}{unit} and {number(values[1], places)}{unit}, 2 runs"))
        else:
            out.append((label, f"{number(middle, places)}{unit} ({number(min(values), places)}-"
                               f"{number(max(values), places)}), {len(values)} runs"))
    return out


def summary(results_text: str) -> str:
    """SUMMARY_DOC's table: every recorded figure over the runs of its command's newest code, with the command,
    the count of those runs and their days, in RESULTS' order (older code's runs are RESULTS' history)."""
    lines = ["| figure | over the newest code's runs: median (min-max), or each of one or two | when | command |",
             "|---|---|---|---|"]
    for m in BLOCK.finditer(results_text):
        runs = read(m["name"])
        for command in dict.fromkeys(r["command"] for r in runs):
            mine = newest_code([r for r in runs if r["command"] == command])
            when = ", ".join(sorted({r["when"][:10] for r in mine}))
            for label, said in figures_of(mine):
                lines.append(f"| {label} | {said} | {when} | `{command}` |")
    return "\n".join(lines)


def with_summary(readme: str, results_text: str) -> str:
    head, found, rest = readme.partition(SUMMARY[0])
    if not found:
        return readme
    return f"{head}{SUMMARY[0]}\n{summary(results_text)}\n{SUMMARY[1]}{rest.partition(SUMMARY[1])[2]}"


def with_blocks(text: str) -> str:
    return BLOCK.sub(lambda m: f"<!-- record: {m['name']} -->\n{render(m['name'], read(m['name']))}\n"
                               f"<!-- /record: {m['name']} -->", text)


NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")


def typed_figures(text: str) -> list[tuple[str, str]]:
    """(section, figure) for each number in a section's prose that none of that section's blocks shows."""
    found = []
    for section in re.split(r"\n(?=## )", text):
        title = section.splitlines()[0] if section else ""
        shown = "".join(m.group(0) for pattern in [BLOCK, *OTHER_BLOCKS] for m in pattern.finditer(section))
        prose = section
        for pattern in [BLOCK, *OTHER_BLOCKS]:
            prose = pattern.sub("", prose)
        prose = re.sub(r"`[^`\n]*`", "", prose)  # commands, options and code are names, not figures
        # days and times are no figures, in the prose or in a block: a "12x" typed in the prose is not one a block
        # shows because its run was on a 12th
        prose, shown = CLOCK.sub("", DATED.sub("", prose)), CLOCK.sub("", DATED.sub("", shown))
        shown_numbers = {n.replace(",", "") for n in NUMBER.findall(shown)}
        for figure in NUMBER.findall(prose.partition("\n")[2]):
            if figure.replace(",", "") not in shown_numbers:
                found.append((title, figure))
    return found


# A figure in prose: a number with a unit of measure (a range's ends share it: "2.2-3.2 s"), or a number
# after a percentile or a precision, recall or F1. A number just after a word of bound or setting ("every
# 10 s", "at most 2 s", "a timeout of 600 s", "max(5 s, ...)") is a setting, not a measurement.
_NUM = r"\d[\d,]*(?:\.\d+)?"
_UNIT = r"(?:ms|µs|us|seconds?|s|%|x|MB|GB|KB|kB|KiB|MiB|GiB|msg/s|minutes?|min|hours?|h)"
FIGURE = re.compile(rf"(?<![\w.\-–])(?P<a>{_NUM})(?:\s?[-–]\s?(?P<b>{_NUM}))?\s?(?P<unit>{_UNIT})(?![\w/]|\.\d)")
SPREAD = re.compile(rf"{_NUM}\s?(?P<unit>{_UNIT})\s*\((?P<low>{_NUM})\s?[-–]\s?(?P<high>{_NUM})\)")
KEYED = re.compile(rf"\b(?:p50|p90|p95|p99|precision|recall|F1)\s*(?:[:=]|\bof\b)?\s*(?P<a>{_NUM})(?!\d|[.,]\d)"
                   rf"(?!\s?{_UNIT}(?![\w/]))", re.I)
BOUND = re.compile(r"(?:\bevery|\bwithin|\bat most|\bat least|\bup to|\bunder|\bpast|\bfor|\bafter"
                   r"|\bdefault|\btimeout|\bdeadline|\bfloor of|\bwindows of|\bcritical at|\bmax\(|\bmin\("
                   r"|\blasted|\blasts|\b(?:limit|timeout|deadline|period|goal) of|[<>≤≥])\s*\(?\s*$", re.I)
BOUND_AFTER = re.compile(r"^\s*(?:timeout|deadline|limit|period|threshold|floor|cgroup|at most|at least)\b", re.I)
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CLOCK = re.compile(r"\b\d\d:\d\d\b")
# what prose is not: code, the product's own words quoted, pictures' captions, comments
# (a span may wrap onto the next line, not past a paragraph's end)
_WRAPS = r"(?:\n(?![ \t]*\n))"
NOT_PROSE = re.compile(rf"```.*?```|`(?:[^`\n]|{_WRAPS})*`|\"(?:[^\"\n]|{_WRAPS})*\"|!\[[^\]]*\]|<!--.*?-->", re.S)


def _blanked(text: str, pattern: re.Pattern) -> str:
    """``text`` with ``pattern``'s matches blanked out, newlines kept (so offsets and line numbers hold)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _plain(number: str) -> str:
    return number.replace(",", "")


def figures_in(text: str) -> set[tuple[str, str]]:
    """(number, unit) of every figure ``text`` shows, and ``(number, "")`` of every number in it."""
    known = {(_plain(n), "") for n in NUMBER.findall(text)}
    for m in FIGURE.finditer(text):
        known |= {(_plain(m["a"]), m["unit"])} | ({(_plain(m["b"]), m["unit"])} if m["b"] else set())
    for m in SPREAD.finditer(text):  # a median's min and max, in its unit: "2.3 s (1.7-3.5)"
        known |= {(_plain(m["low"]), m["unit"]), (_plain(m["high"]), m["unit"])}
    return known


SCRIPT = re.compile(r"\b(bench_\w+|chaos_trials|gpu_check|CHAOS\.md)(?:\.py)?\b")


def recorded_figures() -> dict[str, set[tuple[str, str]]]:
    """Per bench script (``bench_ray_watch``), every figure its records show: each run's table as printed and
    its named figures (at each precision a text may round them to); the blocks rendered from the other
    records (the random trials' in CHAOS.md, the restart table in RESULTS) and the GPU check's saved logs.
    ``"RESULTS.md"``: all of them, for a paragraph that cites RESULTS rather than a bench."""
    known: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(RECORDS.glob("*.jsonl")):
        runs = read(path.stem)
        # each command's newest code's runs: an older code's figure is history, not quotable as today's
        for r in (r for command in dict.fromkeys(r["command"] for r in runs)
                  for r in newest_code([x for x in runs if x["command"] == command])):
            mine = known.setdefault(m[1] if (m := SCRIPT.search(r["command"])) else path.stem, set())
            mine |= figures_in(r["table"])
            for label, value in r["figures"].items():
                unit = r["units"].get(label, "").strip().split(" ")[0]
                mine |= {(_plain(number(value, places)), u) for places in range(4) for u in (unit, "")}
    for script, path, pattern in (("chaos_trials", CHAOS, OTHER_BLOCKS[1]),
                                  ("bench_restart_load", RESULTS, OTHER_BLOCKS[0]),
                                  ("bench_ettr", RESULTS, OTHER_BLOCKS[2])):
        if path.exists():
            blocks = [m.group(0) for m in pattern.finditer(path.read_text())]
            known.setdefault(script, set()).update(*map(figures_in, blocks))
    if CHAOS.exists():  # the chaos suite's tables, which tests/chaos/test_chaos.py writes from its run
        known["CHAOS.md"] = figures_in(CHAOS.read_text())
    for log in sorted((ROOT / "bench").glob("gpu_check-*.log")):
        known.setdefault("gpu_check", set()).update(figures_in(log.read_text()))
    known["RESULTS.md"] = set().union(*known.values())
    return known


def figures_typed_by_hand(text: str, known: dict[str, set[tuple[str, str]]],
                          generated: list[re.Pattern]) -> list[tuple[int, str]]:
    """(line, figure) for each figure in ``text``'s prose that no record its paragraph cites (a bench script by
    name, or RESULTS.md) shows, in a paragraph that does not say the day it was seen; ``generated``: the blocks
    rendered from records, which are not prose."""
    prose = text
    for pattern in generated:
        prose = _blanked(prose, pattern)
    start = 0
    found = []
    heading = ""  # a section's heading cites for all its paragraphs (RESULTS: "## Stacks — `python bench/...`")
    # a paragraph: a blank line's, or a list item's (a list's items are one block of lines)
    for paragraph in re.split(r"(\n[ \t]*\n|\n(?=[ \t]*(?:[-*]|\d+\.)[ \t]))", prose):
        if paragraph.startswith("#"):
            heading = paragraph.partition("\n")[0]
        # the benches it names; only where it names none, every record (a paragraph that cites RESULTS whole)
        names = {m[1] for m in SCRIPT.finditer(heading + paragraph)} or ({"RESULTS.md"} if "RESULTS.md" in paragraph
                                                                         else set())
        cited = set().union(*(known.get(name, set()) for name in names))
        words = _blanked(paragraph, NOT_PROSE)
        if not DATED.search(words):
            for m in [*FIGURE.finditer(words), *KEYED.finditer(words)]:
                if BOUND.search(words[max(0, m.start() - 30):m.start()]) or BOUND_AFTER.match(words[m.end():]):
                    continue
                unit = m.groupdict().get("unit") or ""
                ends = [m["a"], *([m["b"]] if m.groupdict().get("b") else [])]
                if any((_plain(n), unit) not in cited for n in ends):
                    found.append((text.count("\n", 0, start + m.start()) + 1, " ".join(m.group(0).split())))
        start += len(paragraph)
    return found


def prose_docs() -> list[Path]:
    """The documents whose prose may quote a figure: README and docs/ (the summary among them)."""
    return [README, *sorted(DOCS.glob("*.md"))] if DOCS.is_dir() else [README]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def main() -> int:
    check = "--check" in sys.argv[1:]
    text = RESULTS.read_text()
    rendered = with_blocks(text)
    summary_doc, summary_name = SUMMARY_DOC.read_text(), _shown(SUMMARY_DOC)
    if not check:
        RESULTS.write_text(rendered)
        SUMMARY_DOC.write_text(with_summary(summary_doc, rendered))
        return 0
    problems = []
    if SUMMARY[0] not in summary_doc:
        problems.append(f"{summary_name} has no {SUMMARY[0]} block for the summary of the records")
    elif with_summary(summary_doc, text) != summary_doc:
        problems.append(f"{summary_name}'s summary of the records is not theirs: run `python bench/records.py` and "
                        "commit")
    if rendered != text:
        names = [m["name"] for m in BLOCK.finditer(text)
                 if m.group(0) not in rendered]
        problems.append(f"the blocks of {', '.join(names)} are not what their records render: run "
                        "`python bench/records.py` and commit the result")
    for title, figure in typed_figures(text):
        problems.append(f"{title!r}: {figure} is in the prose but in none of the section's tables from records: "
                        "quote it from a block, or drop it")
    for path, shown, blocks in ((RESULTS, "bench/RESULTS.md", [BLOCK, *OTHER_BLOCKS]),
                                *((doc, _shown(doc), [SUMMARY_BLOCK]) for doc in prose_docs())):
        for line, figure in figures_typed_by_hand(path.read_text(), recorded_figures(), blocks):
            problems.append(f"{shown}:{line}: "
                            f"{figure!r} is in no record: quote a record's figure, or say the day it was seen "
                            "in its paragraph (a one-off observation: \"one run, YYYY-MM-DD\")")
    for p in problems:
        print(p if p.startswith(("README", "bench/", "docs/", summary_name)) else f"bench/RESULTS.md: {p}",
              file=sys.stderr)
    if not problems:
        print(f"bench/RESULTS.md: {len(BLOCK.findall(text))} blocks are their records', no figure typed by hand; "
              f"{summary_name}'s summary is theirs")
    return 1 if problems else 0



# Which halves of a comparison a bench can run here, said in one line its smoke prints. A bench that compares
# two things (the torch engine and vLLM, this trainer and TRL, two plotting widgets) runs the other half only
# where its package is installed; ``GKD_SMOKE_REQUIRE`` (space-separated packages: CI sets it where each one is
# installed) turns "alone" into a failure, so CI cannot pass a smoke whose comparison never ran.
def other_half(package: str, ours: str, theirs: str, bench: str) -> bool:
    """Whether ``theirs`` (needing ``package``) runs beside ``ours``; printed as the bench's "halves:" line.
    Exits 1 when it cannot and ``GKD_SMOKE_REQUIRE`` names ``package``."""
    if importlib.util.find_spec(package) is not None:
        print(f"halves: {ours} and {theirs}", flush=True)
        return True
    print(f"halves: {ours} alone ({theirs} needs {package}, which this venv does not have)", flush=True)
    if package in os.environ.get("GKD_SMOKE_REQUIRE", "").split():
        sys.exit(f"{bench}: GKD_SMOKE_REQUIRE names {package}, but it is not installed in this venv "
                 f"({sys.prefix}): install it, or run the bench where it is")
    return False

if __name__ == "__main__":
    sys.exit(main())
