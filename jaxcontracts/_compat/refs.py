"""The array a JAX ref (``jax.new_ref``) holds, read and replaced.

A step's call passes each ref's array (donated: ``new_ref`` and ``ref[...]``
copy) and puts the returned one back, as JAX's own dispatch does (``pxla``).
``jax.jit`` keys a ref on its type, fixed at ``new_ref`` (maybe weak); the
returned array is strong, so :func:`replace` puts back a view with the ref's
weak type: the next call's signature is the first's, as under ``jax.jit``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import jax

from .registry import capability, define

__all__ = ["buffer", "replace", "usable", "weakly_typed"]


@define(
    "ref-buffers",
    "jax.ref.Ref._refs._buf (jax._src.core.ArrayRefImpl, the array a ref holds)",
    "that a hot step takes JAX refs as its state (the refs' arrays donated, "
    "the new ones put back into them after each call)",
)
def _probe() -> str | None:
    from jax._src import core

    impl = getattr(core, "ArrayRefImpl", None)
    if impl is None or getattr(jax.ref, "Ref", None) is not getattr(core, "Ref", None):
        return "jax._src.core.ArrayRefImpl or jax.ref.Ref is missing"
    if list(inspect.signature(impl.__init__).parameters) != ["self", "aval", "buf"]:
        return "ArrayRefImpl(aval, buf) changed"
    return None


def usable() -> bool:
    return capability("ref-buffers").available


def buffer(ref: Any) -> jax.Array | None:
    """The array ``ref`` holds; None for a ref that holds no single array
    (a traced ref, or a ref of a pytree)."""
    buf = getattr(getattr(ref, "_refs", None), "_buf", None)
    return buf if isinstance(buf, jax.Array) else None


@define(
    "ref-weak-types",
    "jax._src.array.ArrayImpl(aval, sharding, arrays, committed, _skip_checks) over "
    "an array's own buffers (Array._arrays): the same buffers under a weakly typed aval",
    "that a hot step keeps a weakly typed ref (jax.new_ref(jnp.array(0))) weakly typed "
    "after a call, as jax.jit does (without it, its second call is refused as a new signature)",
)
def _probe_weak() -> str | None:
    from jax._src import array

    impl = getattr(array, "ArrayImpl", None)
    if impl is None or not issubclass(impl, jax.Array) or not hasattr(impl, "_arrays"):
        return "jax._src.array.ArrayImpl or its _arrays is missing"
    return None


def replace(ref: Any, new: jax.Array) -> None:
    """Make ``ref`` hold ``new``, with the weak type of the ref's own type."""
    impl = ref._refs
    if (
        impl._aval.inner_aval.weak_type
        and not new.aval.weak_type
        and capability("ref-weak-types").available
    ):
        new = weakly_typed(new)
    impl._buf = new


def weakly_typed(x: jax.Array) -> jax.Array:
    """``x``'s device buffers as a weakly typed array (no device work, no copy)."""
    from jax._src.array import ArrayImpl

    return ArrayImpl(_weak_aval(x.aval), x.sharding, x._arrays, x.committed, _skip_checks=True)


@functools.lru_cache(maxsize=64)
def _weak_aval(aval: Any) -> Any:
    return aval.update(weak_type=True)
