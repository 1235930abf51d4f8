"""No error is swallowed silently: a broad ``except`` (bare, ``Exception``, ``BaseException``) in gkd_core or
gkd_tui either raises again or says what it let go, by using the exception it bound (a debug log line, a
message on screen, an event). A narrow one (``except RayActorError``, ``except OSError``) names what it
expects, and may be quiet."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROAD = {"Exception", "BaseException"}


def is_broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in BROAD for n in names)


def says_what_it_let_go(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if handler.name and isinstance(node, ast.Name) and node.id == handler.name:
            return True
    return False


def silent_broad_excepts() -> list[str]:
    out = []
    for path in sorted([*ROOT.glob("gkd_core/**/*.py"), *ROOT.glob("gkd_tui/**/*.py")]):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and is_broad(node) and not says_what_it_let_go(node):
                out.append(f"{rel}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return out


def test_no_broad_except_swallows_silently():
    assert silent_broad_excepts() == [], ("narrow these to what they expect, or bind the error and say it "
                                          "(log.debug(..., e) at least)")


def test_the_walk_finds_a_silent_one(tmp_path):
    handlers = [n for n in ast.walk(ast.parse("try:\n    f()\nexcept Exception:\n    pass\n"
                                              "try:\n    f()\nexcept Exception as e:\n    log.debug('%s', e)\n"
                                              "try:\n    f()\nexcept OSError:\n    pass\n"))
                if isinstance(n, ast.ExceptHandler)]
    assert [is_broad(h) and not says_what_it_let_go(h) for h in handlers] == [True, False, False]
