"""Consumed states: a ``jc.state`` donated to a hot step takes a subclass made
once per (state class, step), so the change is one ``__class__`` store per
call; the class names the step (``_marks.CONSUMED_BY``) for every message."""

from __future__ import annotations

from typing import Any

import jax

from .._contracts.donation import donation_fix
from .._errors import DonationError
from .._format import fmt_aval
from .._hazards import holds_deleted
from .._marks import CONSUMED_BY
from .._runtime import local
from .._state.fields import info_of, register_pytree
from .._tracebacks import trim

__all__ = ["consumed_class"]


_consumed: dict[tuple[type, str], type] = {}


def consumed_class(cls: type, step: str) -> type:
    """The class a ``cls`` instance takes once ``step`` donated its buffers: same
    name and layout (a tree_map over it rebuilds a plain ``cls``); reading a
    donated field raises a DonationError naming the step and the field."""
    key = (cls, step)
    made = _consumed.get(key)
    if made is None:
        made = _consumed[key] = _make_consumed(cls, step)
    return made


def _make_consumed(cls: type, step: str) -> type:
    info = info_of(cls)
    data = frozenset(info.data_names)
    get = object.__getattribute__

    def __getattribute__(self: Any, name: str) -> Any:
        value = get(self, name)
        if name in data and holds_deleted(value):
            __tracebackhide__ = True
            what = (
                fmt_aval(value.shape, value.dtype) if isinstance(value, jax.Array) else "its arrays"
            )
            summary = (
                f"{cls.__name__}.{name}: {what} was donated to {step} and no longer exists "
                f"(this {cls.__name__} was passed to {step}, which reused its buffers)."
            )
            fix = donation_fix("read", step, value=name)
            loop = local.loop
            try:
                if loop is None or local.allow:
                    raise DonationError(
                        summary, fix=fix, contract="no-donated-use", step=step, leaves=[f".{name}"]
                    )
                # In a hot loop: its violation, at the user's line (recorded, in
                # record mode, and the deleted value returned as JAX would).
                loop.violation("donation", summary, fix)
            except DonationError as err:  # the traceback ends at the user's line
                trim(err)
                raise
        return value

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        raise DonationError(
            f"this {cls.__name__} was donated to {step}: its arrays no longer exist, "
            "so it cannot be pickled or copied.",
            fix=donation_fix("use", step),
            contract="no-donated-use",
            step=step,
        )

    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        # type(s)(...) and replace() on a consumed state build a plain, validated
        # one (replace() reads, and so refuses, the fields it does not change).
        return cls(*args, **kwargs)

    made = type(cls)(
        cls.__name__,
        (cls,),
        {
            "__new__": __new__,
            "__slots__": (),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "__getattribute__": __getattribute__,
            "__reduce_ex__": __reduce_ex__,
            CONSUMED_BY: step,
        },
    )
    register_pytree(made, info, via_dict=True, rebuild=cls)
    return made

