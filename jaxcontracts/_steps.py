"""The one registry of live hot steps, and what every module may read of one.

A hot step registers itself when it is made; the registry holds it weakly,
so a step that is freed leaves it with no finalizer and no id to reuse. The
modules that need every live step read them here: the checks level
(``_config``) tells each one the level changed, the loop clock (``_timing``)
turns timing on and off and reads the counters, messages (``_runtime``) read
the last-call slots, contract snapshots (``_snapshot``) read the counts.
Each reads only the :class:`LiveStep` protocol below, never a private
attribute.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._records import StepDescription, StepStats

__all__ = [
    "EARLY_FREE_LEAVES",
    "HOOK_EVERY",
    "Gone",
    "LiveStep",
    "checks_changed",
    "clear_last_calls",
    "last_call_release",
    "last_calls",
    "live",
    "on_timing_changed",
    "register",
    "timing_changed",
    "weak_record",
]

#: Calls between two runs of a step's ``timing_hook`` (``_timing.SAMPLE``).
HOOK_EVERY = 64


class LiveStep(Protocol):
    """What the registry and its readers need of a hot step (``jc.HotStep``)."""

    @property
    def name(self) -> str:
        """``module.qualname`` of the step."""
        ...

    @property
    def short_name(self) -> str:
        """The step's own name (``advance``), as messages write it."""
        ...

    @property
    def donates(self) -> bool:
        """Whether one of its compiled signatures donates buffers."""
        ...

    stats: StepStats
    #: Cumulative host time of the timed calls inside loops: [seconds, calls,
    #: first-phase seconds, first-phase calls] (see ``_timing.timed``).
    timing_counters: list[float]
    #: One slot: ``(arguments, output)`` of the last call made while any loop
    #: was active, for steps off the ``s = step(s)`` path (that path marks its
    #: output instead, ``_marks.PRODUCED_BY``); ``None`` when unknown.
    last_call: list[Any]
    #: The call path runs it after every ``HOOK_EVERY``-th call made while a
    #: loop is active (``None``: nothing to run): it re-arms the timing wrapper.
    timing_hook: Callable[..., None] | None

    def checks_changed(self, level: str) -> None:
        """The checks level changed: build the call path for ``level``."""

    def describe(self) -> StepDescription:
        """The step's frozen record (for contract snapshots)."""
        ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()


def register(step: LiveStep) -> None:
    """Add a step to the registry (held weakly: it leaves when it is freed)."""
    _live.add(step)


def live() -> list[LiveStep]:
    """Every live step, in no particular order (a copy: safe to iterate)."""
    return list(_live)


def donating() -> list[str]:
    """The short names of the live steps that have run a donating signature (sorted)."""
    return sorted({step.short_name for step in live() if step.stats.calls and step.donates})


def checks_changed(level: str) -> None:
    """Tell every live step that the checks level is now ``level``."""
    for step in live():
        step.checks_changed(level)


# Called with True when the first timing loop starts, False when the last
# one ends: each switches a class's call slot (O(1), whatever the number of
# live steps: the class's ``__call__`` reads either the plain or the timed
# call path of each instance).
_timing_switches: list[Callable[[bool], None]] = []


def on_timing_changed(switch: Callable[[bool], None]) -> None:
    """Register a class-level switch for :func:`timing_changed`."""
    _timing_switches.append(switch)


def timing_changed(on: bool) -> None:
    """Timing is now ``on`` (or off): flip every registered class's call slot."""
    for switch in _timing_switches:
        switch(on)


def last_calls(steps: Iterable[LiveStep] | None = None) -> Iterator[tuple[str, Any, Any, bool]]:
    """``(short name, arguments, output, whether it donates)`` of each step's
    recorded last call (a step that donates nothing consumed none of its
    arguments, however deleted they are now); ``steps``: default every live
    step. An argument recorded weakly (:func:`weak_record`) reads as itself,
    or None once nothing else holds it; one recorded by id stays a
    :class:`Gone`, which the reader matches against what it can see."""
    ref = weakref.ref
    for step in live() if steps is None else steps:
        call = step.last_call[0]
        if call is not None:
            args, out = call
            yield (step.short_name, tuple(a() if type(a) is ref else a for a in args), out, step.donates)


_Maker = Callable[[tuple[Any, ...]], tuple[Any, ...]]


