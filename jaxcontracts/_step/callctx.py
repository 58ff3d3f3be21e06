"""What every per-call closure of a compiled signature shares: the step
protocol (:class:`DispatchingStep`), the :class:`CallContext` read at build,
the after-dispatch tail (:func:`make_tail`) and the leaf readers. The closures
are in ``_step.callpath``; the kept-reference check in ``_step.kept``."""

from __future__ import annotations

import dataclasses
import inspect
import operator
import sys
import time
import types
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from .. import _steps
from .._compat.arrays import ArrayImpl
from .._compat.guarded import tree_in_tree
from .._compat.tracing import flatten
from .._dtypes import is_key
from .._records import CompiledSignature
from .._report import timing as _timing
from .._runtime import tracking
from .._steps import HOOK_EVERY, LiveStep
from .definition import StepDefinition

__all__ = [
    "HOST_TYPES", "CallContext", "DispatchingStep", "call_tree", "is_deleted_for",
    "leaf_reader", "leaf_readers", "make_tail", "param_leaves",
    "picker", "stale_reader",
]


#: What host data may be: numpy, a numpy scalar, a Python number.
HOST_TYPES = (np.ndarray, np.generic, bool, int, float, complex)


class DispatchingStep(LiveStep, Protocol):
    """What a call path needs of its step (``jc.HotStep`` is one)."""

    @property
    def definition(self) -> StepDefinition: ...

    def slow_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException | None
    ) -> Any:
        """Everything a closure does not handle (diagnosis, a new compile, traces)."""

    def not_consumed(
        self, cs: CompiledSignature, leaves: Sequence[Any], out: Any
    ) -> BaseException | None:
        """The error for donated buffers XLA copied (``None``: a recording loop took it)."""


@dataclasses.dataclass(frozen=True)
class CallContext:
    """What every closure of one compiled signature needs (read once, at build)."""

    cs: CompiledSignature
    compiled: Callable[..., Any]  # the executable's C++ call
    full: bool
    step: DispatchingStep
    n_params: int
    slow_call: Callable[[tuple[Any, ...], dict[str, Any], BaseException | None], Any]
    marks: tuple[tuple[int, type, type], ...]  # (state parameter, its class, consumed class)
    # the error for donated leaves held elsewhere, at full (None: not checked)
    kept: Callable[[Sequence[int], Sequence[tuple[str, range]]], BaseException] | None
    bind: Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...] | None]  # bind_positional
    defaults: bool  # some parameter has a default: a short positional call is bound too


def make_tail(ctx: CallContext) -> Callable[[tuple[Any, ...], Any, Any, float], Any]:
    """``tail(args, leaves, out, t0)`` after dispatch: check consumption (``leaves``:
    the flat leaves at ``full``), mark, count, tell loops; ``t0``: the clock of a
    timed call, else 0. ``fast`` does its share inline (``_guarded_closure``). At
    ``full`` the consumed arrays stay in ``last_consumed`` until the next call,
    which keeps a weak reference to those held elsewhere (``_steps.keep``), one
    leaf per donated argument (one inside a state was refused before dispatch)."""
    full, stats, cs, not_consumed = ctx.full, ctx.step.stats, ctx.cs, ctx.step.not_consumed
    is_deleted = is_deleted_for(cs)
    every_leaf = tuple(cs.donated) == tuple(range(len(cs.leaves)))
    donated_of = None if every_leaf else picker(cs.donated)
    records = full and bool(cs.donated)
    at = {flat: k for k, flat in enumerate(cs.donated)}  # a donated leaf's position in the record
    # per donated argument, its first donated leaf's position in the record
    # (None: one argument, whose first leaf leads the record)
    positions = [at[min(at.keys() & set(r))] for r in param_leaves(cs) if at.keys() & set(r)]
    firsts = None if len(positions) <= 1 else picker(positions)
    slot, keep, count = ctx.step.last_consumed, _steps.keep, sys.getrefcount
    step, record = ctx.step, ctx.step.last_output
    marks = ctx.marks
    mark_one = marks[0] if len(marks) == 1 else None
    set_class = object.__setattr__  # the states are frozen dataclasses
    every, acc, due, timed, perf = (
        HOOK_EVERY, step.timing_counters, step.timing_due, _timing.timed, time.perf_counter
    )

    def tail(args: tuple[Any, ...], leaves: Any, out: Any, t0: float) -> Any:
        if records:
            stats.consumed_checked += 1
            gone = leaves if donated_of is None else donated_of(leaves)
            if all(map(is_deleted, gone)):  # each consumed: the step's record of them
                last, slot[0] = slot[0], (gone, firsts)  # one store: a thread reads a whole record
                if last is not None:
                    previous, pick = last  # pick: of the signature that made it
                    del last
                    # held by `previous` and the count's argument (and the picked tuple), or by more
                    if (
                        count(previous[0]) > 2
                        if pick is None
                        else max(map(count, pick(previous))) > 3
                    ):
                        keep(previous, step.short_name, held_only=True)
                    del previous
            else:
                err = not_consumed(cs, leaves, out)
                if err is not None:  # None: a recording loop took it as a violation
                    raise err
            del gone
        if mark_one is not None:  # the donated state names its consumer
            i, cls, consumed_cls = mark_one
            if type(args[i]) is cls:
                set_class(args[i], "__class__", consumed_cls)
        elif marks:
            for i, cls, consumed_cls in marks:
                if type(args[i]) is cls:
                    set_class(args[i], "__class__", consumed_cls)
        if t0:  # a timed call (before it is counted: it may join the open loops)
            timed(step, acc, perf() - t0)
        n = stats.calls = stats.calls + 1
        if tracking.count:  # a hot_loop is active somewhere: its clock and messages read the output
            record[0] = out
            if not n % every:  # one call in `every` is timed
                due[0] = True
        return out

    return tail


