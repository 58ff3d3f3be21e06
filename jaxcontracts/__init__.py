"""jaxcontracts: contracts that keep host-driven JAX loops fast.

No device-to-host reads, every state buffer donated, no recompiles: checked
where it is cheapest and failing loudly, with the culprit named, on every
backend, CPU included.

The public names are re-exported lazily (PEP 562), so that importing the
package (the pytest plugin does, at pytest's start) does not import jax:
``JAX_*`` settings made afterwards still take effect.
"""

from __future__ import annotations

import importlib
import sys as _sys
from importlib.metadata import PackageNotFoundError as _PNF
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

# Light modules (no jax): imported now, so JAXCONTRACTS_CHECKS is validated at import.
from . import _config as _config
from . import (
    _contracts as _contracts,  # every contract declared (light: its hooks import JAX when they run)
)
from ._config import checks_level as checks_level
from ._config import get_checks as get_checks
from ._config import set_checks as set_checks
from ._errors import CapabilityWarning as CapabilityWarning
from ._errors import ContractError as ContractError
from ._errors import DefinitionError as DefinitionError
from ._errors import DonationError as DonationError
from ._errors import RecompileError as RecompileError
from ._errors import SpecError as SpecError
from ._errors import TransferError as TransferError

if TYPE_CHECKING:
    from ._audit.session import watch as watch
    from ._audit.watch import Finding as Finding
    from ._audit.watch import Watch as Watch
    from ._audit.watch import WatchReport as WatchReport
    from ._compat import Capability as Capability
    from ._compat import capabilities as capabilities
    from ._explain import Explanation as Explanation
    from ._explain import explain as explain
    from ._loop.fetch import Pending as Pending
    from ._loop.fetch import fetch as fetch
    from ._loop.fetch import fetch_async as fetch_async
    from ._loop.fetch import to_host as to_host
    from ._loop.guard import HotLoop as HotLoop
    from ._loop.guard import hot_loop as hot_loop
    from ._records import CompiledSignature as CompiledSignature
    from ._records import LeafRecord as LeafRecord
    from ._records import StepDescription as StepDescription
    from ._records import StepStats as StepStats
    from ._records import Violation as Violation
    from ._records import WarmupCompile as WarmupCompile
    from ._report.render import Report as Report
    from ._report.timing import LoopTiming as LoopTiming
    from ._report.timing import StepTiming as StepTiming
    from ._state.classes import State as State
    from ._state.classes import state as state
    from ._state.fields import static as static
    from ._state.foreign import Change as Change
    from ._state.foreign import Changes as Changes
    from ._state.foreign import device_tree as device_tree
    from ._state.spec import spec_of as spec_of
    from ._step.check import check as check
    from ._step.decorator import hot_step as hot_step
    from ._step.hot_step import HotStep as HotStep
    from ._testing.recorder import snapshot as snapshot
    from ._testing.snapshot import Snapshot as Snapshot
    from ._testing.snapshot import SnapshotDiff as SnapshotDiff

_EXPORTS = {
    "check": "_step.check",
    "Finding": "_audit.watch",
    "Watch": "_audit.watch",
    "WatchReport": "_audit.watch",
    "watch": "_audit.session",
    "Capability": "_compat",
    "capabilities": "_compat",
    "explain": "_explain",
    "Explanation": "_explain",
    "Change": "_state.foreign",
    "Changes": "_state.foreign",
    "device_tree": "_state.foreign",
    "HotLoop": "_loop.guard",
    "fetch": "_loop.fetch",
    "fetch_async": "_loop.fetch",
    "to_host": "_loop.fetch",
    "Pending": "_loop.fetch",
    "hot_loop": "_loop.guard",
    "HotStep": "_step.hot_step",
    "hot_step": "_step.decorator",
    "CompiledSignature": "_records",
    "LeafRecord": "_records",
    "StepDescription": "_records",
    "StepStats": "_records",
    "Violation": "_records",
    "WarmupCompile": "_records",
    "Report": "_report.render",
    "Snapshot": "_testing.snapshot",
    "SnapshotDiff": "_testing.snapshot",
    "snapshot": "_testing.recorder",
    "spec_of": "_state.spec",
    "LoopTiming": "_report.timing",
    "StepTiming": "_report.timing",
    "State": "_state.classes",
    "state": "_state.classes",
    "static": "_state.fields",
}
__all__ = sorted(
    [
        *_EXPORTS,
        "CapabilityWarning",
        "checks_level",
        "get_checks",
        "set_checks",
        "ContractError",
        "DefinitionError",
        "DonationError",
        "RecompileError",
        "SpecError",
        "TransferError",
    ]
)

try:
    __version__ = _version("jaxcontracts")
except _PNF:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"


# A bad JAXCONTRACTS_CHECKS fails the import, except when pytest loads the
# plugin (it imports this package in every run of the environment): then it
# fails where the library is first used.
if "_pytest.config" not in _sys.modules:
    _config.require_valid_env()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxcontracts' has no attribute {name!r}")
    _config.require_valid_env()
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
