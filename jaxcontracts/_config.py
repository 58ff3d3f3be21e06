"""The checks level: ``JAXCONTRACTS_CHECKS=full|fast|off`` and a setter.

``full`` (default) runs every pre- and post-dispatch check, ``fast`` only the
pre-dispatch ones, ``off`` makes a hot_step a bare compiled call. Hot steps
pick their call path when the level changes (listeners), so the per-call path
never reads the level: ``set_checks`` tells every live step (``_steps``).
"""

from __future__ import annotations

import os
from typing import Literal

from . import _steps
from ._errors import DefinitionError

__all__ = ["CHECK_LEVELS", "checks_level", "get_checks", "require_valid_env", "set_checks"]

CheckLevel = Literal["full", "fast", "off"]
CHECK_LEVELS: tuple[str, ...] = ("full", "fast", "off")
_ENV = "JAXCONTRACTS_CHECKS"


def _validate(level: object, where: str) -> CheckLevel:
    if level not in CHECK_LEVELS:
        raise DefinitionError(
            f"{where} got {level!r}; valid levels are "
            + ", ".join(repr(v) for v in CHECK_LEVELS)
            + ".\n  full: every check before and after dispatch (default)."
            "\n  fast: the checks before dispatch only."
            "\n  off:  a hot_step is a bare compiled call."
        )
    return level  # type: ignore[return-value]


def _from_env() -> tuple[CheckLevel, DefinitionError | None]:
    try:
        return _validate(os.environ.get(_ENV, "full").strip().lower() or "full", f"the environment variable {_ENV}"), None
    except DefinitionError as e:
        return "full", e


# A bad JAXCONTRACTS_CHECKS is kept, not raised here: the pytest plugin imports
# this package in every pytest run of the environment, and a suite that never
# uses the library must not break. It is raised where the library is used
# (``require_valid_env``: importing jaxcontracts outside pytest, any public
# name, the level's getters and setters, the plugin's fixture, marker and
# --jc-checks).
_level, env_error = _from_env()


def require_valid_env() -> None:
    """Raise the DefinitionError of a bad ``JAXCONTRACTS_CHECKS``, if any."""
    if env_error is not None:
        raise env_error.with_traceback(None)


def get_checks() -> CheckLevel:
    """Return the current checks level (``"full"``, ``"fast"`` or ``"off"``)."""
    require_valid_env()
    return _level


def set_checks(level: CheckLevel) -> None:
    """Set the checks level for the whole process.

    Args:
        level: ``"full"``, ``"fast"`` or ``"off"``.

    Raises:
        DefinitionError: for any other value.

    Examples:
        >>> import jaxcontracts as jc
        >>> jc.set_checks("fast"); jc.get_checks()
        'fast'
        >>> jc.set_checks("full")
    """
    global _level
    require_valid_env()
    _level = _validate(level, "jc.set_checks()")
    _steps.checks_changed(_level)


class checks_level:
    """Context manager that sets the checks level and restores it on exit.

    Examples:
        >>> import jaxcontracts as jc
        >>> with jc.checks_level("off"):
        ...     jc.get_checks()
        'off'
    """

    def __init__(self, level: CheckLevel):
        require_valid_env()
        self._level = _validate(level, "jc.checks_level()")
        self._saved: list[CheckLevel] = []

    def __enter__(self) -> checks_level:
        self._saved.append(get_checks())
        set_checks(self._level)
        return self

    def __exit__(self, *exc: object) -> None:
        set_checks(self._saved.pop())
