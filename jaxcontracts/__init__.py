"""jaxcontracts: contracts that keep host-driven JAX loops fast.

No device-to-host reads, every state buffer donated, no recompiles: checked
where it is cheapest and failing loudly, with the culprit named, on every
backend, CPU included.
"""

from importlib.metadata import PackageNotFoundError as _PNF
from importlib.metadata import version as _version

from ._config import checks_level as checks_level
from ._config import get_checks as get_checks
from ._config import set_checks as set_checks
from ._errors import ContractError as ContractError
from ._errors import DefinitionError as DefinitionError
from ._errors import DonationError as DonationError
from ._errors import RecompileError as RecompileError
from ._errors import SpecError as SpecError
from ._errors import TransferError as TransferError
from ._guard import HotLoop as HotLoop
from ._guard import Violation as Violation
from ._guard import fetch as fetch
from ._guard import hot_loop as hot_loop
from ._hot_step import HotStep as HotStep
from ._hot_step import StepStats as StepStats
from ._hot_step import hot_step as hot_step
from ._report import Report as Report
from ._report import check as check
from ._spec import spec_of as spec_of
from ._state import state as state
from ._state import static as static

try:
    __version__ = _version("jaxcontracts")
except _PNF:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"