def call_tree(cs: CompiledSignature) -> Any:
    """The guarded C++ call's argument tree: ``cs``'s structure for a flat-style
    or alias executable; None: the executable's own."""
    return tree_in_tree(cs.spec_args) if cs.flat_style or cs.alias else None


def is_deleted_for(cs: CompiledSignature) -> Callable[[Any], bool]:
    """``ArrayImpl.is_deleted`` unbound (``map()`` runs it in C); a
    method call for typed PRNG keys."""
    if any(is_key(leaf.spec.dtype) for leaf in cs.leaves):
        return operator.methodcaller("is_deleted")
    return ArrayImpl.is_deleted  # type: ignore[no-any-return]


def param_leaves(cs: CompiledSignature) -> list[range]:
    """Per parameter, the positions of its leaves among the flat leaves."""
    out: list[range] = []
    start = 0
    for spec in cs.spec_args:
        n = len(jax.tree_util.tree_leaves(spec))
        out.append(range(start, start + n))
        start += n
    return out


def picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A C-level ``lambda leaves: tuple(leaves[i] for i in indices)``."""
    if not indices:
        return lambda leaves: ()
    if len(indices) == 1:
        only = indices[0]
        return lambda leaves: (leaves[only],)
    return operator.itemgetter(*indices)  # type: ignore[return-value]


def leaf_reader(cs: CompiledSignature, index: int) -> Callable[[tuple[Any, ...]], Any]:
    """Reads flat leaf ``index`` from a call's arguments by its path, without a
    flatten (``__dict__`` first: a consumed state's fields raise); a computed
    attribute (flax's ``Variable.value`` warns) or keyless node is flattened."""
    return leaf_readers(cs, (index,))[0]


def leaf_readers(
    cs: CompiledSignature, indices: Sequence[int]
) -> list[Callable[[tuple[Any, ...]], Any]]:
    """:func:`leaf_reader` for each of ``indices`` (the specs flattened once)."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(cs.spec_args)
    firsts: dict[tuple[Any, ...], int] = {}  # a path prefix -> its first flat leaf
    for i, (p, _) in enumerate(with_path):
        for depth in range(len(p) + 1):
            firsts.setdefault(_prefix_key(p[:depth]), i)
    # Readers are proven on a tree of distinct markers (leaves may share one
    # spec object); None: no such tree can be built, and every reader flattens.
    marks = [object() for _ in with_path]
    try:
        markers = jax.tree_util.tree_unflatten(treedef, marks)
    except Exception:  # noqa: BLE001
        markers = None
    return [_reader(with_path, firsts, i, markers, marks[i]) for i in indices]


_WALKED_KEYS = (jax.tree_util.SequenceKey, jax.tree_util.DictKey, jax.tree_util.GetAttrKey)


def _prefix_key(prefix: tuple[Any, ...]) -> tuple[Any, ...]:
    # Only walked keys are compared; any other (maybe unhashable) stands for itself.
    return tuple(k if isinstance(k, _WALKED_KEYS) else id(k) for k in prefix)


def _reader(
    with_path: Sequence[Any], firsts: dict[tuple[Any, ...], int], index: int, markers: Any,
    mark: object,
) -> Callable[[tuple[Any, ...]], Any]:
    path = with_path[index][0]
    steps: list[tuple[int, Any]] = []  # (0: item, 1: attribute, 2: leaf k of a one-node flatten)

    def read(args: tuple[Any, ...]) -> Any:
        obj: Any = args
        for kind, key in steps:
            if kind == 0:
                obj = obj[key]
            elif kind == 1:
                d = getattr(obj, "__dict__", None)
                obj = d[key] if d is not None and key in d else getattr(obj, key)
            else:
                obj = flatten(obj)[0][key]
        return obj

    node: Any = markers
    costly = False  # a step runs Python: a container's own __getitem__ (nnx.State), a flatten
    shadowed = False  # an attribute read in __dict__ that the class also defines
    for depth, key in enumerate(path if markers is not None else ()):
        if isinstance(key, (jax.tree_util.SequenceKey, jax.tree_util.DictKey)):
            costly = costly or getattr(type(node), "__getitem__", None) not in _BUILTIN_ITEMS
        if isinstance(key, jax.tree_util.SequenceKey):
            steps.append((0, key.idx))
        elif isinstance(key, jax.tree_util.DictKey):
            steps.append((0, key.key))
        elif isinstance(key, jax.tree_util.GetAttrKey) and _plain_attribute(node, key.name):
            steps.append((1, key.name))
            shadowed = shadowed or not _getattr_plain(node, key.name)
        else:  # the rest of the path, read by flattening this node
            # its leaves are a run of the flat leaves: those under the same prefix
            steps.append((2, index - firsts[_prefix_key(path[:depth])]))
            break
        try:
            node = read(markers)  # the steps so far, on the proof tree
        except Exception:  # noqa: BLE001 - not its items or attributes: proven wrong below
            break

    try:
        same = markers is not None and read(markers) is mark
    except Exception:  # noqa: BLE001 - a node whose children are not its items or attributes
        same = False
    if not same:
        read = lambda args: flatten(args)[0][index]  # noqa: E731
    elif not shadowed and all(kind < 2 for kind, _ in steps) and 1 <= len(steps) <= 3:
        # the same reads in C (``getattr`` finds what ``__dict__`` holds)
        read = _chain(
            [
                operator.itemgetter(key) if kind == 0 else operator.attrgetter(key)
                for kind, key in steps
            ]
        )
    read.costly = (  # type: ignore[attr-defined]
        costly or not same or any(kind == 2 for kind, _ in steps)
    )
    return read


def _chain(getters: list[Callable[[Any], Any]]) -> Callable[[tuple[Any, ...]], Any]:
    """``args -> leaf`` as one C call per step (up to three)."""
    if len(getters) == 1:
        (a,) = getters
        return lambda args: a(args)
    if len(getters) == 2:
        a, b = getters
        return lambda args: b(a(args))
    a, b, c = getters
    return lambda args: c(b(a(args)))


_BUILTIN_ITEMS = (tuple.__getitem__, list.__getitem__, dict.__getitem__)


def _plain_attribute(obj: Any, name: str) -> bool:
    """Whether ``obj.name`` is stored data (the instance ``__dict__``, a slot, a
    NamedTuple field), not a property or another computed attribute."""
    d = getattr(obj, "__dict__", None)
    if d is not None and name in d:
        return True
    return _slot(inspect.getattr_static(type(obj), name, None))


def _slot(attr: Any) -> bool:
    """A class attribute that reads stored data: a slot or a NamedTuple field."""
    return isinstance(attr, types.MemberDescriptorType) or type(attr).__name__ == "_tuplegetter"


# the generic attribute read, as the builtin bases a state's classes have define it
_PLAIN_GETATTRIBUTE = (
    object.__getattribute__, tuple.__getattribute__, list.__getattribute__, dict.__getattribute__
)


def _getattr_plain(obj: Any, name: str) -> bool:
    """Whether ``getattr(obj, name)`` reads stored data: no own
    ``__getattribute__``, no data descriptor but a slot or NamedTuple field."""
    cls = type(obj)
    if cls.__getattribute__ not in _PLAIN_GETATTRIBUTE or hasattr(cls, "__getattr__"):
        return False
    attr = inspect.getattr_static(cls, name, None)
    descriptor = hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")
    return not descriptor or _slot(attr)


def stale_reader(cs: CompiledSignature) -> Callable[[tuple[Any, ...]], Any] | None:
    """The first donated leaf's reader, asked ``is_deleted()`` by ``fast`` before
    the call: a stale state goes to the slow path before ``Execute`` logs its
    refusal on stderr. None: nothing is donated."""
    return leaf_reader(cs, cs.donated[0]) if cs.donated else None
