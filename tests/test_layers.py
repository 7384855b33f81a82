"""The package's shape: imports run one way down the stages, no cycle, no oversized file.

Imports are read from the source (module level and inside functions alike: an import moved
into a function to dodge a cycle is still the cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fusionstitching", "costmodel", "tf_hooks")
MAX_LINES = 600

# Lowest first. A module may import from its own layer's areas only without a cycle, and from
# the layers below it; never from a layer above.
LAYERS = (
    ("costmodel", "fusionstitching.child_processes", "fusionstitching.logs",
     "fusionstitching.options", "fusionstitching.job_clock"),
    ("fusionstitching.hlo",),
    ("fusionstitching.graph",),
    ("fusionstitching.explorer", "fusionstitching.codegen"),
    ("fusionstitching.report", "fusionstitching.verification", "fusionstitching.explain",
     "fusionstitching.capture"),
    ("fusionstitching.capability", "fusionstitching.query_workers"),
    ("fusionstitching.pipeline",),
    ("fusionstitching.runtime", "fusionstitching.replay_pool", "fusionstitching.replay_ray"),
    ("fusionstitching.stitched_jit", "fusionstitching.demo", "fusionstitching.fuzz"),
    ("fusionstitching.cli", "tf_hooks", "fusionstitching"),
)
# The explorer asks the code generator through a callback (as XLA's CanFuse): neither imports
# the other.
NEVER = {("fusionstitching.explorer", "fusionstitching.codegen"),
         ("fusionstitching.codegen", "fusionstitching.explorer")}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports (``from a import b`` counts as ``a.b`` where that
    is a module, else ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, set(known)) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def area(module: str) -> str:
    """The longest LAYERS entry that ``module`` is or lies in."""
    names = [a for layer in LAYERS for a in layer if module == a or module.startswith(a + ".")]
    return max(names, key=len)


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if area(module) in layer)


def test_there_is_no_import_cycle():
    assert cycles(import_graph()) == []


def test_imports_run_down_the_layers():
    upward = [f"{a} -> {b}" for a, targets in import_graph().items() for b in sorted(targets)
              if layer_of(b) > layer_of(a) or (area(a), area(b)) in NEVER]
    assert upward == []


def test_every_module_has_a_layer():
    assert [m for m in modules() if not any(m == a or m.startswith(a + ".")
                                            for layer in LAYERS for a in layer)] == []


def test_no_file_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert sorted(cycles(graph)) == expected
