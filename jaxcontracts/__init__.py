"""jaxcontracts: contracts that keep host-driven JAX loops fast.

No device-to-host reads, every state buffer donated, no recompiles: checked
where it is cheapest and failing loudly, with the culprit named, on every
backend, CPU included.

The public names are re-exported lazily (PEP 562), so that importing the
package, or loading its pytest plugin at pytest's start, does not import jax:
``JAX_*`` settings made afterwards (in a conftest, say) still take effect.
"""

from __future__ import annotations

import importlib
import sys as _sys
from importlib.metadata import PackageNotFoundError as _PNF
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

# Light modules (no jax): imported now, so JAXCONTRACTS_CHECKS is validated
# at import.
from . import _config
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
    from ._check import check as check
    from ._compat import Capability as Capability
    from ._compat import capabilities as capabilities
    from ._decorator import hot_step as hot_step
    from ._fetch import fetch as fetch
    from ._fields import static as static
    from ._foreign import Change as Change
    from ._foreign import Changes as Changes
    from ._foreign import device_tree as device_tree
    from ._guard import HotLoop as HotLoop
    from ._guard import hot_loop as hot_loop
    from ._hot_step import HotStep as HotStep
    from ._recorder import snapshot as snapshot
    from ._records import CompiledSignature as CompiledSignature
    from ._records import LeafRecord as LeafRecord
    from ._records import StepDescription as StepDescription
    from ._records import StepStats as StepStats
    from ._records import Violation as Violation
    from ._records import WarmupCompile as WarmupCompile
    from ._report import Report as Report
    from ._snapshot import Snapshot as Snapshot
    from ._snapshot import SnapshotDiff as SnapshotDiff
    from ._spec import spec_of as spec_of
    from ._state import State as State
    from ._state import state as state
    from ._timing import LoopTiming as LoopTiming
    from ._timing import StepTiming as StepTiming

_EXPORTS = {
    "check": "_check",
    "Capability": "_compat",
    "capabilities": "_compat",
    "Change": "_foreign",
    "Changes": "_foreign",
    "device_tree": "_foreign",
    "HotLoop": "_guard",
    "fetch": "_fetch",
    "hot_loop": "_guard",
    "HotStep": "_hot_step",
    "hot_step": "_decorator",
    "CompiledSignature": "_records",
    "LeafRecord": "_records",
    "StepDescription": "_records",
    "StepStats": "_records",
    "Violation": "_records",
    "WarmupCompile": "_records",
    "Report": "_report",
    "Snapshot": "_snapshot",
    "SnapshotDiff": "_snapshot",
    "snapshot": "_recorder",
    "spec_of": "_spec",
    "LoopTiming": "_timing",
    "StepTiming": "_timing",
    "State": "_state",
    "state": "_state",
    "static": "_fields",
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
