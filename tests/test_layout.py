"""The package layout holds: no import cycles between specviz's modules (imports inside functions included) or
between its packages, the library never imports streamlit, every module belongs to a layer, and each layer imports
only the layers below it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "specviz"

# Leaves everyone may use, which import only each other.
LEAVES = {"specviz.errors", "specviz.atomic", "specviz.paths", "specviz.schemacheck"}
# layer -> the layers it may import besides itself and the leaves, bottom to top. A module belongs to the longest key
# naming it or a package above it; "specviz" is the package's own __init__ only.
BELOW_BACKENDS = {"specviz.kernels", "specviz.models", "specviz.decoding", "specviz.drafters", "specviz.analysis"}
ALLOWED = {
    "specviz.kernels": set(),
    "specviz.models": {"specviz.kernels"},
    "specviz.decoding": {"specviz.kernels", "specviz.models.compat"},
    "specviz.drafters": {"specviz.kernels", "specviz.models", "specviz.decoding"},  # a drafter declares its trained part
    "specviz.analysis": set(),  # the cost model's arithmetic, from numbers alone
    "specviz.backends": BELOW_BACKENDS,
    "specviz.api": BELOW_BACKENDS | {"specviz.backends"},
    "specviz.arguments": BELOW_BACKENDS,  # the command-line options several command families share
    "specviz.train": BELOW_BACKENDS,
    "specviz.observatory": BELOW_BACKENDS,  # a running server's /metrics, read and summed
    "specviz.roofline": {"specviz.analysis", "specviz.drafters"},  # a run replayed at a modelled GPU's step costs
    "specviz.llamacpp": BELOW_BACKENDS | {"specviz.backends", "specviz.api", "specviz.train"},  # llama-server: built, run, fed our drafters
    "specviz.bench": BELOW_BACKENDS | {"specviz.backends", "specviz.api", "specviz.arguments", "specviz.llamacpp"},
    "specviz.serve": BELOW_BACKENDS | {"specviz.backends", "specviz.api", "specviz.arguments", "specviz.bench"},
    "specviz.cli": BELOW_BACKENDS | {"specviz.backends", "specviz.api", "specviz.arguments", "specviz.bench",
                                     "specviz.serve", "specviz.train", "specviz.llamacpp"},
    "specviz.__main__": {"specviz.cli"},
    "specviz": {"specviz.api", "specviz.backends", "specviz.decoding"},
}


def within(name: str, unit: str) -> bool:
    """Whether module `name` is `unit` or lies inside it (the root package holds only its own __init__ here)."""
    return name == unit or (unit != "specviz" and name.startswith(unit + "."))


def layer_of(name: str) -> str | None:
    if name in LEAVES:
        return "leaves"
    return max((layer for layer in ALLOWED if within(name, layer)), key=len, default=None)


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


def wrong_imports(edges: dict[str, set[str]], layer: str) -> set[str]:
    """`module -> import` for every import of the layer's modules that the layer may not make."""
    allowed = (ALLOWED[layer] | LEAVES | {layer}) if layer != "leaves" else LEAVES
    return {f"{name} -> {dep}" for name, deps in edges.items() if layer_of(name) == layer
            for dep in deps if dep.split(".")[0] != "streamlit" and not any(within(dep, a) for a in allowed)}


def test_every_module_belongs_to_a_layer():
    homeless = sorted(name for name in graph() if layer_of(name) is None)
    assert not homeless, f"give these a layer in ALLOWED: {homeless}"


@pytest.mark.parametrize("layer", [*sorted(ALLOWED), "leaves"])
def test_each_layer_imports_only_what_lies_below_it(layer):
    wrong = wrong_imports(graph(), layer)
    assert not wrong, sorted(wrong)


def test_the_layer_check_catches_planted_upward_imports():
    edges = graph()
    edges["specviz.backends.service"] = edges["specviz.backends.service"] | {"specviz.serve.http"}
    edges["specviz.bench.cli"] = edges["specviz.bench.cli"] | {"specviz.cli.main"}
    edges["specviz.paths"] = edges["specviz.paths"] | {"specviz.models.cache"}
    assert wrong_imports(edges, "specviz.backends") == {"specviz.backends.service -> specviz.serve.http"}
    assert wrong_imports(edges, "specviz.bench") == {"specviz.bench.cli -> specviz.cli.main"}
    assert wrong_imports(edges, "leaves") == {"specviz.paths -> specviz.models.cache"}


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between layers (a package, or a module of the top level)."""
    between: dict[str, set[str]] = {}
    for name, deps in edges.items():
        between.setdefault(layer_of(name) or name, set()).update(
            layer_of(d) or d for d in deps if d.split(".")[0] != "streamlit" and (layer_of(d) or d) != (layer_of(name) or name))
    return between


def test_no_import_cycles_between_packages():
    found = cycle(packages(graph()))
    assert found is None, "package cycle: " + " -> ".join(found)


def test_the_package_cycle_check_catches_a_planted_cycle():
    edges = graph()
    edges["specviz.backends.service"] = edges["specviz.backends.service"] | {"specviz.serve.runs"}
    assert cycle(packages(edges)) is not None  # the service imports the local backend: serve -> backends -> serve


def test_no_module_in_the_library_or_the_app_passes_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in [*ROOT.glob("specviz/**/*.py"), *ROOT.glob("app/**/*.py")]
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
