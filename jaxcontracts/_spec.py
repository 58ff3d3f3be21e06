"""Specs: jaxtyping annotations -> shapes and dtypes, ``spec_of``, spec diffs.

A *spec* is a pytree whose leaves are :class:`jax.ShapeDtypeStruct` s carrying
shape, dtype, weak type and (when known) sharding. Everything that compiles or
compares in this package goes through the functions here, so "the same spec"
means one thing everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jaxtyping import _array_types as _jt  # the dim classes have no public alias

from ._compat import ArrayImpl
from ._errors import DefinitionError, SpecError
from ._format import fmt_aval, fmt_path, fmt_sharding

__all__ = [
    "ArrayAnnotation",
    "LeafDiff",
    "diff_specs",
    "leaf_spec",
    "parse_array_annotation",
    "spec_of",
]

_ArrayImpl = ArrayImpl


# --------------------------------------------------------------------------
# Leaves -> specs


def leaf_spec(x: Any) -> jax.ShapeDtypeStruct | None:
    """The exact spec of one leaf, or ``None`` when it is not array-like."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        aval = x.aval
        sharding = x.sharding if not isinstance(x, jax.core.Tracer) else None
        return jax.ShapeDtypeStruct(
            aval.shape, aval.dtype, sharding=sharding, weak_type=aval.weak_type
        )
    if isinstance(x, (np.ndarray, np.generic)):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    if isinstance(x, (bool, int, float, complex)):
        # What jax would make of it: a weakly typed scalar of the default type.
        aval = jax.core.get_aval(x) if hasattr(jax.core, "get_aval") else None
        if aval is not None:
            return jax.ShapeDtypeStruct((), aval.dtype, weak_type=aval.weak_type)
        return jax.ShapeDtypeStruct((), jax.numpy.asarray(x).dtype, weak_type=True)
    return None


