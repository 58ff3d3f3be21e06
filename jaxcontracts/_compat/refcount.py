"""How many references an object has: a donated leaf someone else still holds.

A donating call deletes its donated buffers: any other reference to one of
those arrays (a sample kept in a list, a variable, a second container that
shares the leaf) is then a deleted array, and its data is lost. CPython's
``sys.getrefcount`` tells, before the call, whether a leaf has a reference
besides its state's container: a leaf held by one container, in a sequence
of the call's leaves, counts :data:`BASELINE` references when read through
``map(sys.getrefcount, leaves)`` (the container, the sequence, the
argument), and more when anything else holds it.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Sequence
from typing import Any

from .registry import capability, define

__all__ = ["BASELINE", "available", "count", "confirmed", "held_elsewhere", "kept_positions"]

#: References of a leaf held by one container, read through map() over a sequence.
BASELINE = 3
_count = sys.getrefcount
#: ``sys.getrefcount``, for the call path's inline ``max(map(count, leaves))``.
count = _count


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
    alone = max(map(_count, leaves))
    subset = (leaves[0],)  # a second sequence over the same leaves: one more
    nested = max(map(_count, subset))
    del subset
    kept = [holder["x"]]
    held = max(map(_count, leaves))
    del kept
    want = (BASELINE, BASELINE + 1, BASELINE + 1)
    if (alone, nested, held) != want:
        return f"sys.getrefcount counted {(alone, nested, held)}, not {want}"
    return None


def held_elsewhere(leaves: Sequence[Any], sequences: int = 1) -> bool:
    """Whether any of ``leaves`` (the call's donated leaves, each held by its
    state's container and by ``sequences`` sequences of leaves, this one
    included) has any other reference (one C loop)."""
    return max(map(_count, leaves), default=0) > BASELINE + sequences - 1


def kept_positions(leaves: Sequence[Any], sequences: int = 1) -> list[int]:
    """The positions in ``leaves`` of those held elsewhere (for the message)."""
    limit = BASELINE + sequences - 1
    return [i for i, n in enumerate(map(_count, leaves)) if n > limit]


def available() -> bool:
    """Whether the check can run here (the capability's probe passed)."""
    return capability("kept-references").available


def confirmed(leaves: Sequence[Any], positions: Sequence[int], sequences: int = 1) -> list[int]:
    """Those ``positions`` whose other references are not all held, directly
    or through a tuple, list or dict, by frames off the current stack: an
    exception's saved traceback (a notebook's ``sys.last_traceback``, a
    caught error kept in a variable) holds the frames that saw an array, and
    losing the array there loses nothing.

    Only called when :func:`held_elsewhere` found something (it scans the
    heap: milliseconds); a donated leaf is replaced by the call's output, so
    a stale traceback costs this once. Garbage is collected first: an
    unreachable cycle the collector has not reached yet (a caught error and
    its frames, an object that refers to itself) holds nothing anyone can
    read, and a reference it holds is no reason to refuse.
    """
    gc.collect()
    still = set(kept_positions(leaves, sequences))
    positions = [i for i in positions if i in still]
    on_stack: set[int] = set()
    stack: list[types.FrameType] = []
    frame: types.FrameType | None = sys._getframe(0)
    while frame is not None:
        on_stack.add(id(frame))
        stack.append(frame)
        frame = frame.f_back
    del frame
    kept = []
    for i in positions:
        x = leaves[i]
        # Besides the container and the sequences: this local and the argument.
        extra = _count(x) - (BASELINE - 2 + sequences) - 2
        referrers = gc.get_referrers(x)
        dead, r = 0, None
        for r in referrers:  # a loop, not a generator: a generator would be a referrer
            dead += _held_by_dead_frames(r, on_stack, {id(referrers)}, 4)
        for running in stack[2:]:  # the callers (a running frame's locals are invisible to gc)
            dead += _assert_temporaries(running, x)
        del referrers, r, x
        if extra > dead:
            kept.append(i)
    return kept


def _held_by_dead_frames(obj: Any, on_stack: set[int], ignore: set[int], depth: int) -> bool:
    """Whether ``obj`` is a frame off the stack, or held (through at most
    ``depth`` objects: containers, cells, a helper object a frame owned) only
    by such frames."""
    if isinstance(obj, types.FrameType):
        return id(obj) not in on_stack

    if depth == 0 or isinstance(obj, (types.ModuleType, type, types.FunctionType)):
        return False  # a module, a class or a function is alive for good
    referrers = gc.get_referrers(obj)
    inner = ignore | {id(referrers)}
    found = False
    for r in referrers:  # loops, not generators (see confirmed)
        if id(r) in ignore:
            continue
        if not _held_by_dead_frames(r, on_stack, inner, depth - 1):
            return False
        found = True
    return found



def _assert_temporaries(frame: types.FrameType, x: Any) -> int:
    """How many of a running frame's references to ``x`` are pytest's
    assertion temporaries (``@py_assert1``...): a rewritten ``assert`` keeps
    the values of its subexpressions for its failure message, not the test."""
    try:
        snapshot = frame.f_locals
    except Exception:  # noqa: BLE001 - a frame without readable locals
        return 0
    names = [k for k, v in list(snapshot.items()) if v is x]
    if sys.version_info < (3, 13) and type(snapshot) is dict and frame.f_code.co_flags & 0x0001:
        snapshot.clear()  # as _compat.frames.locals_of: leave nothing alive behind
    return sum(1 for k in names if isinstance(k, str) and k.startswith("@py_assert"))
