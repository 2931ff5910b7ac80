"""The layering rule (README, Layout): a part imports only the parts to its left in

    core -> data_gen -> train -> slurm -> serve -> bench -> verdict (the `verdict` app)

Every import counts, at module level or inside a function (an import hidden in a function is still a
dependency), absolute or relative. A part that imports one to its right fails here, naming the file,
the line and the import."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO

# folder -> (part, its place in the order); `verdict/` is the app at the top.
PARTS = {
    "verdict_core": "core",
    "data_gen": "data_gen",
    "train": "train",
    "slurm": "slurm",
    "serve": "serve",
    "bench": "bench",
    "verdict": "verdict",
}
ORDER = ["core", "data_gen", "train", "slurm", "serve", "bench", "verdict"]


def part_of_module(name: str) -> str | None:
    """The part an absolute module name belongs to (`verdict.serve.app` -> serve), None outside."""
    bits = name.split(".")
    if bits[0] != "verdict":
        return None
    if len(bits) == 1 or bits[1] not in ORDER or bits[1] == "verdict":
        return "verdict"  # verdict, verdict.cli, verdict.__main__: the app
    return bits[1]


def imports_of(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file; `package` resolves relative ones."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def package_of(path: Path, folder: str) -> str:
    """The package a file is in, as installed (`serve/audit/store.py` -> verdict.serve.audit)."""
    root = (
        "verdict.core"
        if folder == "verdict_core"
        else "verdict"
        if folder == "verdict"
        else f"verdict.{folder}"
    )
    rel = path.relative_to(REPO / folder).parent.parts
    return ".".join((root, *rel))


def violations() -> list[str]:
    found = []
    for folder, part in PARTS.items():
        allowed = set(ORDER[: ORDER.index(part) + 1])
        for path in sorted((REPO / folder).rglob("*.py")):
            for line, name in imports_of(path, package_of(path, folder)):
                other = part_of_module(name)
                if other is not None and other not in allowed:
                    found.append(
                        f"{path.relative_to(REPO)}:{line}: {part} imports {name} ({other} is to its right)"
                    )
    return found


def test_no_part_imports_a_part_to_its_right():
    assert violations() == []


def test_the_check_sees_imports_hidden_in_functions_and_relative_ones(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from verdict.serve.app import build_app\n\nfrom ..serve import x\n")
    names = {n for _, n in imports_of(src, "verdict.data_gen.formalizer")}
    assert names == {"verdict.serve.app", "verdict.data_gen.serve"}
    assert part_of_module("verdict.serve.app") == "serve" and part_of_module("verdict.core") == "core"
    assert part_of_module("verdict.cli") == "verdict" and part_of_module("typer") is None


# -- no import cycle inside serve ------------------------------------------------------------------
def module_names(folder: str) -> dict[str, Path]:
    """Installed module name -> file, for every module of a part (`serve/audit/__init__.py` ->
    verdict.serve.audit)."""
    out = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        name = (
            package_of(path, folder)
            if path.name == "__init__.py"
            else f"{package_of(path, folder)}.{path.stem}"
        )
        out[name] = path
    return out


def type_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (they never run: no import at run time)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def import_graph(folder: str, *, with_type_only: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of the same part it imports, at module level or inside a function
    (`from .pkg import mod` names the module `pkg.mod`, `from .mod import x` the module `mod`);
    `with_type_only=False` leaves out the imports under `if TYPE_CHECKING:`."""
    modules = module_names(folder)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = set() if with_type_only else type_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = imports_of_node(node, package)
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def imports_of_node(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}  # visiting | done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "visiting"
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "visiting":
                return [*path[path.index(d) :], d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_serve_has_no_import_cycle():
    """Imports hidden in functions count too: a cycle they hide is still a cycle."""
    cycle = import_cycle(import_graph("serve"))
    assert cycle is None, "import cycle in serve: " + " -> ".join(cycle)


def test_data_gen_has_no_import_cycle_and_the_formalizer_runtime_imports_no_stage():
    """The stages depend on the runtime, never the other way round (issue 25): no cycle in data_gen
    at run time (type-only imports aside), and `formalizer/runtime.py` imports no stage at all."""
    graph = import_graph("data_gen", with_type_only=False)
    cycle = import_cycle(graph)
    assert cycle is None, "import cycle in data_gen: " + " -> ".join(cycle)
    runtime = graph["verdict.data_gen.formalizer.runtime"]
    stages = {"parser", "miner", "reader", "arbiter", "verbalizer", "staged", "stages", "routing"}
    assert not {m for m in runtime if m.rsplit(".", 1)[-1] in stages}, runtime


def test_the_formalizer_is_self_contained():
    """`data_gen/formalizer` imports no other module of data_gen (the teacher pipeline around it
    imports the formalizer, never the other way round)."""
    graph = import_graph("data_gen")
    inside = "verdict.data_gen.formalizer"
    out = {
        (m, d)
        for m, deps in graph.items()
        if m == inside or m.startswith(inside + ".")
        for d in deps
        if not (d == inside or d.startswith(inside + ".")) and d != "verdict.data_gen"
    }
    assert not out, sorted(out)


def formalizer_reached_past_its_entry() -> list[str]:
    """Imports of a formalizer module other than its entry (`verdict.data_gen.formalizer`), made
    outside the formalizer's own folder (tests aside: they test the modules one by one)."""
    inside = REPO / "data_gen" / "formalizer"
    entry = "verdict.data_gen.formalizer"
    found = []
    for folder in PARTS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if inside in path.parents:
                continue
            for line, name in imports_of(path, package_of(path, folder)):
                if name.startswith(entry + "."):
                    found.append(f"{path.relative_to(REPO)}:{line}: imports {name} (use {entry})")
    return found


def test_other_parts_reach_the_formalizer_through_its_one_entry():
    """The formalizer's public surface is its package (`data_gen/formalizer/__init__.py`, issue 25):
    serve, bench, train and the teacher pipeline import from it, never from its modules."""
    assert formalizer_reached_past_its_entry() == []


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycle(graph) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) is None
