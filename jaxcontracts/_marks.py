"""The marks jaxcontracts puts on states and state classes, in one place.

Every mark starts with :data:`PREFIX`, so that pickling and copying a state
drop them all (:func:`without_marks`) and no mark leaks into a user's data.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CONSUMED_BY",
    "PREFIX",
    "STATE_INFO",
    "USER_POST_INIT",
    "consumer_of",
    "without_marks",
]

#: Every instance mark starts with this (dropped by pickles and copies).
PREFIX = "__jaxcontracts_"

CONSUMED_BY = PREFIX + "consumed_by__"  # on a consumed class: the step it was donated to
STATE_INFO = PREFIX + "state__"  # on a jc.state class: its field table
USER_POST_INIT = PREFIX + "user_post_init__"  # on our __post_init__: the user's own


def consumer_of(state: Any) -> str | None:
    """The hot step a state was last passed to with donation, if it was marked."""
    return getattr(type(state), CONSUMED_BY, None)


def without_marks(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not k.startswith(PREFIX)}
