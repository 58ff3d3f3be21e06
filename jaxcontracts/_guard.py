"""Hooks between hot steps and ``jc.hot_loop`` critical sections.

``note_compile`` is called by a hot_step before it traces a new signature;
``consumed_by`` names the step that consumed a donated array.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["consumed_by", "note_compile", "record_consumed"]

_consumers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def note_compile(name: str) -> None:
    """Called before a hot_step compiles (a hot_loop makes this an error)."""


def record_consumed(leaves: Any, step_name: str) -> None:
    """Remember which step consumed these donated arrays (for messages)."""


def consumed_by(x: Any) -> str | None:
    """The step that consumed ``x`` by donation, when known."""
    return None
