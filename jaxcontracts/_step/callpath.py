"""The per-call closures of a compiled signature, one per checks level: ``off``
(:func:`_off`, the executable's own C++ call), ``fast`` and ``full``
(:func:`_guarded`: a guarded C++ call whose cache miss runs the per-signature
checks once; ``full`` adds the per-leaf pre-check and the after-dispatch tail).
A closure is picked when the step compiles or the checks level changes, so a
call never reads configuration. Anything unusual falls to the step's slow path;
under an active trace (even over closed-over concrete arrays) every closure
goes there, which traces the function and donates nothing.
"""
from __future__ import annotations

import inspect
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .. import _steps
from .._compat import refcount
from .._compat.arrays import ArrayImpl, KeyArray
from .._compat.effects import effect_tokens
from .._compat.guarded import REFUSED, flat_in_tree, guarded_call
from .._compat.threadguard import allow_host_to_device
from .._compat.tracing import cpp_call, flatten, jit_context, top_level_refs
from .._donation.consumed import consumed_class
from .._dtypes import is_key
from .._hazards import find_hazards
from .._leafdiff import same_placement
from .._records import CompiledSignature
from .._report import timing as _timing
from .._runtime import tracking
from .._state.fields import is_state
from .._state.spec import StaticArg, movable, static_equal, value_key
from .._steps import HOOK_EVERY
from .._tracebacks import trim
from .callctx import (
    HOST_TYPES,
    CallContext,
    DispatchingStep,
    call_tree,
    is_deleted_for,
    make_tail,
    param_leaves,
    picker,
    stale_reader,
)
from .callwrap import (
    host_call,
    loop_refusal,
    with_before,
    with_filtered,
    with_inplace,
    with_static,
)
from .diagnose import kept_leaves_error
from .kept import kept_plan

__all__ = ["make_dispatch"]


def make_dispatch(cs: CompiledSignature, level: str, step: DispatchingStep) -> Callable[..., Any]:
    """The call path of ``step`` for one compiled signature and checks level;
    failures go to ``step.slow_call(args, kwargs, exception_or_None)``."""
    definition = step.definition
    ctx = CallContext(
        cs=cs,
        compiled=cpp_call(cs.compiled),  # skips Compiled.__call__'s Python frame
        full=level == "full",
        step=step,
        n_params=len(definition.param_names),
        slow_call=step.slow_call,
        marks=_consumed_marks(cs, definition.state_params, step.short_name),
        bind=definition.bind_positional,
        defaults=any(
            p.default is not p.empty for p in definition.python_signature.parameters.values()
        ),
        kept=(lambda kept, nodes, last: kept_leaves_error(definition, cs, kept, nodes, last))
        if level == "full" and cs.donated and refcount.available()
        else None,
    )
    # static values taken by the C++ call itself (_static_native), where the
    # closure is the guarded or bare call
    native = (
        bool(definition.static_params) and not definition.filtered_params and not cs.host
        # (a value that can change in place is looked at at every call: JAX's C++ call hashes it)
        and all(getattr(cs.spec_args[i], "key", None) is None for i in definition.static_params)
    )
    if level == "off":
        dispatch = _off(ctx, native)
    else:
        dispatch = _guarded(ctx, native)
    if definition.static_params and not getattr(dispatch, "takes_static", False):
        dispatch = with_static(definition, dispatch)
    if definition.filtered_params:  # never native: its closure does not take static values
        dispatch = with_filtered(definition, dispatch, step)
    ensure = effect_tokens(cs.compiled)  # an ordered effect: JAX's token made outside the guard
    if ensure is not None:
        dispatch = with_before(dispatch, ensure)
    if cs.found:  # a declared contract found something in the program: refused in a loop
        dispatch = with_before(dispatch, loop_refusal(step.short_name, cs.found))
    return with_inplace(definition, dispatch, step) if definition.inplace_params else dispatch


