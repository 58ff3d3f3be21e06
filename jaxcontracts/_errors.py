"""The exception hierarchy, and the one place where messages are assembled.

Two families under one root, as in jaxtyping and beartype: `DefinitionError`
is raised while a decorator or a state class is being *defined* (misuse of the
API); the others are raised while a program *runs* and a contract is broken.

Every error carries structured fields: which contract (``contract``, a key of
:data:`CONTRACTS`), which step (``step``), which leaves (``leaves``) and the
fix (``fix``). Reports and the pytest plugin read these fields, never the
message text. Raise sites give the parts; :func:`compose` lays them out in one
fixed anatomy: the summary line, the detail lines (one per leaf or
parameter), ``Fix: ...``, then a note on what happened to the inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "CONTRACTS",
    "CapabilityWarning",
    "ContractError",
    "DefinitionError",
    "DonationError",
    "RecompileError",
    "SpecError",
    "TransferError",
    "compose",
    "docs_pointer",
]

#: Contract keys and the sentence a report shows for each.
CONTRACTS: dict[str, str] = {
    "definition": "the decorator, options and annotations are valid",
    "state-fields": "every field matches its annotation",
    "dims": "every dimension and static value is given",
    "carry": "carry invariance: each returned state keeps its input's spec",
    "aliasing": "donation verified in the executable",
    "signature": "arguments match a compiled signature",
    "device-arguments": "arguments are device arrays",
    "donation-hazard": "no donated buffer is stale or passed twice",
    "consumed": "every donated input consumed (XLA did not copy)",
    "no-transfer": "no implicit transfers",
    "no-compile": "no compiles",
    "no-donated-use": "no use of donated arrays",
}

INPUTS_INTACT = "The call did not run; your inputs are intact."

#: Where the errors page lives, relative to the repository (and the docs site).
DOCS_ERRORS = "docs/errors.md"


def docs_pointer(cls: type) -> str:
    """``See: docs/errors.md#transfererror``: the section on ``cls``'s errors page.

    The anchor is the lower-cased name of the nearest jaxcontracts class in
    ``cls``'s MRO (a user's subclass points to its jaxcontracts parent); the
    errors page pins each anchor with ``{#name}``, so a heading edit cannot
    break it. ``tests/test_docs.py`` checks every anchor exists.
    """
    for klass in cls.__mro__:
        if klass.__module__ == "jaxcontracts" and klass.__name__ in __all__:
            return f"See: {DOCS_ERRORS}#{klass.__name__.lower()}"
    return f"See: {DOCS_ERRORS}"
NOTHING_RAN = "Nothing has run yet."


def compose(summary: str, details: Sequence[str] = (), fix: str = "", note: str = "") -> str:
    """The message anatomy: summary, details, ``Fix:``, note (each optional)."""
    lines = [summary, *details]
    if fix:
        lines.append(f"Fix: {fix}")
    if note:
        lines.append(note)
    return "\n".join(lines)


class ContractError(Exception):
    """Root of every jaxcontracts error.

    Attributes:
        contract: which contract was broken (a key of ``jc.CONTRACTS``-style
            table in ``jaxcontracts._errors.CONTRACTS``).
        step: the hot step's ``module.qualname``, when a step is involved.
        leaves: the leaf paths involved (``s.pos``, ``['t']``), if any.
        fix: the suggested fix, also the message's ``Fix:`` line.
    """

    default_contract = "definition"

    def __init__(
        self,
        summary: str,
        details: Sequence[str] = (),
        *,
        fix: str = "",
        note: str = "",
        contract: str | None = None,
        step: str | None = None,
        leaves: Sequence[str] = (),
    ) -> None:
        # Every message ends with a pointer to its section of the errors page.
        super().__init__(compose(summary, details, fix, note) + "\n" + docs_pointer(type(self)))
        self.contract = contract or self.default_contract
        self.step = step
        self.leaves = tuple(leaves)
        self.fix = fix

    @property
    def contract_name(self) -> str:
        """The sentence a report shows for this error's contract."""
        return CONTRACTS.get(self.contract, self.contract)


class DefinitionError(ContractError, TypeError):
    """A decorator, option or annotation is misused (raised at definition)."""


class SpecError(ContractError, TypeError):
    """A value does not match the spec its annotation or call promises."""

    default_contract = "state-fields"


class RecompileError(ContractError):
    """A call or a step would trace or compile again."""

    default_contract = "signature"


class DonationError(ContractError):
    """A buffer was not donated as the step's contract says.

    Attributes:
        result: when raised *after* dispatch, the outputs of the call, so that
            nothing is lost; ``None`` when raised before dispatch.
    """

    default_contract = "donation-hazard"

    def __init__(self, summary: str, details: Sequence[str] = (), *, result: Any = None, **fields: Any) -> None:
        super().__init__(summary, details, **fields)
        self.result = result


class TransferError(ContractError):
    """An implicit transfer between host and device."""

    default_contract = "no-transfer"


class CapabilityWarning(UserWarning):
    """A private JAX/jaxtyping mechanism is missing, so something is not checked."""


for _cls in (
    ContractError,
    DefinitionError,
    SpecError,
    RecompileError,
    DonationError,
    TransferError,
    CapabilityWarning,
):
    _cls.__module__ = "jaxcontracts"
del _cls
