"""Which of two live arrays was made first: ``jax.live_arrays()`` lists them
newest first (undocumented). The audit tells by it an eager result made
before the last jitted call (read one step late) from one made after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .registry import capability, define, missing

__all__ = ["made_before"]


@define(
    "live-array-order",
    "the order of jax.live_arrays() (jaxlib lists a client's arrays newest first; undocumented)",
    "that a device-to-host read of an eager result made before the last jitted call (read one step "
    "late) is no host_sync in the audit",
)
def _probe() -> str | None:
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    if not callable(started):
        return "jax._src.xla_bridge.backends_are_initialized is gone"
    # (a probe never starts a backend: before one runs, the order is checked at the first use)
    return _order_broken() if started() else None


#: Whether the order was checked on live arrays (the probe, or the first use), and held.
_held: list[bool | None] = [None]


def _order_broken() -> str | None:
    older = jax.device_put(np.zeros((), np.float32))
    newer = jax.device_put(np.ones((), np.float32))
    _held[0] = _scan([older, newer], [newer]) == {id(older)}
    return None if _held[0] else "jax.live_arrays() no longer lists the newest array first"


def made_before(xs: Sequence[Any], ys: Sequence[Any]) -> set[int]:
    """The ids of the arrays among ``xs`` made before every array of ``ys``
    (alive, on the default backend; an order unknown is not before). One scan
    of every live array."""
    if not capability("live-array-order").available:
        return set()
    if _held[0] is None:  # probed before any backend ran: checked now, once
        why = _order_broken()
        if why is not None:
            missing("live-array-order", why)
    return _scan(xs, ys) if _held[0] else set()


def _scan(xs: Sequence[Any], ys: Sequence[Any]) -> set[int]:
    want, mark = {id(x) for x in xs}, {id(y) for y in ys}
    first, found = -1, {}  # type: tuple[int, dict[int, int]]
    for k, a in enumerate(jax.live_arrays()):
        i = id(a)
        if first < 0 and i in mark:
            first = k
        if i in want:
            found[i] = k
    return set() if first < 0 else {i for i, k in found.items() if k > first}
