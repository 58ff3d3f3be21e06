"""The exception hierarchy.

Two families under one root, as in jaxtyping and beartype: `DefinitionError`
is raised while a decorator or a state class is being *defined* (misuse of the
API); the others are raised while a program *runs* and a contract is broken.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ContractError",
    "DefinitionError",
    "DonationError",
    "RecompileError",
    "SpecError",
    "TransferError",
]


class ContractError(Exception):
    """Root of every jaxcontracts error."""


class DefinitionError(ContractError, TypeError):
    """A decorator, option or annotation is misused (raised at definition)."""


class SpecError(ContractError, TypeError):
    """A value does not match the spec its annotation or call promises."""


class RecompileError(ContractError):
    """A call or a step would trace or compile again."""


class DonationError(ContractError):
    """A buffer was not donated as the step's contract says.

    Attributes:
        result: when raised *after* dispatch, the outputs of the call, so that
            nothing is lost; ``None`` when raised before dispatch.
    """

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result


class TransferError(ContractError):
    """An implicit transfer between host and device."""


for _cls in (
    ContractError,
    DefinitionError,
    SpecError,
    RecompileError,
    DonationError,
    TransferError,
):
    _cls.__module__ = "jaxcontracts"
del _cls
