"""A read of a deleted array outside a hot loop's interceptors, worded as a donation:
once a hot step has donated, JAX's ``ArrayImpl._check_if_deleted`` is hooked
(``_compat.arrays``) to say what happened instead of "Array has been deleted"."""

from __future__ import annotations

from typing import Any

from .. import _steps
from .._compat import frames
from .._contracts.donation import donation_fix
from .._errors import DonatedArrayError
from .._format import fmt_aval
from .._runtime import arrays_named, donated, local
from .._userline import user_frame

__all__ = ["consumed_wait", "deleted_read"]


def deleted_read(x: Any) -> Exception | None:
    """The error for a use of ``x``, a deleted array, named by its path in the
    user's frame; None (JAX's own error) when nothing names it and no step
    donates. Inside a loop it is the loop's donation violation."""
    __tracebackhide__ = True
    frame = user_frame(frames.caller_frame(1))
    found = arrays_named(frame, frame.f_lineno, only=x, limit=1) if frame is not None else []
    by = _steps.consumed_by(x)
    if not found and by is None and not _steps.donating():
        return None  # nothing named, no step that donates: JAX's own error says as much
    path = found[0][0] if found else None
    summary = f"{f'`{path}`' if path else 'an array'} ({fmt_aval(x.shape, x.dtype)}) {donated(by)}."
    fix = donation_fix("use", by)
    loop = local.loop
    if loop is not None and not local.allow:
        loop.violation("donation", summary, fix)  # raises, or records (then JAX's error)
        return None
    return DonatedArrayError(
        summary, fix=fix, contract="no-donated-use", step=by, leaves=[path] if path else []
    )


def consumed_wait(x: Any) -> Exception | None:
    """The error for ``x.block_until_ready()`` of a deleted array: the
    donation's, only where a step's record says it consumed ``x`` (JAX's own
    error there is a ``JaxRuntimeError``, which an array deleted otherwise,
    by ``x.delete()`` or a plain ``jax.jit``'s donation, keeps)."""
    __tracebackhide__ = True
    by = _steps.consumed_by(x)
    return deleted_read(x) if by is not None and _steps.jit_donation(x) is None else None
