"""How many references an object has: a donated leaf someone else still holds.

A leaf held by one container, read through ``map(sys.getrefcount, leaves)``
over a sequence of the call's leaves, counts :data:`BASELINE` (the container,
the sequence, the argument), more when anything else holds it, whatever way
the call was made; the arguments themselves are never counted (``_step.kept``).
"""

from __future__ import annotations

import builtins
import gc
import inspect
import sys
from collections.abc import Callable, Sequence
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

__all__ = ["BASELINE", "available", "count", "kept_after_collecting", "last_error_holding"]

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
    return capability("kept-references").available


def kept_after_collecting(
    leaves: Sequence[Any], sequences: int, arguments: tuple[Any, ...]
) -> tuple[list[int], list[int]]:
    """(kept, unproven): the positions in ``leaves`` (a sequence held
    ``sequences`` times) of the leaves held elsewhere after a garbage
    collection, and of those held only by the interpreter's records of a call
    (:func:`_frame_records`: no reader proven, so as under ``jax.jit``).
    Called only after a count found something (a collection costs ms)."""
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
    shown = _display_records([leaves[i] for i in held])
    kept = [
        i for i in held
        if count(leaves[i]) - records.get(id(leaves[i]), 0) - inside.get(id(leaves[i]), 0)
        - shown.get(id(leaves[i]), 0) > limit
    ]
    return kept, [i for i in held if i not in kept]


def _tally(held: Sequence[Any]) -> tuple[dict[int, int], Callable[[Any], None]]:
    """A count per ``id`` in ``held``, and the function that adds to it the
    references among the values it is given."""
    ids = set(map(id, held))
    found: dict[int, int] = {}

    def add(values: Any) -> None:
        for v in values:
            if id(v) in ids:
                found[id(v)] = found.get(id(v), 0) + 1

    return found, add


def _display_records(held: list[Any]) -> dict[int, int]:
    """Per ``id`` in ``held``, the references of the interpreter's display
    history: the REPL's ``builtins._`` (``sys.displayhook``) and IPython's
    output cache (``Out[n]``, ``_n``, ``_``, ``__``, ``___``, in its
    namespaces and display hook, and the last cell's result). A value shown,
    not one the user kept: the step does what ``jax.jit`` does, and a later
    read of ``Out[n]`` names it."""
    found, add = _tally(held)
    history = ("_", "__", "___")
    add([vars(builtins).get("_")])
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    if shell is None:
        return found
    try:
        ns = shell.user_ns
        for names in (ns, shell.user_ns_hidden, vars(shell.displayhook)):
            add([v for k, v in list(names.items())
                 if k in history or (k[:1] == "_" and k[1:].isdigit())])
        out = ns.get("_oh")
        if isinstance(out, dict):
            add(list(out.values()))
        add([getattr(shell.last_execution_result, "result", None)])
    except Exception:  # noqa: BLE001 - another shell's shape: nothing discounted
        return found
    return found


def _stored_children(objects: list[Any]) -> dict[int, int]:
    """Per leaf ``id``, the second reference a custom pytree node among
    ``objects`` holds to it in a stored record of its children held by nothing
    else (``self._children = (w, b)``): the node's own structure, not a holder."""
    found: dict[int, int] = {}
    here = inspect.currentframe()  # holds `record` below: not a holder of the user's
    try:
        for node in objects:
            try:
                if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(node)):
                    continue
                children = jax.tree_util.tree_flatten(node, is_leaf=lambda x, n=node: x is not n)[0]
                attrs = object.__getattribute__(node, "__dict__")
            except Exception:  # noqa: BLE001
                # not a node whose children can be told: nothing discounted
                continue
            values = list(attrs.values())
            # (no comprehension over `record`: on 3.11 its cell would hold it)
            for record in values:
                if not _is_record(record, children) or _held_besides(
                    record, (node, attrs, values, here)
                ):
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
    return all(a is b for a, b in zip(record, children))


def _frame_records(held: list[Any], own: set[int]) -> dict[int, int]:
    """Per ``id`` in ``held``, the references that are the interpreter's records
    of a call, not a holder of the user's (no proof of a reader: the step
    does what ``jax.jit`` does, and a later read names it):

    * a returned call's frame that no traceback or thread's stack reaches
      (kept by a debugger, a profiler; the collector never reports a running
      frame's variables). The frames a traceback reaches hold (post-mortem
      reads them);
    * before 3.13, a dict only such frames and a debugger's
      ``curframe_locals`` (pdb's snapshot) hold;
    * before 3.13, a dict shaped like a running function's ``locals()``
      snapshot (its variables as keys, its parameters among them): it may hold
      a deleted ``x`` until the next read. ``own``: the call's containers.

    One heap scan for the holders, one more where a frame or dict is among them.
    """
    referrers = gc.get_referrers(*held)
    found, add = _tally(held)
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
        if shaped[k] or (
            id(holder) in records
            and sys.getrefcount(holder) == records[id(holder)] + 2 + _LOCAL
        ):
            add(holder.values())
        k += 1
    return found


def last_error_holding(objects: Sequence[Any]) -> BaseException | None:
    """The last unhandled error the REPL or IPython keeps (``sys.last_exc``)
    where a frame its traceback holds refers to one of ``objects`` (a
    notebook cell that failed inside JAX on a state's leaf), else None."""
    err = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(err, BaseException):
        return None
    ids = set(map(id, objects))
    tb = err.__traceback__
    while tb is not None:
        if any(id(x) in ids for x in gc.get_referents(tb.tb_frame)):
            return err
        tb = tb.tb_next
    return None


def _local_count() -> int:
    """``sys.getrefcount`` of an otherwise unheld local (2 through 3.13; 1 where
    the interpreter borrows the argument)."""
    d: dict[str, Any] = {}
    return sys.getrefcount(d)


_LOCAL = _local_count()


def _dict_records(returned: list[FrameType], debuggers: list[dict[str, Any]]) -> dict[int, int]:
    """Per dict ``id``, the references from ``returned`` frames (not their
    globals) and ``debuggers``' snapshots (a function: none of its locals outlive it)."""
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
    return (
        frozenset((*code.co_varnames, *code.co_cellvars, *code.co_freevars)),
        frozenset(code.co_varnames[:n]),
    )


def _shaped(d: dict[Any, Any], shapes: list[tuple[frozenset[str], frozenset[str]]]) -> bool:
    """Whether ``d``'s keys are one function's variables, its parameters among them."""
    keys = d.keys()
    return any(params <= keys <= variables for variables, params in shapes)


def _tracebacks_and_debuggers() -> tuple[set[int], list[Any]]:
    """One heap scan: the ids of the frames live tracebacks and thread stacks
    reach, and ``bdb`` debuggers' ``curframe_locals`` (no user property runs)."""
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
    while frame is not None and id(frame) not in into:
        into.add(id(frame))
        frame = frame.f_back


_NOT_NODES = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType)


def _held_besides(obj: Any, owners: tuple[Any, ...]) -> bool:
    """Whether anything but ``owners`` refers to ``obj`` (a variable, a list,
    another object: ``history.append(node._children)``)."""
    return any(all(r is not o for o in owners) for r in gc.get_referrers(obj))


def _walk(arguments: tuple[Any, ...], limit: int = 10_000) -> tuple[set[int], list[Any]]:
    """The ids of the containers the arguments are made of, and those with a ``__dict__``."""
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