class Gone:
    """What a call's record keeps of a consumed argument whose container takes
    no weak reference (a dict, tuple, list, NamedTuple): its ``id``, a weak
    reference to its first donated leaf (``first``) and its tree structure
    (the signature's, a constant). It holds none of the
    state, which goes at the caller's rebinding (``s = step(s)``), while the
    caches still hold it, as in a plain loop. While something still holds
    that leaf (the caller's ``old = s``) the argument is found again by its
    id among the objects a message can see, its structure and that leaf
    confirming it is the same object (``_runtime.find``: the reading frame
    and its callers, a call's arguments)."""

    __slots__ = ("cid", "first", "treedef")

    def __init__(self, cid: int, first: Callable[[], Any], treedef: Any) -> None:
        self.cid, self.first, self.treedef = cid, first, treedef

    def holder(self, candidates: Iterable[Any], flatten: Callable[[Any], tuple[Sequence[Any], Any]]) -> Any:
        """The candidate that is this argument (its id, the argument's tree
        structure, and its leaves hold the recorded leaf, still alive), or None."""
        first = self.first()
        if first is None:
            return None
        for c in candidates:
            if id(c) == self.cid:
                try:
                    leaves, treedef = flatten(c)
                    if treedef == self.treedef and any(leaf is first for leaf in leaves):
                        return c
                except Exception:  # noqa: BLE001 - a candidate that does not flatten is not it
                    continue
        return None


