"""Small, pure formatting helpers shared by every message and report."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import keystr

__all__ = [
    "fit_change",
    "fmt_change",
    "fmt_aval",
    "fmt_bindings",
    "fmt_error",
    "fmt_listed",
    "fmt_logged_aval",
    "fmt_object",
    "fmt_path",
    "fmt_sharding",
    "fmt_bytes",
    "flatten_with_path",
    "n_leaves",
    "param_of",
    "qualname",
]


def flatten_with_path(tree: Any) -> tuple[list[tuple[tuple[Any, ...], Any]], Any]:
    """``jax.tree_util.tree_flatten_with_path``, with the leaves of an
    ``equinox.nn.State`` named by the layer's path equinox keeps as their
    index's marker (``state['M.norm.batch_state_index'][0]``), not
    ``[<flat index 1>]``: State registers no keys, only its markers as aux data."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    state_cls = getattr(sys.modules.get("equinox.nn"), "State", None)
    flat = jax.tree_util.FlattenedIndexKey
    if not isinstance(state_cls, type) or not any(
        isinstance(k, flat) for p, _ in with_path for k in p
    ):
        return with_path, treedef
    nodes = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, state_cls)
    )[0]
    names = {tuple(p): node.tree_flatten()[1] for p, node in nodes if isinstance(node, state_cls)}
    renamed = []
    for path, leaf in with_path:
        for n in range(len(path)):
            keys = names.get(tuple(path[:n]))
            key = path[n]
            if (
                isinstance(keys, tuple)
                and isinstance(key, flat)
                and key.key < len(keys)
                and isinstance(keys[key.key], str)
            ):
                path = (*path[:n], jax.tree_util.DictKey(keys[key.key]), *path[n + 1 :])
        renamed.append((path, leaf))
    return renamed, treedef


def fmt_dtype(dtype: Any) -> str:
    """``float32`` -> ``f32``, as JAX prints avals (``key<fry>`` for PRNG keys)."""
    try:
        text: str = jax.core.ShapedArray((), dtype).str_short(short_dtypes=True)
    except Exception:  # noqa: BLE001 - not a dtype JAX knows: numpy's name
        return str(getattr(dtype, "name", dtype))
    return text[: -len("[]")] if text.endswith("[]") else text


def fmt_aval(shape: Sequence[Any], dtype: Any, weak_type: bool = False) -> str:
    """``f32[4,3]``; a weakly typed value reads ``~f32[]`` (jax's own mark)."""
    dims = ",".join(str(d) for d in shape)
    return f"{'~' if weak_type else ''}{fmt_dtype(dtype)}[{dims}]"


def param_of(path: str) -> str:
    """The parameter a written leaf path starts with (``state['w'][0]`` -> ``state``)."""
    return path.split("[", 1)[0].split(".", 1)[0]


def fmt_listed(items: Sequence[str], limit: int = 3) -> str:
    """``a, b, c (and 2 more)``."""
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


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
        layout = (
            f"P{parts!s}".replace(",)", ")") if any(p is not None for p in parts) else "replicated"
        )
        return f"{layout} on mesh({axes})"
    devices = getattr(sharding, "device_set", None)
    if devices is not None and len(devices) == 1:
        (device,) = tuple(devices)
        return f"single device {device}"
    return repr(sharding)


def fmt_bindings(bindings: Mapping[str, Any]) -> str:
    """``n=4, batch=(2, 3)`` in a stable order."""
    return ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))


def qualname(fn: Any) -> str:
    """``module.qualname`` of a function, for the first line of a message."""
    mod = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    return f"{mod}.{name}"


def n_leaves(n: int) -> str:
    """``"1 leaf"``, ``"3 leaves"``."""
    return f"{n} leaf" if n == 1 else f"{n} leaves"


def fmt_bytes(n: int | None) -> str:
    """``1.5 KiB``; ``n/a`` for an unknown size."""
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# The aval JAX's transfer-guard log prints (``float32[3], weak_type=True``).
_LOGGED_AVAL = re.compile(r"^(?P<dtype>[a-z]+\d*)\[(?P<shape>[\d,]*)\](?P<weak>, weak_type=True)?")