def spec_nbytes(spec: Any) -> int:
    """Bytes of an array with this spec (all shards together)."""
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def spec_of(tree: Any) -> Any:
    """Return the exact spec of a pytree: shape, dtype, weak type, sharding.

    Args:
        tree: any pytree of jax arrays, numpy arrays, Python scalars or
            ``jax.ShapeDtypeStruct`` s (a ``jc.state`` instance included).

    Returns:
        The same tree with every leaf replaced by a ``jax.ShapeDtypeStruct``.

    Raises:
        SpecError: when a leaf is not array-like, naming its path.

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> jc.spec_of({"x": jnp.zeros((2, 3))})["x"].shape
        (2, 3)
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    specs, bad = [], []
    for path, leaf in leaves:
        spec = leaf_spec(leaf)
        if spec is None:
            bad.append(f"  {fmt_path(path)}: {type(leaf).__name__} {leaf!r:.60}")
        specs.append(spec)
    if bad:
        raise SpecError(
            "jc.spec_of(): these leaves are not arrays, so they have no spec:\n"
            + "\n".join(bad)
            + "\nFix: make them jax arrays, or mark them jc.static(...) in a "
            "jc.state class so they become part of the tree structure."
        )
    return jax.tree_util.tree_unflatten(treedef, specs)


# --------------------------------------------------------------------------
# jaxtyping annotations -> shapes


@dataclasses.dataclass(frozen=True)
class ArrayAnnotation:
    """A jaxtyping array annotation reduced to what a spec needs."""

    annotation: Any
    dtype: np.dtype
    dims: tuple[Any, ...]
    index_variadic: int | None

    @property
    def dim_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for d in self.dims:
            if isinstance(d, (_jt._NamedDim, _jt._NamedVariadicDim)):
                names.append(d.name)
            elif isinstance(d, _jt._SymbolicDim):
                names.extend(_symbol_names(d.elem))
        return tuple(dict.fromkeys(names))

    def pretty(self) -> str:
        """``f32[n,3]``."""
        return fmt_aval([_dim_str(d) for d in self.dims], self.dtype)

    def shape(self, bindings: Mapping[str, Any], where: str) -> tuple[int, ...]:
        """The concrete shape for these dim bindings (SpecError if one is missing)."""
        out: list[int] = []
        for d in self.dims:
            if isinstance(d, _jt._FixedDim):
                out.append(d.size)
            elif isinstance(d, _jt._NamedDim):
                out.append(_need(bindings, d.name, where, self))
            elif isinstance(d, _jt._NamedVariadicDim):
                value = _need(bindings, d.name, where, self)
                out.extend((value,) if isinstance(value, int) else tuple(value))
            elif isinstance(d, _jt._SymbolicDim):
                for name in _symbol_names(d.elem):
                    _need(bindings, name, where, self)
                out.append(int(eval(d.elem, {}, dict(bindings))))  # noqa: S307
            else:
                raise SpecError(
                    f"{where}: the annotation {self.annotation.__name__} has an "
                    f"anonymous dimension ({_dim_str(d)!r}), so no spec can be "
                    "built from dims alone.\nFix: give that dimension a name "
                    "(e.g. 'n' instead of '_' or '*batch' instead of '...'), or "
                    "build the spec from an instance with jc.spec_of(x)."
                )
        return tuple(out)

    def match(
        self, shape: Sequence[int], bindings: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        """Match a concrete shape; return (why it fails or None, new bindings).

        Used to explain a failure and to report bindings; jaxtyping's own
        ``isinstance`` stays the authority on pass/fail.
        """
        new: dict[str, Any] = {}
        dims = list(self.dims)
        shape = list(shape)
        if self.index_variadic is None:
            if len(shape) != len(dims):
                return f"rank {len(shape)} where rank {len(dims)} is expected", new
            pairs = list(zip(dims, shape))
        else:
            fixed = len(dims) - 1
            if len(shape) < fixed:
                return f"rank {len(shape)} where at least rank {fixed} is expected", new
            k = self.index_variadic
            tail = len(dims) - k - 1
            middle = tuple(shape[k : len(shape) - tail])
            var = dims[k]
            if isinstance(var, _jt._NamedVariadicDim):
                known = bindings.get(var.name, new.get(var.name))
                if known is not None and tuple(known) != middle:
                    return (
                        f"*{var.name} is {middle}, but {var.name}={tuple(known)}",
                        new,
                    )
                new[var.name] = middle
            pairs = list(zip(dims[:k], shape[:k])) + list(
                zip(dims[k + 1 :], shape[len(shape) - tail :])
            )
        for d, size in pairs:
            if isinstance(d, _jt._FixedDim):
                if size != d.size and not (d.broadcastable and size == 1):
                    return f"dimension of size {size} where {d.size} is fixed", new
            elif isinstance(d, _jt._NamedDim):
                known = bindings.get(d.name, new.get(d.name))
                if known is None:
                    if not (d.broadcastable and size == 1):
                        new[d.name] = size
                elif known != size and not (d.broadcastable and size == 1):
                    return f"{d.name} is {size} here, but {d.name}={known}", new
            elif isinstance(d, _jt._SymbolicDim):
                try:
                    want = eval(d.elem, {}, {**bindings, **new})  # noqa: S307
                except NameError:
                    continue
                if want != size:
                    return f"{d.elem} should be {want}, got {size}", new
        return None, new


def parse_array_annotation(annotation: Any, where: str) -> ArrayAnnotation | None:
    """Reduce a jaxtyping array annotation; ``None`` if it is not one.

    Raises:
        DefinitionError: for an abstract dtype (``Float``, ``Shaped``, ...) or
            a non-jax array type, listing what to write instead.
    """
    if not isinstance(annotation, _jt._MetaAbstractArray):
        return None
    name = getattr(annotation, "__name__", repr(annotation))
    dtypes = getattr(annotation, "dtypes", None)
    concrete = _concrete_dtype(dtypes)
    if concrete is None:
        raise DefinitionError(
            f"{where}: {name} has an abstract dtype "
            f"({_dtype_family(annotation)}), so the state's exact spec is unknown."
            "\nFix: use a concrete dtype such as Float32, Float16, BFloat16, "
            "Float64, Int32, Int8, UInt32, UInt8, Bool or Complex64, e.g. "
            f"Float32[Array, {annotation.dim_str!r}]."
        )
    array_type = getattr(annotation, "array_type", None)
    if array_type is not None and not (
        isinstance(array_type, type) and issubclass(array_type, jax.Array)
    ):
        raise DefinitionError(
            f"{where}: {name} annotates a {getattr(array_type, '__name__', array_type)}"
            ", but state fields hold device arrays.\nFix: use jaxtyping's Array "
            f"(jax.Array), e.g. Float32[Array, {annotation.dim_str!r}]."
        )
    return ArrayAnnotation(
        annotation=annotation,
        dtype=concrete,
        dims=tuple(annotation.dims),
        index_variadic=annotation.index_variadic,
    )


def _concrete_dtype(dtypes: Any) -> np.dtype | None:
    if not isinstance(dtypes, (tuple, list)) or not dtypes:
        return None
    found: set[np.dtype] = set()
    for d in dtypes:
        try:
            found.add(np.dtype(jax.numpy.dtype(d)))
        except TypeError:
            return None
    return found.pop() if len(found) == 1 else None


def _dtype_family(annotation: Any) -> str:
    dtypes = getattr(annotation, "dtypes", None)
    if isinstance(dtypes, (tuple, list)):
        return "any of " + ", ".join(str(d) for d in dtypes[:6]) + (
            ", ..." if len(dtypes) > 6 else ""
        )
    return "any dtype"


def _dim_str(d: Any) -> str:
    if isinstance(d, _jt._FixedDim):
        return str(d.size)
    if isinstance(d, _jt._NamedDim):
        return ("#" if d.broadcastable else "") + d.name
    if isinstance(d, _jt._NamedVariadicDim):
        return "*" + d.name
    if isinstance(d, _jt._SymbolicDim):
        return d.elem
    if isinstance(d, _jt._AnonymousVariadicDim):
        return "..."
    return "_"


def _symbol_names(expr: str) -> list[str]:
    import ast

    return [n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)]


def _need(bindings: Mapping[str, Any], name: str, where: str, ann: ArrayAnnotation) -> Any:
    if name not in bindings:
        raise SpecError(
            f"{where}: dimension {name!r} of {ann.pretty()} is not given.\n"
            f"Fix: pass it, e.g. .spec({name}=...) or .zeros({name}=...)."
        )
    return bindings[name]


# --------------------------------------------------------------------------
# Spec diffs


@dataclasses.dataclass(frozen=True)
class LeafDiff:
    """One difference between an expected and an actual spec."""

    path: str
    expected: str
    got: str
    cause: str = ""
    kind: str = "structure"  # structure, dtype, shape, weak_type or sharding


def describe_leaf(spec: Any, with_sharding: bool) -> str:
    if spec is None:
        return "no array"
    text = fmt_aval(spec.shape, spec.dtype, getattr(spec, "weak_type", False))
    if with_sharding:
        text += f" sharded {fmt_sharding(getattr(spec, 'sharding', None))}"
    return text


def _sharding_equal(a: Any, b: Any, ndim: int) -> bool:
    if a is None or b is None:
        return True
    if a == b:
        return True
    try:
        return bool(a.is_equivalent_to(b, ndim))
    except Exception:  # noqa: BLE001 - different sharding kinds
        return False


def _placement(sharding: Any) -> str:
    """Devices and memory kind of a sharding, for shardings that read alike."""
    try:
        ids = sorted(d.id for d in sharding.device_set)
    except Exception:  # noqa: BLE001
        return repr(sharding)
    return f"(devices {ids}, memory {getattr(sharding, 'memory_kind', None)})"


def diff_kind(exp: Any, got: Any) -> str:
    """What differs first between two leaf specs: dtype, shape, weak_type, sharding."""
    if np.dtype(exp.dtype) != np.dtype(got.dtype):
        return "dtype"
    if tuple(exp.shape) != tuple(got.shape):
        return "shape"
    if bool(getattr(exp, "weak_type", False)) != bool(getattr(got, "weak_type", False)):
        return "weak_type"
    return "sharding"


def leaf_cause(exp: Any, got: Any) -> str:
    """A likely cause for one leaf's difference, in a few words."""
    kind = diff_kind(exp, got)
    if kind == "dtype":
        if np.issubdtype(exp.dtype, np.floating) and np.issubdtype(got.dtype, np.integer):
            return "an integer where a float is expected: was it initialised from an int?"
        if np.issubdtype(exp.dtype, np.integer) and np.issubdtype(got.dtype, np.floating):
            return "a float where an integer is expected: integer arithmetic with a float promotes"
        return "dtype changed: cast it with .astype() where it is made"
    if kind == "shape":
        if len(exp.shape) == len(got.shape):
            return "shape changed: a smaller last batch? pad it, or drop it"
        return "rank changed: a missing or extra axis?"
    if kind == "weak_type":
        if getattr(got, "weak_type", False):
            return "weakly typed: made from a Python scalar; use jnp.float32(x) / jnp.asarray(x, dtype)"
        return "strongly typed where a weak type was compiled"
    return "sharding changed: device_put it with the compiled sharding"


