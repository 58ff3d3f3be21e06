"""Named capabilities: each private mechanism the library relies on.

Each is probed once, lazily (probes never initialise a JAX backend). When one
is missing the library warns once (:class:`jaxcontracts.CapabilityWarning`,
naming what is no longer checked) and reports list the capabilities in force,
so nothing turns itself off silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .._errors import CapabilityWarning

__all__ = ["Capability", "capabilities", "capability", "define", "missing", "probe_in"]


@dataclasses.dataclass(frozen=True)
class Capability:
    """One private mechanism and whether it works on the installed versions.

    Attributes:
        name: short name, e.g. ``"array-read-hooks"``.
        mechanism: the private mechanism it uses.
        checks: what the library checks thanks to it.
        available: whether the probe found it working.
        detail: why it is missing (empty when available).
    """

    name: str
    mechanism: str
    checks: str
    available: bool
    detail: str = ""


@dataclasses.dataclass
class _Definition:
    mechanism: str
    checks: str
    probe: Callable[[], str | None]  # None: available; else why it is missing


_definitions: dict[str, _Definition] = {}
_results: dict[str, Capability] = {}
_warned: set[str] = set()
_lock = threading.Lock()
_probe_context: list[Callable[[], AbstractContextManager[Any]]] = []


def probe_in(context: Callable[[], AbstractContextManager[Any]]) -> None:
    """Run every probe inside ``context()``: a probe first asked for inside the
    user's ``jc.hot_loop`` runs as library code, not as the loop's body, whose
    refusal would both fail the loop and switch the capability off."""
    _probe_context[:] = [context]


def define(
    name: str, mechanism: str, checks: str
) -> Callable[[Callable[[], str | None]], Callable[[], str | None]]:
    """Register a capability's probe (a decorator; the probe returns why it fails or None)."""

    def register(probe: Callable[[], str | None]) -> Callable[[], str | None]:
        _definitions[name] = _Definition(mechanism, checks, probe)
        return probe

    return register


def capability(name: str) -> Capability:
    """Probe one capability (once) and return it; warn once if it is missing."""
    found = _results.get(name)
    if found is not None:
        return found
    definition = _definitions[name]
    try:
        with _probe_context[0]() if _probe_context else contextlib.nullcontext():
            why = definition.probe()
    except Exception as e:  # noqa: BLE001 - a probe that breaks means it is missing
        why = f"its probe failed: {type(e).__name__}: {e}"
    found = Capability(name, definition.mechanism, definition.checks, why is None, why or "")
    with _lock:
        _results.setdefault(name, found)
    if why is not None:
        missing(name, why)
    return found


def missing(name: str, why: str) -> None:
    """Warn, once per capability, that a mechanism is missing."""
    with _lock:
        if name in _warned:
            return
        _warned.add(name)
    checks = _definitions[name].checks if name in _definitions else "?"
    warnings.warn(
        f"jaxcontracts: capability {name!r} is not available on the installed "
        f"versions ({why}), so this is no longer checked: {checks}. Reports list "
        "the capabilities in force (python -m jaxcontracts info).",
        CapabilityWarning,
        stacklevel=3,
    )


def capabilities() -> tuple[Capability, ...]:
    """Every capability, probed, in definition order."""
    return tuple(capability(name) for name in _definitions)
