"""Specs: leaves -> ``jax.ShapeDtypeStruct``, ``spec_of``, static values.

Everything that compiles or compares goes through these functions, so "the
same spec" means one thing everywhere; how two differ is ``_step.diffs``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .._compat.tracing import Tracer
from .._dtypes import array_nbytes
from .._errors import SpecError
from .._format import fmt_aval, fmt_object, fmt_path
from .._tracebacks import boundary

__all__ = [
    "StaticArg", "eq_answers_bool", "fmt_value", "leaf_spec", "movable", "moved_by_jax",
    "spec_nbytes", "spec_of", "static_equal", "static_hash",
    "hashed_by_value", "hashed_key", "unchanging", "value_key", "value_kind",
]


def leaf_spec(x: Any) -> jax.ShapeDtypeStruct | None:
    """The exact spec of one leaf, or ``None`` when it is not array-like."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        aval = x.aval
        sharding = x.sharding if not isinstance(x, Tracer) else None
        return jax.ShapeDtypeStruct(
            aval.shape, aval.dtype, sharding=sharding, weak_type=aval.weak_type
        )
    if isinstance(x, (np.ndarray, np.generic)):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    if isinstance(x, (bool, int, float, complex)):
        # as jax would make it (no device): weakly typed unless a bool
        return jax.ShapeDtypeStruct(
            (), jax.numpy.result_type(x), weak_type=not isinstance(x, bool)
        )
    return None


def movable(x: Any) -> bool:
    """An uncommitted jax array (``jnp.zeros``, ``jax.random.key`` made on the
    default device): ``jax.jit`` moves it to where its program runs."""
    return isinstance(x, jax.Array) and not getattr(x, "committed", True)


def moved_by_jax(leaves: Sequence[Any], donated: Sequence[int]) -> set[int]:
    """The undonated uncommitted leaves: JAX moves them as ``jax.jit`` does, so
    their placement is never a new signature."""
    return {i for i, x in enumerate(leaves) if movable(x) and i not in donated}


def fmt_value(value: Any) -> str:
    """Describe a leaf of any kind in a few characters (never reads the device)."""
    if value is None:
        return "None"
    spec = leaf_spec(value)
    if spec is None:
        return fmt_object(value)
    return f"{fmt_aval(spec.shape, spec.dtype, spec.weak_type)} ({value_kind(value)})"


def value_kind(value: Any) -> str:
    """What a leaf is, in words: ``jax array``, ``numpy array``, ``Python float``..."""
    if isinstance(value, jax.Array):
        return "jax array"
    if isinstance(value, jax.ShapeDtypeStruct):
        return "spec"
    if isinstance(value, np.ndarray):
        return "numpy array"
    if isinstance(value, np.generic):
        return "numpy scalar"
    return f"Python {type(value).__name__}"


def spec_nbytes(spec: Any) -> int:
    """Bytes of an array with this spec (all shards together)."""
    return array_nbytes(spec.shape, spec.dtype)


@boundary
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
            bad.append(f"  {fmt_path(path)}: {fmt_object(leaf)}")
        specs.append(spec)
    if bad:
        raise SpecError(
            "jc.spec_of(): these leaves are not arrays, so they have no spec:",
            bad,
            fix="make them jax arrays, or mark them jc.static(...) in a "
            "jc.state class so they become part of the tree structure.",
        )
    return jax.tree_util.tree_unflatten(treedef, specs)


