"""Timing the waits for the device: ``block_until_ready``, both spellings.

While a timing loop is active, the method of the concrete array class and the
module function ``jax.block_until_ready`` (which waits on several arrays
without calling the method) report how long each call blocked. Replacing the
module attribute misses a name imported before the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from .registry import capability, define

__all__ = ["ArrayImpl", "install", "uninstall", "wait_untimed", "wrap_function", "wrap_method"]

try:  # the concrete array class (a C++ type with Python methods; .arrays re-exports it)
    from jax._src.array import ArrayImpl
except ImportError:  # pragma: no cover - future jax
    ArrayImpl = None  # type: ignore[assignment,misc]

_saved: dict[str, Any] = {}
_inside = threading.local()  # inside the module function: the method does not count


@define(
    "block-timing",
    "replacing jax._src.array.ArrayImpl.block_until_ready and jax.block_until_ready",
    "nothing is checked; a loop's timing does not count time blocked in "
    "block_until_ready (jc.fetch is still counted)",
)
def _probe_blocking() -> str | None:
    if ArrayImpl is None or "block_until_ready" not in ArrayImpl.__dict__:
        return "jax._src.array.ArrayImpl.block_until_ready is gone"
    original = ArrayImpl.__dict__["block_until_ready"]
    try:
        ArrayImpl.block_until_ready = original  # settable from Python?
    except TypeError as e:
        return f"its attributes are read-only ({e})"
    return None


def install(report: Callable[[str, float, Any], None]) -> None:
    """Replace both with wrappers calling ``report(where, seconds, value)``."""
    if _saved or not capability("block-timing").available:
        return
    base = [ArrayImpl.__dict__["block_until_ready"]]  # the method beneath (wrap_method)
    function = [jax.block_until_ready]  # the function beneath (wrap_function)
    perf = time.perf_counter

    def block_until_ready_method(self: Any) -> Any:
        if getattr(_inside, "depth", 0):  # called by the module function: counted there
            return base[0](self)
        t0 = perf()
        try:
            return base[0](self)
        finally:
            report("block_until_ready", perf() - t0, self)

    def block_until_ready(x: Any) -> Any:
        t0 = perf()
        depth = getattr(_inside, "depth", 0)
        _inside.depth = depth + 1  # the function may call the method: count once
        try:
            return function[0](x)
        finally:
            _inside.depth = depth
            if not depth:
                report("block_until_ready", perf() - t0, x)

    block_until_ready.__doc__ = function[0].__doc__
    block_until_ready.__wrapped__ = function[0]  # type: ignore[attr-defined]
    _saved.update(base=base, function=function)
    ArrayImpl.block_until_ready = block_until_ready_method
    jax.block_until_ready = block_until_ready


def wait_untimed(x: Any) -> None:
    """``x.block_until_ready()``, not reported as a wait: the library's own
    (the timing of a buffer export, which reports it as the read it is)."""
    depth = getattr(_inside, "depth", 0)
    _inside.depth = depth + 1
    try:
        x.block_until_ready()
    finally:
        _inside.depth = depth


def uninstall() -> None:
    if not _saved:
        return
    ArrayImpl.block_until_ready = _saved["base"][0]
    jax.block_until_ready = _saved["function"][0]
    _saved.clear()


def wrap_method(wrap: Callable[[Any], Any]) -> None:
    """Replace the array method ``block_until_ready`` by ``wrap(method)``, for
    good: beneath the timing wrapper while a timing loop has it installed
    (its uninstall puts the wrapped method back), else on the class."""
    if _saved:
        _saved["base"][0] = wrap(_saved["base"][0])
    else:
        ArrayImpl.block_until_ready = wrap(ArrayImpl.__dict__["block_until_ready"])


def wrap_function(wrap: Callable[[Any], Any]) -> None:
    """As :func:`wrap_method`, for the module function."""
    if _saved:
        _saved["function"][0] = wrap(_saved["function"][0])
    else:
        jax.block_until_ready = wrap(jax.block_until_ready)
