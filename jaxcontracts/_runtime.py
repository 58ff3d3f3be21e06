"""What hot steps and hot loops share at run time, below both of them.

The loop guard (``_guard``) sits above the call path, so a hot step never
imports it. Instead both meet here: the thread's active loop (an object with
a ``violation`` method, set by the guard), a counter that tells a step after
each call whether any loop is active anywhere, and the questions messages
ask while a loop runs: which step produced an array (``advance -> .t``), which
consumed a donated one, which step outputs a frame holds. Those answers come
from the steps' last-call slots (``_steps``) and the marks on the states
(``_marks``), read in one place (:func:`find`, :func:`held_outputs`).
"""

from __future__ import annotations

import contextlib
import itertools
import linecache
import re
import threading
import types
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import jax

from . import _steps
from ._compat.frames import locals_of
from ._donation import is_deleted_array
from ._marks import PRODUCED_BY, consumer_of

__all__ = [
    "LoopHandle",
    "LoopStack",
    "arrays_named",
    "compiling",
    "consumed_by",
    "consumers_of",
    "find",
    "held_outputs",
    "in_hot_loop",
    "local",
    "objects_in",
    "observers",
    "recording_loop",
    "states_in",
    "tracking",
]


class LoopHandle(Protocol):
    """What the call path needs of an active loop (``jc.HotLoop`` is one)."""

    checks_transfers: bool
    checks_compiles: bool
    on_violation: str  # "raise" or "record"
    warmup: bool  # compiles="warmup": the first compile of each thing is let through
    checks_host_to_device: bool  # transfers="disallow"
    sampler_calls: int  # jax.random samplers whose Python-number parameters were copied

    def admit_compile(self, key: Any, what: str, frame: Any = None) -> bool:
        """Whether a compile is a warm-up compile the loop lets through (recorded)."""
        ...

    def seen_compile(self, key: Any) -> bool:
        """Whether a compile with this key was let through already (warm-up)."""
        ...

    def compiles_admitted(self) -> bool:
        """Whether a first compile would be let through now (``compiles="allow"``,
        or the warm-up pass): a trace running now may read concrete arrays."""
        ...

    def violation(self, kind: str, what: str, fix: str, frame: Any = None) -> None:
        """Raise or record one violation (``kind``: a key of ``_errors.VIOLATIONS``)."""


class LoopStack:
    """One thread's active loops, in entry order.

    A plain object held by the thread-local, so that a loop exited on another
    thread (a generator closed there) can still update the thread it was
    entered on. ``entries`` belong to the guard; ``loop`` is the innermost
    checking one, kept up to date by the guard.
    """

    __slots__ = ("entries", "loop", "saved", "thread")

    def __init__(self) -> None:
        self.loop: LoopHandle | None = None
        self.entries: list[Any] = []
        self.saved: Any = None  # the guard's: what the thread had before its loops
        self.thread = threading.current_thread()


class _Local(threading.local):
    allow: int = 0  # > 0 inside an explicit transfer (jc.fetch) or a re-entry

    def __init__(self) -> None:
        self.stack = LoopStack()

    @property
    def loop(self) -> LoopHandle | None:
        """The innermost active loop on this thread."""
        return self.stack.loop


local = _Local()


class _Tracking:
    """Read by hot steps after each call: is any loop active anywhere?"""

    count = 0


tracking = _Tracking()


def in_hot_loop() -> bool:
    """Whether the current thread is inside a transfer-checking hot loop."""
    loop = local.loop
    return loop is not None and loop.checks_transfers and not local.allow


def recording_loop() -> LoopHandle | None:
    """This thread's active loop if it records violations (and is not paused)."""
    loop = local.loop
    if loop is not None and loop.on_violation == "record" and not local.allow:
        return loop
    return None


def find(x: Any, frame: Any = None, scope: Sequence[Any] = ()) -> tuple[str | None, str | None]:
    """(the step that consumed ``x``, ``step -> .path`` of a live output).

    Looks in the steps' last-call records, then, given the user's ``frame``,
    in the states its local variables hold (and in the tuples, lists and
    dicts among them): a state a step returned names that step, a state a
    step consumed names its consumer. A consumed argument the record keeps
    by id (``_steps.Gone``: a dict, tuple or NamedTuple) is found among the
    objects of the frame and its callers (:func:`objects_in`) and ``scope``
    (the arguments of the call being explained). Only called to word a message.
    """
    produced = None
    for name, _, out, _ in _steps.last_calls():
        for p, leaf in jax.tree_util.tree_leaves_with_path(out):
            if leaf is x:
                produced = f"{name} -> {jax.tree_util.keystr(p)}"
    consumed = consumers_of([x], scope, frame)[0]
    if frame is not None and consumed is None and produced is None:
        for state in states_in(frame):
            by = consumer_of(state)
            step = state.__dict__.get(PRODUCED_BY)
            if by is None and step is None:
                continue
            try:
                leaves = jax.tree_util.tree_leaves_with_path(state)
            except Exception:  # noqa: BLE001 - a state we cannot flatten names nothing
                continue
            for p, leaf in leaves:
                if leaf is x:
                    if by is not None:
                        return by, None
                    return None, f"{step} -> {jax.tree_util.keystr(p)}"
    return consumed, produced


