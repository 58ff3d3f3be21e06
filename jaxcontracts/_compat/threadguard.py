"""A thread's transfer-guard levels, settable from another thread.

JAX's ``transfer_guard_*`` context managers set thread-local levels, which
only the thread that set them can restore. A ``jc.hot_loop`` exited on
another thread (a generator closed there) sets the fields of jaxlib's
``guard_lib.thread_local_state()`` record of the thread it was entered on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import capability, define

__all__ = ["allow_host_to_device", "current", "levels", "set_levels"]

#: The guard_lib fields a hot loop sets (JAX's names, as in its config).
FIELDS = ("host_to_device", "device_to_host", "device_to_device")


def _guard_lib() -> Any:
    from jax._src import config

    return config.guard_lib


@define(
    "thread-guard-state",
    "jaxlib guard_lib.thread_local_state(): a thread's transfer-guard levels, "
    "set from another thread",
    "restoring a thread's host-to-device guard when its jc.hot_loop is exited on another "
    "thread (a generator closed there)",
)
def _probe() -> str | None:
    lib = _guard_lib()
    state = lib.thread_local_state()
    if state is not lib.thread_local_state():
        return "guard_lib.thread_local_state() is not one object per thread"
    absent = [f for f in FIELDS if not hasattr(state, f)]
    if absent:
        return "guard_lib's thread state has no " + ", ".join(absent)
    if not hasattr(lib.TransferGuardLevel, "DISALLOW"):
        return "guard_lib.TransferGuardLevel has no DISALLOW"
    return None


def current() -> Any | None:
    """The calling thread's guard record, or None without the capability."""
    if not capability("thread-guard-state").available:
        return None
    return _guard_lib().thread_local_state()


def levels(state: Any) -> dict[str, Any]:
    return {f: getattr(state, f) for f in FIELDS}


def set_levels(state: Any, saved: dict[str, Any], overlay: dict[str, str] | None = None) -> None:
    """Set the record's levels: ``saved`` (from :func:`levels`), then ``overlay``
    (JAX's level names such as ``"disallow"``) on top."""
    for f, value in saved.items():
        setattr(state, f, value)
    for f, name in (overlay or {}).items():
        setattr(state, f, getattr(_guard_lib().TransferGuardLevel, name.upper()))


def allow_host_to_device(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` run with the calling thread's host-to-device guard at ``allow``
    (declared host data), by one field store before and after, not JAX's
    context manager (several microseconds): the fallback without the capability."""
    if not capability("thread-guard-state").available:
        import jax

        def with_context(*args: Any) -> Any:
            with jax.transfer_guard_host_to_device("allow"):
                return call(*args)

        return with_context
    lib = _guard_lib()
    tls, allow = lib.thread_local_state, lib.TransferGuardLevel.ALLOW

    def allowing(*args: Any) -> Any:
        state = tls()
        saved = state.host_to_device
        try:  # the store inside: an interrupt landing on it still restores
            state.host_to_device = allow
            return call(*args)
        finally:
            state.host_to_device = saved

    return allowing
