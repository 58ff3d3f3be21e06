"""JAX's runtime errors for guard refusals and deleted buffers, recognised by
their text (their only mark), restricted to JAX's own exception types.
"""

from __future__ import annotations

import os
from typing import Literal

import jax
import jaxlib

from .registry import define

__all__ = ["JAX_DIRS", "classify", "debug_nans_kind", "is_runtime_error"]

GuardErrorKind = Literal["host-to-device", "device-to-host", "device-to-device", "deleted"]

_JAX_ERRORS: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(jax.errors, "JaxRuntimeError", None),) if isinstance(t, type)
)
#: The folders of jax and jaxlib (their frames are JAX's own).
JAX_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep for m in (jax, jaxlib))
_XLA_DELETED = "INVALID_ARGUMENT: Invalid buffer passed to Execute() as argument"
_MARKERS: tuple[tuple[str, GuardErrorKind, tuple[type[BaseException], ...]], ...] = (
    ("Disallowed host-to-device transfer", "host-to-device", _JAX_ERRORS),
    ("Disallowed device-to-host transfer", "device-to-host", _JAX_ERRORS),
    ("Disallowed device-to-device transfer", "device-to-device", _JAX_ERRORS),
    ("Array has been deleted", "deleted", (RuntimeError,)),
    ("Buffer has been deleted or donated", "deleted", (ValueError, *_JAX_ERRORS)),
    # the TPU runtime's wording of the same refusal (a warm call given a donated buffer)
    ("Donation requested for invalid buffer", "deleted", (ValueError, *_JAX_ERRORS)),
)


@define(
    "runtime-error-text",
    "the text of JAX's transfer-guard and deleted-buffer errors (jax.errors.JaxRuntimeError)",
    "translating JAX's own guard refusals into jc.TransferError / jc.DonationError "
    "naming your line",
)
def _probe() -> str | None:
    return None if _JAX_ERRORS else "jax.errors.JaxRuntimeError is gone"


def is_runtime_error(exc: BaseException) -> bool:
    """Whether ``exc`` is JAX's runtime error: an executable failed while
    running (a callback raised, out of memory...), or refused to (one buffer
    donated twice)."""
    return isinstance(exc, _JAX_ERRORS)


def _raised_by_jax(exc: BaseException) -> bool:
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(JAX_DIRS)


def classify(exc: BaseException) -> tuple[GuardErrorKind, str] | None:
    """(kind, JAX's detail text) when ``exc`` is one of those JAX errors,
    raised by JAX (a user's ``RuntimeError`` quoting such a text is not)."""
    if type(exc).__module__.split(".")[0] not in ("jax", "jaxlib", "builtins"):
        return None  # a user's or another library's exception class
    text = str(exc)
    if not (
        _raised_by_jax(exc)
        or (_XLA_DELETED in text and isinstance(exc, ValueError))
        or (isinstance(exc, _JAX_ERRORS) and "Disallowed " in text)
    ):
        # A warm jax.jit refuses a deleted buffer, or a numpy argument under
        # JAX's guard, in C++: no Python frame of JAX's is on the traceback, but
        # the wording of XLA's own error type is unmistakable.
        return None
    for marker, kind, types in _MARKERS:
        if marker in text and isinstance(exc, types):
            detail = (
                text.split(marker + ":", 1)[1].split(", dst_sharding")[0].strip()
                if marker + ":" in text
                else ""
            )
            return kind, detail
    return None


def debug_nans_kind(exc: BaseException) -> str | None:
    """``"nan"`` or ``"inf"`` when ``exc`` is the private error a compiled call
    raises under ``jax_debug_nans`` / ``jax_debug_infs`` (``jax.jit`` catches it
    to re-run its function op by op), recognised by its class name."""
    kind = type(exc)
    if kind.__name__ != "InternalFloatingPointError" or not kind.__module__.startswith("jax."):
        return None
    args = getattr(exc, "args", ())
    return str(args[1]) if len(args) > 1 else "nan"