def diff_leaves(
    expected: Sequence[tuple[str, Any]],
    got: Sequence[tuple[str, Any]],
    *,
    sharding: bool = True,
) -> list[LeafDiff]:
    """Differences between two flat lists of ``(path, spec)`` with equal paths."""
    diffs = []
    for (path, e), (_, g) in zip(expected, got):
        if e is None or g is None:
            if e is not g:
                diffs.append(LeafDiff(path, describe_leaf(e, False), describe_leaf(g, False)))
            continue
        same = (
            tuple(e.shape) == tuple(g.shape)
            and np.dtype(e.dtype) == np.dtype(g.dtype)
            and bool(getattr(e, "weak_type", False)) == bool(getattr(g, "weak_type", False))
        )
        shard_same = not sharding or _sharding_equal(
            getattr(e, "sharding", None), getattr(g, "sharding", None), len(e.shape)
        )
        if not (same and shard_same):
            show_sharding = same and not shard_same
            expected, got_text = describe_leaf(e, show_sharding), describe_leaf(g, show_sharding)
            if expected == got_text:  # the short forms hide the difference
                expected += f" {_placement(e.sharding)}"
                got_text += f" {_placement(g.sharding)}"
            diffs.append(
                LeafDiff(
                    path,
                    expected,
                    got_text,
                    leaf_cause(e, g),
                    diff_kind(e, g),
                )
            )
    return diffs