def _attrs(value: Any) -> dict[str, Any] | None:
    """``value.__dict__``, or None (a module or class, no ``__dict__``, or a
    ``__getattr__`` that raises anything: a message must not fail on it)."""
    if isinstance(value, (types.ModuleType, type)):
        return None
    try:
        attrs = getattr(value, "__dict__", None)
    except Exception:  # noqa: BLE001 - a proxy's __getattr__ (a KeyError...)
        return None
    return attrs if type(attrs) is dict else None


def _items(value: Any, per: int) -> Iterator[Any]:
    kind = type(value)
    if kind is dict:
        return itertools.islice(value.values(), per)
    if kind in (tuple, list):
        return iter(value[-per:])
    return iter(())


def objects_in(frame: Any, per: int = 1000, frames: int = 8) -> list[Any]:
    """What ``frame`` and up to ``frames - 1`` of its callers hold: their
    locals; the items of the tuples, lists and dicts among them; the
    attributes of the objects among them (``self.state``) and the items of
    the containers among those (``self.history[-1]``). The first ``per``
    values of a dict or ``__dict__``, the last ``per`` items of a list or
    tuple; no module or class."""
    found: list[Any] = []
    while frame is not None and frames > 0:
        try:
            values = list(locals_of(frame).values())
        except Exception:  # noqa: BLE001 - a frame without readable locals
            values = []
        found.extend(values)
        for value in values:
            found.extend(_items(value, per))
            attrs = _attrs(value)
            if attrs is not None:
                for attr in itertools.islice(attrs.values(), per):
                    found.append(attr)
                    found.extend(_items(attr, per))
        frame, frames = frame.f_back, frames - 1
    return found


def states_in(frame: Any, per: int = 1000) -> list[Any]:
    """The objects with a ``__dict__`` that ``frame``'s locals hold, directly
    or in a tuple, list or dict among them (one level; the first ``per`` of
    a dict's values, the last ``per`` items of a list or tuple)."""
    found: list[Any] = []
    seen: set[int] = set()
    try:
        values = list(locals_of(frame).values())
    except Exception:  # noqa: BLE001 - a frame without readable locals
        return found
    for value in values:
        kind = type(value)
        items = (
            itertools.islice(value.values(), per)
            if kind is dict
            else value[-per:]
            if kind in (tuple, list)
            else (value,)
        )
        for v in items:
            if _attrs(v) is not None and id(v) not in seen:
                seen.add(id(v))
                found.append(v)
    return found


def held_outputs(frame: Any, steps: Sequence[Any], limit: int = 64) -> list[Any]:
    """The leaves of the step outputs still live that ``frame`` can see.

    For the loop clock (are they still being computed at exit?): the states
    hot steps returned that ``frame``'s locals hold (marked by the
    ``s = step(s)`` path, at most ``limit`` of them), and the recorded last
    output of each of ``steps`` (those the loop called: ``_timing.in_use``).
    Never blocks, never reads device memory.
    """
    held: list[Any] = []
    if frame is not None:
        live = 0
        for state in states_in(frame, per=limit):  # the latest of a history are enough
            if PRODUCED_BY in state.__dict__ and consumer_of(state) is None:
                try:
                    held.extend(jax.tree_util.tree_leaves(state))
                except Exception:  # noqa: BLE001 - not flattenable: not looked at
                    continue
                live += 1
                if live == limit:  # a long history of live states: enough to tell
                    break
    for _, _, out, _ in _steps.last_calls(steps):
        held.extend(jax.tree_util.tree_leaves(out))
    return held


def consumers_of(xs: Sequence[Any], scope: Sequence[Any] = (), frame: Any = None) -> list[str | None]:
    """The hot step that consumed each of ``xs`` by donation, where known,
    the records read once for all of them (a re-passed state's deleted
    leaves). A record's own arguments are matched by identity (a step that
    donates nothing consumed none of its arguments, however deleted they
    are now); one kept by id (``_steps.Gone``) by its watched leaf, or
    through the object it finds among ``scope`` (a call's arguments) and
    what ``frame`` and its callers hold (:func:`objects_in`, looked at only
    then)."""
    leaves = jax.tree_util.tree_leaves
    by_id: dict[int, str] = {}  # every object here is alive while this runs: ids are theirs
    gone: list[tuple[str, _steps.Gone]] = []
    for name, args, _, donates in _steps.last_calls():
        if donates:
            gone.extend((name, a) for a in args if type(a) is _steps.Gone)
            for leaf in leaves(tuple(a for a in args if type(a) is not _steps.Gone)):
                by_id.setdefault(id(leaf), name)
    seen = None
    for name, mark in gone:
        first = mark.first()
        if first is not None:
            by_id.setdefault(id(first), name)
            if seen is None:
                seen = (*scope, *objects_in(frame)) if frame is not None else tuple(scope)
            holder = mark.holder(seen, jax.tree_util.tree_flatten)
            for leaf in leaves(holder) if holder is not None else ():
                by_id.setdefault(id(leaf), name)
    return [by_id.get(id(x)) if is_deleted_array(x) else None for x in xs]


