"""How many references an object has: a donated leaf someone else still holds.

A donating call deletes its donated buffers: any other reference to one of
those arrays (a sample kept in a list, a variable, a second container that
shares the leaf) is then a deleted array, and its data is lost. CPython's
``sys.getrefcount`` tells, before the call, whether a leaf has a reference
besides its state's container: a leaf held by one container, in a sequence
of the call's leaves, counts :data:`BASELINE` references when read through
``map(sys.getrefcount, leaves)`` (the container, the sequence, the
argument), and more when anything else holds it. That count does not depend
on how the call was made (``map``, ``functools.reduce``, a debugger), which
is why only leaves and containers inside a state are counted, never the
arguments themselves.
"""

from __future__ import annotations

import gc
import inspect
import sys
from collections.abc import Sequence
from types import (
    BuiltinFunctionType,
    FrameType,
    FunctionType,
    MethodType,
    ModuleType,
    TracebackType,
)
from typing import Any

import jax

from .registry import capability, define

__all__ = ["BASELINE", "available", "count", "kept_after_collecting"]

#: References of a leaf held by one container, read through map() over a sequence.
BASELINE = 3
#: ``sys.getrefcount``, for the call path's inline ``max(map(count, leaves))``.
count = sys.getrefcount

_SNAPSHOT_SCAN = 32  # kept leaves looked for in locals() snapshots, at most


@define(
    "kept-references",
    "CPython's sys.getrefcount: the references a leaf has besides its state",
    "refusing, before dispatch, a donated leaf still referenced outside its state "
    "(a kept sample, a variable) instead of letting the donation delete it",
)
def _probe() -> str | None:
    if not hasattr(sys, "getrefcount"):
        return "sys.getrefcount is missing (not CPython)"
    holder = {"x": object()}
    leaves = list(holder.values())
    alone = max(map(count, leaves))
    subset = (leaves[0],)  # a second sequence over the same leaves: one more
    nested = max(map(count, subset))
    del subset
    kept = [holder["x"]]
    held = max(map(count, leaves))
    del kept
    want = (BASELINE, BASELINE + 1, BASELINE + 1)
    if (alone, nested, held) != want:
        return f"sys.getrefcount counted {(alone, nested, held)}, not {want}"
    return None


def available() -> bool:
    """Whether the check can run here (the capability's probe passed)."""
    return capability("kept-references").available


def kept_after_collecting(
    leaves: Sequence[Any], sequences: int, arguments: tuple[Any, ...]
) -> tuple[list[int], list[int]]:
    """The positions in ``leaves`` (a sequence held ``sequences`` times, each
    leaf once by its container) of the leaves held elsewhere, counted after
    a garbage collection (an unreachable cycle holds nothing anyone can
    read); and those held only by the interpreter's records of a call (a
    returned call's frame that no traceback holds, a ``locals()`` snapshot:
    :func:`_frame_records`), which prove no reader, so the step does what
    ``jax.jit`` does there. Every other reference counts, whoever holds it
    (a variable, a saved traceback, pytest's assertion temporaries).
    ``arguments``: the call's, whose own containers are never
    taken for a snapshot. Called only when a count found something (a
    collection costs milliseconds)."""
    gc.collect()
    limit = BASELINE + sequences - 1
    held = [i for i, n in enumerate(map(count, leaves)) if n > limit]
    # (past a few dozen held leaves something else holds them, and each scan
    # below costs the heap times their number)
    if not held or len(held) > _SNAPSHOT_SCAN:
        return held, []
    containers, objects = _walk(arguments)
    inside = _stored_children(objects)
    del objects  # (it holds the leaves: counted below)
    records = _frame_records([leaves[i] for i in held], containers)
    kept = [
        i for i in held
        if count(leaves[i]) - records.get(id(leaves[i]), 0) - inside.get(id(leaves[i]), 0) > limit
    ]
    return kept, [i for i in held if i not in kept]


