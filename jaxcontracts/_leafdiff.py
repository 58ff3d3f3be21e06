"""Leaf diffs: how one array's spec differs from another's, in a message's words,
with the likely cause, for hot steps and plain ``jax.jit`` alike (from specs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._dtypes import is_key, same_dtype
from ._format import fmt_aval, fmt_sharding

__all__ = ["LeafDiff", "diff_leaves", "diff_lines", "memory_kind", "same_placement"]


@dataclasses.dataclass(frozen=True)
class LeafDiff:
    """One difference between an expected and an actual spec."""

    path: str
    expected: str
    got: str
    cause: str = ""
    kind: str = "structure"  # structure, dtype, shape, weak_type, memory_kind or sharding


def diff_lines(
    diffs: Sequence[LeafDiff],
    param: str,
    *,
    words: tuple[str, str],
    cause_prefix: str = "",
    cause: Callable[[LeafDiff], str] | None = None,
    full_paths: bool = True,
) -> tuple[list[str], list[str]]:
    """The detail lines of a message about leaf diffs (``    s.pos: takes f32[4],
    returns i32[4]``, then the cause), and the leaves they name."""
    lines: list[str] = []
    leaves: list[str] = []
    for d in diffs:
        # a structural path such as ``(structure)`` names the parameter alone
        name = param if d.path.startswith("(") else f"{param}{d.path}"
        lines.append(
            f"    {name if full_paths else d.path}: {words[0]} {d.expected}, {words[1]} {d.got}"
        )
        why = cause(d) if cause is not None else d.cause
        if why:
            lines.append(f"      ({why})" if not cause_prefix else f"      {cause_prefix}{why}")
        leaves.append(name)
    return lines, leaves


def describe_leaf(spec: Any, with_sharding: bool) -> str:
    if spec is None:
        return "no array"
    text = fmt_aval(spec.shape, spec.dtype, getattr(spec, "weak_type", False))
    if with_sharding:
        text += f" sharded {fmt_sharding(getattr(spec, 'sharding', None))}"
    return text


def same_placement(a: Any, b: Any, ndim: int) -> bool:
    """Whether two shardings place an ``ndim`` array alike (``None``: unknown,
    alike), as the executable accepts ``P('x', None)`` for ``P('x')``."""
    if a is None or b is None or a == b:
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
    """What differs first between two leaf specs."""
    if not same_dtype(exp.dtype, got.dtype):
        return "dtype"
    if tuple(exp.shape) != tuple(got.shape):
        return "shape"
    if bool(getattr(exp, "weak_type", False)) != bool(getattr(got, "weak_type", False)):
        return "weak_type"
    if memory_kind(exp) != memory_kind(got):
        return "memory_kind"
    return "sharding"


def memory_kind(spec: Any) -> str | None:
    """The memory a leaf spec's sharding puts it in (``device``, ``pinned_host``...), or None."""
    return getattr(getattr(spec, "sharding", None), "memory_kind", None)


def leaf_cause(exp: Any, got: Any) -> str:
    kind = diff_kind(exp, got)
    if kind == "dtype":
        if is_key(exp.dtype) or is_key(got.dtype):
            return (
                "a typed PRNG key of another implementation, or a raw uint32 key "
                "(jax.random.PRNGKey) where a typed key (jax.random.key) is expected"
                if is_key(exp.dtype)
                else "a typed PRNG key where an array of numbers is expected"
            )
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
            return (
                "weakly typed: made from a Python scalar; use jnp.float32(x) "
                "/ jnp.asarray(x, dtype)"
            )
        return ("strongly typed where a weak type was compiled (the first call was given a "
                "Python number, or an array made from one): give that first call the typed array "
                "the later calls give, jnp.asarray(x, dtype)")
    if kind == "memory_kind":
        return f"moved from {memory_kind(exp)} memory to {memory_kind(got)} memory"
    return "sharding changed: device_put it with the compiled sharding"


def diff_leaves(
    expected: Sequence[tuple[str, Any]],
    got: Sequence[tuple[str, Any]],
) -> list[LeafDiff]:
    """Differences between two flat lists of ``(path, spec)`` with equal paths."""
    diffs = []
    for (path, e), (_, g) in zip(expected, got):
        if e is None or g is None:
            if e is not g:
                diffs.append(LeafDiff(path, describe_leaf(e, False), describe_leaf(g, False)))
            continue
        kind = diff_kind(e, g)
        same = kind in ("memory_kind", "sharding")  # shape, dtype and weak type agree
        shard_same = same_placement(
            getattr(e, "sharding", None), getattr(g, "sharding", None), len(e.shape)
        )
        if not (same and shard_same):
            show_sharding = same and not shard_same
            exp_text, got_text = describe_leaf(e, show_sharding), describe_leaf(g, show_sharding)
            if exp_text == got_text:  # the short forms hide the difference
                exp_text += f" {_placement(e.sharding)}"
                got_text += f" {_placement(g.sharding)}"
            diffs.append(LeafDiff(path, exp_text, got_text, leaf_cause(e, g), kind))
    return diffs