def fmt_logged_aval(text: str) -> str:
    """``float32[3], weak_type=True`` -> ``f32[3] (weak: a Python scalar?)``."""
    m = _LOGGED_AVAL.match(text)
    if m is None:
        return (
            text
            or "an argument (jaxlib's jit fast path gives no shape: a numpy array or Python scalar "
            "passed to a jax.jit function?)"
        )
    try:
        shape = tuple(int(d) for d in m["shape"].split(",") if d)
        out = fmt_aval(shape, np.dtype(m["dtype"]))
    except TypeError:
        return text
    return out + (" (weakly typed: a Python scalar)" if m["weak"] else "")


_PLAIN = (str, bytes, bool, int, float, complex, type(None), type)


def fmt_error(err: BaseException, limit: int | None = None) -> str:
    """``TypeError: cannot reshape ...``: an error's type and its message's
    first line (cut to ``limit``); its ``__str__`` may be anyone's: never fails."""
    try:
        lines = str(err).strip().splitlines()
    except Exception:  # noqa: BLE001
        lines = []
    text = lines[0] if lines else ""
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def fmt_object(value: Any, limit: int = 60) -> str:
    """``Holder(w: f32[3])``: an opaque value described without running its
    ``repr`` (which may read device arrays, be slow, or fail): plain values by
    ``repr``, others by type name and the specs of their ``__dict__``'s arrays."""
    if isinstance(value, (jax.Array, np.ndarray)):
        kind = "numpy" if isinstance(value, np.ndarray) else "jax"
        return f"{_fmt_array(value)} {kind} array"
    if isinstance(value, _PLAIN):
        try:
            text = f"{type(value).__name__} {value!r}"
        except Exception:  # noqa: BLE001 - a str/int subclass whose repr raises
            return f"{type(value).__qualname__} object"
        return text if len(text) <= limit else text[: limit - 3] + "..."
    name = type(value).__qualname__
    try:
        attrs = object.__getattribute__(value, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__ (slots, a C type): the type alone
        attrs = None
    arrays = []
    if isinstance(attrs, dict):
        for key, x in list(attrs.items())[:50]:
            if isinstance(x, (jax.Array, np.ndarray)) and isinstance(key, str):
                arrays.append(f"{key}: {_fmt_array(x)}")
    if not arrays:
        return f"{name} object"
    text = f"{name}({', '.join(arrays[:3])}{', ...' if len(arrays) > 3 else ''})"
    return text if len(text) <= limit else text[: limit - 4] + "...)"


def _fmt_array(x: Any) -> str:
    weak = bool(getattr(getattr(x, "aval", None), "weak_type", False))
    return fmt_aval(x.shape, x.dtype, weak)


def fmt_change(old: str, new: str, room: int = 14) -> str:
    """Where two reprs first differ, ``room`` characters either side:
    ``...NeighborList[672, ... -> ...NeighborList[703, ...``."""
    i = next((k for k, (x, y) in enumerate(zip(old, new)) if x != y), min(len(old), len(new)))
    start = max(0, i - room)

    def cut(text: str) -> str:
        return (
            ("..." if start else "") + text[start : i + room]
            + ("..." if len(text) > i + room else "")
        )

    return f"{cut(old)} -> {cut(new)}"


def fit_change(line: str, width: int) -> str:
    """A diff line ``what: old -> new`` fitted to ``width`` around where old
    and new first differ (:func:`fmt_change`): ``static cfg: ...rtol=0.001) ->
    ...rtol=0.0001)``. Split at the middle ``->`` (a repr may hold some, each
    side as many); a line that cannot be split so is cut at the end."""
    if len(line) <= width:
        return line
    head, sep, rest = line.partition(": ")
    parts = rest.split(" -> ")
    if not sep or len(parts) % 2:
        return line[: width - 3] + "..."
    half = len(parts) // 2
    room = max(8, (width - len(head) - 18) // 4)  # each side: "..." + 2 * room + "..."
    return f"{head}: {fmt_change(' -> '.join(parts[:half]), ' -> '.join(parts[half:]), room)}"
