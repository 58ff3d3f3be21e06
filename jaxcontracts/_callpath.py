"""The per-call closures of a compiled signature, one per checks level.

The call path is a closure picked when the step compiles or the checks level
changes, so a call never reads configuration:

* ``off``:  the compiled executable's own C++ fast path, nothing else;
* ``fast``: flatten the arguments (C++), compare the tree structure, check
  that every leaf is a strongly typed device array (and, on a multi-device
  executable, its sharding), then call. Shape, dtype and committed shardings
  are checked by the executable itself before it runs;
* ``full``: ``fast`` plus, after dispatch, that every donated input was
  consumed. Nothing blocks on the device.

A state a hot step returned carries the provenance token of its exact spec
and skips the per-leaf checks (see ``provenance`` below). Every checked path
ends in the same after-dispatch tail (:func:`_tail`): stamp the tokens, check
consumption, count, tell active loops. Anything unusual falls to the step's
slow path, which diagnoses it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ._compat.arrays import ArrayImpl
from ._compat.tracing import cpp_call, flatten
from ._compile import TOKEN_KEY
from ._records import CompiledSignature, StepStats
from ._runtime import note_call, tracking

__all__ = ["make_dispatch"]

SlowCall = Callable[[tuple[Any, ...], dict[str, Any], "BaseException | None"], Any]
NotConsumed = Callable[[CompiledSignature, Sequence[Any], Any], BaseException]
FlatFields = Callable[[type], "tuple[str, ...] | None"]


def make_dispatch(
    cs: CompiledSignature,
    level: str,
    *,
    step_id: int,
    name: str,
    n_params: int,
    n_state_params: int,
    slow_call: SlowCall,
    stats: StepStats,
    not_consumed: NotConsumed,
    flat_fields: FlatFields,
) -> Callable[..., Any]:
    """Build the per-call closure for one compiled signature and checks level.

    Args:
        slow_call: ``(args, kwargs, exception_or_None)``: the step's slow path.
        not_consumed: builds the DonationError raised when XLA copied.
        flat_fields: for a state class whose fields are all arrays (or
            static), its array field names, read by attribute; else ``None``.
    """
    compiled = cpp_call(cs.compiled)  # skips Compiled.__call__'s Python frame
    in_treedef = cs.in_treedef
    array_impl = ArrayImpl

    if level == "off":
        if cs.flat_style:

            def off_flat(*args: Any, **kwargs: Any) -> Any:
                leaves, treedef = flatten(args)
                if kwargs or treedef != in_treedef:
                    return slow_call(args, kwargs, None)
                try:
                    return compiled(*leaves)
                except Exception as e:  # noqa: BLE001
                    return slow_call(args, kwargs, e)

            return off_flat

        def off(*args: Any, **kwargs: Any) -> Any:
            try:
                return compiled(*args, **kwargs)
            except Exception as e:  # noqa: BLE001
                return slow_call(args, kwargs, e)

        return off

    full = level == "full"
    donated = cs.donated
    weak = cs.weak
    any_weak = any(weak)
    shardings = [leaf.spec.sharding for leaf in cs.leaves] if cs.multi_device else None
    flat_style = cs.flat_style
    # One is_deleted() per call catches the usual stale state (all of it was
    # donated) before XLA refuses it with an error line on stderr.
    first_donated = donated[0] if donated else None
    out_tokens = cs.out_tokens
    key = TOKEN_KEY
    is_deleted = array_impl.is_deleted  # unbound: map() runs it in C

    def stamp(out: Any) -> None:
        for pos, token in out_tokens:
            obj = out
            for k in pos:
                obj = obj[k]
            obj.__dict__[key] = token

    if len(out_tokens) == 1 and out_tokens[0][0] == ():
        token_out = out_tokens[0][1]

        def stamp(out: Any) -> None:  # noqa: F811 - the common `s = step(s)`
            out.__dict__[key] = token_out

    def _tail(consumed: Callable[[Any], bool]) -> Callable[[tuple[Any, ...], Any, Any], Any]:
        """The after-dispatch tail, given how to tell that donation happened."""

        def tail(args: tuple[Any, ...], src: Any, out: Any) -> Any:
            stamp(out)
            if full and not consumed(src):
                raise not_consumed(cs, flatten(args)[0], out)
            stats.calls += 1
            if tracking.count:  # a hot_loop is active somewhere: remember for messages
                note_call(step_id, name, args, out)
            return out

        return tail

    def leaves_consumed(leaves: Sequence[Any]) -> bool:
        return all(leaves[i].is_deleted() for i in donated)

    checked_tail = _tail(leaves_consumed)

    def checked(*args: Any, **kwargs: Any) -> Any:
        leaves, treedef = flatten(args)
        if kwargs or treedef != in_treedef:
            return slow_call(args, kwargs, None)
        if any_weak:
            for x, w in zip(leaves, weak):
                if type(x) is not array_impl or x.aval.weak_type is not w:
                    return slow_call(args, kwargs, None)
        else:
            for x in leaves:
                if type(x) is not array_impl or x.aval.weak_type:
                    return slow_call(args, kwargs, None)
        if shardings is not None:
            for x, s in zip(leaves, shardings):
                if x.sharding != s:
                    return slow_call(args, kwargs, None)
        if first_donated is not None and leaves[first_donated].is_deleted():
            return slow_call(args, kwargs, None)  # a stale state: explain, quietly
        try:
            out = compiled(*leaves) if flat_style else compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        return checked_tail(args, leaves, out)

    in_tokens = cs.in_tokens
    if not in_tokens or len(in_tokens) != n_state_params:
        return checked

    # The provenance fast path. A jc.state returned by a hot_step carries the
    # token of its exact spec (structure with static values, shapes, dtypes,
    # weak types, shardings): the executable made every leaf, and carry
    # invariance proved the spec when the step compiled. The instance is
    # frozen and the token is dropped by replace(), tree_map and pickling, so
    # an argument carrying this entry's token needs no per-leaf checks; the
    # executable itself still refuses deleted buffers (-> the slow path).
    getters = {arg: _leaves_of(type(cs.spec_args[arg]), flat_fields) for arg, _ in in_tokens}
    donated_getters = tuple((arg, getters[arg]) for arg, _ in in_tokens) if donated else ()
    first_leaf: Callable[[tuple[Any, ...]], Any] | None = None
    if donated_getters and jax.tree_util.tree_leaves(cs.spec_args[donated_getters[0][0]]):
        arg0 = donated_getters[0][0]
        get_first = _first_leaf_of(type(cs.spec_args[arg0]), flat_fields)

        def first_leaf(args: tuple[Any, ...]) -> Any:
            return get_first(args[arg0])

    def states_consumed(args: tuple[Any, ...]) -> bool:
        return all(all(map(is_deleted, get(args[arg]))) for arg, get in donated_getters)

    provenance_tail = _tail(states_consumed)
    others = tuple(i for i in range(n_params) if i not in dict(in_tokens))
    other_specs, other_treedef = jax.tree_util.tree_flatten(tuple(cs.spec_args[i] for i in others))
    other_weak = tuple(bool(s.weak_type) for s in other_specs)
    other_any_weak = any(other_weak)

    def provenance(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != n_params:
            return checked(*args, **kwargs)
        for i, token in in_tokens:
            d = getattr(args[i], "__dict__", None)
            if d is None or d.get(key) is not token:
                return checked(*args)
        if first_leaf is not None and first_leaf(args).is_deleted():
            return slow_call(args, kwargs, None)
        if others:
            leaves, treedef = flatten(tuple(args[i] for i in others))
            if treedef != other_treedef or shardings is not None:
                return checked(*args)
            for x, w in zip(leaves, other_weak):
                if type(x) is not array_impl or (x.aval.weak_type is not w if other_any_weak else x.aval.weak_type):
                    return checked(*args)
        try:
            out = compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        return provenance_tail(args, args, out)

    if n_params != 1 or len(out_tokens) != 1 or out_tokens[0][0] != ():
        return provenance

    # The common `s = step(s)`: one parameter, the state, returned alone.
    token0 = in_tokens[0][1]

    def provenance_one(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != 1:
            return checked(*args, **kwargs)
        d = getattr(args[0], "__dict__", None)
        if d is None or d.get(key) is not token0:
            return checked(*args)
        if first_leaf is not None and first_leaf(args).is_deleted():
            return slow_call(args, kwargs, None)
        try:
            out = compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        return provenance_tail(args, args, out)

    return provenance_one


def _leaves_of(cls: type, flat_fields: FlatFields) -> Callable[[Any], Sequence[Any]]:
    """The leaves of a state instance: attribute reads for a flat class."""
    names = flat_fields(cls)
    if not names:
        return lambda x: flatten(x)[0]
    if len(names) == 1:
        (only,) = names
        return lambda x: (getattr(x, only),)
    return operator.attrgetter(*names)


def _first_leaf_of(cls: type, flat_fields: FlatFields) -> Callable[[Any], Any]:
    """The first leaf of a state instance: one attribute read for a flat class."""
    names = flat_fields(cls)
    if names:
        return operator.attrgetter(names[0])
    return lambda x: flatten(x)[0][0]
