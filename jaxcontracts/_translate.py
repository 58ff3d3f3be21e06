"""JAX runtime errors that leave a hot loop, as the contract errors they are.

JAX's own guards raise bare ``JaxRuntimeError`` s (a disallowed host-to-device
transfer, a deleted buffer); when one leaves a ``jc.hot_loop`` it is turned
into a :class:`TransferError` or :class:`DonationError` naming the user's
line, the cause (a Python constant in an eager op, ``jax.device_get`` of a
typed key, which local was donated and to what) and the fix.
"""

from __future__ import annotations

import linecache
import re
import types
from typing import Any

import jax

from ._compat import frames, runtime_errors
from ._donation import is_deleted_array
from ._errors import DonationError, TransferError
from ._format import fmt_aval
from ._runtime import consumed_by
from ._userline import is_library, traceback_where

__all__ = ["translate"]


# JAX runtime errors that leave a loop, and what they mean there.
_RUNTIME_ERRORS: dict[str, tuple[type[Exception], str, str, str]] = {
    "host-to-device": (
        TransferError,
        "no-transfer",
        "implicit transfer inside jc.hot_loop: host-to-device",
        "put host data on the device once, before the loop (x = "
        "jax.device_put(x)); a Python scalar in an eager op (x * 2 outside a "
        "step) is a transfer too: do the op inside a hot_step, or make the "
        "scalar a device array before the loop.",
    ),
    "device-to-host": (
        TransferError,
        "no-transfer",
        "implicit transfer inside jc.hot_loop: device-to-host (seen by JAX's own guard)",
        "read it deliberately and rarely with jc.fetch(x), or move the read after the loop.",
    ),
    "deleted": (
        DonationError,
        "no-donated-use",
        "use of a donated array inside jc.hot_loop: an array that a hot_step "
        "consumed was used again",
        "use the state the step returned (s = step(s)).",
    ),
}


# A weakly typed scalar crossing to the device is a Python constant in an
# eager op: `flag & 1`, `loss * 0.5`, or one JAX makes itself (`x[idx]`
# normalises negative indices with Python ints).
_CONSTANT_TITLE = (
    "implicit transfer inside jc.hot_loop: host-to-device, a Python constant "
    "in an eager op"
)


_CONSTANT_FIX = (
    "each eager op with a Python number copies it to the device on every call. "
    "Do the op inside the hot_step (return what you need), or in a jax.jit "
    "helper warmed before the loop (constants are compiled in); or make the "
    "constant a device array once, before the loop (one = jnp.int32(1); flag & one). "
    "If these small copies are acceptable here: "
    'jc.hot_loop(transfers="allow_host_to_device") (device-to-host reads stay refused).'
)


def _in_device_get(tb: Any) -> bool:
    """Whether the traceback passes through jax.device_get (a key rebuilt on the device)."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in ("device_get", "_device_get") and is_library(code.co_filename, False):
            return True
        tb = tb.tb_next
    return False


def _donated_names(tb: Any) -> str:
    """Which arrays the user's failing frame refers to were donated, and to what.

    JAX refuses a deleted buffer in C++ and names only an argument number;
    the user's frame still holds the array, directly (``x``) or inside a
    state it holds (``old.position`` of a NamedTuple, ``state.params['w']``).
    Reads no device memory.
    """
    frame, lineno = None, 0
    while tb is not None:
        if not is_library(tb.tb_frame.f_code.co_filename):
            frame, lineno = tb.tb_frame, tb.tb_lineno  # the line that failed, not where it is now
        tb = tb.tb_next
    if frame is None:
        return ""
    named: list[str] = []
    code = frame.f_code
    scope = {**frame.f_globals, **frames.locals_of(frame)}
    names = list(dict.fromkeys((*code.co_varnames, *code.co_freevars, *code.co_cellvars, *code.co_names)))
    line = linecache.getline(code.co_filename, lineno)
    names.sort(key=lambda n: re.search(rf"\b{re.escape(n)}\b", line) is None)  # the failing line's first
    for name in names[:200]:  # the names this code refers to
        for path, x in _arrays_in(scope.get(name)):
            if is_deleted_array(x):
                by = consumed_by(x, frame)
                named.append(
                    f"`{name}{path}` ({fmt_aval(x.shape, x.dtype)}) was donated" + (f" to {by}" if by else "")
                )
                if len(named) == 5:
                    return "; ".join(named)
    return "; ".join(named)


def _arrays_in(value: Any) -> list[tuple[str, Any]]:
    """(path, array) for an array, or the arrays of a container (a state), bounded."""
    if isinstance(value, jax.Array):
        return [] if isinstance(value, jax.core.Tracer) else [("", value)]
    if value is None or isinstance(value, (str, bytes, int, float, complex, bool, type, types.ModuleType)) or callable(value):
        return []
    try:
        leaves = jax.tree_util.tree_flatten_with_path(value)[0]
    except Exception:  # noqa: BLE001 - not a pytree we can flatten: nothing to name
        return []
    return [
        (jax.tree_util.keystr(p), x)
        for p, x in leaves[:1000]
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
    ]


def translate(exc: BaseException, tb: Any) -> Exception | None:
    """A JAX runtime error leaving the loop, as the contract error it is."""
    found = runtime_errors.classify(exc)
    if found is None:
        return None
    kind, detail = found
    error, contract, title, fix = _RUNTIME_ERRORS[kind]
    if kind == "host-to-device" and "weak_type=True" in detail:
        title, fix = _CONSTANT_TITLE, _CONSTANT_FIX
    elif kind == "host-to-device" and _in_device_get(tb):
        title = "implicit transfer inside jc.hot_loop: jax.device_get of a typed PRNG key"
        fix = (
            "jax.device_get rebuilds a typed key on the device (a host-to-device "
            "copy of its data); read it with jc.fetch(key), which returns the key "
            "data (jax.random.wrap_key_data(data) makes it a key again)."
        )
    where, source = traceback_where(tb)
    if kind == "deleted":
        named = _donated_names(tb)
        if named:
            title = f"use of a donated array inside jc.hot_loop: {named}"
    return error(
        f"{title}{f' ({detail})' if detail else ''}\n  at {where}" + (f":  {source}" if source else ""),
        fix=fix,
        contract=contract,
    )

