"""No host callbacks in a loop's compiled steps: ``jc.hot_loop(callbacks="disallow")``.

A program that calls back into Python makes a device-to-host round trip at
every call; JAX also keeps one with callback effects off its C++ fast path
and out of its persistent compilation cache. A plain ``jax.jit`` is seen
where the loop sees its call: a compile inside the loop, or any call of a
program with callback effects; one with only ``pure_callback``, compiled
before the loop, takes JAX's C++ path there and is not seen.

No JAX at import (``explain`` and the loop's options read the declaration):
the hooks import what they use when they run.
"""

from __future__ import annotations

from typing import Any

from .._errors import Contract, TransferError, declare

__all__: list[str] = []


def _wanted(loop: Any) -> bool:
    """Whether a loop needs a plain jax.jit's program scanned: it refuses callbacks."""
    return loop.option("callbacks") == "disallow"


def _scan(name: str, closed: Any) -> tuple[Any, ...]:
    """The program's host callbacks, each at the user's line that wrote it."""
    from .._compat.callbacks import callback_sites
    from .._tracebacks import is_library

    return callback_sites(closed, lambda file, function: not is_library(file, True, function))


def _listed(sites: tuple[Any, ...]) -> str:
    from .._format import fmt_listed
    from .._userline import place

    return fmt_listed(
        [f"{s.primitive} at {place(s.file, s.line)[0]}" if s.file else s.primitive for s in sites]
    )


def _refuse(loop: Any, name: str, sites: tuple[Any, ...]) -> None:
    """Inside a ``callbacks="disallow"`` loop, before the call: the violation."""
    __tracebackhide__ = True
    if not _wanted(loop):
        return
    loop.violation(
        "callback",
        f"`{name}` calls back to the host at every call: {_listed(sites)}",
        "take the callback out of the step: return the value and read it with jc.fetch every "
        "N steps; or let this loop make it: jc.hot_loop(callbacks=\"allow\").",
        before_call=True,
    )


def _fact(sites: tuple[Any, ...]) -> tuple[str, str] | None:
    if not sites:
        return None
    return (
        "host callbacks",
        f"{_listed(sites)}: a device-to-host round trip at each call (refused in "
        "jc.hot_loop(callbacks=\"disallow\"))",
    )


declare(
    Contract(
        "no-host-callback",
        "no host callbacks in compiled steps",
        TransferError,
        violations=(("callback", "a host callback inside jc.hot_loop"),),
        option="callbacks",
        choices=("allow", "disallow"),
        wanted=_wanted,
        scan=_scan,
        refuse=_refuse,
        fact=_fact,
    )
)
