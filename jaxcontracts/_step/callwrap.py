"""The wrappers in front of a call path: static values and equinox Modules
become tree nodes the signature knows, in-place updates are written back, and
something runs before the call (effect tokens, loop refusals) or around it
(declared host data)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import numpy as np

from .. import _contracts, _runtime
from .._compat.guarded import REFUSED
from .._compat.threadguard import allow_host_to_device
from .._errors import DefinitionError
from .._state.filter import Filtered, join_out, split
from .._state.foreign import holds_module
from .._state.inplace import ref_arrays, repeated_refs_error, replace_all, write_back
from .._state.spec import value_key
from .._tracebacks import trim
from .callctx import HOST_TYPES, CallContext, DispatchingStep, leaf_readers, picker
from .definition import StepDefinition

__all__ = [
    "host_call",
    "in_place_call",
    "inside_in_place_call",
    "loop_refusal",
    "module_params",
    "with_before",
    "with_filtered",
    "with_inplace",
    "with_static",
]


def with_filtered(
    definition: StepDefinition, dispatch: Callable[..., Any], step: DispatchingStep
) -> Callable[..., Any]:
    """Equinox Modules as :class:`Filtered` nodes (the last key reused while the
    same static leaves come back), the output rebuilt, as ``eqx.filter_jit``."""
    normalize, n_params, filtered = (
        definition.normalize, len(definition.param_names), definition.filtered_params
    )
    bind, record = definition.bind_positional, step.last_output
    last: dict[int, Any] = {}

    def filtered_call(*args: Any, **kwargs: Any) -> Any:
        try:
            if kwargs or len(args) != n_params:
                args = bind(args, kwargs) or normalize(args, kwargs)
            items = list(args)
            for i in filtered:
                value = items[i]
                if type(value) is not Filtered:
                    items[i] = node = split(value, last.get(i))
                    last[i] = node.key
            del value
            out = dispatch(*items)
            joined = join_out(out)
            if record[0] is out:  # the loops' record: the rebuilt output, held once
                record[0] = joined
            return joined
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return filtered_call


def with_static(definition: StepDefinition, dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """Static values as :class:`StaticArg` nodes, the last one reused while the
    same object comes back (the usual call neither hashes nor compares)."""
    normalize, n_params, static = (
        definition.normalize, len(definition.param_names), definition.static_params
    )
    bind = definition.bind_positional
    last: dict[int, tuple[Any, Any]] = {}

    def static_call(*args: Any, **kwargs: Any) -> Any:
        try:
            # update(state, config=config): bound without inspect
            if kwargs or len(args) != n_params:
                bound = bind(args, kwargs)
                if bound is None:  # a wrong call: normalize explains
                    return dispatch(*normalize(args, kwargs))
                args = bound
            items = list(args)
            for i in static:
                value = items[i]
                seen = last.get(i)
                # (a value that can change in place: while it holds what it held)
                if (
                    seen is not None
                    and seen[0] is value
                    and (seen[1].key is None or value_key(value) == seen[1].key)
                ):
                    items[i] = seen[1]
                else:
                    items = list(normalize(tuple(items), {}))
                    last.update((j, (args[j], items[j])) for j in static)
                    break
            return dispatch(*items)
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return static_call


def with_inplace(
    definition: StepDefinition, dispatch: Callable[..., Any], step: DispatchingStep
) -> Callable[..., Any]:
    """:func:`in_place_call` around ``dispatch`` (NNX objects, refs:
    ``_state.inplace``); inside the step's own in-place call, ``dispatch``."""
    n_params, bind, normalize = (
        len(definition.param_names), definition.bind_positional, definition.normalize
    )

    def inplace_call(*args: Any, **kwargs: Any) -> Any:
        try:
            if kwargs or len(args) != n_params:
                args = bind(args, kwargs) or normalize(args, kwargs)
            if inside_in_place_call(step) is not None:
                return dispatch(*args)
            return in_place_call(definition, step, dispatch, args)
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return inplace_call


# per step: (its loop, its first ref) at its last call inside a loop (_same_refs_in_loop)
_last_refs: weakref.WeakKeyDictionary[Any, tuple[weakref.ref[Any], weakref.ref[Any]]] = (
    weakref.WeakKeyDictionary()
)


class _Inside(threading.local):
    call: tuple[Any, tuple[Any, ...]] | None = None  # (step, the caller's arguments)


_inside = _Inside()


def inside_in_place_call(step: Any) -> tuple[Any, ...] | None:
    """The caller's arguments when ``step``'s slow path runs inside its own
    in-place call, which expects (output, updated states) back."""
    call = _inside.call
    return call[1] if call is not None and call[0] is step else None


