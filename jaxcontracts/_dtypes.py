"""Dtypes of every kind a leaf may have, typed PRNG keys included.

``numpy.dtype(...)`` refuses JAX's extended dtypes: a typed PRNG key made by
``jax.random.key`` has dtype ``key<fry>`` (``jax.dtypes.prng_key``), which
numpy cannot interpret. Every comparison, size or name of a dtype in this
package goes through these helpers, so keys are leaves like any other.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["canonical", "default_key_dtype", "is_key", "itemsize", "same_dtype"]


_is_key_seen: dict[Any, bool] = {}  # dtype -> is_key: a few entries, read per leaf


def is_key(dtype: Any) -> bool:
    """Whether ``dtype`` is a typed PRNG key dtype (``key<fry>``, ``key<rbg>``...)."""
    try:
        return _is_key_seen[dtype]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    try:
        found = bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        found = False
    try:
        _is_key_seen[dtype] = found
    except TypeError:
        pass
    return found


def canonical(dtype: Any) -> Any:
    """``np.dtype(dtype)``, or the key dtype itself (numpy cannot hold it)."""
    return dtype if is_key(dtype) else np.dtype(dtype)


def same_dtype(a: Any, b: Any) -> bool:
    """Dtype equality that works for keys (``key<fry>`` vs ``key<rbg>`` differ)."""
    if is_key(a) or is_key(b):
        return bool(a == b)
    return bool(np.dtype(a) == np.dtype(b))


def itemsize(dtype: Any) -> int:
    """Bytes per element; a key's element is its key data (8 bytes for threefry)."""
    return int(dtype.itemsize) if is_key(dtype) else int(np.dtype(dtype).itemsize)


def default_key_dtype() -> Any:
    """The dtype of ``jax.random.key(seed)`` under the current default PRNG
    implementation (``jax_default_prng_impl``), worked out without a device."""
    return jax.eval_shape(lambda: jax.random.key(0)).dtype
