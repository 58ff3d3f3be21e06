"""The wrappers in front of a call path whose parameters are not all pytrees
of arrays: static values (:func:`with_static`) and equinox Modules
(:func:`with_filtered`). Each turns its arguments into tree nodes the compiled
signature knows, then calls the closure of :mod:`._callpath`. And
:func:`with_inplace`, which writes back the objects a step updates in place,
:func:`with_effect_tokens`, for an executable with ordered effects, and
:func:`host_call`, around the executable's call of a step with declared
host data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._compat.guarded import REFUSED
from .._compat.threadguard import allow_host_to_device
from .._errors import ContractError
from .._state.filter import Filtered, join_out, split
from .._state.foreign import holds_module
from .._state.inplace import write_back
from .._tracebacks import trim
from .callctx import CallContext, DispatchingStep, binder, leaf_readers, picker
from .definition import StepDefinition

__all__ = ["host_call", "module_params", "with_effect_tokens", "with_inplace", "with_filtered", "with_static"]


def with_filtered(sig: StepDefinition, dispatch: Callable[..., Any], step: DispatchingStep) -> Callable[..., Any]:
    """The call path behind a wrapper that filters equinox Modules (``_filter``).

    Each filtered argument becomes a :class:`Filtered` node (its array leaves;
    the structure and the other leaves as aux data, the last key reused while
    the same static leaves come back), and what the executable returns is
    rebuilt. The cost of ``eqx.filter_jit``: one flatten and one unflatten of
    the Module per call.
    """
    normalize, n_params, filtered = sig.normalize, len(sig.param_names), sig.filtered_params
    last: dict[int, Any] = {}
    record = step.last_output

    bind = binder(sig)

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
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return filtered_call


def with_static(sig: StepDefinition, dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """The call path behind a wrapper that turns static values into tree nodes.

    Static values travel as :class:`StaticArg` nodes of the tree structure
    (hashability is checked when one is made). The node made for the last
    value of each static parameter is reused while the same object comes
    back, so the usual call (one config object) neither hashes nor compares.
    """
    normalize, n_params, static = sig.normalize, len(sig.param_names), sig.static_params
    last: dict[int, tuple[Any, Any]] = {}

    bind = binder(sig)

    def static_call(*args: Any, **kwargs: Any) -> Any:
        try:
            if kwargs or len(args) != n_params:  # update(state, config=config): bound without inspect
                bound = bind(args, kwargs)
                if bound is None:  # a wrong call: normalize explains
                    return dispatch(*normalize(args, kwargs))
                args = bound
            items = list(args)
            for i in static:
                value = items[i]
                seen = last.get(i)
                if seen is not None and seen[0] is value:
                    items[i] = seen[1]
                else:
                    items = list(normalize(tuple(items), {}))
                    last.update((j, (args[j], items[j])) for j in static)
                    break
            return dispatch(*items)
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return static_call


def with_inplace(sig: StepDefinition, dispatch: Callable[..., Any], step: DispatchingStep) -> Callable[..., Any]:
    """The call path of a step that updates state objects in place (flax NNX:
    ``_state.inplace``). The executable returns (the step's output, each such
    object after the step); their new arrays are written back into the
    caller's own objects, whose old arrays the call donated, and the step's
    own output is returned."""
    normalize, n_params, inplace = sig.normalize, len(sig.param_names), sig.inplace_params
    bind, record = binder(sig), step.last_output

    def inplace_call(*args: Any, **kwargs: Any) -> Any:
        try:
            if kwargs or len(args) != n_params:
                args = bind(args, kwargs) or normalize(args, kwargs)
            full = dispatch(*args)
            out, updated = full
            for i, new in zip(inplace, updated):
                write_back(args[i], new)
            if record[0] is full:  # the loops' record holds the step's own output, not the
                record[0] = out  # returned objects (whose arrays the caller's objects now hold)
            return out
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return inplace_call


def with_effect_tokens(dispatch: Callable[..., Any], ensure: Callable[[], None]) -> Callable[..., Any]:
    """The call path of an executable with ordered effects: JAX's runtime
    token of each is made first where this thread has none
    (``_compat.effects``), so that the call inside a ``jc.hot_loop`` is not
    refused for JAX's own ``bool[0]`` transfer."""

    def effects_call(*args: Any, **kwargs: Any) -> Any:
        try:
            ensure()
            return dispatch(*args, **kwargs)
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise

    effects_call.takes_static = getattr(dispatch, "takes_static", False)  # type: ignore[attr-defined]
    return effects_call


def module_params(
    sig: StepDefinition, positional: tuple[Any, ...], with_path: list[tuple[Any, Any]], host: list[tuple[str, Any]]
) -> tuple[int, ...]:
    """The parameters to filter: every host leaf is a non-array leaf of an
    argument holding an equinox Module (a function, a Python number), never a
    numpy array (host data), in a parameter neither static nor declared host."""
    params: set[int] = set()
    by_path = {sig.param_path(p): p[0].idx for p, _ in with_path}
    for path, x in host:
        i = by_path.get(path)
        if i is None or isinstance(x, np.ndarray) or i in sig.filtered_params or not holds_module(positional[i]):
            return ()
        params.add(i)
    return tuple(sorted(params))


def host_call(ctx: CallContext, call: Callable[..., Any], flat: bool) -> Callable[..., Any]:
    """``call`` for a step with declared host data (``host=``).

    The declared leaves may be numpy arrays: the executable's call transfers
    them in JAX's C++ path (and checks their shape and dtype), and the
    closure's own checks have refused numpy anywhere else. The call runs with
    the thread's host-to-device guard at ``allow`` (a declared transfer, in a
    loop or under the user's own guard); calls that passed numpy host data
    are counted with their bytes. ``flat``: ``call`` takes the flat leaves (else the arguments, whose
    host leaves are read by their paths).
    """
    cs, stats = ctx.cs, ctx.stats
    allowing = allow_host_to_device(call)  # a declared transfer, inside a loop too
    if flat:
        host_of = picker(cs.host)
    else:
        readers = leaf_readers(cs, cs.host)

        def host_of(args: Sequence[Any]) -> tuple[Any, ...]:
            return tuple([read(args) for read in readers])  # type: ignore[arg-type]

    host_kinds, nbytes, refused_mark = (np.ndarray, np.generic, bool, int, float, complex), cs.host_nbytes, REFUSED

    def call_host(*args: Any) -> Any:
        out = allowing(*args)
        if out is not refused_mark:
            try:
                hosted = host_of(args)
                transferred = any(isinstance(x, host_kinds) for x in hosted)  # host data, not a device array
            except Exception:  # noqa: BLE001 - arguments of another structure: nothing counted
                transferred = False
            if transferred:
                stats.host_calls += 1
                stats.host_bytes += nbytes
        return out

    return call_host
