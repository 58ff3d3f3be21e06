"""The one registry of live hot steps (held weakly, no finalizer), and the
:class:`LiveStep` protocol, all that other modules read of one.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._records import StepDescription, StepStats

__all__ = [
    "HOOK_EVERY",
    "LiveStep",
    "checks_changed",
    "clear_last_outputs",
    "JitDonation",
    "consumed_by",
    "donating",
    "jit_donation",
    "keep",
    "prune_dead",
    "last_outputs",
    "live",
    "register",
    "timing_on",
]

#: Past a step's first calls inside loops, one call in this many is timed
#: (``_report.timing.SAMPLE``).
HOOK_EVERY = 64

#: One slot, true while any timing loop is active (any thread): the checked
#: closures read the clock around a call only then (``_report.timing``).
timing_on: list[bool] = [False]


class LiveStep(Protocol):
    """What the registry and its readers need of a hot step (``jc.HotStep``)."""

    @property
    def name(self) -> str: ...  # module.qualname

    @property
    def short_name(self) -> str: ...  # the step's own name (``advance``), as messages write it

    @property
    def donates(self) -> bool: ...  # whether one of its compiled signatures donates

    stats: StepStats
    #: Cumulative host time of the timed calls inside loops: [seconds, calls,
    #: first-phase seconds, first-phase calls] (see ``_report.timing.timed``).
    timing_counters: list[float]
    #: One slot: whether the step's next call inside a loop is timed (set by
    #: ``_report.timing``).
    timing_due: list[bool]
    #: One slot: the output of the last call made while any loop was active.
    #: No argument is ever recorded: a consumed state goes when the caller
    #: rebinds it, as in a plain ``s = f(s)`` loop.
    last_output: list[Any]
    #: One slot: ``(arrays, pick)``, the donated arrays of its last call at
    #: checks ``full``, all consumed (they hold no device memory), and the
    #: picker of one leaf per argument among them; or None.
    last_consumed: list[Any]

    def checks_changed(self, level: str) -> None: ...  # build the call path for ``level``

    def describe(self) -> StepDescription: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()


def register(step: LiveStep) -> None:
    _live.add(step)


def live() -> list[LiveStep]:
    """Every live step (a copy: safe to iterate)."""
    return list(_live)


def donating() -> list[str]:
    """The short names of the live steps that have run a donating signature (sorted)."""
    return sorted({step.short_name for step in live() if step.stats.calls and step.donates})


def checks_changed(level: str) -> None:
    for step in live():
        step.checks_changed(level)


def last_outputs(steps: Iterable[LiveStep] | None = None) -> Iterator[tuple[str, Any]]:
    """``(short name, output)`` of each step's last call inside a loop."""
    for step in live() if steps is None else steps:
        out = step.last_output[0]
        if out is not None:
            yield step.short_name, out


def clear_last_outputs(steps: Iterable[LiveStep] | None = None) -> None:
    for step in live() if steps is None else steps:
        step.last_output[0] = None


# -- which step consumed a deleted array -----------------------------------
# Consumed arrays still held elsewhere at a step's next call, and a plain
# ``jax.jit``'s donations, kept by weak reference so a later read names it.


@dataclasses.dataclass(frozen=True)
class JitDonation:
    """A donated parameter of a plain ``jax.jit`` function, as a consumer;
    ``instead``: undonated parameters whose buffers the outputs could take
    (the donation likely drifted when a parameter was inserted)."""

    function: str  # its short name
    param: str
    jit_line: str  # file:line of the jax.jit that set the donation ("" where unknown)
    argnums: tuple[int, ...]  # the positions of ``instead`` among the parameters
    instead: tuple[str, ...]

    def __str__(self) -> str:
        return self.function


_held: dict[int, tuple[weakref.ref[Any], str | JitDonation]] = {}
_prune_at = [64]


def keep(arrays: Iterable[Any], step: str | JitDonation, held_only: bool = False) -> None:
    """Remember that ``step`` (a hot step's short name, or a plain ``jax.jit``'s
    donated parameter) consumed ``arrays``, for as long as each lives
    (``held_only``: those that something besides ``arrays`` holds)."""
    for x in arrays:
        if held_only and sys.getrefcount(x) <= 3:  # `arrays`, `x`, the count's argument
            continue
        try:
            _held[id(x)] = (weakref.ref(x), step)
        except TypeError:  # not weakly referenceable: not remembered
            continue
    _prune_at[0] = prune_dead(_held, _prune_at[0])


def prune_dead(table: dict[Any, tuple[Any, ...]], limit: int, floor: int = 64) -> int:
    """Once ``table`` grew past ``limit``, drop its entries whose weak reference
    is dead; returns the next limit. Never a callback at the object's death:
    library code would run wherever the last reference goes (a Ctrl-C there
    is lost)."""
    if len(table) <= limit:
        return limit
    for key in [key for key, entry in table.items() if entry[0]() is None]:
        del table[key]
    return max(floor, 2 * len(table))


def consumed_by(x: Any) -> str | None:
    """The short name of the step whose call consumed ``x`` (recorded at checks ``full``)."""
    entry = _entry(x)
    if entry is not None:
        return str(entry)
    for step in live():
        record = step.last_consumed[0]
        if record is not None and any(y is x for y in record[0]):
            return step.short_name
    return None


def jit_donation(x: Any) -> JitDonation | None:
    entry = _entry(x)
    return entry if isinstance(entry, JitDonation) else None


def _entry(x: Any) -> str | JitDonation | None:
    """What :func:`keep` recorded of ``x`` (not of another array since at its id)."""
    entry = _held.get(id(x))
    return entry[1] if entry is not None and entry[0]() is x else None
