"""Spec diffs: how an argument differs from what a step was compiled for.

Leaf by leaf (``_leafdiff``) and structure by structure (a static value, a
dataclass field, a container's aux data, a class defined again), from specs
and reprs only, never device memory.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._format import flatten_with_path, fmt_aval, fmt_path
from .._leafdiff import LeafDiff, diff_leaves
from .._state.annotations import STATIC
from .._state.filter import Filtered, join
from .._state.filter import short as short_static
from .._state.inplace import static_attributes
from .._state.spec import StaticArg, hashed_key, leaf_spec, static_equal, unchanging, value_key

__all__ = ["diff_specs", "key_difference", "same_structure"]


def diff_specs(expected: Any, got: Any) -> list[LeafDiff]:
    """Every difference between two spec trees: the structure's, else the leaves'."""
    structural = structure_diffs(expected, got, "")
    if structural:
        return structural
    exp = [(fmt_path(p), leaf_spec(x)) for p, x in flatten_with_path(expected)[0]]
    act = [(fmt_path(p), leaf_spec(x)) for p, x in flatten_with_path(got)[0]]
    return diff_leaves(exp, act)


def structure_diffs(a: Any, b: Any, path: str) -> list[LeafDiff]:
    """Structural differences between two pytrees, by path."""
    here = path or "(the value itself)"
    if same_structure(jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)):
        return []
    ta, tb = type(a), type(b)
    if ta is not tb and (ta.__qualname__, ta.__module__) == (tb.__qualname__, tb.__module__):
        return [
            LeafDiff(
                here,
                _class_id(ta),
                _class_id(tb),
                "a different class object with the same name: the class was defined "
                "again (a re-run notebook cell, a re-imported or reloaded module), and "
                "instances of the old and the new class never match; build the state "
                "from one definition (re-run the cells that make it, or define the "
                "class once, outside the re-run code)",
            )
        ]
    if isinstance(a, StaticArg) and isinstance(b, StaticArg):
        return [_static_diff(a, b, here)]
    if isinstance(a, StaticArg) != isinstance(b, StaticArg):
        sa, sb = (
            f"static {_short(x.value)}" if isinstance(x, StaticArg) else _struct_name(x)
            for x in (a, b)
        )
        return [
            LeafDiff(
                here,
                sa,
                sb,
                "a static value at one call and an argument at the other: a parameter whose "
                "default a call leaves out is a constant of the program (as for jax.jit), and "
                "passing it makes it an argument, a new signature; leave it out at every call, "
                "or pass it at every call",
            )
        ]
    if ta is tb and dataclasses.is_dataclass(a) and not isinstance(a, type):
        found = _dataclass_diffs(a, b, path)
        if found:
            return found
    if ta is tb and isinstance(a, Mapping):
        out = []
        for k in sorted(set(a) | set(b), key=repr):
            if k not in b:
                out.append(LeafDiff(f"{path}[{k!r}]", "present", "missing", "a key was dropped"))
            elif k not in a:
                out.append(LeafDiff(f"{path}[{k!r}]", "absent", "present", "a key was added"))
            else:
                out.extend(structure_diffs(a[k], b[k], f"{path}[{k!r}]"))
        return out
    if ta is tb and isinstance(a, (list, tuple)) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b)) for d in structure_diffs(x, y, f"{path}[{i}]")
        ]
    if ta is tb:
        node = _node_diffs(a, b, path, here)
        if node:
            return node
    return [
        LeafDiff(
            here,
            _struct_name(a),
            _struct_name(b),
            "the tree structure differs",
        )
    ]


def _static_diff(a: StaticArg, b: StaticArg, here: str) -> LeafDiff:
    """Two static values of one parameter: where inside they differ, else how."""
    at, was, now = (
        key_difference(a.key, b.key) if a.key is not None and b.key is not None else ("", "", "")
    )
    if at:  # a part of it (an object hashed by value is said below, by its hash and attributes)
        same = "the same object" if a.value is b.value else "a value"
        return LeafDiff(
            here,
            f"static {type(a.value).__name__} holding {was} at {at}",
            f"{same} holding {now} there",
            "a static value is compiled for what it holds: changed in place since, or "
            "another holding other values, it is a new signature (never the program traced "
            "for the old value); pass a new value, such as a frozen dataclass or a tuple, "
            "instead of changing the object",
        )
    if a.value is b.value:
        return LeafDiff(
            here,
            f"static {type(a.value).__name__} (object id {id(a.value):#x}, hashed {a.hash} then)",
            f"the same object, changed in place since: {_short(b.value)}, hashed {b.hash}",
            "a static value changed after the compile is a new signature (as jax.jit "
            "hashes it anew); pass a new value, such as a frozen dataclass, instead of "
            "changing the object",
        )
    sa, sb = _pair(a.value, b.value)
    return LeafDiff(
        here,
        f"static {sa}",
        f"static {sb}",
        "a static argument is part of the compiled signature; a new value "
        "means a new compile" + _inside(a.value, b.value),
    )


def _dataclass_diffs(a: Any, b: Any, path: str) -> list[LeafDiff]:
    """Field by field, for two instances of one dataclass."""
    out: list[LeafDiff] = []
    unequal: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(a):
        if not hasattr(a, f.name) or not hasattr(b, f.name):
            continue
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if _is_static_field(f):
            if not static_equal(va, vb):
                sa, sb = _pair(va, vb)
                out.append(
                    LeafDiff(
                        f"{path}.{f.name}",
                        f"static {sa}",
                        f"static {sb}",
                        "a static field is part of the compiled signature; "
                        "changing it means a new compile" + _closure_hint(va, vb),
                    )
                )
        else:
            found = structure_diffs(va, vb, f"{path}.{f.name}")
            out.extend(found)
            if not found and not _has_arrays(va) and not static_equal(va, vb):
                unequal.append((f"{path}.{f.name}", va, vb))
    if out:
        return out
    # A field held as aux data by a foreign container.
    return [
        LeafDiff(
            p,
            _pair(va, vb)[0],
            f"another {type(vb).__name__}, not equal: {_pair(va, vb)[1]}",
            f"{type(a).__name__} keeps this field in its tree structure (pytree "
            "aux data, not a leaf), so a new value means a new compile" + _closure_hint(va, vb),
        )
        for p, va, vb in unequal
    ]


def _node_diffs(a: Any, b: Any, path: str, here: str) -> list[LeafDiff]:
    """Two containers of one registered type: their aux data, else their children."""
    try:
        da = jax.tree_util.tree_structure(a).node_data()
        db = jax.tree_util.tree_structure(b).node_data()
    except Exception:  # noqa: BLE001 - a leaf, or no node data to read
        return []
    if da is None or db is None:
        return []
    if da[0] is Filtered and db[0] is Filtered and not static_equal(da[1], db[1]):
        return _filtered_diffs(a, b, path, here)
    if not _same_value(da[1], db[1]):
        named_a, named_b = static_attributes(da[0], da[1]), static_attributes(db[0], db[1])
        if named_a is not None and named_b is not None:  # an NNX object: its attributes by name
            aux_a, aux_b = types.SimpleNamespace(**named_a), types.SimpleNamespace(**named_b)
        else:
            aux_a, aux_b = da[1], db[1]
        sa, sb = _pair(da[1], db[1])
        name = type(a).__name__
        return [
            LeafDiff(
                here,
                f"{name} with static data {sa}",
                f"{name} with static data {sb}",
                f"{name} keeps that data in its tree structure (pytree aux data, not "
                "leaves), so a new value means a new compile"
                + _inside(aux_a, aux_b)
                + _closure_hint(da[1], db[1]),
            )
        ]
    children_a = jax.tree_util.tree_flatten_with_path(a, is_leaf=lambda x: x is not a)[0]
    children_b = jax.tree_util.tree_flatten_with_path(b, is_leaf=lambda x: x is not b)[0]
    if len(children_a) != len(children_b):
        return []
    return [
        d
        for (ka, va), (_, vb) in zip(children_a, children_b)
        for d in structure_diffs(va, vb, f"{path}{fmt_path(ka)}")
    ]


def _filtered_diffs(a: Any, b: Any, path: str, here: str) -> list[LeafDiff]:
    """Two filtered equinox Modules: their differing static leaves, else the rebuilt Modules'."""
    ka, kb = a.key, b.key
    if ka.treedef != kb.treedef or ka.static != kb.static:
        return structure_diffs(join(a), join(b), path) or [
            LeafDiff(here, f"{type(join(a)).__name__} {ka!r}", f"{type(join(b)).__name__} {kb!r}")
        ]
    return [
        LeafDiff(
            f"{path}{p}",
            short_static(x),
            short_static(y),
            "a non-array leaf of an equinox Module (a function, a Python number) is part of "
            "the signature, as eqx.filter_jit has it: a new value means a new compile"
            + _closed_inside(x, y),
        )
        for p, x, y in zip(ka.static_paths(), ka.values, kb.values)
        if not static_equal(x, y)
    ]


