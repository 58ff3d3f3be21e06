"""Every contract, declared in a module of its own (``_errors.declare``).

Hot steps and loops apply the hooks through :func:`scan` and :func:`refuse`;
a new contract: ARCHITECTURE.md ("Adding a contract").
"""

from __future__ import annotations

import weakref
from typing import Any

from .._errors import CONTRACTS, hooked
from .._steps import prune_dead

# the declaration order is the order of jc info, explain and a loop report's rows
from . import definition, transfers, compiles, donation, callbacks  # isort: skip

__all__ = [
    "callbacks", "compiles", "definition", "donation", "refuse", "scan", "transfers", "wanted"
]

# id(closed jaxpr) -> (a weak reference to it, what each contract found): a
# plain jax.jit with effects takes JAX's Python path at every call (no C++
# fast-path entry), so its cache-miss observer sees the same jaxpr each call
_scanned: dict[int, tuple[Any, dict[str, tuple[Any, ...]]]] = {}
_prune_at = [64]  # its size at which the dead entries go (_steps.prune_dead)


def wanted(loop: Any) -> bool:
    """Whether ``loop`` needs plain jax.jit programs scanned (a contract it switches on)."""
    return any(c.wanted is not None and c.wanted(loop) for c in hooked("scan"))


def scan(name: str, closed: Any) -> dict[str, tuple[Any, ...]]:
    """What each contract with a ``scan`` hook finds in a compiled program
    (``closed``: its closed jaxpr), by contract key; contracts that find
    nothing are left out (a capability's probe it asks for first traces as
    library code: ``_runtime.library_code``)."""
    key = id(closed)
    hit = _scanned.get(key)
    if hit is not None and hit[0]() is closed:
        return hit[1]
    found = {
        c.key: got for c in hooked("scan") if (got := c.scan(name, closed))  # type: ignore[misc]
    }
    try:
        _scanned[key] = (weakref.ref(closed), found)
    except TypeError:  # not weakly referable: not kept
        return found
    _prune_at[0] = prune_dead(_scanned, _prune_at[0])
    return found


def refuse(loop: Any, name: str, found: dict[str, tuple[Any, ...]]) -> None:
    """Before a call, inside ``loop`` (this thread's active loop, not paused),
    of a program in which contracts found something: each such contract's
    ``refuse`` hook (where ``loop`` disallows it, the violation)."""
    __tracebackhide__ = True
    for key, got in found.items():
        hook = CONTRACTS[key].refuse
        if hook is not None:
            hook(loop, name, got)
