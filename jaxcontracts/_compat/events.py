"""Compile events: the names ``jax.monitoring`` gives each compile phase (the
listener API is public, the event names are not)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax

from .registry import capability, define

__all__ = ["BACKEND_EVENT", "LOWERING_EVENT", "listen", "unlisten"]

COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
# Every compile lowers to MLIR once (a cold eager op may skip the trace event).
LOWERING_EVENT = COMPILE_EVENTS[1]
BACKEND_EVENT = COMPILE_EVENTS[2]


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


# --------------------------------------------------------------------------
# The persistent compilation cache: whether a compile was served from it

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"
CACHE_USE_EVENT = "/jax/compilation_cache/compile_requests_use_cache"


@define(
    "compilation-cache-events",
    "jax.monitoring events "
    "/jax/compilation_cache/{compile_requests_use_cache,cache_hits,cache_misses}",
    "nothing is checked; step reports cannot say whether an executable came from "
    "JAX's persistent compilation cache",
)
def _probe_cache_events() -> str | None:
    import inspect

    from jax._src import compilation_cache, compiler  # where JAX records them

    source = inspect.getsource(compiler) + inspect.getsource(compilation_cache)
    missing = [e for e in (CACHE_HIT_EVENT, CACHE_MISS_EVENT, CACHE_USE_EVENT) if e not in source]
    if missing:
        return "jax no longer records " + ", ".join(missing)
    if not hasattr(jax.monitoring, "unregister_event_listener"):
        return "jax.monitoring.unregister_event_listener is missing"
    return None


class CacheOutcome:
    """JAX's persistent compilation cache's hits and misses on the compiling
    thread (its "considered" event fires even without a cache directory)."""

    __slots__ = ("hits", "misses", "thread")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.hits = 0
        self.misses = 0

    def __call__(self, event: str, **kwargs: Any) -> None:
        if threading.get_ident() != self.thread:
            return
        if event == CACHE_HIT_EVENT:
            self.hits += 1
        elif event == CACHE_MISS_EVENT:
            self.misses += 1

    @property
    def verdict(self) -> str:
        """``"hit"``, ``"miss"``, or ``"off"`` (the cache was not consulted)."""
        if self.hits:
            return "hit"
        if self.misses:
            return "miss"
        return "off"


def watch_cache() -> CacheOutcome | None:
    """Start counting cache events on this thread (None: not on this JAX)."""
    if not capability("compilation-cache-events").available:
        return None
    outcome = CacheOutcome()
    jax.monitoring.register_event_listener(outcome)
    return outcome


def unwatch_cache(outcome: CacheOutcome | None) -> None:
    if outcome is not None:
        try:
            jax.monitoring.unregister_event_listener(outcome)
        except (ValueError, AssertionError, KeyError):  # pragma: no cover - already gone
            pass
