"""Equinox Modules as state: their non-array leaves are static, as ``eqx.filter_jit``
has them. The argument travels as a :class:`Filtered` node (array children; aux
data a :class:`FilterKey` of the structure and the other leaves); the output is
filtered inside the executable and rebuilt after the call."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax

from .spec import static_equal

__all__ = ["Filtered", "join", "join_out", "short", "split", "split_if_needed", "split_out"]


class FilterKey:
    """A filtered argument's structure and its static (non-array) leaves."""

    __slots__ = ("treedef", "static", "static_set", "values", "paths", "_hash")

    def __init__(self, treedef: Any, static: tuple[int, ...], values: tuple[Any, ...]) -> None:
        self.treedef, self.static, self.values = treedef, static, values
        self.static_set = frozenset(static)
        self.paths: tuple[str, ...] | None = None  # every leaf's path, when first asked
        try:
            self._hash = hash((treedef, static, values))
        except TypeError:  # an unhashable static leaf: equal keys still compare equal
            self._hash = hash((treedef, static))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return (
            isinstance(other, FilterKey)
            and self.static == other.static
            and self.treedef == other.treedef
            and all(static_equal(a, b) for a, b in zip(self.values, other.values))
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        shown = ", ".join(short(v) for v in self.values[:4])
        more = f", ... ({len(self.values)} in all)" if len(self.values) > 4 else ""
        return f"static leaves ({shown}{more})"

    def _all_paths(self) -> tuple[str, ...]:
        if self.paths is None:
            n = self.treedef.num_leaves
            full = jax.tree_util.tree_unflatten(self.treedef, list(range(n)))
            self.paths = tuple(
                jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(full)[0]
            )
        return self.paths

    def leaf_paths(self) -> list[str]:
        """``.layers[0].weight`` for each array leaf (built once, from the structure)."""
        return [p for i, p in enumerate(self._all_paths()) if i not in self.static_set]

    def static_paths(self) -> list[str]:
        """``.layers[2]`` for each static leaf."""
        paths = self._all_paths()
        return [paths[i] for i in self.static]


def short(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if name is None and hasattr(value, "__wrapped__"):
        name = getattr(value.__wrapped__, "__qualname__", None)
    return name if isinstance(name, str) else f"{type(value).__name__} {value!r:.30}"


class Filtered:
    """A filtered argument: the array leaves, and the key that rebuilds it."""

    __slots__ = ("leaves", "key")

    def __init__(self, leaves: Iterable[Any], key: FilterKey) -> None:
        self.leaves, self.key = tuple(leaves), key

    def __repr__(self) -> str:
        return f"Filtered({len(self.leaves)} arrays, {self.key!r})"


class _LeafKey:
    """A child's key: its path in the rebuilt Module, as messages print it."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def __str__(self) -> str:
        return self.path

    __repr__ = __str__


def _flatten_with_keys(f: Filtered) -> tuple[list[tuple[Any, Any]], FilterKey]:
    return [(_LeafKey(p), x) for p, x in zip(f.key.leaf_paths(), f.leaves)], f.key


jax.tree_util.register_pytree_with_keys(
    Filtered,
    _flatten_with_keys,
    lambda key, leaves: Filtered(leaves, key),
    flatten_func=lambda f: (f.leaves, f.key),
)


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array) or hasattr(x, "shape") and hasattr(x, "dtype")


def split(value: Any, last: FilterKey | None = None) -> Filtered:
    """``value`` as a :class:`Filtered` node (``last``: reused when it still fits)."""
    leaves, treedef = jax.tree_util.tree_flatten(value)
    key = last
    if key is None or treedef != key.treedef or not all(
        leaves[i] is v for i, v in zip(key.static, key.values)
    ):
        static_pos = tuple(i for i, x in enumerate(leaves) if not _is_array(x))
        key = FilterKey(treedef, static_pos, tuple(leaves[i] for i in static_pos))
    static = key.static_set
    return Filtered([x for i, x in enumerate(leaves) if i not in static], key)


def join(f: Any) -> Any:
    """The value a :class:`Filtered` node stands for (anything else as it is)."""
    if type(f) is not Filtered:
        return f
    key = f.key
    it = iter(f.leaves)
    static = dict(zip(key.static, key.values))
    leaves = [static[i] if i in static else next(it) for i in range(key.treedef.num_leaves)]
    return jax.tree_util.tree_unflatten(key.treedef, leaves)


def split_out(out: Any) -> Any:
    """A step's output with each element that holds non-array leaves filtered
    (a returned tuple element by element, so a returned state keeps its node)."""
    if type(out) is tuple:
        return tuple(split_if_needed(x) for x in out)
    return split_if_needed(out)


def split_if_needed(x: Any) -> Any:
    leaves = jax.tree_util.tree_leaves(x)
    return split(x) if any(not _is_array(v) for v in leaves) else x


def join_out(out: Any) -> Any:
    """The inverse of :func:`split_out` (idempotent)."""
    if type(out) is tuple:
        return tuple(join(x) for x in out)
    return join(out)
