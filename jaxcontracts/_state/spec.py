"""Specs: leaves -> ``jax.ShapeDtypeStruct``, ``spec_of``, static values.

A *spec* is a pytree whose leaves are :class:`jax.ShapeDtypeStruct` s carrying
shape, dtype, weak type and (when known) sharding. Everything that compiles or
compares in this package goes through the functions here, so "the same spec"
means one thing everywhere. How two specs differ is ``_step.diffs``.
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
    "StaticArg", "eq_answers_bool", "fmt_value", "leaf_spec", "movable", "moved_by_jax", "spec_nbytes", "spec_of", "static_equal", "static_hash",
    "unchanging", "value_kind",
]


# --------------------------------------------------------------------------
# Leaves -> specs


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
        # What jax would make of it, worked out without touching a device: a
        # scalar of the default type, weakly typed unless it is a bool.
        return jax.ShapeDtypeStruct(
            (), jax.numpy.result_type(x), weak_type=not isinstance(x, bool)
        )
    return None


def movable(x: Any) -> bool:
    """An uncommitted jax array (``jnp.zeros``, ``jax.random.key`` made on the
    default device): ``jax.jit`` moves it to where its program runs."""
    return isinstance(x, jax.Array) and not getattr(x, "committed", True)


def moved_by_jax(leaves: Sequence[Any], donated: Sequence[int]) -> set[int]:
    """The positions of the undonated uncommitted arrays among a call's flat
    leaves: placed as compiled whatever their own placement (JAX moves them,
    as ``jax.jit`` does), so never a new signature nor its cause."""
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


# --------------------------------------------------------------------------
# Static arguments


class StaticArg:
    """A static argument's value, carried in the tree structure (no leaves).

    A pytree node with no children whose aux data is ``(type, value)``, and
    the value's hash where the value can change in place (:func:`unchanging`):
    two calls with equal values of one type share a tree structure (and a
    compiled signature); a new value is a new structure, so it is a new
    signature. The type is in the aux data because tree structures compare
    aux data with ``==``: ``1 == True == 1.0`` would otherwise share a
    signature (and run the program traced for another type), where
    ``jax.jit``'s static arguments would not. The hash, taken as the value
    was made, tells an object changed in place since (it compares equal to
    itself) from the value compiled for, as ``jax.jit`` tells it by hashing.
    """

    __slots__ = ("aux", "hash", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.hash = static_hash(value)  # as made: a value changed in place since hashes anew
        # what tree structures compare; the hash only of what can change in place
        self.aux = (type(value), value) if unchanging(value) else (type(value), value, self.hash)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StaticArg) and self.hash == other.hash and static_equal(self.value, other.value)

    def __hash__(self) -> int:
        return self.hash

    def __repr__(self) -> str:
        return f"static {self.value!r}"


_ATOMS = (type(None), bool, int, float, complex, str, bytes, np.generic, jax.Array, enum.Enum, type)
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodWrapperType, types.WrapperDescriptorType)


def unchanging(value: Any) -> bool:
    """Whether ``value`` can never change once made: numbers, strings, bytes,
    ``None``, enums, classes, functions, JAX arrays, and tuples, frozen
    dataclasses and partials of those. A list, dict, set, numpy array, a
    mutable dataclass or any other object can change in place after a
    program was traced with it."""
    if isinstance(value, _ATOMS) or isinstance(value, _FUNCTIONS):
        return True
    if isinstance(value, tuple):
        return all(map(unchanging, value))
    if type(value) is functools.partial:
        return unchanging(value.func) and all(map(unchanging, (*value.args, *value.keywords.values())))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        frozen = getattr(type(value), "__dataclass_params__", None)
        return bool(frozen and frozen.frozen) and all(
            unchanging(getattr(value, f.name, None)) for f in dataclasses.fields(value)
        )
    return False


def static_hash(value: Any) -> int:
    """``hash(value)``, or -1 where it raises. A static value hashed as a call
    made it: an object changed in place after a compile hashes anew, and is a
    new signature, as for ``jax.jit``'s static arguments (never the program
    traced for its old value)."""
    try:
        return hash(value)
    except Exception:  # noqa: BLE001 - unhashable: refused where the definition binds it
        return -1


def static_equal(a: Any, b: Any) -> bool:
    """Whether two static values are equal: their ``==``, when it answers a bool.

    An ``__eq__`` that returns anything else (an array: ``bool()`` of it would
    read the device) or raises is "not equal".
    """
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
    """``None`` when ``value == value`` is a bool; else what it returned (a
    static value JAX compares with ``==`` to pick a compiled signature)."""
    try:
        result = value == value
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}"
    if isinstance(result, (bool, np.bool_)):
        return None
    return f"returned {fmt_object(result)}"


jax.tree_util.register_pytree_node(
    StaticArg, lambda s: ((), s.aux), lambda aux, _: StaticArg(aux[1])
)