def weak_record(
    whole: tuple[int, ...],
    types: Iterable[type],
    donating: Iterable[int] = (),
    firsts: Mapping[int, tuple[Callable[[tuple[Any, ...]], Any], Any]] | None = None,
) -> tuple[_Maker, _Maker] | tuple[None, None]:
    """How a call records its consumed state without holding it: a wholly
    donated parameter whose container (``types``, in the order of ``whole``)
    takes a weak reference (a flax struct dataclass such as ``TrainState``,
    an ``nnx.State``, a ``jc.state``) as one, and one that takes none but has
    a reader of its first donated leaf (``firsts``: parameter -> ``(read(args),
    its tree structure)``; a dict, tuple, list or NamedTuple) as a :class:`Gone`.
    ``(outside loops, in loops)``, each making the record's arguments from
    the call's. The record then holds none of the consumed state: it goes
    when the caller lets it go (``s = step(s)``), while the caches still hold
    it, as in a plain loop, and a state the caller still holds (``old = s``)
    is still found, and named, through it. In loops the other parameters
    with donated leaves (``donating``) are held as they are, and those with
    none (a batch: this step consumed nothing of it) as None, so a record
    with nothing to free early holds no batch either. An argument that takes
    no weak reference after all (another class of the same tree structure),
    or whose first leaf cannot be read or referenced, is held as it is.
    ``(None, None)`` where a parameter takes neither (an equinox Module's
    per-call node: the record holds them)."""
    firsts = firsts or {}
    if not whole or not all(t.__weakrefoffset__ or i in firsts for i, t in zip(whole, types)):
        return None, None
    ref = weakref.ref
    weak, kept = frozenset(whole), frozenset(donating) - frozenset(whole)
    readers = {i: firsts.get(i, (None, None)) for i in whole}

    def held(i: int, args: tuple[Any, ...]) -> Any:
        a = args[i]
        read, treedef = readers[i]
        try:
            return ref(a) if read is None else Gone(id(a), ref(read(args)), treedef)
        except Exception:  # noqa: BLE001 - no weak reference after all, or a leaf not read: held
            return a

    if len(whole) == 1 and not kept:
        only = whole[0]
        read_only, treedef_only = readers[only]

        if read_only is None:

            def outside_one(args: tuple[Any, ...]) -> tuple[Any, ...]:
                try:
                    return (ref(args[only]),)
                except TypeError:
                    return (args[only],)

        else:

            def outside_one(args: tuple[Any, ...]) -> tuple[Any, ...]:
                try:
                    return (Gone(id(args[only]), ref(read_only(args)), treedef_only),)
                except Exception:  # noqa: BLE001 - see held
                    return (args[only],)

        def inside_one(args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (*(None,) * only, held(only, args), *(None,) * (len(args) - only - 1))

        return outside_one, inside_one

    def outside(args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(held(i, args) for i in whole)

    def inside(args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(held(i, args) if i in weak else a if i in kept else None for i, a in enumerate(args))

    return outside, inside


def clear_last_calls(steps: Iterable[LiveStep] | None = None) -> None:
    """Forget the last call of ``steps`` (default: every live step)."""
    for step in live() if steps is None else steps:
        step.last_call[0] = None


#: A state consumed by a call is freed before the next call's dispatch up to
#: this many donated leaves (``last_call_release``; ``_callpath._guarded``).
EARLY_FREE_LEAVES = 128


def _keep() -> None:
    return None


def last_call_release(
    record: list[Any],
    whole: tuple[int, ...],
    leaves: int,
    nodes: tuple[int, ...],
    count: Callable[[Any], int] | None,
    baseline: int,
    total: int = 0,
) -> Callable[[], None]:
    """What a call runs just before its executable: drop ``record`` (a step's
    ``last_call``: ``(arguments, output)``) where it alone holds the state
    the last call consumed, so that state is freed before this call's
    outputs are made.

    ``whole``: the parameters every leaf of which is donated, holding
    ``leaves`` leaves in all. The record holds either the call's positional
    arguments (in loops; their first positions are the parameters, the
    static ones passed by keyword left out) or only the wholly donated ones,
    in order (outside loops): the two differ in length unless the arguments
    are exactly the wholly donated parameters, where both read alike. Where
    anything else still holds one of those arguments (``old = s``; with
    several, one of them held keeps them all), dropping the record would
    free nothing, so it is kept: should this call fail, a later read of that
    state still names the step that consumed it. Past ``EARLY_FREE_LEAVES``
    leaves the record is left to the tail, after the dispatch (freeing costs
    about 0.5 us a leaf); a record of all the arguments (in loops) is left to
    it past ``EARLY_FREE_LEAVES`` leaves in ``total`` (all the signature's
    leaves: a large batch only the record holds would be freed too).
    ``count``: ``sys.getrefcount``, where a leaf held by one container and
    read through ``map()`` over a sequence has ``baseline`` references
    (``_compat.refcount``); None where references cannot be counted (not
    CPython): the record is then always dropped.
    """
    if not whole or leaves > EARLY_FREE_LEAVES:
        return _keep
    if count is None:

        def drop() -> None:
            record[0] = None

        return drop
    # An argument only the record holds: its tuple's reference and count's
    # own (baseline - 1), and one more read through a fresh sequence (pick).
    alone, alone_picked = baseline - 1, baseline
    n_whole = len(whole)
    # A record another compiled signature of the step wrote (max_compiles > 1)
    # may be laid out otherwise: what cannot be read in it is kept, to be safe.
    unreadable = (IndexError, TypeError, AttributeError)
    all_args = total <= EARLY_FREE_LEAVES  # a record of every argument is small enough to free
    if nodes:
        inner = frozenset(whole.index(i) for i in nodes)

        def release_through_nodes() -> None:
            seen = record[0]
            if seen is not None:
                try:
                    held = seen[0]
                    if len(held) != n_whole and not all_args:
                        return
                    args = [held[i] for i in (range(n_whole) if len(held) == n_whole else whole)]
                    for k in inner:
                        args[k] = args[k].leaves[0]
                except unreadable:
                    return
                if max(map(count, args)) <= alone_picked:  # the record's tuple or a node's, the list's, count's
                    record[0] = None

        return release_through_nodes
    if n_whole == 1:
        only = whole[0]

        def release_one() -> None:
            seen = record[0]
            if seen is not None:
                held = seen[0]
                try:
                    if len(held) == 1:
                        alone_now = count(held[0]) <= alone
                    elif all_args:
                        alone_now = count(held[only]) <= alone
                    else:
                        return
                except unreadable:
                    return
                if alone_now:
                    record[0] = None

        return release_one

    pick = operator.itemgetter(*whole)

    def release() -> None:
        seen = record[0]
        if seen is not None:
            held = seen[0]
            try:
                if len(held) == n_whole:
                    alone_now = max(map(count, held)) <= alone
                elif all_args:
                    alone_now = max(map(count, pick(held))) <= alone_picked
                else:
                    return
            except unreadable:
                return
            if alone_now:
                record[0] = None

    return release
