"""The house's shape: a module imports from its own layer or lower ones, never higher; no parts, and no
modules, import each other, however far round (an import only for the type checker counts: a circle the
checker needs is a circle a reader must hold in mind); no module is over 400 lines, no class over 300. The layers,
lowest first, are in ``LAYERS`` (ARCHITECTURE.md says what each holds)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS = [
    # words, units, files and processes: what everything else is said in
    {"gkd_core.units", "gkd_core.vocab", "gkd_core.errors", "gkd_core.stack_text", "gkd_core.lifeline",
     "gkd_core.proctree", "gkd_core.memory", "gkd_core.rundir", "gkd_core.config"},
    {"gkd_core.telemetry"},  # the protocol: events, their codec, the reporter, control
    {"gkd_core.state"},  # the reducer
    # what reads the state or feeds it: the log, the diagnosis, a late joiner, node agents, the teacher service,
    # an alert told to a person
    {"gkd_core.runlog", "gkd_core.diagnosis", "gkd_core.subscriber", "gkd_core.node", "gkd_core.teacher",
     "gkd_core.notify"},
    # what runs a job: our trainer, other people's jobs, and the tools beside them
    {"gkd_core.trainer", "gkd_core.integrations", "gkd_core.doctor", "gkd_core.bundle", "gkd_core.demo_driver"},
    {"gkd_core.supervisor"},  # owns a run: starts the driver, records, diagnoses, answers
    {"gkd_tui", "gkd_core.__main__"},  # what a person runs
]
LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str | None:
    """The part (a package, or a module of the top level) that ``module`` belongs to."""
    names = module.split(".")
    if names[0] == "gkd_tui":
        return "gkd_tui"
    if names[0] != "gkd_core" or len(names) == 1:
        return None
    return ".".join(names[:2])


def imports() -> list[tuple[str, str, str]]:
    """(file, part it is in, part it imports) for every import of ours in gkd_core and gkd_tui, at
    any depth (a function's import counts: it runs the module too)."""
    out = []
    for path in sorted([*ROOT.glob("gkd_core/**/*.py"), *ROOT.glob("gkd_tui/**/*.py")]):
        rel = path.relative_to(ROOT)
        here = part_of(".".join(rel.with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named = [node.module] if node.module != "gkd_core" else [f"gkd_core.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                continue
            for module in named:
                there = part_of(module)
                if there and there != here:
                    out.append((str(rel), here, there))
    return out


def test_every_part_has_a_layer():
    parts = {p for _, here, there in imports() for p in (here, there)}
    assert parts - set(LAYER) == set(), "a new part: give it a layer in LAYERS"


def test_no_import_from_a_lower_layer_to_a_higher_one():
    upward = sorted({f"{f}: {here} (layer {LAYER[here]}) imports {there} (layer {LAYER[there]})"
                     for f, here, there in imports() if LAYER[there] > LAYER[here]})
    assert upward == []


def test_no_import_cycle_among_the_parts():
    graph: dict[str, set[str]] = {}
    for _, here, there in imports():
        graph.setdefault(here, set()).add(there)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"parts that import each other: {' -> '.join(e.args[1])}") from None


def module_imports() -> dict[str, set[str]]:
    """module -> the modules of ours it imports, at any depth and under ``if TYPE_CHECKING`` too
    (``from gkd_core.state import views`` is of ``gkd_core.state.views``, a module of its own)."""
    files = {}
    for path in sorted([*ROOT.glob("gkd_core/**/*.py"), *ROOT.glob("gkd_tui/**/*.py")]):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                continue
            graph[module].update(m for m in named if m in files and m != module)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected parts of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    part.append(w)
                    if w == v:
                        break
                if len(part) > 1:
                    out.append(sorted(part))
    return out


def test_no_import_circle_among_the_modules():
    assert circles(module_imports()) == [], "modules that import each other (split what both need out of one)"


def test_the_circle_walk_finds_one_however_far_round():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]


MODULE_MAX, CLASS_MAX = 400, 300


def test_no_module_over_400_lines_and_no_class_over_300():
    over = []
    for path in sorted([*ROOT.glob("gkd_core/**/*.py"), *ROOT.glob("gkd_tui/**/*.py")]):
        src = path.read_text()
        rel = path.relative_to(ROOT)
        if src.count("\n") > MODULE_MAX:
            over.append(f"{rel}: {src.count(chr(10))} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_MAX:
                over.append(f"{rel}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    assert over == []
