"""Small, pure formatting helpers shared by every message and report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.tree_util import keystr

__all__ = [
    "fmt_aval",
    "fmt_bindings",
    "fmt_dtype",
    "fmt_path",
    "fmt_sharding",
    "fmt_value",
    "qualname",
]

_SHORT = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint64": "u64",
    "uint32": "u32",
    "uint16": "u16",
    "uint8": "u8",
    "complex64": "c64",
    "complex128": "c128",
    "bool": "bool",
}


def fmt_dtype(dtype: Any) -> str:
    """``float32`` -> ``f32``; unknown dtypes keep their numpy name."""
    name = str(np.dtype(dtype)) if not hasattr(dtype, "name") else dtype.name
    return _SHORT.get(name, name)


def fmt_aval(shape: Sequence[Any], dtype: Any, weak_type: bool = False) -> str:
    """``f32[4,3]``; a weakly typed value reads ``~f32[]`` (jax's own mark)."""
    dims = ",".join(str(d) for d in shape)
    return f"{'~' if weak_type else ''}{fmt_dtype(dtype)}[{dims}]"


def fmt_path(path: Sequence[Any]) -> str:
    """A leaf path as jax prints it (``.pos``, ``['t']``, ``[0].vel``)."""
    return keystr(tuple(path)) or "(the value itself)"


def fmt_sharding(sharding: Any) -> str:
    """A sharding in one short line (mesh axes and partition spec)."""
    if sharding is None:
        return "unspecified"
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is not None and mesh is not None:
        axes = ",".join(f"{k}={v}" for k, v in mesh.shape.items())
        parts = tuple(spec)
        layout = f"P{parts!s}".replace(",)", ")") if any(p is not None for p in parts) else "replicated"
        return f"{layout} on mesh({axes})"
    devices = getattr(sharding, "device_set", None)
    if devices is not None and len(devices) == 1:
        (device,) = tuple(devices)
        return f"single device {device}"
    return repr(sharding)


def fmt_bindings(bindings: Mapping[str, Any]) -> str:
    """``n=4, batch=(2, 3)`` in a stable order."""
    return ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))


def fmt_value(value: Any) -> str:
    """Describe a leaf of any kind in a few characters."""
    from ._spec import leaf_spec  # local: _spec imports this module

    if value is None:
        return "None"
    spec = leaf_spec(value)
    if spec is None:
        return f"{type(value).__name__} {value!r}"[:60]
    kind = _kind(value)
    return f"{fmt_aval(spec.shape, spec.dtype, spec.weak_type)} ({kind})"


def _kind(value: Any) -> str:
    import jax

    if isinstance(value, jax.Array):
        return "jax array"
    if isinstance(value, jax.ShapeDtypeStruct):
        return "spec"
    if isinstance(value, np.ndarray):
        return "numpy array"
    if isinstance(value, np.generic):
        return "numpy scalar"
    return f"Python {type(value).__name__}"


def qualname(fn: Any) -> str:
    """``module.qualname`` of a function, for the first line of a message."""
    mod = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    return f"{mod}.{name}"

