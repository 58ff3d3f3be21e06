"""States updated in place: flax NNX objects (Modules, Optimizers, Metrics, Rngs).

An NNX step mutates its objects (``optimizer.update(model, grads)``,
``metrics.update(...)``) and returns nothing, as ``nnx.jit`` lets it. A
compiled function cannot change objects outside it, so a hot step carries
them: the compiled function returns each such state object after the step
ran (the traced copy it mutated), its arrays donated and aliased like any
carried state, and :func:`write_back` puts the new arrays into the user's
own objects' Variables after the call. Every object sharing those Variables
(``nnx.view``, an eval copy made by ``nnx.merge`` of the same state) sees
them, as after ``nnx.jit``.

flax is not imported here: an object is NNX's only if ``flax.nnx`` is
already loaded (no NNX object exists otherwise).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import jax

from .._errors import DefinitionError

__all__ = ["is_inplace_object", "is_ref", "mutated", "refs_error", "static_attributes", "write_back"]


def _nnx() -> Any:
    return sys.modules.get("flax.nnx")


def is_inplace_object(x: Any) -> bool:
    """Whether ``x`` is an NNX object a step may update in place: a pytree
    (flax >= 0.11) whose arrays live in Variables."""
    nnx = _nnx()
    base = getattr(nnx, "Pytree", None) or getattr(nnx, "Object", None)
    return base is not None and isinstance(x, base)


def write_back(obj: Any, new: Any) -> None:
    """Put the arrays of ``new`` (the object the compiled step returned for
    ``obj``: the same structure) into ``obj``'s own Variables."""
    variable = _nnx().Variable
    is_variable = lambda v: isinstance(v, variable)  # noqa: E731
    old_vars = [v for v in jax.tree_util.tree_leaves(obj, is_leaf=is_variable) if is_variable(v)]
    new_vars = [v for v in jax.tree_util.tree_leaves(new, is_leaf=is_variable) if is_variable(v)]
    for old, fresh in zip(old_vars, new_vars, strict=True):
        old.set_raw_value(fresh.get_raw_value())


def mutated(before: Sequence[Any], after: Sequence[Any]) -> bool:
    """Whether an argument's leaves, read again after the traced step ran,
    are not the ones it was given (an in-place update)."""
    return len(before) != len(after) or any(a is not b for a, b in zip(before, after))


def static_attributes(kind: type, aux: Any) -> dict[str, Any] | None:
    """An NNX object's static attributes by name, from its pytree aux data
    (node names, static names, static values), so that a message names
    ``use_running_average``, not a tuple index; None for any other node."""
    nnx = _nnx()
    base = getattr(nnx, "Pytree", None)
    if base is None or not isinstance(kind, type) or not issubclass(kind, base):
        return None
    if not (isinstance(aux, tuple) and len(aux) == 3 and isinstance(aux[1], tuple) and isinstance(aux[2], tuple)):
        return None
    names, values = aux[1], aux[2]
    if len(names) != len(values) or not all(isinstance(n, str) for n in names):
        return None
    return {n: v for n, v in zip(names, values) if not n.startswith("_pytree__")}


_REF = getattr(getattr(jax, "ref", None), "Ref", None)


def is_ref(x: Any) -> bool:
    """Whether ``x`` is a JAX ref (``jax.new_ref``), which a step updates in place."""
    return _REF is not None and isinstance(x, _REF)


def refs_error(name: str, paths: Sequence[str]) -> DefinitionError:
    """A hot step given JAX refs: not taken yet, said as it is (they are not host data)."""
    return DefinitionError(
        f"{name}: {', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''} "
        f"{'is a JAX ref' if len(paths) == 1 else f'are JAX refs ({len(paths)})'} "
        "(jax.new_ref), which hot steps do not take yet: they update their arrays "
        "in place, and a hot step's call path, signature and donation checks are "
        "built for arrays.",
        fix="carry arrays instead (state = jax.tree.map(lambda r: r[...], refs) once, "
        "then state = step(state) with the step returning its new state), or keep "
        "this step a plain jax.jit (jc.hot_loop still guards the loop around it).",
        contract="definition",
        leaves=list(paths),
    )
