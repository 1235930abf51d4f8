"""What a bench measured, kept, and the tables in bench/RESULTS.md made from it alone.

Every full run of a bench appends one line to ``bench/records/NAME.jsonl``: the command as typed, when,
the machine, the table it printed, and the figures it names (numbers, for the spread over runs). RESULTS
shows a record between ``<!-- record: NAME -->`` and ``<!-- /record: NAME -->``: for each command its
count of runs, the newest run's table as printed, and each figure's median (min-max) over the runs of that
command. ``python bench/records.py --check`` renders every block again from its record and fails on any
difference, and on a figure in a section's prose that none of its blocks shows (a number typed by hand).
A ``--smoke`` run records nothing: it is the same code path on sizes nobody should quote.

    python bench/records.py            # write every block from its record
    python bench/records.py --check    # CI: fail where RESULTS is not its records
"""

from __future__ import annotations

import contextlib
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
# README's summary of every record's figures, between these (written and checked with RESULTS' blocks)
SUMMARY = ("<!-- records: summary -->", "<!-- /records: summary -->")
BLOCK = re.compile(r"<!-- record: (?P<name>[\w-]+) -->\n.*?<!-- /record: (?P=name) -->", re.S)
# the other generated tables in RESULTS (their benches render and check them themselves)
OTHER_BLOCKS = [re.compile(r"<!-- restart under load -->\n.*?<!-- /restart under load -->", re.S)]


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


def save(name: str, command: str, table: str, figures: dict[str, float] | None = None,
         units: dict[str, str] | None = None) -> Path:
    """One run of bench ``name``: appended to its record, and its block in RESULTS written again.

    ``figures``: label -> number, each summed up over the runs of the same command as median (min-max);
    ``units``: label -> what follows the number ("ms", "x", " %"). The table is kept as printed."""
    RECORDS.mkdir(exist_ok=True)
    path = RECORDS / f"{name}.jsonl"
    row = {"command": command, "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": machine(),
           "table": table.rstrip("\n"), "figures": figures or {}, "units": units or {}}
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    text = RESULTS.read_text()
    if f"<!-- record: {name} -->" in text:
        RESULTS.write_text(with_blocks(text))
        README.write_text(with_summary(README.read_text(), RESULTS.read_text()))
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


def render(name: str, runs: list[dict]) -> str:
    """The block for one record: per command, its runs, the newest table, and each figure's spread."""
    if not runs:
        return (f"No run of this bench is recorded yet (bench/records/{name}.jsonl): the command in the heading "
                "makes the first.")
    out = []
    for command in dict.fromkeys(r["command"] for r in runs):
        mine = [r for r in runs if r["command"] == command]
        newest = mine[-1]
        dates = sorted({r["when"][:10] for r in mine})
        out.append(f"`{command}`: {len(mine)} run{'s' * (len(mine) != 1)} recorded "
                   f"(bench/records/{name}.jsonl, {', '.join(dates)}, {newest['machine']})"
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
    """README's table: every recorded figure, with its command and its count of runs, in RESULTS' order."""
    lines = ["| figure | over the runs: median (min-max), or each of one or two | command |", "|---|---|---|"]
    for m in BLOCK.finditer(results_text):
        runs = read(m["name"])
        for command in dict.fromkeys(r["command"] for r in runs):
            for label, said in figures_of([r for r in runs if r["command"] == command]):
                lines.append(f"| {label} | {said} | `{command}` |")
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
        shown_numbers = {n.replace(",", "") for n in NUMBER.findall(shown)}
        for figure in NUMBER.findall(prose.partition("\n")[2]):
            if figure.replace(",", "") not in shown_numbers:
                found.append((title, figure))
    return found


def main() -> int:
    check = "--check" in sys.argv[1:]
    text = RESULTS.read_text()
    rendered = with_blocks(text)
    readme = README.read_text()
    if not check:
        RESULTS.write_text(rendered)
        README.write_text(with_summary(readme, rendered))
        return 0
    problems = []
    if SUMMARY[0] not in readme:
        problems.append(f"README.md has no {SUMMARY[0]} block for the summary of the records")
    elif with_summary(readme, text) != readme:
        problems.append("README.md's summary of the records is not theirs: run `python bench/records.py` and commit")
    if rendered != text:
        names = [m["name"] for m in BLOCK.finditer(text)
                 if m.group(0) not in rendered]
        problems.append(f"the blocks of {', '.join(names)} are not what their records render: run "
                        "`python bench/records.py` and commit the result")
    for title, figure in typed_figures(text):
        problems.append(f"{title!r}: {figure} is in the prose but in none of the section's tables from records: "
                        "quote it from a block, or drop it")
    for p in problems:
        print(p if p.startswith("README") else f"bench/RESULTS.md: {p}", file=sys.stderr)
    if not problems:
        print(f"bench/RESULTS.md: {len(BLOCK.findall(text))} blocks are their records', no figure typed by hand; "
              "README.md's summary is theirs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
