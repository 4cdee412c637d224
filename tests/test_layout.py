"""The package layout holds: no import cycles between specviz's modules (imports inside functions included), the
library never imports streamlit, and each layer imports only the layers below it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "specviz"

# layer -> what it may import besides itself (errors, atomic, paths and settings are leaves everyone may use)
LEAVES = {"specviz.errors", "specviz.atomic", "specviz.paths"}
ALLOWED = {
    "specviz.kernels": set(),
    "specviz.models": {"specviz.kernels"},
    "specviz.decoding": {"specviz.kernels", "specviz.models.compat"},
    "specviz.drafters": {"specviz.kernels", "specviz.models.compat", "specviz.decoding"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The specviz modules one file imports anywhere in it (top level and inside functions; not those under
    `if TYPE_CHECKING:`, which never run)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
                   for n in ast.walk(block)}  # imports for annotations only: never run
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:  # `from specviz.models import heads` imports the submodule heads
                found.add(f"{source}.{alias.name}" if is_module(f"{source}.{alias.name}") else source)
    return {m for m in found if m == "specviz" or m.startswith("specviz.") or m.split(".")[0] == "streamlit"}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(LIBRARY.rglob("*.py"))}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_cycles():
    found = cycle(graph())
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_cycle_check_catches_a_planted_cycle():
    edges = graph()
    edges["specviz.decoding.tree"] = edges["specviz.decoding.tree"] | {"specviz.decoding.engine"}
    assert cycle(edges) is not None


def test_the_library_never_imports_streamlit():
    offenders = {name for name, deps in graph().items() if any(d.split(".")[0] == "streamlit" for d in deps)}
    assert not offenders


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_what_lies_below_it(layer):
    allowed = ALLOWED[layer] | LEAVES | {layer}
    wrong = {
        f"{name} -> {dep}"
        for name, deps in graph().items() if name == layer or name.startswith(layer + ".")
        for dep in deps if not any(dep == a or dep.startswith(a + ".") for a in allowed)
    }
    assert not wrong, sorted(wrong)


def test_no_module_in_the_library_or_the_app_passes_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in [*ROOT.glob("specviz/**/*.py"), *ROOT.glob("app/**/*.py")]
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
