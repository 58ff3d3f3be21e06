"""Dtypes of every kind a leaf may have, typed PRNG keys included.

``numpy.dtype(...)`` refuses JAX's extended dtypes (a typed PRNG key's
``key<fry>``): every comparison or size of a dtype goes through these helpers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = ["array_nbytes", "canonical", "default_key_dtype", "is_key", "same_dtype"]


def _per_dtype(compute: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``compute(dtype)``, remembered per dtype (read per leaf)."""
    seen: dict[Any, Any] = {}

    def cached(dtype: Any) -> Any:
        try:
            return seen[dtype]
        except (KeyError, TypeError):  # not seen yet, or not hashable
            pass
        found = compute(dtype)
        try:
            seen[dtype] = found
        except TypeError:
            pass
        return found

    cached.__doc__ = compute.__doc__
    return cached


@_per_dtype
def is_key(dtype: Any) -> bool:
    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


def canonical(dtype: Any) -> Any:
    """``np.dtype(dtype)``, or the key dtype itself (numpy cannot hold it)."""
    return dtype if is_key(dtype) else np.dtype(dtype)


def same_dtype(a: Any, b: Any) -> bool:
    """Dtype equality that works for keys (``key<fry>`` vs ``key<rbg>`` differ)."""
    if is_key(a) or is_key(b):
        return bool(a == b)
    return bool(np.dtype(a) == np.dtype(b))


@_per_dtype
def _bits(dtype: Any) -> int:
    """Bits per element (XLA packs int4 two to a byte); a key's key data in full."""
    if is_key(dtype):
        return 8 * int(dtype.itemsize)
    dt = np.dtype(dtype)
    try:
        return int(jax.dtypes.itemsize_bits(dt))
    except Exception:  # noqa: BLE001 - a dtype it does not know: numpy's size
        return 8 * int(dt.itemsize)


def array_nbytes(shape: Any, dtype: Any) -> int:
    """Bytes of an array of this shape and dtype as XLA stores it (sub-byte
    types packed: 1,024 int4 elements are 512 bytes)."""
    return (math.prod(map(int, shape)) * _bits(dtype) + 7) // 8


def default_key_dtype() -> Any:
    """The dtype of ``jax.random.key(seed)`` now, worked out without a device."""
    return jax.eval_shape(lambda: jax.random.key(0)).dtype