def _is_static_field(f: Any) -> bool:
    """A dataclass field held in the tree structure: jc.static, flax
    ``pytree_node=False``, equinox ``static=True``."""
    md = f.metadata
    return bool(md.get(STATIC)) or md.get("pytree_node", True) is False or md.get("static") is True


def _class_id(t: type) -> str:
    return f"class {t.__module__}.{t.__qualname__} (class object id {id(t):#x})"


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails: name the type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pair(a: Any, b: Any) -> tuple[str, str]:
    """Two unequal values, told apart: by repr, else by type and id."""
    sa, sb = _short(a), _short(b)
    if sa == sb or sa.endswith("...") or sb.endswith("..."):
        return (
            f"{type(a).__name__} (object id {id(a):#x})",
            f"{type(b).__name__} (object id {id(b):#x})",
        )
    return sa, sb


def key_difference(a: Any, b: Any, path: str = "") -> tuple[str, str, str]:
    """(path, old, new) of the first place two :func:`value_key` s differ
    (``.keywords['scale'][0]``, ``3.0``, ``4.0``)."""
    if hashed_key(a) and hashed_key(b):
        found = differences(a[2].obj, b[2].obj, limit=1)
        if found and ": " in found[0] and " vs " in found[0]:
            sub, rest = found[0].split(": ", 1)
            was, now = rest.rsplit(" vs ", 1)
            return path + ("" if sub.startswith("(") else sub), was, now
        if a[2].obj is b[2].obj:  # the same object, hashed anew: its old value is gone
            return path, f"{_shown(a[2].obj)} (hashed {a[1]} then)", f"hashed {b[1]} now"
        return path, _key_text(a), _key_text(b)
    if (
        type(a) is not tuple
        or type(b) is not tuple
        or not a
        or not b
        or a[0] is not b[0]
        or len(a) != len(b)
    ):
        return path, _key_text(a), _key_text(b)
    t = a[0]
    if isinstance(t, type) and issubclass(t, (np.ndarray, np.generic)) and a[1:3] == b[1:3]:
        return path, _key_text(a) + " (other values)", _key_text(b) + " (other values)"
    if (
        isinstance(t, type) and issubclass(t, (list, tuple, dict, functools.partial))
        or dataclasses.is_dataclass(t)
    ):
        if dataclasses.is_dataclass(t):
            # (the fields value_key keys: those its == compares)
            names = [f".{f.name}" for f in dataclasses.fields(t) if f.compare]
        elif t is functools.partial:
            names = [".func", ".args", ".keywords"]
        elif issubclass(t, dict):
            names = [f"[{_key_text(k[0])}]" for k in a[1:]]
        else:
            names = [f"[{i}]" for i in range(len(a) - 1)]
        for name, x, y in zip(names, a[1:], b[1:]):
            if x != y:
                if issubclass(t, dict) and x[0] != y[0]:
                    return path, f"keys {_key_text(a)}", f"keys {_key_text(b)}"
                return (
                    key_difference(x[1], y[1], path + name)
                    if issubclass(t, dict)
                    else key_difference(x, y, path + name)
                )
    return path, _key_text(a), _key_text(b)