def _consumed_marks(
    cs: CompiledSignature, state_params: tuple[int, ...], step: str
) -> tuple[tuple[int, type, type], ...]:
    """The jc.state parameters with donated leaves: (index, class, consumed class)."""
    if not cs.donated:
        return ()
    ranges = param_leaves(cs)
    marks = []
    for i in state_params:
        if is_state(cs.spec_args[i]) and any(d in ranges[i] for d in cs.donated):
            cls = type(cs.spec_args[i])
            marks.append((i, cls, consumed_class(cls, step)))
    return tuple(marks)


def _off(ctx: CallContext, native: bool) -> Callable[..., Any]:
    """Checks ``off``: the bare compiled call. Keywords and omitted defaults are
    bound only once the executable refused the call (all-positional calls pay
    nothing)."""
    cs, slow_call, refused_mark = ctx.cs, ctx.slow_call, REFUSED
    tree_call = _off_guarded(ctx)  # its cache miss asks (a new signature, another JAX option)
    # the arguments as they come (JAX's C++ call flattens them), else the bare call
    compiled: Callable[..., Any] = ctx.compiled if tree_call is None else tree_call
    refusable = tree_call is not None
    if cs.host:
        compiled = allow_host_to_device(compiled)
    # "no trace is active": JAX's is_top_level() read inline (see top_level_refs)
    tref, ev, aref, top = top_level_refs()
    n_params, bind, short = ctx.n_params, ctx.bind, ctx.defaults
    normalize = ctx.step.definition.normalize

    if cs.flat_style and tree_call is None:  # no guarded call: the tree checked here
        flat_call, in_treedef = compiled, cs.in_treedef

        def compiled(*args: Any) -> Any:
            leaves, treedef = flatten(args)
            return flat_call(*leaves) if treedef == in_treedef else refused_mark

        refusable = True

    def off(*args: Any, **kwargs: Any) -> Any:
        try:
            if tref.value is not ev or aref.value is not top:  # under a transformation: trace
                return slow_call(args, kwargs, None)
            if kwargs or (short and len(args) != n_params):  # keywords, or defaults left out
                bound = bind(args, kwargs)
                if bound is not None:
                    args, kwargs = bound, {}
            try:
                out = compiled(*args, **kwargs)
                if not refusable or out is not refused_mark:  # a signature its C++ call refused
                    return out
                exc = None
            except Exception as e:  # noqa: BLE001
                exc = e
            if kwargs or len(args) != n_params:
                return off(*normalize(args, kwargs))
            return slow_call(args, kwargs, exc)
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    if native:  # static values static in the C++ call (_static_native)
        return _static_native(ctx, None, with_static(ctx.step.definition, off), False) or off
    return off


def _off_guarded(ctx: CallContext) -> Callable[..., Any] | None:
    """The executable's guarded C++ call at ``off`` (None: missing); a refused call
    returns ``REFUSED``. With ``host=`` (the guard at ``allow``, so JAX's would not
    see numpy elsewhere), a new signature is refused unless every other leaf is a
    JAX array."""
    cs, host = ctx.cs, frozenset(ctx.cs.host)
    undeclared = picker([i for i in range(len(cs.leaves)) if i not in host])

    def arrays_undeclared(leaves: Sequence[Any]) -> bool:
        return all(isinstance(x, jax.Array) for x in undeclared(leaves))

    approve = _tree_approver(cs, arrays_undeclared if host else None)
    return guarded_call(cs.compiled, approve, call_tree(cs))


def _tree_approver(
    cs: CompiledSignature, leaves_ok: Callable[[Sequence[Any]], bool] | None
) -> Callable[[tuple[Any, ...]], bool]:
    """``approve`` of a guarded C++ call: no trace active, the compiled tree
    structure, and ``leaves_ok`` (if any) takes the leaves. Never raises."""
    tref, ev, aref, top = top_level_refs()
    in_treedef, context = cs.in_treedef, cs.context

    def approve(args: tuple[Any, ...]) -> bool:
        try:
            if tref.value is not ev or aref.value is not top:  # traced: the slow path traces
                return False
            # another config: jax.jit compiles again
            if context is not None and jit_context() != context:
                return False
            leaves, treedef = flatten(args)
            return treedef == in_treedef and (leaves_ok is None or leaves_ok(leaves))
        except Exception:  # noqa: BLE001 - anything odd: the slow path explains it
            return False

    return approve


