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
ends in the after-dispatch tail (:func:`_tail`: stamp the tokens, check
consumption, mark the donated states with the step's name, count, tell
active loops); the common ``s = step(s)`` path (:func:`_provenance_one`)
writes the same tail out inline, to save a call. Anything unusual falls to
the step's slow path, which diagnoses it. Under an active trace (an outer
``jax.jit``, ``vmap``, ``lax.cond``..., even over concrete arrays it closed
over) every closure goes to the slow path, which traces the function and
donates nothing.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from ._compat import refcount
from ._compat.arrays import ArrayImpl, KeyArray
from ._compat.threadguard import allow_host_to_device
from ._compat.tracing import cpp_call, flatten, top_level_refs
from ._consumed import consumed_class
from ._donation import find_hazards
from ._dtypes import is_key
from ._fields import dict_getter, flat_field_names, is_state
from ._marks import PRODUCED_BY, TOKEN
from ._records import CompiledSignature, StepStats
from ._runtime import tracking
from ._signature import StepSignature
from ._spec import same_placement
from ._steps import HOOK_EVERY, LiveStep

__all__ = ["DispatchingStep", "make_dispatch"]


class DispatchingStep(LiveStep, Protocol):
    """What a call path needs of its step (``jc.HotStep`` is one)."""

    @property
    def definition(self) -> StepSignature:
        """What the decorator learnt of the function (``_signature.analyse``)."""
        ...

    def slow_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException | None) -> Any:
        """Everything a closure does not handle (diagnosis, a new compile, traces)."""

    def not_consumed(self, cs: CompiledSignature, leaves: Sequence[Any], out: Any) -> BaseException | None:
        """The error for donated buffers XLA copied (``None``: a recording loop took it)."""

    def kept_error(self, cs: CompiledSignature, kept: Sequence[int]) -> BaseException:
        """The refusal of a call whose donated leaves (flat indices) are held elsewhere."""

    def redispatching(self) -> bool:
        """Whether this thread is inside the slow path's re-dispatch of a call
        (whose frames hold the call's leaves: their counts say nothing)."""


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every closure of one compiled signature needs (read once, at build)."""

    cs: CompiledSignature
    compiled: Callable[..., Any]  # the executable's C++ call
    full: bool
    step: DispatchingStep
    name: str
    n_params: int
    slow_call: Callable[[tuple[Any, ...], dict[str, Any], BaseException | None], Any]
    stats: StepStats
    not_consumed: Callable[[CompiledSignature, Sequence[Any], Any], BaseException | None]
    marks: tuple[tuple[int, type, type], ...]  # (state parameter, its class, consumed class)
    normalize: Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]
    # At full (with the kept-references capability): refuse a donated leaf
    # held elsewhere. None: not checked.
    kept: Callable[[Sequence[int]], BaseException] | None = None


def make_dispatch(cs: CompiledSignature, level: str, step: DispatchingStep) -> Callable[..., Any]:
    """Build the call path of ``step`` for one compiled signature and checks level.

    Failures go to ``step.slow_call((args, kwargs, exception_or_None))``;
    after a call, each ``jc.state`` argument whose leaves were donated takes
    its consumed class, which names the step (one store). Static parameters
    are wrapped into tree nodes first (:func:`_with_static`).
    """
    sig = step.definition
    ctx = _Context(
        cs=cs,
        compiled=cpp_call(cs.compiled),  # skips Compiled.__call__'s Python frame
        full=level == "full",
        step=step,
        name=step.short_name,
        n_params=len(sig.param_names),
        slow_call=step.slow_call,
        stats=step.stats,
        not_consumed=step.not_consumed,
        marks=_consumed_marks(cs, sig.state_params, step.short_name),
        normalize=sig.normalize,
        kept=(lambda kept: step.kept_error(cs, kept))
        if level == "full" and cs.donated and refcount.available()
        else None,
    )
    if level == "off":
        dispatch = _off(ctx)
    elif cs.host:
        dispatch = _checked_host(ctx)
    elif cs.in_tokens and len(cs.in_tokens) == len(sig.state_params):
        dispatch = _provenance(ctx, _checked(ctx))
    else:
        dispatch = _checked(ctx)
    return _with_static(sig, dispatch) if sig.static_params else dispatch


def _consumed_marks(
    cs: CompiledSignature, state_params: tuple[int, ...], step: str
) -> tuple[tuple[int, type, type], ...]:
    """The jc.state parameters with donated leaves: (index, class, consumed class)."""
    if not cs.donated:
        return ()
    ends, n = [], 0
    for spec in cs.spec_args:
        n += len(jax.tree_util.tree_leaves(spec))
        ends.append(n)
    marks = []
    for i in state_params:
        start = ends[i - 1] if i else 0
        if is_state(cs.spec_args[i]) and any(start <= d < ends[i] for d in cs.donated):
            cls = type(cs.spec_args[i])
            marks.append((i, cls, consumed_class(cls, step)))
    return tuple(marks)


def _with_static(sig: StepSignature, dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """The call path behind a wrapper that turns static values into tree nodes.

    Static values travel as :class:`StaticArg` nodes of the tree structure
    (hashability is checked when one is made). The node made for the last
    value of each static parameter is reused while the same object comes
    back, so the usual call (one config object) neither hashes nor compares.
    """
    normalize, n_params, static = sig.normalize, len(sig.param_names), sig.static_params
    last: dict[int, tuple[Any, Any]] = {}

    def with_static(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != n_params:
            return dispatch(*normalize(args, kwargs))
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

    return with_static


def _off(ctx: _Context) -> Callable[..., Any]:
    """Checks ``off``: the bare compiled call; failures go to the slow path.

    Keyword arguments and omitted defaults are bound to positions (the
    executable takes positional arguments only) once the executable has
    refused the call, so a call with every argument by position pays nothing.
    Declared host data (``host=``) is a declared transfer at every level: the
    call runs with the thread's host-to-device guard at ``allow`` (a hot loop
    at ``off`` still engages JAX's own guard).
    """
    compiled, slow_call, in_treedef = ctx.compiled, ctx.slow_call, ctx.cs.in_treedef
    if ctx.cs.host:
        compiled = allow_host_to_device(compiled)
    # "no trace is active": JAX's is_top_level() read inline (see top_level_refs)
    tref, ev, aref, top = top_level_refs()
    n_params, normalize = ctx.n_params, ctx.normalize
    if ctx.cs.flat_style:

        def off_flat(*args: Any, **kwargs: Any) -> Any:
            leaves, treedef = flatten(args)
            if kwargs or treedef != in_treedef or tref.value is not ev or aref.value is not top:
                if normalize is not None and (kwargs or len(args) != n_params) and tref.value is ev:
                    return off_flat(*normalize(args, kwargs))
                return slow_call(args, kwargs, None)
            try:
                return compiled(*leaves)
            except Exception as e:  # noqa: BLE001
                return slow_call(args, kwargs, e)

        return off_flat

    def off(*args: Any, **kwargs: Any) -> Any:
        if tref.value is not ev or aref.value is not top:  # under a transformation: trace
            return slow_call(args, kwargs, None)
        try:
            return compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            if normalize is not None and (kwargs or len(args) != n_params):
                return off(*normalize(args, kwargs))
            return slow_call(args, kwargs, e)

    return off


def _stamper(out_tokens: tuple[tuple[tuple[int, ...], object], ...]) -> Callable[[Any], None]:
    """Stamp each returned state with the provenance token of its spec."""
    key = TOKEN
    if len(out_tokens) == 1 and out_tokens[0][0] == ():
        token_out = out_tokens[0][1]

        def stamp_one(out: Any) -> None:  # the common `s = step(s)`
            out.__dict__[key] = token_out

        return stamp_one

    def stamp(out: Any) -> None:
        for pos, token in out_tokens:
            obj = out
            for k in pos:
                obj = obj[k]
            obj.__dict__[key] = token

    return stamp


def _tail(ctx: _Context, consumed: Callable[[Any], bool]) -> Callable[[tuple[Any, ...], Any, Any], Any]:
    """The one after-dispatch tail: stamp, check consumption, mark, count, tell loops.

    Args:
        consumed: tells, from the closure's own view of the arguments (flat
            leaves or the arguments), whether every donated buffer was used.
    """
    out_tokens = ctx.cs.out_tokens
    # The common `s = step(s)` stamps one token on the output itself, inline.
    single = len(out_tokens) == 1 and out_tokens[0][0] == ()
    token_out = out_tokens[0][1] if single else None
    stamp = _stamper(out_tokens)
    key = TOKEN
    full, stats, cs, not_consumed = ctx.full, ctx.stats, ctx.cs, ctx.not_consumed
    step, record = ctx.step, ctx.step.last_call
    marks = ctx.marks
    mark_one = marks[0] if len(marks) == 1 else None
    set_class = object.__setattr__  # the states are frozen dataclasses
    every = HOOK_EVERY

    def tail(args: tuple[Any, ...], src: Any, out: Any) -> Any:
        if single:
            out.__dict__[key] = token_out
        else:
            stamp(out)
        if full and not consumed(src):
            err = not_consumed(cs, flatten(args)[0], out)
            if err is not None:  # None: a recording loop took it as a violation
                raise err
        if mark_one is not None:  # the donated state names its consumer
            i, cls, consumed_cls = mark_one
            if type(args[i]) is cls:
                set_class(args[i], "__class__", consumed_cls)
        elif marks:
            for i, cls, consumed_cls in marks:
                if type(args[i]) is cls:
                    set_class(args[i], "__class__", consumed_cls)
        n = stats.calls = stats.calls + 1
        if tracking.count:  # a hot_loop is active somewhere: remember for messages
            record[0] = (args, out)
            if not n % every:  # a timing loop's sampling hook, one call in `every`
                hook = step.timing_hook
                if hook is not None:
                    hook()
        return out

    return tail


@dataclasses.dataclass(frozen=True)
class _KeptPlan:
    """At ``full``: how a closure tells, before dispatch, that a donated leaf is
    held by something besides its state (a kept sample, a variable, a numpy
    view), and the refusal then.

    The closure counts references inline, in one C loop:
    ``max(map(getrefcount, pick(leaves))) > limit`` over a fresh sequence of
    the watched leaves (``pick`` None: the closure's own flat leaves, all
    watched); :meth:`refuse` confirms (references only a saved traceback
    holds do not count) and builds the error, which the slow path raises once
    it has ruled out a wrong signature. A donated argument that is an array
    itself is not watched: the caller's own variable holds it, as it should.
    """

    watched: tuple[int, ...]  # flat leaf indices
    pick: Callable[[Sequence[Any]], Sequence[Any]] | None
    limit: int
    error: Callable[[Sequence[int]], BaseException]
    redispatching: Callable[[], bool]

    def refuse(self, seq: Sequence[Any], sequences: int) -> BaseException | None:
        if self.redispatching():  # the slow path's frames hold the leaves too
            return None
        kept = refcount.confirmed(seq, refcount.kept_positions(seq, sequences), sequences)
        return self.error([self.watched[i] for i in kept]) if kept else None


def _kept_plan(ctx: _Context) -> _KeptPlan | None:
    """The kept-leaf check of a closure over the flat leaves (None: not checked)."""
    if ctx.kept is None:
        return None
    cs = ctx.cs
    whole: set[int] = set()
    start = 0
    for spec in cs.spec_args:
        n = len(jax.tree_util.tree_leaves(spec))
        if jax.tree_util.tree_structure(spec).num_nodes == 1:  # the argument is one array
            whole.update(range(start, start + n))
        start += n
    watched = tuple(i for i in cs.donated if i not in whole)
    if not watched:
        return None
    if len(watched) == len(cs.leaves):  # all of them: the flat leaves themselves
        pick, sequences = None, 1
    elif len(watched) == 1:
        only = watched[0]
        pick, sequences = (lambda leaves: (leaves[only],)), 2
    else:
        pick, sequences = operator.itemgetter(*watched), 2
    return _KeptPlan(watched, pick, refcount.BASELINE + sequences - 1, ctx.kept, ctx.step.redispatching)


def _checked(ctx: _Context) -> Callable[..., Any]:
    """Checks ``fast``/``full``: flatten, check each leaf's kind, call."""
    cs, compiled, slow_call = ctx.cs, ctx.compiled, ctx.slow_call
    in_treedef, donated, weak, flat_style = cs.in_treedef, cs.donated, cs.weak, cs.flat_style
    any_weak = any(weak)
    shardings = [leaf.spec.sharding for leaf in cs.leaves] if cs.multi_device else None
    ndims = [len(leaf.spec.shape) for leaf in cs.leaves]
    # Shardings that differ as objects but place the data alike (P('x', None)
    # vs P('x'), a renamed mesh axis): the executable accepts them, and so does
    # the slow path's diff, so refusing them here would loop. Checked once per
    # (leaf, sharding), on the path that used to fall back.
    equivalent: set[tuple[int, Any]] = set()

    def placed_alike(i: int, got: Any, want: Any) -> bool:
        if (i, got) in equivalent:
            return True
        ok = same_placement(got, want, ndims[i])
        if ok and len(equivalent) < 256:
            equivalent.add((i, got))
        return ok

    array_impl = ArrayImpl
    key_array: Any = KeyArray  # typed PRNG keys: checked only when a leaf is not an ArrayImpl
    tref, ev, aref, top = top_level_refs()  # a trace active (jit, vmap...): the slow path traces
    # One is_deleted() per call catches the usual stale state (all of it was
    # donated) before XLA refuses it with an error line on stderr.
    first_donated = donated[0] if donated else None
    full, is_deleted, n_leaves = ctx.full, _is_deleted_for(cs), len(cs.leaves)

    def leaves_consumed(leaves: Sequence[Any]) -> bool:
        return all(leaves[i].is_deleted() for i in donated)

    tail = _tail(ctx, leaves_consumed)
    kept = _kept_plan(ctx)
    count = refcount.count
    kept_pick, kept_limit = (kept.pick, kept.limit) if kept is not None else (None, 0)

    def checked(*args: Any, **kwargs: Any) -> Any:
        leaves, treedef = flatten(args)
        if kwargs or treedef != in_treedef or tref.value is not ev or aref.value is not top:
            return slow_call(args, kwargs, None)
        if any_weak:
            for x, w in zip(leaves, weak):
                if (type(x) is not array_impl and type(x) is not key_array) or x.aval.weak_type is not w:
                    return slow_call(args, kwargs, None)
        else:
            for x in leaves:
                if (type(x) is not array_impl and type(x) is not key_array) or x.aval.weak_type:
                    return slow_call(args, kwargs, None)
        if shardings is not None:
            for i, (x, s) in enumerate(zip(leaves, shardings)):
                if x.sharding != s and not placed_alike(i, x.sharding, s):
                    return slow_call(args, kwargs, None)
        x = None  # the loops' variable held the last leaf: a reference the kept check would count
        if first_donated is not None and leaves[first_donated].is_deleted():
            return slow_call(args, kwargs, None)  # a stale state: explain, quietly
        if full and (
            any(map(is_deleted, leaves))
            or (len(set(map(id, leaves))) != n_leaves and find_hazards(leaves, donated)[1])
        ):
            # any other deleted or repeated donated buffer, before XLA refuses it with
            # an ExecutePrepare error line on stderr (fast leaves that to XLA)
            return slow_call(args, kwargs, None)
        if kept is not None:
            seq = leaves if kept_pick is None else kept_pick(leaves)
            if max(map(count, seq)) > kept_limit:
                refused = kept.refuse(seq, 1 if kept_pick is None else 2)
                if refused is not None:
                    del seq
                    return slow_call(args, kwargs, refused)
            del seq
        try:
            out = compiled(*leaves) if flat_style else compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        return tail(args, leaves, out)

    return checked


