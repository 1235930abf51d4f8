"""Every error class of gkd's is a ``GkdError`` (gkd_core/errors.py): one base, whose message a person reads,
beside the builtin its callers catch; and one ``Refused``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = {"Exception", "BaseException", "RuntimeError", "ValueError", "TimeoutError", "OSError", "KeyError",
           "LookupError", "TypeError"}


def test_every_error_class_derives_from_the_one_base_and_there_is_one_refusal():
    loose, refusals = [], []
    for path in sorted([*ROOT.glob("gkd_core/**/*.py"), *ROOT.glob("gkd_tui/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                     for b in node.bases}
            if bases & BUILTIN and "GkdError" not in bases and rel != "gkd_core/errors.py":
                loose.append(f"{rel}: class {node.name}({', '.join(sorted(bases))})")
            if node.name == "Refused":
                refusals.append(rel)
    assert loose == []
    assert refusals == ["gkd_core/errors.py"]