def _signature_check(cs: CompiledSignature) -> Callable[[Sequence[Any]], bool]:
    """``signature_ok(leaves)``, run once per signature in the guarded call's cache
    miss: the config, each leaf's exact type and weak type (one C map each), its
    sharding, the first donated leaf's device."""
    donated, weak = cs.donated, cs.weak
    host = frozenset(cs.host)  # declared host data (host=): numpy accepted there
    kinds = tuple((i in host, w) for i, w in enumerate(weak))
    shardings = (
        [None if i in host else leaf.spec.sharding for i, leaf in enumerate(cs.leaves)]
        if cs.multi_device
        else None
    )
    ndims = [len(leaf.spec.shape) for leaf in cs.leaves]
    # Shardings placing the data alike (P('x', None) vs P('x')): the executable
    # and the slow path accept them, so refusing here would loop. Memoised.
    equivalent: set[tuple[int, Any]] = set()
    donated_set = frozenset(donated)

    def placed_alike(i: int, got: Any, want: Any) -> bool:
        if (i, got) in equivalent:
            return True
        ok = same_placement(got, want, ndims[i])
        if ok and len(equivalent) < 256:
            equivalent.add((i, got))
        return ok

    array_impl, host_types = ArrayImpl, HOST_TYPES
    key_array: Any = KeyArray  # typed PRNG keys: checked only when a leaf is not an ArrayImpl
    first_donated = donated[0] if donated else None
    # JAX silently moves an uncommitted array on another device (the copy is
    # donated, the input not consumed): with several devices, signature_ok
    # compares the first donated leaf's placement; the slow path names all.
    placed = None
    if shardings is None and first_donated is not None and jax.device_count() > 1:
        placed = cs.leaves[first_donated].spec.sharding
    types: tuple[Any, ...] = tuple(
        np.ndarray if i in host else KeyArray if is_key(leaf.spec.dtype) else ArrayImpl
        for i, leaf in enumerate(cs.leaves)
    )
    # a typed PRNG key's aval costs ~9 us and a key is never weak: its weak type is not read
    unkeyed = [i for i, t in enumerate(types) if i not in host and t is not KeyArray]
    unkeyed_of, unkeyed_weak = picker(unkeyed), tuple(bool(weak[i]) for i in unkeyed)
    weak_of = operator.attrgetter("aval.weak_type")
    if ArrayImpl is None or None in types:  # a class missing here: the leaf-by-leaf loop
        types = ()
    context = cs.context

    def signature_ok(leaves: Sequence[Any]) -> bool:
        if context is not None and jit_context() != context:
            return False
        if (
            tuple(map(type, leaves)) != types
            or tuple(map(weak_of, unkeyed_of(leaves))) != unkeyed_weak
        ):
            # the variants the executable accepts
            for x, (is_host, w) in zip(leaves, kinds):
                t = type(x)
                if is_host and issubclass(t, host_types):  # np.memmap, np.float32, a Python float
                    continue
                if t is not key_array and (t is not array_impl or x.aval.weak_type is not w):
                    return False
        if shardings is not None:
            for i, (x, s) in enumerate(zip(leaves, shardings)):
                if (
                    s is not None
                    and x.sharding != s
                    and not placed_alike(i, x.sharding, s)
                    and not (i not in donated_set and movable(x))
                ):
                    return False  # (an undonated uncommitted array: JAX moves it, as jax.jit does)
        # on another device: JAX would move it, undonated
        if placed is None:
            return True
        got = leaves[first_donated].sharding
        return got == placed or placed_alike(first_donated, got, placed)

    return signature_ok


