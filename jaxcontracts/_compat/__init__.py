"""Every private JAX, jaxlib, jaxtyping, IPython or CPython mechanism, one
module each, behind a named capability with a probe (:mod:`.registry`).
"""

from __future__ import annotations

from . import (
    arrays,
    blocking,
    callbacks,
    effects,
    events,
    executable,
    frames,
    guarded,
    hostcopy,
    jaxtyping,
    jitwatch,
    liveorder,
    refcount,
    refs,
    runtime_errors,
    threadguard,
    tracing,
)
from .registry import Capability, capabilities, capability

__all__ = [
    "Capability",
    "arrays",
    "blocking",
    "callbacks",
    "capabilities",
    "capability",
    "effects",
    "events",
    "executable",
    "frames",
    "guarded",
    "hostcopy",
    "jitwatch",
    "jaxtyping",
    "liveorder",
    "refcount",
    "refs",
    "runtime_errors",
    "threadguard",
    "tracing",
]