def _stored_children(objects: list[Any]) -> dict[int, int]:
    """Per ``id`` of a leaf, the references a custom pytree node among the
    arguments' ``objects`` (:func:`_walk`) holds to it twice: as an attribute and in a stored record of
    its children, the tuple its ``tree_flatten`` returns (``self.w = w;
    self._children = (w, b)``), held by nothing else. That record is the
    node's own structure, not a holder: the step does what ``jax.jit`` does
    there. A record the user keeps too (``history.append(node._children)``),
    and any other container inside the state (a list of samples in a static
    field, a user's object) is a holder like any other."""
    found: dict[int, int] = {}
    here = inspect.currentframe()  # holds `record` below: not a holder of the user's
    try:
        for node in objects:
            try:
                if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(node)):
                    continue
                children = jax.tree_util.tree_flatten(node, is_leaf=lambda x, n=node: x is not n)[0]
                attrs = object.__getattribute__(node, "__dict__")
            except Exception:  # noqa: BLE001 - not a node whose children can be told: nothing discounted
                continue
            values = list(attrs.values())
            for record in values:  # (no comprehension over `record`: on 3.11 its cell would hold it)
                if not _is_record(record, children) or _held_besides(record, (node, attrs, values, here)):
                    continue
                direct = set(map(id, values))
                for child in record:
                    if child is not record and id(child) in direct:
                        found[id(child)] = found.get(id(child), 0) + 1
                break
    finally:
        del here  # (a frame that holds itself outlives its call, and what its locals hold)
    return found


def _is_record(record: Any, children: list[Any]) -> bool:
    """Whether ``record`` is a tuple or list of exactly ``children``."""
    if not isinstance(record, (tuple, list)) or len(record) != len(children):
        return False
    for a, b in zip(record, children):
        if a is not b:
            return False
    return True


def _frame_records(held: list[Any], own: set[int]) -> dict[int, int]:
    """Per ``id`` of the objects in ``held``, how many references to it are
    the interpreter's records of a call rather than a holder of the user's.
    Such a reference is not proof that anything will read the array: the
    step does what ``jax.jit`` does, and a later read names it. Three kinds:

    * The frame of a call that has returned, kept by something that no
      traceback reaches (a debugger stopped once in a helper keeps it as its
      current frame; a profiler, or ``inspect.currentframe()`` stored away):
      it holds the variables the call ended with, readable only through the
      frame. A running frame holds its variables where the collector does
      not look, a suspended generator's are held by the generator, and every
      thread's stack is left out anyway (``sys._current_frames``). The frames
      a traceback reaches (its own, and the callers above them, through
      ``f_back``) hold: a caught exception the user kept, a logging record, a
      notebook's last error, which post-mortem debugging reads.
    * Before 3.13, a dict that only such frames and a debugger's
      ``curframe_locals`` (pdb's ``locals()`` snapshot of the frame it last
      stopped in, which it replaces at its next stop) hold, counted: the
      snapshot of a returned call, or a dict only its variables hold.
    * Before 3.13, a dict shaped like the ``locals()`` snapshot of a running
      function of this thread (its keys all variables of that function, its
      parameters among them). A frame keeps the dict ``locals()`` returned
      (and that a debugger's or tracer's ``f_locals`` read filled), and syncs
      it with the frame's variables only at the next such read: after ``x =
      s['x']; locals(); del x`` it still holds ``x``, though nothing can read
      it without the sync that drops it. ``hparams = locals()`` is one too,
      and its entry is then named at its later read. A dict of the user's
      whose keys happen to be variable names (``best = {"x": s["x"]}`` in a
      function with a loop variable ``x``) lacks the function's parameters:
      it holds, and is refused. ``own``: the call's own containers, never
      taken for a snapshot.

    One scan of the heap for the holders of all of them, and one more where a
    frame or a dict is among them (the tracebacks and debuggers alive).
    """
    referrers = gc.get_referrers(*held)
    ids = set(map(id, held))
    found: dict[int, int] = {}

    def add(values: Any) -> None:
        for v in values:
            if id(v) in ids:
                found[id(v)] = found.get(id(v), 0) + 1

    snapshots = sys.version_info < (3, 13)
    frames = [r for r in referrers if type(r) is FrameType]
    dicts = [r for r in referrers if snapshots and type(r) is dict and id(r) not in own]
    if not frames and not dicts:
        return found
    shapes = []
    here: FrameType | None = sys._getframe(1)
    while dicts and here is not None:
        if here.f_code.co_flags & inspect.CO_OPTIMIZED:
            shapes.append(_variables(here.f_code))
        here = here.f_back
    shaped = [_shaped(d, shapes) for d in dicts]
    if not frames and all(shaped):  # (a tracer filled the snapshots: no scan of the heap)
        for holder in dicts:  # (a plain loop: a comprehension's cell would hold each)
            add(holder.values())
        return found
    reached, debuggers = _tracebacks_and_debuggers()
    returned = [f for f in frames if id(f) not in reached]
    del frames
    for frame in returned:
        add(gc.get_referents(frame))  # one entry per reference: a variable, a value on its stack
    records = _dict_records(returned, debuggers) if dicts else {}
    del returned, debuggers
    k = 0
    for holder in dicts:  # (no enumerate: its cached pair would hold the dict too)
        # besides the records: `referrers` and `dicts`, and `holder` as a local is counted
        if shaped[k] or (id(holder) in records and sys.getrefcount(holder) == records[id(holder)] + 2 + _LOCAL):
            add(holder.values())
        k += 1
    return found