def in_place_call(
    definition: StepDefinition,
    step: DispatchingStep,
    inner: Callable[..., Any],
    args: tuple[Any, ...],
) -> Any:
    """Call ``inner`` with the refs replaced by their arrays; write the returned
    states back into the caller's objects and refs; return the step's output."""
    items = list(args)
    taken: dict[int, list[Any]] = {}  # per ref parameter: its refs, flat (passed as their arrays)
    for i in definition.ref_params:
        items[i], arrays, refs = ref_arrays(args[i])
        if arrays:
            taken[i] = refs
    if taken:
        held = [r for refs in taken.values() for r in refs]
        if len({id(r) for r in held}) != len(held):  # one ref twice: one update would be lost
            named = [
                (definition.param_path((jax.tree_util.SequenceKey(i), *path)), ref)
                for i in definition.ref_params
                for path, ref in jax.tree_util.tree_flatten_with_path(args[i])[0]
            ]
            raise repeated_refs_error(definition.name, named)
        if _runtime.local.loop is not None:
            _same_refs_in_loop(definition, step, held[0])
    previous, _inside.call = _inside.call, (step, args)
    try:
        full = inner(*items)
    finally:
        _inside.call = previous
    del items
    out, updated = full
    for i, new in zip(step.definition.inplace_params, updated, strict=True):  # known once compiled
        refs = taken.get(i)
        if refs is None:
            write_back(args[i], new)
        else:
            replace_all(refs, jax.tree_util.tree_leaves(new))
    record = step.last_output
    if record[0] is full:  # the loops' record holds the step's own output, not the
        record[0] = out  # returned states (whose arrays the caller's objects now hold)
    return out


def _same_refs_in_loop(definition: StepDefinition, step: Any, first: Any) -> None:
    """In a hot loop, refuse new refs where the last call's are gone (lost update)."""
    loop = _runtime.local.loop
    last = _last_refs.get(step)
    _last_refs[step] = (weakref.ref(loop), weakref.ref(first))
    if last is not None and last[0]() is loop and last[1]() is None:
        name = definition.param_names[definition.ref_params[0]]
        raise DefinitionError(
            f"{definition.name}: `{name}` holds new refs, and the refs its last call updated "
            "are gone: that update was lost (the refs are made anew each iteration).",
            fix=f"make the refs once, before the loop ({name} = jax.tree.map(jax.new_ref, "
            f"{name})), and pass the same ones at each call; read values with jc.fetch.",
            contract="definition",
            step=definition.name,
            leaves=[name],
            note="Nothing was dispatched; the refs are intact.",
        )


def with_before(dispatch: Callable[..., Any], before: Callable[[], Any]) -> Callable[..., Any]:
    """``before()`` run first: JAX's ordered-effect tokens made outside the guard
    (``_compat.effects``), or a declared contract's loop refusal."""

    def before_call(*args: Any, **kwargs: Any) -> Any:
        try:
            before()
            return dispatch(*args, **kwargs)
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return before_call


def loop_refusal(name: str, found: dict[str, tuple[Any, ...]]) -> Callable[[], None]:
    """Inside a loop, each contract that found something refuses (a host callback)."""
    local = _runtime.local

    def refuse() -> None:
        loop = local.loop
        if loop is not None and not local.allow:
            _contracts.refuse(loop, name, found)

    return refuse


def module_params(
    definition: StepDefinition,
    positional: tuple[Any, ...],
    with_path: list[tuple[Any, Any]],
    host: list[tuple[str, Any]],
    compiled_arrays: Collection[str] = (),
) -> tuple[int, ...]:
    """The parameters to filter, where every host leaf is a non-array, non-numpy
    leaf of an argument holding an equinox Module, and none stands where a
    compiled signature took a device array (``compiled_arrays``: a float put
    back for a learning rate is host data)."""
    params: set[int] = set()
    by_path = {definition.param_path(p): p[0].idx for p, _ in with_path}
    for path, x in host:
        i = by_path.get(path)
        if (
            i is None
            or isinstance(x, np.ndarray)
            or i in definition.filtered_params
            or path in compiled_arrays
            or not holds_module(positional[i])
        ):
            return ()
        params.add(i)
    return tuple(sorted(params))


def host_call(ctx: CallContext, call: Callable[..., Any], flat: bool) -> Callable[..., Any]:
    """``call`` for declared host data (``host=``) with the host-to-device guard at
    ``allow`` (JAX's C++ path transfers it), counted with its bytes. ``flat``:
    ``call`` takes the flat leaves (else the arguments, read by their paths)."""
    cs, stats = ctx.cs, ctx.step.stats
    allowing = allow_host_to_device(call)  # a declared transfer, inside a loop too
    if flat:
        host_of = picker(cs.host)
    else:
        readers = leaf_readers(cs, cs.host)

        def host_of(args: Sequence[Any]) -> tuple[Any, ...]:
            return tuple([read(args) for read in readers])  # type: ignore[arg-type]

    host_kinds, nbytes, refused_mark = HOST_TYPES, cs.host_nbytes, REFUSED

    def call_host(*args: Any) -> Any:
        out = allowing(*args)
        if out is not refused_mark:
            try:
                transferred = any(isinstance(x, host_kinds) for x in host_of(args))
            except Exception:  # noqa: BLE001 - arguments of another structure: nothing counted
                transferred = False
            if transferred:
                stats.host_calls += 1
                stats.host_bytes += nbytes
        return out

    return call_host
