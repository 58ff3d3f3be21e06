"""The package's layers go one way: each unit imports only units before it.

Imports are read from the source (``ast``), those inside functions and under
``TYPE_CHECKING`` included, so a lazy import cannot hide an upward edge. The
package order below is the architecture (see ARCHITECTURE.md); a new
subpackage or top-level module must be placed in it.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxcontracts"

# The package order, lowest first. A unit is a subpackage (``_step``) or a
# top-level module (``_errors``); each imports only units before it, and its
# own modules (in no cycle: test_no_import_cycles). The package's __init__,
# the public API, comes after all of them; only the modules that use the
# public API as a user does may import it.
ORDER = [
    # the vocabulary: errors and their layout, records passed upward, formatting,
    # dtypes, marks, a call's buffer hazards, leaf diffs, the errors page
    "_errors", "_records", "_format", "_dtypes", "_marks", "_hazards", "_leafdiff", "_explain",
    # the registry of live steps, the private mechanisms, the checks level,
    # tracebacks, the user's line
    "_steps", "_compat", "_config", "_tracebacks", "_userline",
    # every contract, declared in a module of its own: its words, fixes and hooks
    "_contracts",
    # where steps and loops meet at run time
    "_runtime",
    # reports and states, the consumed class of a donated state
    "_report", "_state", "_donation",
    # hot steps and hot loops (never each other), then what reads them
    "_step", "_loop", "_audit", "_testing", "_info",
    # the command line and the demo
    "__main__", "demo",
]  # fmt: skip
PUBLIC_API_USERS = ("_testing.pytest_plugin", "demo")  # may `import jaxcontracts`


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path  # "" is the package's own __init__
    return out


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """Package-relative names of the package's modules this module imports."""
    modules = _modules()
    is_pkg = path.name == "__init__.py"
    here = ["jaxcontracts", *[p for p in name.split(".") if p]]
    base = here if is_pkg else here[:-1]

    def module_of(dotted: str) -> str | None:
        if dotted != "jaxcontracts" and not dotted.startswith("jaxcontracts."):
            return None
        parts = dotted.split(".")[1:]
        while parts and ".".join(parts) not in modules:
            parts.pop()  # `_compat.arrays.ArrayImpl` -> `_compat.arrays`
        return ".".join(parts)

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(module_of(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                # `from . import _config` imports the module `_config`;
                # `from ._spec import leaf_spec` imports `_spec`.
                found.add(module_of(f"{mod}.{a.name}"))
    return {m for m in found if m is not None and m != name}


def _unit(module: str) -> str:
    return module.split(".")[0]


def test_every_module_belongs_to_a_unit_of_the_order():
    unplaced = sorted({_unit(m) for m in _modules() if m} - set(ORDER))
    assert not unplaced, f"place these in ORDER (tests/test_layers.py, and ARCHITECTURE.md): {unplaced}"


@pytest.mark.parametrize("name", sorted(m for m in _modules() if m))
def test_imports_go_down_the_order_only(name):
    path = _modules()[name]
    rank = ORDER.index(_unit(name))
    wrong = []
    for dep in sorted(_imports(name, path)):
        if dep == "":
            if not name.startswith(PUBLIC_API_USERS):
                wrong.append("jaxcontracts (the public API: only its users may)")
        elif _unit(dep) != _unit(name) and ORDER.index(_unit(dep)) > rank:
            wrong.append(f"{dep} (after {_unit(name)} in ORDER)")
    assert not wrong, f"{name} imports upward: {wrong}"


def test_no_cycle_between_packages():
    # the units' graph, imports inside functions included: one way, so that
    # hot loops never reach hot-step code through the audit, and run time
    # never through the consumed class (issue 52)
    graph: dict[str, set[str]] = {}
    for name, path in _modules().items():
        for dep in _imports(name, path):
            if name and dep and _unit(dep) != _unit(name):
                graph.setdefault(_unit(name), set()).add(_unit(dep))
    state: dict[str, int] = {}

    def visit(v: str, trail: list[str]) -> None:
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                raise AssertionError("cycle between packages: " + " -> ".join([*trail[trail.index(w) :], w]))
            if w not in state:
                visit(w, [*trail, w])
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v, [v])


def test_no_import_cycles():
    graph = {name: _imports(name, path) for name, path in _modules().items() if name}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> None:
        state[v] = 1
        stack.append(v)
        for w in graph.get(v, ()):
            if w and state.get(w) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(w) :] + [w]))
            if w and w not in state:
                visit(w)
        stack.pop()
        state[v] = 2

    for v in graph:
        if v not in state:
            visit(v)


def test_the_layer_test_sees_imports_inside_functions(tmp_path):
    # An upward import hidden in a function body must be seen.
    fake = tmp_path / "_x.py"
    fake.write_text("def f():\n    from ._errors import ContractError\n    return ContractError\n")
    assert _imports("_x", fake) == {"_errors"}


def _all_of(path: pathlib.Path) -> set[str] | None:
    """The names in a module's ``__all__`` (None when it defines none)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return None


def test_every_name_a_module_imports_from_another_is_in_its_all():
    # `from ._fields import info_of` is an interface between two modules: the
    # provider lists it in __all__ (a private `_name` would be a reach into
    # another module's internals, which no module does).
    modules = _modules()
    missing = []
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        here = [p for p in name.split(".") if p]
        base = here if is_pkg else here[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            anchor = base[: len(base) - (node.level - 1)]
            source = ".".join(anchor + ([node.module] if node.module else []))
            if source not in modules or source == "":
                continue  # `from . import _config`: a module, not a name
            exported = _all_of(modules[source])
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    continue  # a submodule (`from ._compat import arrays`)
                if alias.name.startswith("_") or (exported is not None and alias.name not in exported):
                    missing.append(f"{name} imports {alias.name} from {source}")
    assert not missing, "\n".join(missing)


def test_the_lazy_exports_and_the_type_checking_imports_agree():
    # jaxcontracts/__init__.py names its public API twice: _EXPORTS (what
    # __getattr__ imports at run time) and the TYPE_CHECKING block (what type
    # checkers see). A name in one and not the other, or from another
    # module, is a public name broken for one of them.
    init = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    typed: dict[str, str] = {}
    exports: dict[str, str] = {}
    for node in init.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for sub in node.body:
                assert isinstance(sub, ast.ImportFrom), ast.unparse(sub)
                for alias in sub.names:
                    typed[alias.asname or alias.name] = sub.module or ""
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        ):
            exports = ast.literal_eval(node.value)
    assert exports and typed
    assert exports == typed


def test_hot_steps_and_hot_loops_never_import_each_other():
    # Both sit over donation and state; where they meet (the active loop, the
    # recorded outputs, the wording of a donated array) is _runtime, below both.
    modules = _modules()
    crossing = []
    for name, path in modules.items():
        for a, b in (("_step", "_loop"), ("_loop", "_step")):
            if name == a or name.startswith(a + "."):
                crossing += [f"{name} imports {d}" for d in _imports(name, path) if d == b or d.startswith(b + ".")]
    assert not crossing, crossing
    assert {"_step.hot_step", "_loop.guard", "_state.classes", "_donation.consumed"} <= set(modules)
