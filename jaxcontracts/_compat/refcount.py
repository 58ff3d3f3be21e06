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
from types import BuiltinFunctionType, FrameType, FunctionType, MethodType, ModuleType
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
    read); and those held only by dicts that may be a function's
    ``locals()`` snapshot (:func:`_snapshot_references`), which cannot be
    told for a holder without reading the interpreter's frames, so the step
    does what ``jax.jit`` does there. Every other reference counts, whoever
    holds it (a variable, a saved traceback, pytest's assertion
    temporaries). ``arguments``: the call's, whose own containers are never
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
    snapshots = _snapshot_references([leaves[i] for i in held], containers) if sys.version_info < (3, 13) else {}
    kept = [
        i for i in held
        if count(leaves[i]) - snapshots.get(id(leaves[i]), 0) - inside.get(id(leaves[i]), 0) > limit
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


def _snapshot_references(held: list[Any], own: set[int]) -> dict[int, int]:
    """Per ``id`` of the objects in ``held``, how many references to it come
    from dicts shaped like a locals() snapshot of a function running on this
    thread (Python 3.11/3.12); one scan of the heap for all of them.

    Before 3.13 a function frame keeps the dict ``locals()`` returned (and
    that a debugger's or tracer's ``f_locals`` read filled), and syncs it with
    the frame's variables only at the next such read: after ``x = s['x'];
    locals(); del x`` it still holds ``x``, though nothing can read it
    without the sync that drops it, and a debugger stopped once in the
    function holds it past the stop. Such a dict (its keys all variables of
    one running function, its parameters among them, as every snapshot has
    them; not one of the call's own containers) is not proof of a holder:
    ``hparams = locals()`` is one too, and its entry is then named at its
    later read instead of being refused here. A dict of the user's whose
    keys happen to be variable names (``best = {"x": s["x"]}`` in a
    function with a loop variable ``x``) lacks the function's parameters:
    it holds, and is refused."""
    shapes: list[tuple[frozenset[str], frozenset[str]]] = []  # (every variable, the parameters)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_flags & inspect.CO_OPTIMIZED:
            n = code.co_argcount + code.co_kwonlyargcount
            n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
            variables = frozenset((*code.co_varnames, *code.co_cellvars, *code.co_freevars))
            shapes.append((variables, frozenset(code.co_varnames[:n])))
        frame = frame.f_back
    del frame
    ids = set(map(id, held))
    found: dict[int, int] = {}
    for holder in gc.get_referrers(*held):
        if type(holder) is dict and id(holder) not in own and any(
            params <= holder.keys() <= variables for variables, params in shapes
        ):
            for v in holder.values():
                if id(v) in ids:
                    found[id(v)] = found.get(id(v), 0) + 1
    return found


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
