"""The house rules, checked on the code's own imports (every import, also those inside functions).

Each folder of the package is one layer and every import points down the list below; modules
never import each other in a loop; the model code knows no Lightning, files or tokenizer; the
renderer knows no model; nothing in the wheel only serves benchmarks or tests.
"""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "docclass"
# Lowest first. A module may import its own layer and those below it, never one above.
LAYERS = [
    {"errors", "metrics", "calibration", "files", "processes"},
    {"nn"},
    {"data"},
    {"artifacts"},
    {"train"},
    {"interpret"},
    {"evaluate"},
    {"report"},
    {"inference"},
    {"cli"},
]
# The model: torch and the standard library's plain tools only.
NN_MAY_IMPORT = {"__future__", "math", "dataclasses", "typing", "collections", "torch"}
# The renderer reads records: these are all of docclass it may see.
REPORT_MAY_IMPORT = {
    "docclass.errors",
    "docclass.files",  # pages written whole or not at all (standard library only)
    "docclass.metrics",
    "docclass.interpret.records",
    "docclass.interpret.default_method",
}
# Lines of a function, its signature included and its docstring not: what a reader follows.
LONGEST_BODY = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(tree: ast.Module, known: set[str]) -> set[str]:
    """Every module named by an import anywhere in ``tree`` (``from a import b`` counts as
    ``a.b`` when that is a module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names} & known
    return found


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "docclass" or len(parts) == 1:
        return None  # the package's own __init__ is the public face, above every layer
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index
    raise AssertionError(f"{module}: its folder is in no layer; add it to LAYERS")


def graph() -> dict[str, set[str]]:
    trees = modules()
    known = set(trees)
    return {name: imports_of(tree, known) for name, tree in trees.items()}


def test_every_import_points_down():
    upward = []
    for module, imported in graph().items():
        own = layer_of(module)
        for target in imported:
            theirs = layer_of(target) if target.startswith("docclass.") else None
            if own is not None and theirs is not None and theirs > own:
                upward.append(f"{module} → {target}")
    assert not upward, "imports that climb a layer:\n" + "\n".join(sorted(upward))


def test_no_import_loop():
    edges = {m: {t for t in ts if t.startswith("docclass.")} for m, ts in graph().items()}
    edges = {m: {t for t in ts if t in edges and t != m} for m, ts in edges.items()}
    state: dict[str, int] = defaultdict(int)  # 0 unseen, 1 on the path, 2 done
    loops = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state[target] == 1:
                loops.append(" → ".join([*path[path.index(target) :], target]))
            elif state[target] == 0:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(edges):
        if state[node] == 0:
            visit(node, [node])
    assert not loops, "modules that import each other:\n" + "\n".join(loops)


def test_the_model_code_knows_only_torch():
    for module, imported in graph().items():
        if not module.startswith("docclass.nn"):
            continue
        outside = {
            name
            for name in imported
            if name.split(".")[0] not in NN_MAY_IMPORT
            and not name.startswith(("docclass.nn", "docclass.errors"))
        }
        assert not outside, f"{module} imports {sorted(outside)}"


def test_the_renderer_knows_no_model():
    for module, imported in graph().items():
        if not module.startswith("docclass.report"):
            continue
        ours = {n for n in imported if n.startswith("docclass.") and "docclass.report" not in n}
        assert ours <= REPORT_MAY_IMPORT, f"{module} imports {sorted(ours - REPORT_MAY_IMPORT)}"
        assert not {n for n in imported if n.split(".")[0] in ("torch", "lightning")}, module


def test_nothing_in_the_wheel_serves_only_benchmarks_or_tests():
    for module, imported in graph().items():
        assert not {n for n in imported if n.split(".")[0] in ("benchmarks", "tests")}, module
        assert not any(word in module for word in ("bench", "serve_process", "seeds")), module


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every line from ``def`` to the function's end (a long signature is read too), less the
    docstring: prose a reader skims, and the help text of the commands built from it."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        lines -= first.end_lineno - first.lineno + 1
    return lines


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_functions_stay_readable(path):
    long = [
        f"{node.name} ({body_lines(node)} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and body_lines(node) > LONGEST_BODY
    ]
    assert not long, f"{path.name}: {long}"
