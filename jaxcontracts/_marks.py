"""The marks jaxcontracts puts on states and state classes, in one place.

Each mark is a name in an object's (or a class's) ``__dict__``. Every mark an
instance carries starts with :data:`PREFIX`, so that pickling and copying a
state drop them all (:func:`without_marks`) and no mark can leak into a
user's data.

* :data:`CONSUMED_BY`: on a *consumed class* (``_consumed``), the name of the
  step a state of that class was donated to.
* :data:`STATE_INFO`: on a ``jc.state`` class, its field table
  (``_fields.StateInfo``).
* :data:`USER_POST_INIT`: on the ``__post_init__`` jaxcontracts installs, the
  user's own ``__post_init__`` it calls.
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

CONSUMED_BY = PREFIX + "consumed_by__"
STATE_INFO = PREFIX + "state__"
USER_POST_INIT = PREFIX + "user_post_init__"


def consumer_of(state: Any) -> str | None:
    """The hot step a state was last passed to with donation, if it was marked."""
    return getattr(type(state), CONSUMED_BY, None)


def without_marks(d: dict[str, Any]) -> dict[str, Any]:
    """An instance ``__dict__`` without jaxcontracts' marks (for pickles and copies)."""
    return {k: v for k, v in d.items() if not k.startswith(PREFIX)}
