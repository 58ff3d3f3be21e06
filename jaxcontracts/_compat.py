"""The few JAX internals jaxcontracts relies on, in one place.

Nothing here may initialise a backend at import time: users set ``XLA_FLAGS``
(e.g. the number of simulated CPU devices) after importing libraries.
"""

from __future__ import annotations

try:  # the concrete array class (a C++ type with Python methods)
    from jax._src.array import ArrayImpl
except ImportError:  # pragma: no cover - future jax
    from jaxlib.xla_extension import ArrayImpl  # type: ignore[no-redef]

try:  # one attribute read: is any trace active on this thread?
    from jax._src.core import trace_state_clean
except ImportError:  # pragma: no cover - future jax

    def trace_state_clean() -> bool:
        return True


def cpp_call(compiled: object) -> object:
    """The C++ call of a ``jax.stages.Compiled``, or ``compiled`` itself.

    ``Compiled.__call__`` is a Python method whose only job, once warm, is to
    forward to this C++ function (JAX's compiled fast path); calling it
    directly saves that frame on every call. Errors are the same: it is the
    very function ``Compiled.__call__`` calls.
    """
    call = getattr(compiled, "_call", None)
    if call is None:
        try:
            call = compiled._executable.create_cpp_call(compiled._params)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - private API moved: use the public call
            return compiled
        if call is None:
            return compiled
        compiled._call = call  # type: ignore[attr-defined]  # what __call__ would cache
    return call


__all__ = ["ArrayImpl", "cpp_call", "trace_state_clean"]
