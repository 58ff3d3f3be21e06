"""The array a JAX ref (``jax.new_ref``) holds, read and replaced.

A hot step carries a pytree of refs as arrays: the call passes each ref's
array (donated), and puts the array the executable returned for it back into
the ref, as JAX's own dispatch of a jitted function with ref arguments does
(``pxla``: ``x._refs._buf`` in, ``_refs._buf._replace_with(out)`` after).
That array is the ref's alone: ``jax.new_ref(x)`` copies ``x`` and
``ref[...]`` returns a copy, so no user object holds it.

Private: ``Ref._refs`` (an ``ArrayRefImpl``) and its mutable field ``_buf``,
the same in jax 0.10.0 to 0.12.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax

from .registry import capability, define

__all__ = ["buffer", "replace", "usable"]


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
    """Whether refs' arrays can be read and replaced on the installed JAX."""
    return capability("ref-buffers").available


def buffer(ref: Any) -> jax.Array | None:
    """The array ``ref`` holds; None for a ref that holds no single array
    (a traced ref, or a ref of a pytree)."""
    buf = getattr(getattr(ref, "_refs", None), "_buf", None)
    return buf if isinstance(buf, jax.Array) else None


def replace(ref: Any, new: jax.Array) -> None:
    """Make ``ref`` hold ``new`` (the executable's output for it)."""
    ref._refs._buf = new
