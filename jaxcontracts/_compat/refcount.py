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

import dis
import gc
import operator
import sys
from collections.abc import Sequence
from typing import Any

from .registry import capability, define

__all__ = [
    "BASELINE",
    "argument_counts",
    "available",
    "count",
    "kept_after_collecting",
    "unpacks",
]

#: References of a leaf held by one container, read through map() over a sequence.
BASELINE = 3
#: ``sys.getrefcount``, for the call path's inline ``max(map(count, leaves))``.
count = sys.getrefcount


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


def kept_after_collecting(leaves: Sequence[Any], sequences: int = 1, stale: dict[int, int] | None = None) -> list[int]:
    """The positions in ``leaves`` (a sequence held ``sequences`` times, each
    leaf once by its container) of the leaves held elsewhere, counted after
    a garbage collection (an unreachable cycle holds nothing anyone can
    read). Every other reference counts, whoever holds it (a variable, a
    saved traceback, pytest's assertion temporaries): the check cannot
    prove losing the array there loses nothing. Called only when a count
    found something (a collection costs milliseconds). ``stale``: per
    ``id``, references known not to be holders (a locals snapshot no one
    reads unsynced: ``frames.locals_snapshot_mirrors``)."""
    gc.collect()
    limit, stale = BASELINE + sequences - 1, stale or {}
    return [i for i, n in enumerate(map(count, leaves)) if n - stale.get(id(leaves[i]), 0) > limit]


@define(
    "kept-arguments",
    "CPython's reference counts of a call's arguments at the call's outermost "
    "frame, and the calling instruction (CALL_FUNCTION_EX) of the caller's frame",
    "refusing, before dispatch, a donated argument that is one array (state=\"theta\") "
    "held by more than the name it is passed from (a list of samples, a second variable)",
)
def _probe_arguments() -> str | None:
    if not available() or not hasattr(sys, "_getframe"):
        return "sys.getrefcount or sys._getframe does not work as the check expects"
    _arguments[:] = [_measure_arguments()]
    if _arguments[0] is None:
        return "an argument held by one name counts otherwise from a function and from a module"
    return None


#: (without unpacking, with): per kind of argument (by position, by position
#: beside keywords, by keyword), the references of one held by one name.
Counts = tuple[tuple[int, int, int], tuple[int, int, int]]
_arguments: list[Counts | None] = [None]  # the probe's measure


def argument_counts() -> Counts | None:
    """The references ``_step.kept.argument_check`` counts for an argument held
    by one name (a variable, an attribute, a dict value), per kind of
    argument (by position, by position beside keywords, by keyword), for a
    plain call and for one that unpacks (``f(x, *rest)``: one fewer, the
    unpacked tuple being the call's own, as told by ``unpacks``). Measured
    once in that check's shape (a property call slot such as
    ``HotStep.__call__``, a closure taking ``*args, **kwargs``), from a
    function's frame and a module's, which must agree. None: not measurable
    here (the capability warns, and the check is not made)."""
    return _arguments[0] if capability("kept-arguments").available else None


_FORMS = (
    "probe(x)", "probe(x, y=None)", "probe(x=x)",  # a plain call
    "probe(*[x])", "probe(*[x], y=None)", "probe(**{'x': x})",  # one that unpacks
)  # fmt: skip


def _measure_arguments() -> Counts | None:
    seen: list[tuple[int, bool]] = []

    def check(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        n = count(args[0]) if args else count(kwargs["x"])
        seen.append((n, unpacks(2)))

    def entry(*args: Any, **kwargs: Any) -> None:
        return check(None, args, kwargs)

    probe = type("_Probe", (), {"__call__": property(operator.attrgetter("_call"))})()
    probe._call = entry  # type: ignore[attr-defined]
    source = "".join(form + "\n" for form in _FORMS)
    exec(compile(source, "<kept-arguments>", "exec"), {"probe": probe, "x": object()})  # noqa: S102
    module = list(seen)
    seen.clear()
    body = "".join("    " + form + "\n" for form in _FORMS)
    scope: dict[str, Any] = {}
    exec(compile("def calls(probe, x):\n" + body, "<kept-arguments>", "exec"), scope)  # noqa: S102
    scope["calls"](probe, object())
    if len(seen) != len(_FORMS) or seen != module or [u for _, u in seen] != [False] * 3 + [True] * 3:
        return None
    plain, unpacked = tuple(n for n, _ in seen[:3]), tuple(n for n, _ in seen[3:])
    if min(unpacked) < 2 or any(u > p for u, p in zip(unpacked, plain)):
        return None
    return plain, unpacked  # type: ignore[return-value]


_CALL_EX = dis.opmap["CALL_FUNCTION_EX"]


def unpacks(depth: int) -> bool:
    """Whether the frame ``depth`` levels above the caller of this function
    is inside a call that unpacks its arguments (``f(*args)``, ``f(x,
    *rest)``, ``f(**kw)``): its current instruction is ``CALL_FUNCTION_EX``
    (the ``kept-arguments`` capability's probe checks it on every form)."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:  # called from C with no Python frame above (a new thread's target):
        return True  # its arguments come in a tuple of the caller's own, as unpacked ones do
    return frame.f_code.co_code[frame.f_lasti] == _CALL_EX