def _key_text(key: Any) -> str:
    """A :func:`value_key` shown as the value it snapshots (arrays by spec)."""
    if type(key) is not tuple or not key:
        return _shown(getattr(key, "obj", key))
    t = key[0]
    if t is float:
        return repr(float.fromhex(key[1]))
    if isinstance(t, type) and issubclass(t, (np.ndarray, np.generic)):
        return fmt_aval(key[2], np.dtype(key[1]))
    if len(key) == 2 and not isinstance(key[1], tuple):
        return _short(key[1], 40)
    if len(key) == 3 and hasattr(key[2], "obj"):  # an object hashed by value: (type, hash, it)
        return f"{_shown(key[2].obj)} (hashed {key[1]})"
    if isinstance(t, type) and issubclass(t, (list, tuple, dict, set, frozenset)):
        n = len(key[1]) if issubclass(t, (set, frozenset)) else len(key) - 1
        return f"a {t.__name__} of {n} item{'s' if n != 1 else ''}"
    return _short(t.__name__ if isinstance(t, type) else t, 40)


def _inside(a: Any, b: Any) -> str:
    """``; it differs at .x: 1 vs 2``, with advice where a closed-over value differs."""
    found = differences(a, b)
    if not found:
        return ""
    return (
        "; it differs at "
        + "; ".join(found)
        + (_CLOSED_OVER if any(_CLOSURE in d for d in found) else "")
    )


