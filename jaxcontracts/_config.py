"""The checks level: ``JAXCONTRACTS_CHECKS=full|fast|off`` and a setter.

The per-call path never reads the level: a change tells every live step
(``_steps``), which picks its call path for it.
"""

from __future__ import annotations

import os
import threading
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
    value = os.environ.get(_ENV, "full").strip().lower() or "full"
    try:
        return _validate(value, f"the environment variable {_ENV}"), None
    except DefinitionError as e:
        return "full", e


# A bad JAXCONTRACTS_CHECKS is kept, not raised here: the pytest plugin imports
# this package in every pytest run of the environment, and a suite that never
# uses the library must not break. ``require_valid_env`` raises it where the
# library is used.
_level, env_error = _from_env()


def require_valid_env() -> None:
    if env_error is not None:
        raise env_error.with_traceback(None)


def get_checks() -> CheckLevel:
    """Return the current checks level (``"full"``, ``"fast"`` or ``"off"``)."""
    require_valid_env()
    return _level


# Active checks_level blocks, any thread, in entry order: the level is the
# latest one's, else the one set_checks (or the environment) gave. A block's
# exit removes its own entry, so blocks on two threads ending in any order
# leave the level they found (restoring a saved value would not).
_lock = threading.Lock()
_base: CheckLevel = _level
_blocks: list[list[CheckLevel]] = []


def _apply() -> None:
    global _level
    level = _blocks[-1][0] if _blocks else _base
    if level != _level:
        _level = level
        _steps.checks_changed(level)


def set_checks(level: CheckLevel) -> None:
    """Set the checks level for the whole process (inside a ``checks_level``
    block: until that block ends).

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
    global _base
    require_valid_env()
    level = _validate(level, "jc.set_checks()")
    with _lock:
        if _blocks:
            _blocks[-1][0] = level
        else:
            _base = level
        _apply()


class checks_level:
    """Context manager that sets the checks level until it exits.

    Blocks may overlap on several threads and end in any order: the level is
    the latest active block's, else the one ``set_checks`` gave.

    Examples:
        >>> import jaxcontracts as jc
        >>> with jc.checks_level("off"):
        ...     jc.get_checks()
        'off'
    """

    def __init__(self, level: CheckLevel):
        require_valid_env()
        self._level = _validate(level, "jc.checks_level()")
        self._entries: list[list[CheckLevel]] = []

    def __enter__(self) -> checks_level:
        entry = [self._level]
        with _lock:
            self._entries.append(entry)
            _blocks.append(entry)
            _apply()
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            entry = self._entries.pop()
            for i in range(len(_blocks) - 1, -1, -1):
                if _blocks[i] is entry:
                    del _blocks[i]
                    break
            _apply()