def _guarded(ctx: CallContext, native: bool) -> Callable[..., Any]:
    """Checks ``fast``/``full`` on a guarded C++ call (``_compat.guarded``), whose
    cache miss runs ``signature_ok``; without it (capability ``guarded-call``) the
    ``full`` closure runs it per call at both levels. ``fast`` takes ``full``'s
    closure where reading the first donated leaf runs Python (``nnx.State``)."""
    cs, slow_call, bind, full = ctx.cs, ctx.slow_call, ctx.bind, ctx.full
    short, n_params = ctx.defaults, ctx.n_params
    tref, ev, aref, top = top_level_refs()
    in_treedef, donated, n_leaves = cs.in_treedef, cs.donated, len(cs.leaves)
    signature_ok = _signature_check(cs)
    host = frozenset(cs.host)
    if not full:  # the first donated leaf only (a declared host leaf is never donated)
        device_of = picker(donated[:1])
    else:
        device_of = picker([i for i in range(n_leaves) if i not in host]) if host else None

    approve_tree = _tree_approver(cs, signature_ok)

    def approve_flat(leaves: tuple[Any, ...]) -> bool:
        try:
            return tref.value is ev and aref.value is top and signature_ok(leaves)
        except Exception:  # noqa: BLE001
            return False

    first = None if full else stale_reader(cs)
    # where that read runs Python per step, full's closure with that one leaf
    if not full and (first is None or not first.costly):  # type: ignore[attr-defined]
        call = guarded_call(cs.compiled, approve_tree, call_tree(cs))
        if call is not None:
            fast = _guarded_closure(
                ctx, host_call(ctx, call, False) if cs.host else call, True, first
            )
            if native:  # static values static in the C++ call too (_static_native)
                return (
                    _static_native(ctx, approve_tree, with_static(ctx.step.definition, fast), True)
                    or fast
                )
            return fast
    call = guarded_call(
        cs.compiled, approve_flat, None if cs.flat_style else flat_in_tree(n_leaves)
    )
    per_call = call is None  # no guarded call here: the closure checks each call's signature
    if per_call:
        native, compiled = False, ctx.compiled
        if cs.flat_style:
            call = compiled
        else:  # the executable takes the arguments in their structure

            def call(*leaves: Any) -> Any:
                return compiled(*jax.tree_util.tree_unflatten(in_treedef, leaves))

    if cs.host:
        call = host_call(ctx, call, True)
    tail, kept = make_tail(ctx), kept_plan(ctx)  # (full's: fast returned above)
    is_deleted, refused_mark = is_deleted_for(cs), REFUSED
    # A buffer passed twice raises the count of a watched leaf: where every
    # donated leaf is watched, the ids are compared only on a kept-reference hit.
    ids_always = full and (kept is None or len(set(kept.watched)) != len(donated))
    count = refcount.count
    kept_pick, kept_limit = (kept.pick, kept.limit) if kept is not None else (None, 0)
    kept_sequences = kept_limit - refcount.BASELINE + 1
    nodes_of = kept.nodes.of if kept is not None and kept.nodes is not None else None
    timing_on, due, start, acc = (
        _steps.timing_on, ctx.step.timing_due, _timing.start, ctx.step.timing_counters
    )
    step = ctx.step
    node_limit = refcount.BASELINE  # a container: its parent, the fresh list, the count's argument

    def repeated(leaves: Sequence[Any]) -> bool:
        return len(set(map(id, leaves))) != n_leaves and bool(find_hazards(leaves, donated)[1])

    def make_full(static: tuple[int, ...]) -> Callable[..., Any]:
        """``static``: parameters taken as they come (compared by identity, then
        ``==``; not flattened), or () where they arrive as ``StaticArg`` nodes."""
        want, dynamic_of, fallback = in_treedef, None, None
        if static:
            children = in_treedef.children()
            dynamic = tuple(j for j in range(n_params) if j not in static)
            want = jax.tree_util.treedef_tuple([children[j] for j in dynamic])
            dynamic_of = picker(dynamic)
            fallback = with_static(ctx.step.definition, make_full(()))
            compiled_values = [cs.spec_args[i].value for i in static]
            compiled_keys = [cs.spec_args[i].key for i in static]
            seen = list(compiled_values)  # the objects last accepted, per static parameter
            # a value that can change in place (a config object) is looked at at every call
            changing = [key is not None for key in compiled_keys]
            pairs = tuple(enumerate(static))

        def guarded_full(*args: Any, **kwargs: Any) -> Any:
            try:
                # a timed call (inside loops)
                t0 = start(step, acc) if timing_on[0] and due[0] else 0.0
                if kwargs or (short and len(args) != n_params):  # keywords, or defaults left out
                    bound = bind(args, kwargs)
                    if bound is None:
                        return slow_call(args, kwargs, None)
                    args = bound
                if dynamic_of is None:
                    leaves, treedef = flatten(args)
                else:  # update(state, config=config): the config is not flattened
                    if len(args) != n_params:
                        return fallback(*args)  # type: ignore[misc]
                    for k, i in pairs:
                        value = args[i]
                        if value is not seen[k] or changing[k]:
                            if (value_key(value) != compiled_keys[k] if changing[k]
                                    else not static_equal(value, compiled_values[k])):
                                # another value: a new signature
                                return fallback(*args)  # type: ignore[misc]
                            seen[k] = value
                    leaves, treedef = flatten(dynamic_of(args))
                exc: BaseException | None = None
                try:
                    # a deleted buffer: before XLA refuses it with an error line on stderr
                    # under a trace the guarded call refuses (its cache miss asks);
                    # without it, or before a refusal of ours, the closure asks
                    stop = (
                        treedef != want
                        or (
                            per_call
                            and (
                                tref.value is not ev
                                or aref.value is not top
                                or not signature_ok(leaves)
                            )
                        )
                        or any(map(is_deleted, leaves if device_of is None else device_of(leaves)))
                        or (ids_always and repeated(leaves))
                    )
                # not a device array: the slow path says what it is
                except (TypeError, AttributeError):
                    stop = True
                if not stop and kept is not None:  # KeptPlan.refused, its count inline
                    seq = leaves if kept_pick is None else kept_pick(leaves)
                    if max(map(count, seq)) > kept_limit:
                        exc = kept.refuse(seq, kept_sequences, args)
                    del seq
                    if exc is None and nodes_of is not None:  # the containers inside the state
                        seq = nodes_of(args)
                        if max(map(count, seq)) > node_limit:
                            exc = kept.refuse_nodes(seq, args)
                        del seq
                    if exc is not None:
                        stop = True
                        if repeated(leaves) or tref.value is not ev or aref.value is not top:
                            exc = None  # the slow path tells (a trace: nothing is donated)
                if not stop:
                    try:
                        out = call(*leaves)
                    # diagnosed, or re-raised, by the slow path
                    except Exception as e:  # noqa: BLE001
                        exc = e
                    else:
                        if out is not refused_mark:
                            return tail(args, leaves, out, t0)
                # the slow path may dispatch again: its kept-leaf count sees none of ours
                del leaves
                return slow_call(args, {}, exc)
            except Exception as err:  # the traceback ends at the user's line
                trim(err)
                raise

        return guarded_full

    definition = ctx.step.definition
    if native and all(type(cs.spec_args[i]) is StaticArg for i in definition.static_params):
        guarded_full = make_full(definition.static_params)
        guarded_full.takes_static = True  # type: ignore[attr-defined]  # make_dispatch: no wrapper
        return guarded_full
    return make_full(())