def _local_count() -> int:
    """What ``sys.getrefcount`` counts for a local variable that nothing else
    holds (2 through 3.13: the variable and the argument; an interpreter
    that borrows the argument counts 1)."""
    d: dict[str, Any] = {}
    return sys.getrefcount(d)


_LOCAL = _local_count()


def _dict_records(returned: list[FrameType], debuggers: list[dict[str, Any]]) -> dict[int, int]:
    """Per ``id`` of a dict, the references to it from ``returned`` frames
    (their variables, their ``locals()`` snapshot; not their globals) and
    from ``debuggers``' snapshots. (A function of its own: none of its
    variables outlives it to hold a dict the caller counts.)"""
    records: dict[int, int] = {}
    for frame in returned:
        for r in gc.get_referents(frame):
            if type(r) is dict and r is not frame.f_globals and r is not frame.f_builtins:
                records[id(r)] = records.get(id(r), 0) + 1
    for snapshot in debuggers:
        records[id(snapshot)] = records.get(id(snapshot), 0) + 1
    return records


def _variables(code: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(every variable, the parameters) of a function's code."""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return frozenset((*code.co_varnames, *code.co_cellvars, *code.co_freevars)), frozenset(code.co_varnames[:n])


def _shaped(d: dict[Any, Any], shapes: list[tuple[frozenset[str], frozenset[str]]]) -> bool:
    """Whether ``d``'s keys are variables of one of ``shapes``' functions, its parameters among them."""
    keys = d.keys()
    return any(params <= keys <= variables for variables, params in shapes)


def _tracebacks_and_debuggers() -> tuple[set[int], list[Any]]:
    """One scan of the heap: the ids of the frames that the tracebacks alive
    reach and those on every thread's stack (neither is a returned call's
    record), and the ``locals()`` snapshots debuggers built on ``bdb`` keep
    (pdb's ``curframe_locals``; an instance's own ``__dict__`` is read, no
    property of the user's runs)."""
    reached: set[int] = set()
    for top in sys._current_frames().values():
        _add_chain(top, reached)
    # (this thread's top frame is this call's own: a variable of ours holding it
    # would keep it, and the callers' variables it reaches, past the return)
    del top
    bdb = sys.modules.get("bdb")
    debugger = bdb.Bdb if bdb is not None else None
    snapshots = []
    for obj in gc.get_objects():
        t = type(obj)
        if t is TracebackType:  # (each of a chain's entries is in the heap's list too)
            _add_chain(obj.tb_frame, reached)
        elif debugger is not None and issubclass(t, debugger):
            try:
                snapshot = object.__getattribute__(obj, "__dict__").get("curframe_locals")
            except (AttributeError, TypeError):
                continue
            if type(snapshot) is dict:
                snapshots.append(snapshot)
    del obj  # (the last object of the heap's list: perhaps a frame of ours, as above)
    return reached, snapshots


def _add_chain(frame: FrameType | None, into: set[int]) -> None:
    """Adds the ids of ``frame`` and its callers (``f_back``)."""
    while frame is not None and id(frame) not in into:
        into.add(id(frame))
        frame = frame.f_back


_NOT_NODES = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType)


def _held_besides(obj: Any, owners: tuple[Any, ...]) -> bool:
    """Whether anything but ``owners`` refers to ``obj`` (a variable, a list,
    another object: ``history.append(node._children)``)."""
    return any(all(r is not o for o in owners) for r in gc.get_referrers(obj))


def _walk(arguments: tuple[Any, ...], limit: int = 10_000) -> tuple[set[int], list[Any]]:
    """The ids of the Python containers the call's arguments are made of (dicts,
    lists, tuples, and objects' own ``__dict__``), to at most ``limit``; and
    the objects among them that have a ``__dict__``."""
    seen: set[int] = set()
    objects: list[Any] = []
    stack: list[Any] = [arguments]
    while stack and len(seen) < limit:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if type(node) is dict:
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif not isinstance(node, _NOT_NODES):
            try:
                own = object.__getattribute__(node, "__dict__")
            except (AttributeError, TypeError):
                continue
            if type(own) is dict:
                objects.append(node)
                stack.append(own)
    return seen, objects
