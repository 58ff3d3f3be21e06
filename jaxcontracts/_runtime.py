"""What hot steps and hot loops share at run time, below both of them.

The loop guard (``_guard``) sits above the call path, so a hot step never
imports it. Instead both meet here: the thread's active loop (an object with
a ``violation`` method, set by the guard), a counter that tells a step after
each call whether any loop is active anywhere, and the last call of each step
while loops are active, which names arrays in messages (``advance -> .t``) and
the step that consumed a donated one.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax

from ._errors import RecompileError

__all__ = [
    "CONSUMED_BY",
    "LoopHandle",
    "LoopStack",
    "clear_calls",
    "compiling",
    "call_hooks",
    "consumed_by",
    "recording_loop",
    "consumer_of",
    "find",
    "in_hot_loop",
    "last_output",
    "local",
    "last_calls",
    "PRODUCED_BY",
    "states_in",
    "call_record",
    "new_step",
    "forget_step",
    "HOOK_EVERY",
    "run_hook",
    "observers",
    "tracking",
]


class LoopHandle(Protocol):
    """What the call path needs of an active loop (``jc.HotLoop`` is one)."""

    checks_transfers: bool
    checks_compiles: bool
    on_violation: str  # "raise" or "record"

    def violation(
        self, kind: str, what: str, fix: str, error: type[Exception], frame: Any = None
    ) -> None: ...


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
# Per step (by id): (its short name, its record), for messages and the loop
# clock. The record is a one-slot list, made once per step by
# :func:`call_record`; after each call while any loop is active, the call path
# sets its slot to (the arguments (a tuple, or the one state), the output).
# One list store per call: a store into this dict costs more (measured).
last_calls: dict[int, tuple[str, list[Any]]] = {}


# No lock guards these records: forget_step runs from a weakref finalizer,
# that is at any allocation, on any thread, possibly inside call_record or
# clear_calls; each function is one atomic dict operation or works on a copy.


def call_record(step_id: int, name: str) -> list[Any]:
    """The step's record slot (made on first use, kept across call-path rebuilds)."""
    return last_calls.setdefault(step_id, (name, [None]))[1]


def new_step(step_id: int, name: str) -> None:
    """A hot step was made: its record starts empty (an entry left under a
    reused id, by a step whose finalizer missed this dict, is replaced)."""
    last_calls[step_id] = (name, [None])


def forget_step(step_id: int) -> None:
    """Drop a step's record and hook (the step is being freed; takes no lock)."""
    last_calls.pop(step_id, None)
    call_hooks.pop(step_id, None)


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


# Per step (by id), while timing loops run: puts the step's timing wrapper
# back; the call path runs it after every SAMPLE-th call (see _timing.timed).
call_hooks: dict[int, Callable[[], None]] = {}
HOOK_EVERY = 64  # calls between runs of a step's hook (_timing.SAMPLE)


def run_hook(step_id: int) -> None:
    """Run a step's hook, if a timing loop set one (every HOOK_EVERY-th call)."""
    hook = call_hooks.get(step_id)
    if hook is not None:
        hook()


def _calls() -> list[tuple[str, Any, Any]]:
    """(name, arguments, output) of each step's last call while loops were active."""
    return [(name, *rec[0]) for name, rec in list(last_calls.values()) if rec[0] is not None]


def last_output(step_id: int) -> Any:
    """The output of a step's last call while loops were active (None if unknown)."""
    entry = last_calls.get(step_id)
    call = None if entry is None else entry[1][0]
    return None if call is None else call[1]


def clear_calls() -> None:
    """Forget every step's last call (the last loop has exited)."""
    for _, rec in list(last_calls.values()):
        rec[0] = None


# Key in the ``__dict__`` of a state a hot step returned inside a loop: the
# step's name (one dict store per call, so that the ``s = step(s)`` path keeps
# no last-call record: holding the last arguments and output measurably slows
# a loop of small steps). Pickles and copies drop it (``__jaxcontracts`` prefix).
PRODUCED_BY = "__jaxcontracts_produced_by__"


def find(x: Any, frame: Any = None) -> tuple[str | None, str | None]:
    """(the step that consumed ``x``, ``step -> .path`` of a live output).

    Looks in the steps' last-call records, then, given the user's ``frame``,
    in the states its local variables hold (and in the tuples, lists and
    dicts among them): a state a step returned names that step, a state a
    step consumed names its consumer. Only called to word a message.
    """
    consumed, produced = None, None
    for name, args, out in _calls():
        for p, leaf in jax.tree_util.tree_leaves_with_path(out):
            if leaf is x:
                produced = f"{name} -> {jax.tree_util.keystr(p)}"
        for leaf in jax.tree_util.tree_leaves(args):
            if leaf is x and leaf.is_deleted():
                consumed = name
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


def states_in(frame: Any) -> list[Any]:
    """The objects with a ``__dict__`` that ``frame``'s locals hold, directly
    or in a tuple, list or dict among them (one level)."""
    found: list[Any] = []
    seen: set[int] = set()
    try:
        values = list(frame.f_locals.values())
    except Exception:  # noqa: BLE001 - a frame without readable locals
        return found
    for value in values:
        items = value.values() if type(value) is dict else value if type(value) in (tuple, list) else (value,)
        for v in itertools.islice(items, 1000):
            if isinstance(getattr(v, "__dict__", None), dict) and id(v) not in seen:
                seen.add(id(v))
                found.append(v)
    return found


# A jc.state passed to a hot step that donated its buffers changes class to a
# "consumed" subclass made once per (state class, step) (one __class__ store
# per call): its class names the step, so messages about the state (a field
# read, its repr, passing it again, jc.fetch) name the step outside loops too.
CONSUMED_BY = "__jc_consumed_by__"


def consumer_of(state: Any) -> str | None:
    """The hot step a state was last passed to with donation, if it was marked."""
    return getattr(type(state), CONSUMED_BY, None)


def consumed_by(x: Any, frame: Any = None) -> str | None:
    """The hot step that consumed ``x`` by donation, when it is known (see :func:`find`)."""
    return find(x, frame)[0] if isinstance(x, jax.Array) else None


@contextlib.contextmanager
def compiling(name: str) -> Iterator[None]:
    """Wrap a hot step's compile: a violation inside a loop (recorded once)."""
    __tracebackhide__ = True
    loop = local.loop
    if loop is None or not loop.checks_compiles or local.allow:
        yield
        return
    short = name.rsplit(".", 1)[-1]
    loop.violation(
        "compile",
        f"hot_step {short} would compile a new signature",
        f"compile it before the loop ({short}.compile(State.spec(...)) or one "
        "call), and keep every call's arguments on that signature.",
        RecompileError,
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
    """Every hot step alive, the ``jc.fetch`` count, and active recorders.

    A recorder has ``on_compile(step)`` and ``on_loop(loop, entering)``.
    """

    def __init__(self) -> None:
        self.steps: weakref.WeakSet[Any] = weakref.WeakSet()
        self.recorders: list[Any] = []
        self.fetches = 0

    def step_made(self, step: Any) -> None:
        self.steps.add(step)

    def compiled(self, step: Any) -> None:
        for recorder in list(self.recorders):
            recorder.on_compile(step)

    def loop(self, loop: Any, entering: bool) -> None:
        for recorder in list(self.recorders):
            recorder.on_loop(loop, entering)


observers = _Observers()