def consumed_by(x: Any, frame: Any = None, scope: Sequence[Any] = ()) -> str | None:
    """The hot step that consumed ``x`` by donation, when it is known (see :func:`find`)."""
    return find(x, frame, scope)[0] if isinstance(x, jax.Array) else None


def arrays_named(
    frame: Any, lineno: int, only: Any = None, limit: int = 5
) -> list[tuple[str, Any]]:
    """(``name.path``, array) for the deleted arrays that ``frame``'s code
    refers to (``only``: that array alone), the names on line ``lineno`` first.

    The user's frame holds the array directly (``x``) or inside a state it
    holds (``old.position`` of a NamedTuple, ``state.params['w']``,
    ``samples[3]``). Only called to word a message; reads no device memory.
    """
    found: list[tuple[str, Any]] = []
    code = frame.f_code
    scope = {**frame.f_globals, **locals_of(frame)}
    names = list(
        dict.fromkeys((*code.co_varnames, *code.co_freevars, *code.co_cellvars, *code.co_names))
    )
    line = linecache.getline(code.co_filename, lineno)
    names.sort(
        key=lambda n: re.search(rf"\b{re.escape(n)}\b", line) is None
    )  # the failing line's first
    for name in names[:200]:  # the names this code refers to
        for path, x in _arrays_in(scope.get(name)):
            if (x is only) if only is not None else is_deleted_array(x):
                found.append((f"{name}{path}", x))
                if len(found) == limit:
                    return found
    return found


def _arrays_in(value: Any) -> list[tuple[str, Any]]:
    """(path, array) for an array, or the arrays of a container (a state), bounded."""
    if isinstance(value, jax.Array):
        return [] if isinstance(value, jax.core.Tracer) else [("", value)]
    if (
        value is None
        or isinstance(value, (str, bytes, int, float, complex, bool, type, types.ModuleType))
        or callable(value)
    ):
        return []
    try:
        leaves = jax.tree_util.tree_flatten_with_path(value)[0]
    except Exception:  # noqa: BLE001 - not a pytree we can flatten: nothing to name
        return []
    return [
        (jax.tree_util.keystr(p), x)
        for p, x in leaves[:1000]
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
    ]


@contextlib.contextmanager
def compiling(name: str, spec: str = "jc.spec_of(<its arguments>)") -> Iterator[None]:
    """Wrap a hot step's compile: a violation inside a loop (recorded once).

    ``spec``: how the fix writes the step's arguments as specs (``S.spec(...)``
    for the user's state class ``S``).
    """
    __tracebackhide__ = True
    loop = local.loop
    if loop is None or not loop.checks_compiles or local.allow:
        yield
        return
    short = name.rsplit(".", 1)[-1]
    if not loop.admit_compile(("hot_step", name), short):
        again = loop.seen_compile(("hot_step", name))
        loop.violation(
            "compile",
            f"hot_step {short} would compile a new signature"
            + (" (it compiled once already in this loop's warm-up)" if again else ""),
            f"compile it before the loop ({short}.compile({spec}) or one "
            "call), and keep every call's arguments on that signature; where a new "
            "signature is expected (a reallocated buffer), compile it where it appears: "
            f"{short}.compile(<the new arguments>) inside "
            'with jc.hot_loop(compiles="allow"), in the branch that makes them.',
        )
    local.allow += 1  # record mode: compile without reporting its phases again
    try:
        yield
    finally:
        local.allow -= 1


# --------------------------------------------------------------------------
# Observers: what contract snapshots (``_snapshot``) are told. Each hook costs
# one attribute read when nobody records; none is on a step's call path.


class _Observers:
    """The ``jc.fetch`` count and the active recorders (live steps are in
    ``_steps``). A recorder has ``on_compile(step)`` and ``on_loop(loop, entering)``.
    """

    def __init__(self) -> None:
        self.recorders: list[Any] = []
        self.fetches = 0

    def compiled(self, step: Any) -> None:
        for recorder in list(self.recorders):
            recorder.on_compile(step)

    def loop(self, loop: Any, entering: bool) -> None:
        for recorder in list(self.recorders):
            recorder.on_loop(loop, entering)


observers = _Observers()
