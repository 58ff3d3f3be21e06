"""JAX runtime errors that leave a hot loop, as the contract errors they are.

JAX's own guards raise bare ``JaxRuntimeError`` s (a disallowed host-to-device
transfer, a deleted buffer); when one leaves a ``jc.hot_loop`` it is turned
into a :class:`TransferError` or :class:`DonationError` naming the user's
line, the cause (a Python constant in an eager op, ``jax.device_get`` of a
typed key, which local was donated and to what) and the fix.
"""

from __future__ import annotations

from typing import Any

import jax

from ._compat import frames, runtime_errors
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
    """Which local arrays of the user's failing frame were donated, and to what.

    JAX refuses a deleted buffer in C++ and names only an argument number;
    the user's frame still holds the array. Reads no device memory.
    """
    frame = None
    while tb is not None:
        if not is_library(tb.tb_frame.f_code.co_filename):
            frame = tb.tb_frame
        tb = tb.tb_next
    if frame is None:
        return ""
    named = []
    code = frame.f_code
    scope = {**frame.f_globals, **frames.locals_of(frame)}
    names = dict.fromkeys((*code.co_varnames, *code.co_freevars, *code.co_cellvars, *code.co_names))
    for name in list(names)[:200]:  # the names this code refers to
        value = scope.get(name)
        if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
            try:
                deleted = value.is_deleted()
            except Exception:  # noqa: BLE001
                continue
            if deleted:
                by = consumed_by(value, frame)
                named.append(
                    f"`{name}` ({fmt_aval(value.shape, value.dtype)}) was donated"
                    + (f" to {by}" if by else "")
                )
    return "; ".join(named)


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

