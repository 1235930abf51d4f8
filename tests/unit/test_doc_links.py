"""The documents a newcomer reads hold together: README is the front door (the two commands, the keys, a
screenshot, where to read more) in under 300 lines, and every link in it and in docs/, CONTRIBUTING.md and
ARCHITECTURE.md reaches a file of the repository and, where it names one, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 300


def anchors(doc: Path) -> set[str]:
    """Its headings as GitHub makes their anchors: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"(?ms)^```.*?^```", "", doc.read_text())  # (a comment in a code block is no heading)
    return {re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
            for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def broken_links(doc: Path) -> list[str]:
    out = []
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        there = (doc.parent / path).resolve() if path else doc
        if not there.exists():
            out.append(f"{target}: no such file")
        elif anchor and there.suffix == ".md" and anchor not in anchors(there):
            out.append(f"{target}: {there.name} has no heading #{anchor}")
    return out


def test_every_link_in_the_documents_reaches_its_file_and_heading():
    broken = {str(d.relative_to(ROOT)): b for d in DOCS if (b := broken_links(d))}
    assert broken == {}, broken


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") < README_MAX_LINES, f"README is {text.count(chr(10))} lines: move the detail to docs/"
    for command in ('pip install torch==2.13.0 && pip install -e ".[test]"', "gkd-tui launch\n",
                    "python -m pytest -q -rs"):
        assert command in text, f"README lost one of its two commands: {command!r}"
    assert "](screenshots/" in text and "](docs/" in text
