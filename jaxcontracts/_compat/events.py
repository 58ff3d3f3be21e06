"""Compile events: the names ``jax.monitoring`` gives each compile phase.

``jax.monitoring``'s listener API is public; the event names and the
``fun_name`` keyword are not documented, so they are a capability.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .registry import define

__all__ = ["COMPILE_EVENTS", "LOWERING_EVENT", "listen", "unlisten"]

COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
# Every compile lowers to MLIR once (a cold eager op may skip the trace event).
LOWERING_EVENT = COMPILE_EVENTS[1]


@define(
    "compile-events",
    "jax.monitoring duration events named /jax/core/compile/*_duration",
    "compiles inside jc.hot_loop other than a hot step's own (a fresh jax.jit, a cold eager op)",
)
def _probe_events() -> str | None:
    from jax._src import dispatch  # where JAX names its compile events

    named = (
        getattr(dispatch, "JAXPR_TRACE_EVENT", None),
        getattr(dispatch, "JAXPR_TO_MLIR_MODULE_EVENT", None),
        getattr(dispatch, "BACKEND_COMPILE_EVENT", None),
    )
    if named != COMPILE_EVENTS:
        return f"jax names its compile events {named}"
    if not hasattr(jax.monitoring, "unregister_scalar_listener"):
        return "jax.monitoring.unregister_scalar_listener is missing"
    return None


def listen(callback: Callable[..., Any]) -> None:
    jax.monitoring.register_scalar_listener(callback)


def unlisten(callback: Callable[..., Any]) -> None:
    jax.monitoring.unregister_scalar_listener(callback)
