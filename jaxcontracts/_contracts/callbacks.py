"""No host callbacks in a loop's compiled steps: ``jc.hot_loop(callbacks="disallow")``.

A compiled program that calls back into Python (``jax.debug.print``,
``jax.debug.callback``, ``jax.pure_callback``, ``io_callback``) makes a
device-to-host round trip at every call, which stalls an accelerator's
pipeline as a ``print`` in the loop does. Beyond the round trip, JAX keeps a
program with callback effects off its C++ fast path (each call takes Python
dispatch) and writes no persistent compilation-cache entry for it.

Allowed by default (a ``jax.debug.print`` while developing is what users
expect); listed in the step's report either way. With ``"disallow"``, a hot
step or plain ``jax.jit`` whose program has one is refused before its call
runs (at its compile inside the loop, or at its first call there when it was
compiled before), naming the step, the callback and the line that wrote it.
"""

from __future__ import annotations

from typing import Any

from .._compat.callbacks import CallbackSite, callback_sites
from .._errors import Contract, TransferError, declare
from .._runtime import local
from .._tracebacks import is_library
from .._userline import place

__all__ = ["CONTRACT"]


def _scan(name: str, closed: Any) -> tuple[CallbackSite, ...]:
    """The program's host callbacks, each at the user's line that wrote it."""
    return callback_sites(closed, lambda file, function: not is_library(file, True, function))


def _listed(sites: tuple[CallbackSite, ...]) -> str:
    shown = [f"{s.primitive} at {place(s.file, s.line)[0]}" if s.file else s.primitive for s in sites[:3]]
    return ", ".join(shown) + (f" (and {len(sites) - 3} more)" if len(sites) > 3 else "")


def _refuse(name: str, sites: tuple[CallbackSite, ...]) -> None:
    """Inside a ``callbacks="disallow"`` loop, before the call: the violation."""
    __tracebackhide__ = True
    loop = local.loop
    if loop is None or local.allow or loop.option("callbacks") != "disallow":
        return
    loop.violation(
        "callback",
        f"`{name}` calls back to the host at every call: {_listed(sites)}",
        "take the callback out of the step: return the value and read it with jc.fetch every "
        "N steps; or let this loop make it: jc.hot_loop(callbacks=\"allow\"). The call did not run.",
    )


def _fact(sites: tuple[CallbackSite, ...]) -> tuple[str, str] | None:
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
        scan=_scan,
        refuse=_refuse,
        fact=_fact,
    )
)