class StaticArg:
    """A static argument's value, carried in the tree structure (no leaves).

    Aux data ``(type, value)`` (the type, as ``1 == True == 1.0`` must not
    share a signature), or ``(type, value_key, value)`` for a value that can
    change in place; the hash taken as made tells such a change, as
    ``jax.jit`` does by hashing.
    """

    __slots__ = ("aux", "hash", "key", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.hash = static_hash(value)  # as made: a value changed in place since hashes anew
        # what tree structures compare: a value that can change in place, by what
        # it holds as this call made it (value_key), carried besides
        self.key = None if unchanging(value) else value_key(value)
        self.aux = (
            (type(value), value) if self.key is None else (type(value), self.key, _Carried(value))
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StaticArg) or self.key != other.key:
            return False
        return (
            self.key is not None
            or (self.hash == other.hash and static_equal(self.value, other.value))
        )

    def __hash__(self) -> int:
        return self.hash

    def __repr__(self) -> str:
        return f"static {self.value!r}"


_ATOMS = (type(None), bool, int, float, complex, str, bytes, np.generic, jax.Array, enum.Enum, type)
_FUNCTIONS = (
    types.FunctionType, types.BuiltinFunctionType, types.MethodWrapperType,
    types.WrapperDescriptorType,
)


def unchanging(value: Any) -> bool:
    """Whether ``value`` can never change once made: atoms, functions, JAX's own
    objects, and tuples, frozen dataclasses and partials of those."""
    if isinstance(value, _ATOMS) or isinstance(value, _FUNCTIONS):
        return True
    if type(value).__module__.partition(".")[0] in ("jax", "jaxlib") and not isinstance(
        value, functools.partial
    ):
        return True  # JAX's own objects (jnp.multiply, a jitted function, a mesh) never change
    if isinstance(value, tuple):
        return all(map(unchanging, value))
    if type(value) is functools.partial:
        return unchanging(value.func) and all(
            map(unchanging, (*value.args, *value.keywords.values()))
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        frozen = getattr(type(value), "__dataclass_params__", None)
        return bool(frozen and frozen.frozen) and all(
            unchanging(getattr(value, f.name, None)) for f in dataclasses.fields(value)
        )
    return False


class _Same:
    """An object a value key compares by identity: a function, a class, a JAX
    array (``==`` of one is a device op), an object of the user's own kind."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is _Same and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


#: Containers nested deeper than this in a static value are compared by identity.
_KEY_DEPTH = 32


def value_key(value: Any) -> Any:
    """A snapshot of what ``value`` holds now, equal to another's only where the
    two trace alike (numbers by type and bits, containers item by item, numpy
    by bytes, hashable objects by hash and ``==`` as ``jax.jit``, functions
    and arrays by identity). Made at each call for a value that can change in
    place (:func:`unchanging`): a change is a new signature, never the
    program traced for the old value."""
    return _key(value, 0, {})


#: Types keyed as themselves (after float, complex), and types keyed as the same object.
_PLAIN_TYPES = frozenset({bool, int, str, bytes, type(None)})
_SAME_TYPES = frozenset({type, *_FUNCTIONS})


def _key(value: Any, depth: int, memo: dict[int, Any]) -> Any:
    t = type(value)  # (exact types first: an isinstance of jax.Array costs a microsecond)
    if t is float:
        return (t, value.hex())
    if t in _PLAIN_TYPES:
        return (t, value)
    if t in _SAME_TYPES:
        return _Same(value)
    if t is complex:
        return (t, value.real.hex(), value.imag.hex())
    seen = memo.get(id(value))
    if seen is not None:  # met before in this value (shared, or a cycle): which one, not again
        return seen
    # (each object expanded once: a key's size is the value's)
    memo[id(value)] = ("seen", len(memo))
    return _walked(value, t, depth, memo)


def _walked(value: Any, t: type, depth: int, memo: dict[int, Any]) -> Any:
    deeper = depth < _KEY_DEPTH
    depth += 1
    if deeper and (t is tuple or t is list):
        return (t, *[_key(x, depth, memo) for x in value])
    if deeper and t is dict:
        return (t, *[(_key(k, depth, memo), _key(v, depth, memo)) for k, v in list(value.items())])
    if deeper and t is functools.partial:
        return (
            t,
            _key(value.func, depth, memo),
            _key(value.args, depth, memo),
            _key(value.keywords, depth, memo),
        )
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.hasobject:
            return (t, value.dtype, value.shape, *[_key(x, depth, memo) for x in np.ravel(value)])
        return (t, value.dtype, value.shape, value.tobytes())
    if isinstance(value, (enum.Enum, type, *_FUNCTIONS)):
        return (t, value) if isinstance(value, enum.Enum) else _Same(value)
    if deeper and isinstance(value, (tuple, list)):  # a NamedTuple, a list's subclass
        return (t, *[_key(x, depth, memo) for x in value])
    if deeper and isinstance(value, dict):
        return (t, *[(_key(k, depth, memo), _key(v, depth, memo)) for k, v in list(value.items())])
    if deeper and isinstance(value, (set, frozenset)):
        return (t, frozenset([_key(x, depth, memo) for x in list(value)]))
    if deeper and t is types.MethodType:
        return (t, _Same(value.__func__), _key(value.__self__, depth, memo))
    if t.__hash__ is object.__hash__:  # by identity, as jax.jit takes it
        return _Same(value)
    # (an array hashes by nothing) never read
    if t.__hash__ is None and isinstance(value, jax.Array):
        return _Same(value)
    hashed = static_hash(value) if t.__hash__ is not None else -1
    if hashed != -1:
        # hashed by value (an nnx.GraphDef, a dataclass with unsafe_hash=True): by its hash
        # and ==, as jax.jit tells a change (a field left out of the hash is not seen by either)
        return hashed_by_value(value, hashed)
    if deeper and dataclasses.is_dataclass(value):  # no hash: its fields, as its == compares them
        fields = [f.name for f in dataclasses.fields(value) if f.compare]
        return (t, *[_key(getattr(value, name, None), depth, memo) for name in fields])
    if deeper and isinstance(getattr(value, "__dict__", None), dict):  # an argparse.Namespace
        return (t, *[(name, _key(v, depth, memo)) for name, v in list(vars(value).items())])
    return _Same(value)


def hashed_by_value(value: Any, hashed: int) -> Any:
    """The :func:`value_key` of an object hashed by value, its hash ``hashed`` given."""
    return (type(value), hashed, _Equal(value))


def hashed_key(key: Any) -> bool:
    """Whether a :func:`value_key` is that of an object hashed by value: (type, hash, it)."""
    return type(key) is tuple and len(key) == 3 and type(key[2]) is _Equal


class _Equal(_Same):
    """An object hashed by value, in a value key: compared by ``==``
    (:func:`static_equal`), its hash beside it telling a change in place."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is _Equal and static_equal(self.obj, other.obj)

    def __hash__(self) -> int:
        return 0


def static_hash(value: Any) -> int:
    """``hash(value)``, or -1 where it raises."""
    try:
        return hash(value)
    except Exception:  # noqa: BLE001 - unhashable: refused where the definition binds it
        return -1


def static_equal(a: Any, b: Any) -> bool:
    """Whether two static values are equal: their ``==`` when it answers a bool
    (anything else, an array that ``bool()`` would read, is "not equal")."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        result = a == b
    except Exception:  # noqa: BLE001 - an __eq__ that cannot answer: not equal
        return False
    return bool(result) if isinstance(result, (bool, np.bool_)) else False


def eq_answers_bool(value: Any) -> str | None:
    """``None`` when ``value == value`` is a bool; else what it returned."""
    try:
        result = value == value
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}"
    if isinstance(result, (bool, np.bool_)):
        return None
    return f"returned {fmt_object(result)}"


class _Carried:
    """A static value carried in a tree structure's aux data beside its
    :func:`value_key`, which alone is compared."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is _Carried

    def __hash__(self) -> int:
        return 0


jax.tree_util.register_pytree_node(
    StaticArg,
    lambda s: ((), s.aux),
    lambda aux, _: StaticArg(aux[-1].value if len(aux) == 3 else aux[1]),
)