def diff_specs(expected: Any, got: Any, *, sharding: bool = True) -> list[LeafDiff]:
    """Every difference between two spec trees: structure first, then leaves.

    Structure differences (a static field's value, a missing field, another
    class) are reported by path; leaves by shape, dtype, weak type, sharding.
    """
    structural = structure_diffs(expected, got, "")
    if structural:
        return structural
    exp = [(fmt_path(p), leaf_spec(x)) for p, x in jax.tree_util.tree_leaves_with_path(expected)]
    act = [(fmt_path(p), leaf_spec(x)) for p, x in jax.tree_util.tree_leaves_with_path(got)]
    return diff_leaves(exp, act, sharding=sharding)


def structure_diffs(a: Any, b: Any, path: str) -> list[LeafDiff]:
    """Structural differences between two pytrees, by path."""
    from ._state import is_state, static_field_names  # local: _state imports us

    here = path or "(the value itself)"
    if jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b):
        return []
    if is_state(a) and is_state(b) and type(a) is type(b):
        out: list[LeafDiff] = []
        for f in dataclasses.fields(a):
            va, vb = getattr(a, f.name), getattr(b, f.name)
            if f.name in static_field_names(type(a)):
                if va != vb:
                    out.append(
                        LeafDiff(
                            f"{path}.{f.name}",
                            f"static {va!r}",
                            f"static {vb!r}",
                            "a static field is part of the compiled signature; "
                            "changing it means a new compile",
                        )
                    )
            else:
                out.extend(structure_diffs(va, vb, f"{path}.{f.name}"))
        return out
    if isinstance(a, Mapping) and isinstance(b, Mapping) and type(a) is type(b):
        out = []
        for k in sorted(set(a) | set(b), key=repr):
            if k not in b:
                out.append(LeafDiff(f"{path}[{k!r}]", "present", "missing", "a key was dropped"))
            elif k not in a:
                out.append(LeafDiff(f"{path}[{k!r}]", "absent", "present", "a key was added"))
            else:
                out.extend(structure_diffs(a[k], b[k], f"{path}[{k!r}]"))
        return out
    if (
        isinstance(a, (list, tuple))
        and isinstance(b, (list, tuple))
        and type(a) is type(b)
        and len(a) == len(b)
    ):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(structure_diffs(x, y, f"{path}[{i}]"))
        return out
    return [
        LeafDiff(
            here,
            _struct_name(a),
            _struct_name(b),
            "the tree structure differs",
        )
    ]


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
