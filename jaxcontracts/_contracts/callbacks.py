"""No host callbacks in a loop's compiled steps: ``jc.hot_loop(callbacks="disallow")``.

A compiled program that calls back into Python (``jax.debug.print``,
``jax.debug.callback``, ``jax.pure_callback``, ``io_callback``) makes a
device-to-host round trip at every call, which stalls an accelerator's
pipeline as a ``print`` in the loop does. Beyond the round trip, JAX keeps a
program with callback effects off its C++ fast path (each call takes Python
dispatch) and writes no persistent compilation-cache entry for it.

Allowed by default (a ``jax.debug.print`` while developing is what users
expect); listed in the step's report either way. With ``"disallow"``, a hot
step whose program has one is refused before its call runs (at its compile
inside the loop, or at its first call there when it was compiled before); a
plain ``jax.jit`` is, where the loop sees its call: a compile inside the
loop, or any call of a program with callback effects (``jax.debug.*``,
``io_callback``: JAX gives it no C++ fast path). A plain ``jax.jit`` with
only ``pure_callback``, compiled before the loop, takes JAX's C++ path there
and is not seen.

The declaration is light (no JAX at import): ``explain`` and the loop's
options read it before any hot step or loop exists; the hooks import what
they use when they run.
"""

from __future__ import annotations

from typing import Any

from .._errors import Contract, TransferError, declare

__all__ = ["CONTRACT"]


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


CONTRACT = declare(
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
