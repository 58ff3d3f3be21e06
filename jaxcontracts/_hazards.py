"""Donation hazards at call time (a buffer already deleted, or one buffer
passed twice), and the field a leaf path selects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["field_of", "find_hazards", "holds_deleted", "is_deleted_array"]


def field_of(key: Any) -> str | None:
    """The field name a path entry selects (``.pos`` or ``['pos']``)."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    return None


def find_hazards(
    leaves: Sequence[Any], donated: Sequence[int]
) -> tuple[list[int], list[tuple[int, int]]]:
    """``(deleted, duplicates)``: the deleted leaves (donated or not), and
    ``(first, second)`` pairs where a donated buffer appears twice."""
    deleted = [i for i, x in enumerate(leaves) if is_deleted_array(x)]
    donated_set = set(donated)
    seen: dict[Any, int] = {}
    duplicates: list[tuple[int, int]] = []
    for i, x in enumerate(leaves):
        if not isinstance(x, jax.Array) or i in deleted:
            continue
        key = _buffer_key(x)
        first = seen.get(key)
        if first is None:
            seen[key] = i
        elif first in donated_set or i in donated_set:
            duplicates.append((first, i))
    return deleted, duplicates


def is_deleted_array(x: Any) -> bool:
    """Whether ``x`` is a jax array whose buffer was deleted (donated); never raises."""
    if not isinstance(x, jax.Array):
        return False
    try:
        return bool(x.is_deleted())
    except Exception:  # noqa: BLE001 - tracers and exotic arrays
        return False


def holds_deleted(tree: Any) -> bool:
    if isinstance(tree, jax.Array):
        return is_deleted_array(tree)
    return any(map(is_deleted_array, jax.tree_util.tree_leaves(tree)))


def _buffer_key(x: jax.Array) -> Any:
    if x.size == 0:  # empty buffers may all share one address
        return ("id", id(x))
    try:
        return ("ptr", x.unsafe_buffer_pointer())
    except Exception:  # noqa: BLE001 - multi-device arrays have no single pointer
        return ("id", id(x))
