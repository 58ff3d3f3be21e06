"""Copying a device array to the host without pinning its buffer.

On CPU a host read is a view of the device buffer, which XLA cannot donate
while it lives; jaxlib 0.11.2 caches the view of ``__array__``, ``_value``,
``device_get`` and ``copy_to_host_async`` for the array's life (0.10.x,
0.11.0/1 and 0.12 release it). :func:`host_copy` releases the view at once.
"""

from __future__ import annotations

import ctypes
from typing import Any

import jax
import jaxlib
import numpy as np

from .registry import define

__all__ = ["host_copy", "pins_host_views"]


def pins_host_views() -> bool:
    """Whether the installed jaxlib keeps a CPU array's host view alive after a read."""
    return getattr(jaxlib, "__version__", "") in ("0.11.2",)


@define(
    "pin-free-host-copy",
    "the buffer protocol of a single-device CPU array, or its unsafe_buffer_pointer and "
    "Array.format.layout",
    "that jc.fetch (and reads allowed in a loop on a pinning jaxlib) leave buffers donatable",
)
def _probe() -> str | None:
    from jax._src.array import ArrayImpl

    wanted = ("addressable_shards", "unsafe_buffer_pointer", "format", "on_device_size_in_bytes")
    missing = [a for a in wanted if not hasattr(ArrayImpl, a)]
    if not hasattr(jax.dtypes, "itemsize_bits"):
        missing.append("jax.dtypes.itemsize_bits")
    return ("missing: " + ", ".join(missing)) if missing else None


def _dense_row_major(a: Any) -> bool:
    try:
        # Sub-byte dtypes (int4, float4) are packed on the device, though jax
        # 0.10 reports on_device_size == nbytes for them.
        if jax.dtypes.itemsize_bits(a.dtype) < 8 or a.on_device_size_in_bytes() != a.nbytes:
            return False
        layout = a.format.layout
        return tuple(layout.major_to_minor) == tuple(range(a.ndim)) and not layout.tiling
    except Exception:  # noqa: BLE001 - no layout information: do not guess
        return False


def _single_to_numpy(a: Any) -> np.ndarray:
    try:
        view = memoryview(a)  # an external reference until release()
    except (BufferError, TypeError, SystemError):
        # bfloat16, float8, int4: not exportable. SystemError: on Python 3.11,
        # while a loop's buffer hook is installed, the original slot's error is
        # lost in the ctypes callback ("returned NULL without setting an exception").
        view = None
    if view is not None:
        try:
            out = np.array(view, copy=True)
        finally:
            view.release()
        return out.view(a.dtype) if out.dtype != a.dtype else out
    if _dense_row_major(a):
        a.block_until_ready()
        out = np.empty(a.shape, a.dtype)
        if a.nbytes:
            ctypes.memmove(out.ctypes.data, a.unsafe_buffer_pointer(), a.nbytes)
        return out
    return np.array(jax.device_get(a), copy=True)  # sub-byte: jaxlib copies anyway


def host_copy(x: Any) -> Any:
    """A fresh, writeable host copy of a live, addressable ``jax.Array`` that
    leaves it donatable (keys and non-CPU arrays: ``jax.device_get``, a copy)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended) or any(
        d.platform != "cpu" for d in x.sharding.device_set
    ):
        host = jax.device_get(x)
        return np.array(host, copy=True) if isinstance(host, np.ndarray) else host
    shards = x.addressable_shards
    if x.is_fully_replicated or len(shards) == 1:
        return _single_to_numpy(shards[0].data)
    out = np.empty(x.shape, x.dtype)
    seen: set[str] = set()
    for shard in shards:
        key = repr(shard.index)
        if key not in seen:  # replicated along some mesh axis: copy once
            seen.add(key)
            out[shard.index] = _single_to_numpy(shard.data)
    return out
