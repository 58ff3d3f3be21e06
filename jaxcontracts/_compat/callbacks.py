"""Host callbacks an executable runs (``jax.debug.callback``/``print``,
``pure_callback``, ``io_callback``): a hook around each.

XLA calls back into Python while a compiled step runs; on CPU that happens on
the thread that dispatched the step, inside its ``jc.hot_loop``. The
callback's own eager ops (``jnp.sum(x)`` in a ``jax.debug.callback``) would
then be refused by the loop, and the refusal fails the whole step after XLA
took its donated buffers: the state is gone and no output is returned. The
hook lets the loop lift its guards for the callback's duration.

JAX's lowerings call ``debug_callback_p.impl``, ``pure_callback_impl`` and
``io_callback_impl`` by attribute or global name when the callback runs, so
replacing those three attributes reaches every compiled callback, including
those compiled before the hook was installed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .registry import capability, define

__all__ = ["hook_host_callbacks"]

try:
    from jax._src import callback as _callback
    from jax._src import debugging as _debugging
except ImportError:  # pragma: no cover - future jax
    _callback = _debugging = None  # type: ignore[assignment]

_hooked: list[Any] = []


def _targets() -> list[tuple[Any, str]]:
    """(owner, attribute) of each callback runner, where they are."""
    out: list[tuple[Any, str]] = []
    if _debugging is not None and callable(getattr(getattr(_debugging, "debug_callback_p", None), "impl", None)):
        out.append((_debugging.debug_callback_p, "impl"))
    for name in ("pure_callback_impl", "io_callback_impl"):
        if _callback is not None and callable(getattr(_callback, name, None)):
            out.append((_callback, name))
    return out


@define(
    "host-callback-hook",
    "jax._src.debugging.debug_callback_p.impl, jax._src.callback.pure_callback_impl and io_callback_impl",
    "a host callback a hot step runs inside jc.hot_loop (a jax.debug.callback doing a jnp op) "
    "runs with the loop's guards lifted, instead of failing the step after its donated state is gone",
)
def _probe() -> str | None:
    found = {name for _, name in _targets()}
    want = {"impl", "pure_callback_impl", "io_callback_impl"}
    return None if found == want else "missing: " + ", ".join(sorted(want - found))


def hook_host_callbacks(around: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]) -> None:
    """Run each host callback as ``around(runner, args, kwargs)`` (once, for good).

    ``around`` must call ``runner(*args, **kwargs)`` and return its result;
    it costs the callback one call when no loop is active.
    """
    if _hooked or not capability("host-callback-hook").available:
        return
    for owner, name in _targets():
        original = getattr(owner, name)
        _hooked.append((owner, name, original))
        setattr(owner, name, _runner(original, around))


def _runner(original: Callable[..., Any], around: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def runner(*args: Any, **kwargs: Any) -> Any:
        return around(original, args, kwargs)

    return runner
