"""JAX's runtime tokens for a compiled step's ordered effects, made ahead.

JAX keeps the last token per ordered effect (per thread); the first call on a
thread, or after ``jax.effects_barrier()``, makes one by transferring a
``bool[0]`` numpy array, which a ``jc.hot_loop`` would refuse as the user's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .registry import capability, define

__all__ = ["effect_tokens"]

try:
    from jax._src import dispatch as _dispatch
except ImportError:  # pragma: no cover - future jax
    _dispatch = None  # type: ignore[assignment]


@define(
    "effect-tokens",
    "jax._src.dispatch.runtime_tokens (get_token_input, current_tokens) and "
    "Compiled._executable.unsafe_call.ordered_effects / _local_devices",
    "a hot step with an ordered effect (io_callback(ordered=True)) first called inside "
    "jc.hot_loop does not fail on JAX's own transfer of its effect token",
)
def _probe() -> str | None:
    tokens = getattr(_dispatch, "runtime_tokens", None)
    if tokens is None:
        return "jax._src.dispatch.runtime_tokens is missing"
    if not callable(getattr(tokens, "get_token_input", None)) or not isinstance(
        getattr(tokens, "current_tokens", None), dict
    ):
        return "runtime_tokens has no get_token_input / current_tokens dict"
    return None


def _ordered(compiled: Any) -> tuple[list[Any], Any] | None:
    """(the ordered effects, the local devices) of an AOT executable."""
    try:
        call = compiled._executable.unsafe_call
        effects = list(call.ordered_effects)
        devices = call._local_devices
    except (AttributeError, TypeError):
        return None
    return (effects, devices) if effects else None


def effect_tokens(compiled: Any) -> Callable[[], None] | None:
    """A function making, on the calling thread, the missing runtime tokens
    of the executable's ordered effects; None where it has none or the
    mechanism is missing (the first call inside a loop is then refused)."""
    found = _ordered(compiled)
    if found is None or not capability("effect-tokens").available:
        return None
    effects, devices = found
    tokens = _dispatch.runtime_tokens

    def ensure() -> None:
        current = tokens.current_tokens  # this thread's (a threading.local)
        for eff in effects:
            if eff not in current:  # once per thread (and after jax.effects_barrier())
                with jax.transfer_guard_host_to_device("allow"):
                    tokens.get_token_input(eff, devices)

    return ensure
