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


__all__ = ["ArrayImpl", "trace_state_clean"]