def _closed_inside(a: Any, b: Any) -> str:
    """:func:`_inside` for two functions, where a value they close over differs."""
    if not isinstance(a, types.FunctionType):
        return ""
    text = _inside(a, b)
    return text if _CLOSURE in text else ""


_CLOSURE = " -> "  # a path step from a function into a variable it closes over
_CLOSED_OVER = (
    " (f -> name: a value f closes over, such as an optimizer's learning rate; to change it "
    "between calls without a compile, pass it as an array: "
    "optax.inject_hyperparams(optax.adam)(learning_rate=lr), or a schedule)"
)


def differences(a: Any, b: Any, limit: int = 5) -> list[str]:
    """Where two unequal values differ, as ``path: a vs b`` (at most ``limit``),
    through fields, items and ``vars()``; arrays shown by spec, never read."""
    out: list[str] = []
    _walk(a, b, "", 8, out, limit)
    return out


def _walk(
    a: Any, b: Any, path: str, depth: int, out: list[str], limit: int, closed: bool = False
) -> None:
    """``closed``: inside what a function closes over, where two functions of
    one code that hold equal values are no difference of their own."""
    if len(out) >= limit or a is b:
        return
    here = path or "(the value)"
    # on the host: compared as value keys are
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if value_key(a) != value_key(b):
            same = (a.dtype, a.shape) == (b.dtype, b.shape)
            out.append(f"{here}: {_shown(a)} vs {_shown(b)}" + (" (other values)" if same else ""))
        return
    if isinstance(a, (jax.Array, np.ndarray)) or isinstance(b, (jax.Array, np.ndarray)):
        out.append(f"{here}: {_shown(a)} vs {_shown(b)} (another array object)")  # never read
        return
    if _same_value(a, b):
        return
    if depth == 0 or type(a) is not type(b):
        out.append(f"{here}: {_shown(a)} vs {_shown(b)}")
        return
    if type(a) is functools.partial:  # compared by value: say which part differs
        items = [
            (".func", a.func, b.func),
            (".args", a.args, b.args),
            (".keywords", a.keywords, b.keywords),
        ]
    elif isinstance(a, types.FunctionType) and a.__code__ is b.__code__:  # one def, made twice
        found: list[str] = []
        for sub, x, y in _closed_over(a, b):
            _walk(x, y, (path or a.__name__) + sub, depth - 1, found, limit - len(out), True)
        if not found and not closed:  # nothing it holds differs: the objects alone do
            found.append(f"{here}: {_shown(a)} vs {_shown(b)}")
        out.extend(found)
        return
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        items = [
            (f".{f.name}", getattr(a, f.name, None), getattr(b, f.name, None))
            for f in dataclasses.fields(a)
        ]
    elif isinstance(a, tuple) and hasattr(a, "_fields"):  # a NamedTuple
        items = [(f".{n}", x, y) for n, x, y in zip(a._fields, a, b)]
    elif isinstance(a, (tuple, list)):
        if len(a) != len(b):
            out.append(f"{here}: {len(a)} items vs {len(b)}")
            return
        items = [(f"[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
    elif isinstance(a, Mapping):
        if set(a) != set(b):
            out.append(f"{here}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}")
            return
        items = [(f"[{k!r}]", a[k], b[k]) for k in a]
    elif isinstance(getattr(a, "__dict__", None), dict) and not callable(a):
        keys = sorted(set(vars(a)) | set(vars(b)))
        items = [(f".{k}", vars(a).get(k), vars(b).get(k)) for k in keys]
    else:
        out.append(f"{here}: {_shown(a)} vs {_shown(b)}")
        return
    for sub, x, y in items:
        _walk(x, y, path + sub, depth - 1, out, limit, closed)


def _closed_over(a: types.FunctionType, b: types.FunctionType) -> list[tuple[str, Any, Any]]:
    """(`` -> name``, a's value, b's value) for each variable two functions of
    one code close over, then their defaults."""
    items: list[tuple[str, Any, Any]] = []
    for name, ca, cb in zip(a.__code__.co_freevars, a.__closure__ or (), b.__closure__ or ()):
        try:
            items.append((f"{_CLOSURE}{name}", ca.cell_contents, cb.cell_contents))
        except ValueError:  # a cell not filled yet: nothing to compare
            continue
    items.append((".__defaults__", a.__defaults__, b.__defaults__))
    items.append((".__kwdefaults__", a.__kwdefaults__, b.__kwdefaults__))
    return items


def _shown(value: Any) -> str:
    """A short text for a value in a diff: arrays by spec (never read), else repr."""
    spec = leaf_spec(value) if isinstance(value, (jax.Array, np.ndarray)) else None
    if spec is not None:
        return fmt_aval(spec.shape, spec.dtype)
    if callable(value) and not isinstance(value, type):
        return f"{getattr(value, '__qualname__', type(value).__name__)} (object id {id(value):#x})"
    return _short(value, 40)


def _has_arrays(x: Any) -> bool:
    return any(leaf_spec(v) is not None for v in jax.tree_util.tree_leaves(x))


def same_structure(a: Any, b: Any) -> bool:
    """Whether two tree structures are equal, aux data compared by
    :func:`_same_value`: as JAX's ``==``, but partials by value (a second model
    instance's own ``partial(nnx.avg_pool, ...)`` traces to the same program)."""
    if a == b:
        return True
    if a.num_leaves != b.num_leaves or a.num_nodes != b.num_nodes:
        return False
    da, db = a.node_data(), b.node_data()
    if da is None or db is None:
        return da is db
    ca, cb = a.children(), b.children()
    return (
        da[0] is db[0]
        and _same_value(da[1], db[1])
        and len(ca) == len(cb)
        and all(same_structure(x, y) for x, y in zip(ca, cb))
    )


def _same_value(a: Any, b: Any) -> bool:
    """Whether two static values trace alike: partials and containers item by
    item, numbers by type and bits, arrays only as the same object, anything
    else by ``static_equal``. Never equal where unsure (a new signature)."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    # by value, where no value can change: else the new one is a new signature
    if t is functools.partial:
        values = (*a.args, *a.keywords.values(), *b.args, *b.keywords.values())
        return (
            _same_value(a.func, b.func)
            and all(map(unchanging, values))
            and _same_value(a.args, b.args)
            and _same_value(a.keywords, b.keywords)
        )
    if isinstance(a, (np.ndarray, jax.Array)):
        return False
    if isinstance(a, np.generic):
        return a.tobytes() == b.tobytes()
    if t is float:
        return a.hex() == b.hex()  # type: ignore[no-any-return]
    if t is complex:
        return (  # type: ignore[no-any-return]
            a.real.hex() == b.real.hex() and a.imag.hex() == b.imag.hex()
        )
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if t is dict:
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(
            _same_value(getattr(a, f.name, None), getattr(b, f.name, None))
            for f in dataclasses.fields(a)
        )
    return static_equal(a, b)


def _closure_hint(a: Any, b: Any) -> str:
    """The hint that functions compare by identity (a second optax.adam(...))."""
    whole = lambda v: isinstance(v, functools.partial)  # noqa: E731 - jax flattens a partial
    fa = [v for v in jax.tree_util.tree_leaves(a, is_leaf=whole) if callable(v)]
    fb = [v for v in jax.tree_util.tree_leaves(b, is_leaf=whole) if callable(v)]
    # partials compare by value (same_structure): their diff says what differs
    if any(x is not y and type(x) is not functools.partial for x, y in zip(fa, fb)):
        return (
            "; it holds functions, which compare by identity: new closures (an "
            "optimizer built again, e.g. a second optax.adam(...)) are a new value "
            "even if they do the same: build it once and reuse it"
        )
    return ""


def _struct_name(x: Any) -> str:
    if leaf_spec(x) is not None:
        return "an array leaf"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of {len(x)}"
    if isinstance(x, Mapping):
        return f"{type(x).__name__} with keys {sorted(map(str, x))}"
    if x is None:
        return "None"
    return type(x).__name__
