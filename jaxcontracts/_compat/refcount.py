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
from collections.abc import Sequence
from typing import Any

from .registry import capability, define

__all__ = ["BASELINE", "available", "count", "held_elsewhere", "kept_after_collecting", "kept_positions"]

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


def kept_positions(leaves: Sequence[Any], sequences: int = 1, stale: dict[int, int] | None = None) -> list[int]:
    """The positions in ``leaves`` of those held elsewhere (for the message).
    ``stale``: per ``id``, references that are known not to be holders (a
    locals snapshot nobody can read unsynced: ``frames.unobserved_locals_snapshot``)."""
    limit = BASELINE + sequences - 1
    if stale:
        return [i for i, n in enumerate(map(_count, leaves)) if n - stale.get(id(leaves[i]), 0) > limit]
    return [i for i, n in enumerate(map(_count, leaves)) if n > limit]


def available() -> bool:
    """Whether the check can run here (the capability's probe passed)."""
    return capability("kept-references").available


def kept_after_collecting(leaves: Sequence[Any], sequences: int = 1, stale: dict[int, int] | None = None) -> list[int]:
    """:func:`kept_positions` once garbage is collected: an unreachable cycle
    the collector has not reached yet holds nothing anyone can read, and
    collecting it makes the count exact. Every other reference counts,
    whoever holds it (a variable, a list, a saved exception's traceback,
    pytest's assertion temporaries): the check cannot prove that losing the
    array there loses nothing, so it refuses. Only called when
    :func:`held_elsewhere` found something (a collection costs milliseconds).
    ``stale``: as for :func:`kept_positions`."""
    gc.collect()
    return kept_positions(leaves, sequences, stale)
