"""What hot steps and hot loops share at run time, below both: the thread's
active loop (set by ``_loop.guard``), which step returned an array in a loop,
and how a donated array is worded (its fixes: ``_contracts.donation``).
"""

from __future__ import annotations

import collections
import contextlib
import linecache
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any, Protocol

import jax
import numpy as np

from . import _steps
from ._compat import registry
from ._compat.frames import locals_of
from ._format import flatten_with_path
from ._hazards import is_deleted_array
from ._tracebacks import is_library

__all__ = [
    "LoopStack",
    "arrays_named",
    "compiling",
    "deleted_because",
    "donated",
    "held_outputs",
    "in_hot_loop",
    "library_code",
    "local",
    "observers",
    "produced_by",
    "recording_loop",
    "static_is_exact",
    "take_recompile",
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
    audit: bool  # jc.watch()'s own recording loop
    # told of each recorded read: how long it took, the array, the read's name
    read_timer: Callable[[float, Any, str], None] | None
    plain_signatures: dict[int, tuple[Any, list[Any]]]  # plain jax.jit signatures (_loop.plainjit)
    named_transfers: collections.Counter[str]  # host arguments named at their line (_loop.plainjit)

    def admit_compile(self, key: Any, what: str, frame: Any = None) -> bool:
        """Whether a compile is a warm-up compile the loop lets through (recorded)."""

    def seen_compile(self, key: Any) -> bool: ...

    def withdraw_compile(self, key: Any) -> None:
        """A compile let through that failed (its trace raised): not spent."""

    def compiles_admitted(self) -> bool:
        """Whether a first compile would be let through now: a trace running
        now may read concrete arrays."""

    def option(self, name: str) -> str: ...

    def violation(
        self, kind: str, what: str, fix: str, frame: Any = None, before_call: bool = False
    ) -> None:
        """Raise or record one violation (``before_call``: refused before a
        call, which does not run where it raises)."""


class LoopStack:
    """One thread's active loops, in entry order (an object, so a loop exited
    on another thread can update its own); ``loop``: the innermost checking one."""

    __slots__ = ("entries", "loop", "saved", "thread")

    def __init__(self) -> None:
        self.loop: LoopHandle | None = None
        self.entries: list[Any] = []
        self.saved: Any = None  # the guard's: what the thread had before its loops
        self.thread = threading.current_thread()


class _Local(threading.local):
    allow: int = 0  # > 0 inside an explicit transfer (jc.fetch) or a re-entry
    # a plain jax.jit's cache miss compiling now, with what changed:
    # (name, diff, fix) (_loop.plainjit)
    plain_recompile: tuple[str, list[str], str] | None = None

    def __init__(self) -> None:
        self.stack = LoopStack()

    @property
    def loop(self) -> LoopHandle | None:
        return self.stack.loop


local = _Local()


def take_recompile(name: str) -> tuple[list[str], str] | None:
    """The diff and fix of the plain jax.jit ``name`` whose cache miss is
    compiling now (set by ``_loop.plainjit``, read once by the compile listener)."""
    found = local.plain_recompile
    if found is None or found[0] != name:
        return None
    local.plain_recompile = None
    return found[1], found[2]


class _Tracking:
    count = 0  # active loops, any thread (hot steps read it after each call)


tracking = _Tracking()


def in_hot_loop() -> bool:
    loop = local.loop
    return loop is not None and loop.checks_transfers and not local.allow


def recording_loop() -> LoopHandle | None:
    """This thread's active loop if it records violations (and is not paused)."""
    loop = local.loop
    if loop is not None and loop.on_violation == "record" and not local.allow:
        return loop
    return None


def produced_by(x: Any) -> str | None:
    """``step -> .path`` where ``x`` is a leaf of a step's recorded loop output."""
    for name, out in _steps.last_outputs():
        for p, leaf in jax.tree_util.tree_leaves_with_path(out):
            if leaf is x:
                return f"{name} -> {jax.tree_util.keystr(p)}"
    return None


def donated(by: str | None, already: bool = False, brief: bool = False) -> str:
    """How every message says that an array was donated: to ``by`` where proven,
    else deleted, naming the live donating steps (``brief``: not why)."""
    was = "was already" if already else "was"
    if by:
        return f"{was} donated to {by}"
    return f"{was} deleted" + ("" if brief else f": {deleted_because()}")


def deleted_because() -> str:
    """Why an array whose consumer is not known was deleted."""
    steps = _steps.donating()
    if not steps:
        return "donated to a jax.jit with donate_argnums, or x.delete()"
    names = ", ".join(steps[:3]) + (", ..." if len(steps) > 3 else "")
    return (
        f"most likely donated to an earlier call (hot steps that donate: {names}; "
        "or a jax.jit with donate_argnums), or x.delete()"
    )


def static_is_exact(x: Any) -> bool:
    """Whether making the host value ``x`` a static argument gives the same
    results as passing it: not for a float, whose arithmetic XLA then folds
    in double precision (``2 * h ** 2``) where the traced value runs in
    float32, so the results differ in their last bits."""
    return not isinstance(x, (float, complex, np.inexact, np.ndarray))


def held_outputs(steps: Sequence[Any]) -> list[Any]:
    """The leaves of the recorded last outputs of ``steps``, for the loop clock
    (are they still being computed at exit?). Never reads device memory."""
    held: list[Any] = []
    for _, out in _steps.last_outputs(steps):
        held.extend(jax.tree_util.tree_leaves(out))
    return held


def arrays_named(
    frame: Any, lineno: int, only: Any = None, limit: int = 5
) -> list[tuple[str, Any]]:
    """(``name.path``, array) for the deleted arrays ``frame``'s code refers to
    (``only``: that one), the names on line ``lineno`` first, also inside a
    state (``state.params['w']``); inside the user's own method, the callers'
    name for ``only`` (``model.l1.kernel.value``). Reads no device memory."""
    found = _named_in(frame, lineno, only, limit)
    caller, searched = frame.f_back, 0
    while (
        only is not None
        and caller is not None
        and searched < _CALLERS
        and (not found or _by_self(found))
    ):
        if not is_library(caller.f_code.co_filename, True, caller.f_code.co_name):
            searched += 1
            outer = _named_in(caller, caller.f_lineno, only, limit)
            if outer and not (found and _by_self(outer)):
                found = outer
        caller = caller.f_back
    return found


_CALLERS = 8  # the user's frames searched outwards for a name of one array


def _by_self(found: list[tuple[str, Any]]) -> bool:
    return found[0][0].startswith(("self.", "self["))


def _named_in(frame: Any, lineno: int, only: Any, limit: int) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    code = frame.f_code
    scope = {**frame.f_globals, **locals_of(frame)}
    names = list(
        dict.fromkeys((*code.co_varnames, *code.co_freevars, *code.co_cellvars, *code.co_names))
    )
    line = linecache.getline(code.co_filename, lineno)
    names.sort(key=lambda n: re.search(rf"\b{re.escape(n)}\b", line) is None)  # the line's first
    for name in names[:200]:  # the names this code refers to
        for path, x in _arrays_in(scope.get(name)):
            if (x is only) if only is not None else is_deleted_array(x):
                found.append((f"{name}{path}", x))
                if len(found) == limit:
                    return found
    return found


_NOT_CONTAINERS = (  # a callable pytree (an equinox or NNX Module) is a container
    str,
    bytes,
    int,
    float,
    complex,
    type,
    ModuleType,
    FunctionType,
    BuiltinFunctionType,
    MethodType,
)


def _arrays_in(value: Any) -> list[tuple[str, Any]]:
    """(path, array) for an array, or the arrays of a container, bounded."""
    if isinstance(value, jax.Array):
        return [] if isinstance(value, jax.core.Tracer) else [("", value)]
    if value is None or isinstance(value, _NOT_CONTAINERS):
        return []
    try:
        leaves = flatten_with_path(value)[0]
    except Exception:  # noqa: BLE001 - not a pytree we can flatten: nothing to name
        return []
    return [
        (jax.tree_util.keystr(p), x)
        for p, x in leaves[:1000]
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
    ]


@contextlib.contextmanager
def library_code() -> Iterator[None]:
    """What the library runs for itself on the user's thread (a capability's
    probe): outside any loop's checks and JAX's transfer guards."""
    local.allow += 1
    try:
        with jax.transfer_guard("allow"):
            yield
    finally:
        local.allow -= 1


registry.probe_in(library_code)


@contextlib.contextmanager
def compiling(
    name: str, spec: str = "jc.spec_of(<its arguments>)", fn: Any = None, why: str = ""
) -> Iterator[None]:
    """Wrap a hot step's compile: a violation inside a loop (recorded once).

    ``spec``: the fix's ``.compile`` arguments; ``fn``: what a warm-up tells
    steps apart by (held weakly; names may repeat); ``why``: what is new.
    """
    __tracebackhide__ = True
    loop = local.loop
    if loop is None:  # a loop at checks level off: JAX's own guard, lifted for the compile
        with jax.transfer_guard("allow") if local.stack.entries else contextlib.nullcontext():
            yield
        return
    short = name.rsplit(".", 1)[-1]
    try:
        key: Any = ("hot_step", weakref.ref(fn) if fn is not None else name)
    except TypeError:  # not weakly referenceable: by name
        key = ("hot_step", name)
    admitted = loop.checks_compiles and not local.allow and loop.admit_compile(key, short)
    if loop.checks_compiles and not local.allow and not admitted:
        again = loop.seen_compile(key)
        loop.violation(
            "compile",
            f"hot_step {short} would compile a new signature"
            + (f" ({why})" if why else "")
            + (" (it compiled once already in this loop's warm-up)" if again else ""),
            f"compile it before the loop ({short}.compile({spec}) or one "
            'call), or let the loop\'s first pass compile it (jc.hot_loop(compiles="warmup")), '
            "and keep every call's arguments on that signature; where a new "
            "signature is expected (a reallocated buffer), compile it where it appears: "
            f"{short}.compile(<the new arguments>) inside "
            'with jc.hot_loop(compiles="allow"), in the branch that makes them.',
        )
    # A permitted compile is not reported again phase by phase, and what its
    # trace runs eagerly (jax.ensure_compile_time_eval) is part of it.
    local.allow += 1
    try:
        with jax.transfer_guard("allow"):
            yield
    except BaseException:
        if admitted:  # a trace that failed compiled nothing: the warm-up's compile is not spent
            loop.withdraw_compile(key)
        raise
    finally:
        local.allow -= 1


class _Observers:
    """What contract snapshots (``_testing.recorder``) are told: the ``jc.fetch``
    count and the active recorders (``on_compile(step)``, ``on_loop(loop,
    entering)``). One attribute read when nobody records; none on a call path.
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
