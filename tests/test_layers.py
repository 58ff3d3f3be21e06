"""The package's layers go one way: each module imports only layers below it.

Imports are read from the source (``ast``), those inside functions and under
``TYPE_CHECKING`` included, so a lazy import cannot hide an upward edge. The
table below is the architecture (see ARCHITECTURE.md); a new module must be
placed in it.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxcontracts"

# module -> layer. A module may import only modules of a strictly lower layer.
LAYERS: dict[str, int] = {
    # 0: plain data, marks, messages and formatting (no other module of the package)
    "_errors": 0,  # exception classes, the message layout, CONTRACTS and VIOLATIONS
    "_explain": 1,  # the errors page, offline (python -m jaxcontracts explain)
    "_records": 0,
    "_format": 0,
    "_dtypes": 0,
    "_donation.hazards": 0,
    "_marks": 0,  # the marks put on states and state classes
    # 1: the registry of live steps, the capability registry
    "_steps": 1,
    "_compat.registry": 1,
    # 2: configuration, the loop/step meeting point
    "_config": 2,
    "_tracebacks": 2,  # contract errors trimmed to the user's frames; which frames are library code
    "_loop.interrupts": 2,  # signals held while a loop is entered or exited
    "_runtime": 4,  # below the guard and the call path; reads frames
    # 3: each private mechanism, behind a named capability
    "_compat.arrays": 3,
    "_compat.blocking": 3,
    "_compat.callbacks": 3,
    "_compat.events": 3,
    "_compat.effects": 3,
    "_compat.executable": 3,
    "_compat.frames": 3,
    "_compat.hostcopy": 3,
    "_compat.jaxtyping": 3,
    "_compat.refcount": 3,
    "_compat.refs": 3,  # the array a JAX ref holds, read and replaced
    "_compat.runtime_errors": 3,
    "_compat.threadguard": 3,
    "_compat.guardlog": 3,
    "_compat.guarded": 3,
    "_compat.tracing": 3,
    "_compat.jitwatch": 3,  # jax.jit replaced while jc.watch() is open; a jitted function's options
    "_compat": 4,
    # annotations -> specs; what the loop guard is built from
    "_state.annotations": 4,
    "_state.foreign": 4,  # jc.device_tree: any pytree -> device leaves
    "_report.timing": 4,  # a loop's clock: timed step calls, time blocked on the device
    "_userline": 4,  # the user's frame and line, for messages
    "_report.render": 5,  # renders records; below everything that returns a report
    "_state.spec": 5,
    "_loop.fetch": 5,  # jc.fetch
    "_loop.plainjit": 9,  # plain jax.jit cache misses inside a loop (installed by the guard)
    "_audit.signatures": 8,  # plain jax.jit calls: signatures, diffs (_step.diffs), reusable arguments
    "_audit.watch": 9,  # jc.watch(): plain jax.jit code observed (its HTML from _report.render)
    "_loop.rng": 5,  # jax.random samplers inside loops: their Python-number parameters pass
    "_loop.intercept": 6,  # read, buffer and compile interceptors
    "_loop.translate": 6,  # JAX runtime errors leaving a loop -> contract errors
    "_loop.loopstack": 5,  # a thread's loop entries and JAX's guard contexts on them
    # states: fields -> validation / consumed classes -> spec()/zeros() -> the decorator
    "_state.fields": 6,
    "_state.inplace": 4,  # flax NNX objects and JAX refs a step updates in place
    "_state.filter": 6,  # equinox Modules: non-array leaves static, as eqx.filter_jit has them
    "_step.diffs": 7,  # how specs differ, for messages
    "_state.validate": 7,
    "_donation.consumed": 7,
    "_donation.reads": 5,  # a read of a deleted array outside loops, worded as a donation
    "_state.construct": 8,
    "_state.classes": 9,
    # the compiled signature -> the call path -> the step
    "_step.definition": 10,
    "_step.misuse": 10,  # what @jc.hot_step was given that is not a step function
    "_step.analyse": 11,  # the decorator's options and the function -> StepDefinition
    "_step.compile": 11,
    "_step.callctx": 12,  # what the per-call closures share: context, tail, leaf readers
    "_step.kept": 13,  # the kept-reference check: leaves, containers, arguments that are one array
    "_step.diagnose": 12,
    "_step.callwrap": 13,  # the static-value and equinox-Module wrappers in front of a call path
    "_step.callpath": 14,
    "_step.hot_step": 15,
    "_step.decorator": 16,  # @jc.hot_step
    # the loop guard, then what uses everything
    "_loop.guard": 16,
    "_step.check": 17,
    "_audit.session": 17,  # jc.watch(): the jit watch and a recording loop for reads
    "_audit.cli": 18,  # python -m jaxcontracts audit
    "_info": 17,
    "_testing.recorder": 17,  # jc.snapshot and the plugin's Recorder
    "_testing.snapshot": 5,  # a snapshot record, its text and its diff
    "_testing.snapshot_file": 6,  # snapshot files: render and parse
    # public API users: may import the package itself (its lazy __init__)
    "_testing.pytest_plugin": 18,
    "demo.simulation": 18,
    "demo.regressions": 19,
    "demo.cli": 20,
    "demo": 21,
    "__main__": 22,
    # the packages by concept: their __init__ is a docstring
    "_state": 0,
    "_donation": 0,
    "_step": 0,
    "_loop": 0,
    "_report": 0,
    "_testing": 0,
    "_audit": 0,
}
PUBLIC_API_USERS = 18  # from this layer up, `import jaxcontracts` is allowed


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


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _modules() if m and m not in LAYERS)
    assert not unplaced, f"place these modules in the LAYERS table: {unplaced}"


@pytest.mark.parametrize("name", sorted(m for m in LAYERS))
def test_imports_go_down_only(name):
    path = _modules()[name]
    layer = LAYERS[name]
    upward = []
    for dep in sorted(_imports(name, path)):
        if dep == "":
            if layer < PUBLIC_API_USERS:
                upward.append("jaxcontracts (the package; only public-API users may)")
        elif LAYERS.get(dep, 99) >= layer:
            upward.append(f"{dep} (layer {LAYERS.get(dep)})")
    assert not upward, f"{name} (layer {layer}) imports sideways or upward: {upward}"


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