def _checked_host(ctx: _Context) -> Callable[..., Any]:
    """Checks ``fast``/``full`` for a step with declared host data (``host=``).

    The declared leaves may be numpy arrays (the executable's call transfers
    them, and checks their shape and dtype); inside a loop the call runs with
    the thread's host-to-device guard at ``allow`` for its duration (a
    declared transfer), and every other leaf is checked as ``_checked``
    does. Calls that transferred are counted with their bytes.
    """
    cs, compiled, slow_call, stats = ctx.cs, ctx.compiled, ctx.slow_call, ctx.stats
    in_treedef, donated, weak, flat_style = cs.in_treedef, cs.donated, cs.weak, cs.flat_style
    host = frozenset(cs.host)
    kinds = tuple((i in host, w) for i, w in enumerate(weak))
    device = [i for i in range(len(cs.leaves)) if i not in host]
    allowing = allow_host_to_device(compiled)
    array_impl, key_array, ndarray = ArrayImpl, KeyArray, np.ndarray
    tref, ev, aref, top = top_level_refs()
    full, nbytes, n_leaves = ctx.full, cs.host_nbytes, len(cs.leaves)
    first_donated = donated[0] if donated else None

    def leaves_consumed(leaves: Sequence[Any]) -> bool:
        return all(leaves[i].is_deleted() for i in donated)

    tail = _tail(ctx, leaves_consumed)
    kept = _kept_plan(ctx)
    count = refcount.count
    kept_pick, kept_limit = (kept.pick, kept.limit) if kept is not None else (None, 0)

    def checked_host(*args: Any, **kwargs: Any) -> Any:
        leaves, treedef = flatten(args)
        if kwargs or treedef != in_treedef or tref.value is not ev or aref.value is not top:
            return slow_call(args, kwargs, None)
        transfers = False
        for x, (is_host, w) in zip(leaves, kinds):
            t = type(x)
            if is_host and t is ndarray:
                transfers = True
            elif (t is not array_impl and t is not key_array) or x.aval.weak_type is not w:
                return slow_call(args, kwargs, None)
        x = None  # the loop's variable held the last leaf (see _checked)
        if first_donated is not None and leaves[first_donated].is_deleted():
            return slow_call(args, kwargs, None)  # a stale state: explain, quietly
        if full and (
            any(leaves[i].is_deleted() for i in device)
            or (len(set(map(id, leaves))) != n_leaves and find_hazards(leaves, donated)[1])
        ):
            return slow_call(args, kwargs, None)
        if kept is not None:
            seq = leaves if kept_pick is None else kept_pick(leaves)
            if max(map(count, seq)) > kept_limit:
                refused = kept.refuse(seq, 1 if kept_pick is None else 2)
                if refused is not None:
                    del seq
                    return slow_call(args, kwargs, refused)
            del seq
        call = allowing if transfers and tracking.count else compiled
        try:
            out = call(*leaves) if flat_style else call(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        if transfers:
            stats.host_calls += 1
            stats.host_bytes += nbytes
        return tail(args, leaves, out)

    return checked_host


def _is_deleted_for(cs: CompiledSignature) -> Callable[[Any], bool]:
    """``ArrayImpl.is_deleted`` unbound (``map()`` runs it in C), or a method
    call when the signature has typed PRNG keys (not ``ArrayImpl`` s)."""
    if any(is_key(leaf.spec.dtype) for leaf in cs.leaves):
        return operator.methodcaller("is_deleted")
    return ArrayImpl.is_deleted  # type: ignore[no-any-return]


def _provenance(ctx: _Context, checked: Callable[..., Any]) -> Callable[..., Any]:
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
    is_deleted = _is_deleted_for(cs)
    getters = {arg: _leaves_of(type(cs.spec_args[arg])) for arg, _ in in_tokens}
    donated_getters = tuple((arg, getters[arg]) for arg, _ in in_tokens) if cs.donated else ()
    first_leaf: Callable[[tuple[Any, ...]], Any] | None = None
    if donated_getters and jax.tree_util.tree_leaves(cs.spec_args[donated_getters[0][0]]):
        arg0 = donated_getters[0][0]
        get_first = _first_leaf_of(type(cs.spec_args[arg0]))

        def first_leaf(args: tuple[Any, ...]) -> Any:
            return get_first(args[arg0])

    if len(donated_getters) == 1:
        ((arg_d, get_d),) = donated_getters

        def states_consumed(args: tuple[Any, ...]) -> bool:
            return all(map(is_deleted, get_d(args[arg_d])))

    else:

        def states_consumed(args: tuple[Any, ...]) -> bool:
            return all(all(map(is_deleted, get(args[arg]))) for arg, get in donated_getters)

    if n_params == 1 and len(cs.out_tokens) == 1 and cs.out_tokens[0][0] == ():
        return _provenance_one(ctx, checked, states_consumed, first_leaf is not None)

    tail = _tail(ctx, states_consumed)

    kept = _kept_plan(ctx)
    others = tuple(i for i in range(n_params) if i not in dict(in_tokens))
    other_specs, other_treedef = jax.tree_util.tree_flatten(tuple(cs.spec_args[i] for i in others))
    other_weak = tuple(bool(s.weak_type) for s in other_specs)
    other_any_weak = any(other_weak)
    multi_device = cs.multi_device

    def provenance(*args: Any, **kwargs: Any) -> Any:
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
                if (type(x) is not array_impl and type(x) is not key_array) or (
                    x.aval.weak_type is not w if other_any_weak else x.aval.weak_type
                ):
                    return checked(*args)
            if full and any(map(is_deleted, leaves)):
                return slow_call(args, kwargs, None)  # before XLA's error line
        if kept is not None:
            flat = flatten(args)[0]
            seq = flat if kept.pick is None else kept.pick(flat)
            del flat
            if max(map(refcount.count, seq)) > kept.limit:
                refused = kept.refuse(seq, 1 if kept.pick is None else 2)
                if refused is not None:
                    del seq
                    return slow_call(args, kwargs, refused)
            del seq
        try:
            out = compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        return tail(args, args, out)

    return provenance


def _provenance_one(
    ctx: _Context,
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
    tail of :func:`_tail` written out: stamp, the ``full`` consumption
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
    first_leaf = _first_leaf_of(cls) if donates and first_name is None else None
    kept = _kept_plan(ctx)
    count = refcount.count
    if kept is not None and names is not None and kept.pick is None:  # a flat class, all donated
        kept_get = operator.itemgetter(*names) if len(names) > 1 else (lambda d, n=names[0]: (d[n],))
        kept_of = None  # the sequence comes from the state's __dict__ directly
    elif kept is not None:
        kept_get, kept_of = None, _leaves_of(cls)
    else:
        kept_get = kept_of = None
    kept_limit = kept.limit if kept is not None else 0

    def provenance_one(s: Any = missing, *rest: Any, **kwargs: Any) -> Any:
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
            leaves = kept_of(s)
            seq = leaves if kept.pick is None else kept.pick(leaves)  # type: ignore[union-attr]
            del leaves
            if max(map(count, seq)) > kept.limit:  # type: ignore[union-attr]
                refused = kept.refuse(seq, 1 if kept.pick is None else 2)  # type: ignore[union-attr]
                if refused is not None:
                    del seq
                    return slow_call((s,), {}, refused)
            del seq
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

    return provenance_one


def _leaves_of(cls: type) -> Callable[[Any], Sequence[Any]]:
    """The leaves of a state instance: ``__dict__`` reads for a flat class
    (never attribute reads: a consumed state's fields raise when read)."""
    names = flat_field_names(cls)
    if not names:
        return lambda x: flatten(x)[0]
    return dict_getter(names)


def _first_leaf_of(cls: type) -> Callable[[Any], Any]:
    """The first leaf of a state instance: one ``__dict__`` read for a flat class."""
    names = flat_field_names(cls)
    if names:
        first = names[0]
        return lambda x: x.__dict__[first]
    return lambda x: flatten(x)[0][0]