def _guarded_closure(
    ctx: CallContext,
    call: Callable[..., Any],
    checked: bool,
    stale: Callable[[tuple[Any, ...]], Any] | None,
    fallback: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """The closure around a guarded C++ call, at ``fast`` and for native statics.
    ``stale``: the first donated leaf's reader, asked ``is_deleted()`` first;
    ``checked``: False at ``off`` (nothing counted); ``fallback`` (the static
    wrapper): where refusals go (else the slow path), the C++ call binding static
    keywords. ``fast``'s share of :func:`make_tail` is inline (a Python frame is a
    percent of a ten-leaf call)."""
    slow_call, bind, refused_mark = ctx.slow_call, ctx.bind, REFUSED
    short, n_params, binds = ctx.defaults, ctx.n_params, fallback is None
    refused = (
        fallback
        if fallback is not None
        else (lambda *args, **kwargs: slow_call(args, kwargs, None))
    )
    # timed inside loops (``_report.timing``); at ``off`` never
    timing_on = _steps.timing_on if checked else [False]
    step, due, start, acc = ctx.step, ctx.step.timing_due, _timing.start, ctx.step.timing_counters
    stats, record, marks, every = ctx.step.stats, ctx.step.last_output, ctx.marks, HOOK_EVERY
    timed, perf, set_class = _timing.timed, time.perf_counter, object.__setattr__

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            t0 = start(step, acc) if timing_on[0] and due[0] else 0.0  # a timed call (inside loops)
            # keywords, or defaults left out
            if binds and (kwargs or (short and len(args) != n_params)):
                bound = bind(args, kwargs)
                if bound is None:
                    return slow_call(args, kwargs, None)
                args, kwargs = bound, {}
            if stale is not None:  # a stale state (or one that cannot be read): explain, quietly
                try:
                    gone = stale(args).is_deleted()
                except Exception:  # noqa: BLE001
                    gone = True
                if gone:
                    return refused(*args, **kwargs)
            try:
                out = call(*args, **kwargs) if kwargs else call(*args)
            except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
                return slow_call(args, kwargs, e)
            if out is refused_mark:  # a new signature the checks refused, or a trace
                return refused(*args, **kwargs)
            if not checked:
                return out
            for i, cls, consumed_cls in marks:  # the donated state names its consumer
                if type(args[i]) is cls:
                    set_class(args[i], "__class__", consumed_cls)
            if t0:  # a timed call (before it is counted: it may join the open loops)
                timed(step, acc, perf() - t0)
            n = stats.calls = stats.calls + 1
            # a hot_loop is active somewhere: its clock and messages read the output
            if tracking.count:
                record[0] = out
                if not n % every:  # one call in `every` is timed
                    due[0] = True
            return out
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    return guarded


def _static_native(
    ctx: CallContext,
    approve: Callable[[tuple[Any, ...]], bool] | None,
    fallback: Callable[..., Any],
    checked: bool,
) -> Callable[..., Any] | None:
    """A step's call with static parameters static in the C++ call itself, as
    ``jax.jit``'s ``static_argnames`` (None where the guarded call is missing).
    On a new signature the arguments are bound and normalized, then ``approve``
    (None: the tree approver) judges them; refusals go to ``fallback``."""
    definition, cs = ctx.step.definition, ctx.cs
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = list(definition.python_signature.parameters.values())
    static = definition.static_params
    names = tuple(definition.param_names[i] for i in static if params[i].kind in kinds)
    allowed = frozenset(names)
    bind, normalize, n_params = ctx.bind, definition.normalize, ctx.n_params

    def bind_static(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        try:
            if kwargs:
                if not allowed.issuperset(kwargs) or len(args) + len(kwargs) != n_params:
                    # a keyword that is not static, or defaults left out: the fallback binds
                    return None
                bound = bind(args, kwargs)
                if bound is None:
                    return None
                args = bound
            elif len(args) != n_params:
                return None
            return normalize(args, {})
        except Exception:  # noqa: BLE001 - unhashable, odd ==...: the fallback explains
            return None

    if approve is None:
        approve = _tree_approver(cs, None)
    call = guarded_call(cs.compiled, approve, call_tree(cs), (static, names, bind_static))
    if call is None:
        return None
    stale = stale_reader(cs) if checked else None  # checks fast: see _guarded
    closure = _guarded_closure(ctx, call, checked, stale, fallback)
    closure.takes_static = True  # type: ignore[attr-defined]  # make_dispatch: no wrapper
    return closure
