"""``jc.check``: compile a step for some arguments and report, never raising."""

from __future__ import annotations

from typing import Any

from .._errors import ContractError, DefinitionError
from .._format import fmt_error
from .._report.render import Report, error_contract, step_report
from .._tracebacks import boundary
from .._userline import traceback_where
from .hot_step import HotStep

__all__ = ["check"]


@boundary
def check(step: Any = None, *args: Any, **kwargs: Any) -> Report:
    """Compile ``step`` for these arguments (or specs) if needed and report.

    Never raises: a failing compile-time contract, a misuse (something that
    is not a hot step, the wrong number of arguments) or an error of the
    step's own function while it is traced (``s.x`` on an array passed for
    the state) appears in the report as a failed contract with its message.

    Args:
        step: a ``jc.hot_step``.
        *args: arguments or specs, as for ``step.compile``.
        **kwargs: keyword arguments or specs, as for ``step.compile``.

    Returns:
        A :class:`Report`; ``report.ok`` tells whether every contract holds.

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> @jc.hot_step
        ... def step(s: dict) -> dict:
        ...     return {"t": s["t"] + 1.0}
        >>> jc.check(step, {"t": jnp.int32(0)}).ok
        False
    """
    if not isinstance(step, HotStep):
        err = DefinitionError(
            "jc.check() takes a jc.hot_step, "
            f"got {type(step).__name__ if step is not None else 'nothing'}.",
            fix="pass the step and its arguments or specs: jc.check(step, State.spec(n=...)).",
        )
        return Report(title="jc.check", contracts=[error_contract(err)])
    try:
        step.compile(*args, **kwargs)
    except ContractError as err:
        return step_report(step.describe(), extra=[error_contract(err)])
    except TypeError as err:  # wrong number of arguments, from binding them
        wrapped = DefinitionError(str(err), fix="pass one argument or spec per parameter.")
        return step_report(step.describe(), extra=[error_contract(wrapped)])
    except Exception as err:  # noqa: BLE001 - the step's own code failed while it was traced
        at, text = traceback_where(err.__traceback__)
        wrapped = DefinitionError(
            f"{step.name} could not be traced for these arguments: its function raised "
            f"{fmt_error(err)}",
            [f"  at {at}" + (f":  {text}" if text else "")],
            fix="check the arguments are what the step takes (a state, not one of its "
            "arrays), or fix the function at that line.",
        )
        return step_report(step.describe(), extra=[error_contract(wrapped)])
    return step_report(step.describe())
