"""No error is swallowed silently: a broad ``except`` (bare, ``Exception``, ``BaseException``) in gkd_core or
gkd_tui either raises again or says what it let go, by using the exception it bound (a debug log line, a
message on screen, an event). Kept in an attribute that nothing reads (``self.last_error = e``) it is said to
no one, and does not count. A narrow one (``except RayActorError``, ``except OSError``) names what it expects,
and may be quiet."""

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


def attribute_stored(target: ast.expr) -> str | None:
    """The attribute an assignment's target keeps its value in (``self.x``, ``self.x[k]``), if it is one."""
    while isinstance(target, ast.Subscript):
        target = target.value
    return target.attr if isinstance(target, ast.Attribute) else None


def attributes_read(trees: list[ast.Module]) -> set[str]:
    """The names of the attributes the code reads somewhere (by name alone: ``x.last_error`` anywhere reads every
    ``last_error``); storing into one (``self.x[k] = v``) is not reading it."""
    stored_into = {id(t) for tree in trees for n in ast.walk(tree)
                   if isinstance(n, ast.Subscript) and not isinstance(n.ctx, ast.Load)
                   for t in ast.walk(n.value) if isinstance(t, ast.Attribute)}
    return {n.attr for tree in trees for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and id(n) not in stored_into}


def kept_unread(node: ast.AST, read: set[str]) -> bool:
    """An assignment only to attributes that nothing reads: what it keeps is said to no one."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return False
    return all((attr := attribute_stored(t)) is not None and attr not in read for t in targets)


def says_what_it_let_go(handler: ast.ExceptHandler, read: set[str]) -> bool:
    body = ast.Module(body=handler.body, type_ignores=[])
    unsaid = {id(n) for kept in ast.walk(body) if kept_unread(kept, read) for n in ast.walk(kept)}
    for node in ast.walk(body):
        if isinstance(node, ast.Raise):
            return True
        if handler.name and isinstance(node, ast.Name) and node.id == handler.name and id(node) not in unsaid:
            return True
    return False


def silent_broad_excepts() -> list[str]:
    paths = sorted([*ROOT.glob("gkd_core/**/*.py"), *ROOT.glob("gkd_tui/**/*.py")])
    trees = {str(path.relative_to(ROOT)): ast.parse(path.read_text(), str(path)) for path in paths}
    read = attributes_read(list(trees.values()))
    return [f"{rel}:{node.lineno}: {ast.unparse(node).splitlines()[0]}" for rel, tree in trees.items()
            for node in ast.walk(tree)
            if isinstance(node, ast.ExceptHandler) and is_broad(node) and not says_what_it_let_go(node, read)]


def test_no_broad_except_swallows_silently():
    assert silent_broad_excepts() == [], ("narrow these to what they expect, or bind the error and say it "
                                          "(log.debug(..., e) at least)")


def test_the_walk_finds_a_silent_one(tmp_path):
    handlers = [n for n in ast.walk(ast.parse("try:\n    f()\nexcept Exception:\n    pass\n"
                                              "try:\n    f()\nexcept Exception as e:\n    log.debug('%s', e)\n"
                                              "try:\n    f()\nexcept OSError:\n    pass\n"))
                if isinstance(n, ast.ExceptHandler)]
    assert [is_broad(h) and not says_what_it_let_go(h, set()) for h in handlers] == [True, False, False]


def test_an_error_kept_where_nothing_reads_it_is_not_said():
    code = ("class Helpers:\n"
            "    def start(self):\n"
            "        try:\n            f()\n        except Exception as e:\n            self.last_error = str(e)\n"
            "        try:\n            f()\n        except Exception as e:\n            self.errors['n'] = e\n"
            "        try:\n            f()\n        except Exception as e:\n            self.last_error = e\n"
            "            emit(StackEvent(error=str(e)))\n"
            "        try:\n            f()\n        except Exception as e:\n            self._error = e\n"
            "    def wait(self):\n"
            "        raise self._error\n")
    tree = ast.parse(code)
    handlers = [n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler)]
    read = attributes_read([tree])
    assert read == {"_error"}  # (self.errors['n'] = e stores into errors, and reads nothing)
    # unread: silent; also put into an event: said; kept for a reader (another thread raises it): said
    assert [says_what_it_let_go(h, read) for h in handlers] == [False, False, True, True]
