"""The provenance fast paths: states a hot step returned skip the per-leaf checks.

A sealed ``jc.state`` a hot step returned carries the provenance token of its
exact spec (``_marks.TOKEN``); a call whose state arguments carry the
signature's tokens needs no per-leaf checks (the executable still refuses
deleted buffers). :func:`provenance_one_path` is the common ``s = step(s)``
with the tail written out inline; anything else falls back to the checked
closure of ``_callpath``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax

from ._callctx import (
    CallContext,
    KeptPlan,
    first_leaf_of,
    freed_before_call,
    is_deleted_for,
    kept_plan,
    leaves_of,
    make_tail,
)
from ._compat import refcount
from ._compat.arrays import ArrayImpl, KeyArray
from ._compat.tracing import flatten, top_level_refs
from ._errors import ContractError
from ._fields import flat_field_names
from ._marks import PRODUCED_BY, TOKEN
from ._records import CompiledSignature
from ._runtime import tracking
from ._steps import HOOK_EVERY
from ._tracebacks import trim

__all__ = ["provenance_one_path", "provenance_path"]


def provenance_path(ctx: CallContext, checked: Callable[..., Any]) -> Callable[..., Any]:
    """The provenance fast path, for states that a hot step returned.

    A jc.state returned by a hot_step carries the token of its exact spec
    (structure with static values, shapes, dtypes, weak types, shardings): the
    executable made every leaf, and carry invariance proved the spec when the
    step compiled. Only sealed states get one (no ``PyTree`` container the
    user could edit in place); the instance is frozen and replace(), tree_map
    and pickling drop the token, so an argument carrying this signature's
    token needs no per-leaf checks (the executable still refuses deleted
    buffers: -> the slow path). Anything else goes to ``checked``.
    """
    cs, compiled, slow_call, n_params = ctx.cs, ctx.compiled, ctx.slow_call, ctx.n_params
    in_tokens, key = cs.in_tokens, TOKEN
    full = ctx.full
    array_impl = ArrayImpl
    tref, ev, aref, top = top_level_refs()
    key_array: Any = KeyArray
    is_deleted = is_deleted_for(cs)
    first_leaf, states_consumed = _donated_state_readers(cs, is_deleted)

    if n_params == 1 and len(cs.out_tokens) == 1 and cs.out_tokens[0][0] == ():
        return provenance_one_path(ctx, checked, states_consumed, first_leaf is not None)

    tail = make_tail(ctx, states_consumed)
    release = freed_before_call(ctx)

    kept = kept_plan(ctx)
    others = tuple(i for i in range(n_params) if i not in dict(in_tokens))
    other_specs, other_treedef = jax.tree_util.tree_flatten(tuple(cs.spec_args[i] for i in others))
    other_weak = tuple(bool(s.weak_type) for s in other_specs)
    other_any_weak = any(other_weak)
    multi_device = cs.multi_device

    def provenance(*args: Any, **kwargs: Any) -> Any:
        try:
            if kwargs or len(args) != n_params:
                return checked(*args, **kwargs)
            for i, token in in_tokens:
                d = getattr(args[i], "__dict__", None)
                if d is None or d.get(key) is not token:
                    return checked(*args)
            if tref.value is not ev or aref.value is not top:
                return slow_call(args, kwargs, None)
            if first_leaf is not None and first_leaf(args).is_deleted():
                return slow_call(args, kwargs, None)
            if others:
                leaves, treedef = flatten(tuple(args[i] for i in others))
                if treedef != other_treedef or multi_device:
                    return checked(*args)
                for x, w in zip(leaves, other_weak):
                    t = type(x)  # a typed key is never weak (its aval is built on each read: not read)
                    if t is not key_array and (
                        t is not array_impl or (x.aval.weak_type is not w if other_any_weak else x.aval.weak_type)
                    ):
                        return checked(*args)
                if full and any(map(is_deleted, leaves)):
                    return slow_call(args, kwargs, None)  # before XLA's error line
            if kept is not None:
                refused = kept.refused(flatten(args)[0])
                if refused is not None:
                    return slow_call(args, kwargs, refused)
            release()  # see _callpath._guarded
            try:
                out = compiled(*args)
            except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
                return slow_call(args, kwargs, e)
            return tail(args, args, out)
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return provenance


def _donated_state_readers(
    cs: CompiledSignature, is_deleted: Callable[[Any], bool]
) -> tuple[Callable[[tuple[Any, ...]], Any] | None, Callable[[tuple[Any, ...]], bool]]:
    """(the first donated state's first leaf, whether every token state's
    leaves were consumed), read from the arguments by ``__dict__``."""
    donated = tuple((arg, leaves_of(type(cs.spec_args[arg]))) for arg, _ in cs.in_tokens) if cs.donated else ()
    first_leaf: Callable[[tuple[Any, ...]], Any] | None = None
    if donated and jax.tree_util.tree_leaves(cs.spec_args[donated[0][0]]):
        arg0, get_first = donated[0][0], first_leaf_of(type(cs.spec_args[donated[0][0]]))

        def first_leaf(args: tuple[Any, ...]) -> Any:
            return get_first(args[arg0])

    if len(donated) == 1:
        ((arg_d, get_d),) = donated

        def states_consumed(args: tuple[Any, ...]) -> bool:
            return all(map(is_deleted, get_d(args[arg_d])))

    else:

        def states_consumed(args: tuple[Any, ...]) -> bool:
            return all(all(map(is_deleted, get(args[arg]))) for arg, get in donated)

    return first_leaf, states_consumed


def _kept_readers(
    kept: KeptPlan | None, cls: type, names: tuple[str, ...] | None
) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None, int]:
    """For ``s = step(s)``: (a reader of the watched leaves from the state's
    ``__dict__``, for an inline count; else a reader of the state's leaves
    for ``KeptPlan.refused``; the count's limit)."""
    if kept is None:
        return None, None, 0
    if names is not None and kept.pick is None:  # a flat class, all donated
        get = operator.itemgetter(*names) if len(names) > 1 else (lambda d, n=names[0]: (d[n],))
        return get, None, kept.limit
    return None, leaves_of(cls), kept.limit


def provenance_one_path(
    ctx: CallContext,
    checked: Callable[..., Any],
    states_consumed: Callable[[tuple[Any, ...]], bool],
    donates: bool,
) -> Callable[..., Any]:
    """The provenance path of the common ``s = step(s)``, with the tail inline.

    One parameter, the state, returned alone. Per call: the state's class
    (a state a hot step consumed has taken its consumed class: it goes to
    ``checked``, which explains it), its token, the trace refs, one
    ``is_deleted()`` (a state whose buffers something else deleted, before
    XLA refuses it with an error line on stderr), the executable, then the
    tail of :func:`make_tail` written out: stamp, the ``full`` consumption
    check, the consumed class, the count, the loops.
    """
    cs, compiled, slow_call = ctx.cs, ctx.compiled, ctx.slow_call
    token0, token_out, key = cs.in_tokens[0][1], cs.out_tokens[0][1], TOKEN
    tref, ev, aref, top = top_level_refs()
    cls = type(cs.spec_args[0])
    consumed_cls = ctx.marks[0][2] if ctx.marks else None
    full, stats, not_consumed = ctx.full, ctx.stats, ctx.not_consumed
    step, name, produced_by = ctx.step, ctx.name, PRODUCED_BY
    set_class = object.__setattr__  # the states are frozen dataclasses
    missing: Any = object()
    every = HOOK_EVERY
    names = flat_field_names(cls) if donates else None
    first_name = names[0] if names else None
    first_leaf = first_leaf_of(cls) if donates and first_name is None else None
    kept, count = kept_plan(ctx), refcount.count
    kept_get, kept_of, kept_limit = _kept_readers(kept, cls, names)

    def provenance_one(s: Any = missing, *rest: Any, **kwargs: Any) -> Any:
        try:
            if rest or kwargs or s is missing or type(s) is not cls:
                return checked(*(() if s is missing else (s,)), *rest, **kwargs)
            d = s.__dict__
            if d.get(key) is not token0 or tref.value is not ev or aref.value is not top:
                return checked(s)  # untrusted (per-leaf checks), or traced (the slow path)
            if first_name is not None:
                if d[first_name].is_deleted():
                    return slow_call((s,), {}, None)
            elif first_leaf is not None and first_leaf(s).is_deleted():
                return slow_call((s,), {}, None)
            if kept_get is not None:
                seq = kept_get(d)
                if max(map(count, seq)) > kept_limit:
                    refused = kept.refuse(seq, 1)  # type: ignore[union-attr]
                    if refused is not None:
                        del seq
                        return slow_call((s,), {}, refused)
                del seq
            elif kept_of is not None:
                refused = kept.refused(kept_of(s))  # type: ignore[union-attr]
                if refused is not None:
                    return slow_call((s,), {}, refused)
            try:
                out = compiled(s)
            except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
                return slow_call((s,), {}, e)
            od = out.__dict__
            od[key] = token_out
            if full and not states_consumed((s,)):
                err = not_consumed(cs, flatten((s,))[0], out)
                if err is not None:  # None: a recording loop took it as a violation
                    raise err
            if consumed_cls is not None:  # the donated state names its consumer
                set_class(s, "__class__", consumed_cls)
            n = stats.calls = stats.calls + 1
            if tracking.count:  # a hot_loop is active somewhere: name the producer for messages
                od[produced_by] = name
                if not n % every:  # a timing loop's sampling hook, one call in `every`
                    hook = step.timing_hook
                    if hook is not None:
                        hook()
            return out
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return provenance_one
