"""The exception hierarchy, and the one place where messages are assembled.

Every error carries structured fields (``contract``, ``step``, ``leaves``,
``fix``) that reports read, never the text. Each contract is one
:class:`Contract`, declared (:func:`declare`) in its module under
``_contracts``; :data:`CONTRACTS`, :data:`VIOLATIONS` and :func:`loop_options`
derive from them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "CONTRACTS",
    "VIOLATIONS",
    "INPUTS_INTACT",
    "MAX_DETAIL_LINES",
    "NOTHING_RAN",
    "CapabilityWarning",
    "Contract",
    "ContractError",
    "DefinitionError",
    "DonatedArrayError",
    "DonationError",
    "RecompileError",
    "SpecError",
    "TransferError",
    "compose",
    "contract_of_finding",
    "declare",
    "docs_pointer",
    "error_name",
    "hooked",
    "loop_options",
    "violation_summary",
]

INPUTS_INTACT = "The call did not run; your inputs are intact."

#: The documentation site (mkdocs.yml's ``site_url``). Messages point at the
#: offline page; ``JAXCONTRACTS_DOCS_URL`` adds a copy of the site to open.
DOCS_URL = "https://jaxcontracts.readthedocs.io/en/stable/"
#: The errors page on that site (jaxcontracts/_pages/errors.md, which docs/errors.md includes).
DOCS_ERRORS = "errors/"


def error_name(cls: type) -> str | None:
    """The name of the nearest jaxcontracts error class in ``cls``'s MRO (a
    user's subclass is explained by its jaxcontracts parent)."""
    return next(
        (
            k.__name__
            for k in cls.__mro__
            if k.__module__ == "jaxcontracts" and k.__name__ in __all__
        ),
        None,
    )


def docs_pointer(cls: type) -> str:
    """``See: python -m jaxcontracts explain TransferError`` (offline), and the
    section on ``JAXCONTRACTS_DOCS_URL``'s site where set (anchor ``{#name}``;
    ``tests/test_explain.py`` checks each resolves)."""
    name = error_name(cls) or "ContractError"
    base = os.environ.get("JAXCONTRACTS_DOCS_URL")
    if base and not base.endswith("/"):
        base += "/"
    site = f" (or {base}{DOCS_ERRORS}#{name.lower()})" if base else ""
    return f"See: python -m jaxcontracts explain {name}{site}"


NOTHING_RAN = "Nothing has run yet."


#: A message shows at most this many detail lines (the rest: "... and N more").
MAX_DETAIL_LINES = 20
#: and cuts a summary or detail line longer than this (one naming 10,000 leaves).
MAX_LINE = 600


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    return f"{line[: MAX_LINE - 40]}... ({len(line) - MAX_LINE + 40:,} more characters)"


def compose(summary: str, details: Sequence[str] = (), fix: str = "", note: str = "") -> str:
    """The message anatomy: summary, details, ``Fix:``, note (each optional),
    bounded whatever the state's size; the whole list stays on the error."""
    detail_lines = [line for d in details for line in d.split("\n")]
    hidden = len(detail_lines) - MAX_DETAIL_LINES
    if hidden > 0:
        detail_lines = detail_lines[:MAX_DETAIL_LINES]
        detail_lines.append(f"  ... and {hidden:,} more lines (all of them: the error's .details)")
    lines = [_clip(line) for line in (*summary.split("\n"), *detail_lines)]
    if fix:
        lines.append(f"Fix: {fix}")
    if note:
        lines.append(note)
    return "\n".join(lines)


class ContractError(Exception):
    """Root of every jaxcontracts error.

    Attributes:
        contract: which contract was broken (a key of
            ``jaxcontracts._errors.CONTRACTS``, e.g. ``"no-transfer"``).
        step: the hot step's ``module.qualname``, when a step is involved.
        leaves: the leaf paths involved (``s.pos``, ``['t']``), if any.
        fix: the suggested fix, also the message's ``Fix:`` line.
        details: every detail line (the message shows the first
            ``MAX_DETAIL_LINES`` of them).
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
        fix_in_details: bool = False,
    ) -> None:
        # ``fix_in_details``: the details say each leaf's fix (no ``Fix:`` line).
        shown_fix = "" if fix_in_details else fix
        super().__init__(
            compose(summary, details, shown_fix, note) + "\n" + docs_pointer(type(self))
        )
        self.contract = contract or self.default_contract
        self.details = tuple(details)
        self.step = step
        self.leaves = tuple(leaves)
        self.fix = fix

    def add_note(self, note: str, /) -> None:
        # not JAX's "removed its internal frames" note: ours ends at the user's line
        if note.startswith("--------------------\nFor simplicity, JAX has removed"):
            return
        super().add_note(note)

    @property
    def contract_name(self) -> str:
        """The sentence a report shows for this error's contract."""
        info = CONTRACTS.get(self.contract)
        return info.sentence if info is not None else self.contract


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

    def __init__(
        self, summary: str, details: Sequence[str] = (), *, result: Any = None, **fields: Any
    ) -> None:
        super().__init__(summary, details, **fields)
        self.result = result


class DonatedArrayError(DonationError, RuntimeError):
    """A donated array used after the call that consumed it, outside a hot
    loop: still the ``RuntimeError`` JAX raises there, with the leaf and the
    step named."""


class TransferError(ContractError):
    """An implicit transfer between host and device."""

    default_contract = "no-transfer"


@dataclasses.dataclass(frozen=True)
class Contract:
    """One contract, declared once (:func:`declare`): its words, its error,
    what a ``jc.hot_loop`` calls breaking it, the loop option that switches it,
    and its optional hooks (ARCHITECTURE.md, "Adding a contract"):

    * ``scan(name, closed_jaxpr)``: at each compile (of a hot step, or of a
      plain ``jax.jit`` in a loop that ``wanted(loop)``), what the program
      holds that the contract is about (a tuple, empty where nothing);
    * ``refuse(loop, name, found)``: before a call whose compile found
      something, inside ``loop``: raise or record the violation;
    * ``fact(found)``: a (name, text) line of the step's report, or None;
    * ``verdict(cs, stats)``: its row in a hot step's report: (held, detail,
      a suffix to the row's name, why it is unchecked where it is).
    """

    key: str
    sentence: str
    error: type[ContractError]
    # (kind, title): what a jc.hot_loop raises or records
    violations: tuple[tuple[str, str], ...] = ()
    option: str = ""  # the jc.hot_loop keyword that switches it
    choices: tuple[str, ...] = ()  # that keyword's values, its default first
    row: str = ""  # a hot step report's row, where it differs from the sentence
    findings: tuple[str, ...] = ()  # the audit's finding kinds that break it (jc.watch())
    # whether a loop needs a plain jax.jit's program scanned
    wanted: Callable[[Any], bool] | None = None
    scan: Callable[[str, Any], tuple[Any, ...]] | None = None
    refuse: Callable[[Any, str, tuple[Any, ...]], None] | None = None
    fact: Callable[[tuple[Any, ...]], tuple[str, str] | None] | None = None
    verdict: Callable[[Any, Any], tuple[bool, str, str, str]] | None = None


@dataclasses.dataclass(frozen=True)
class ViolationKind:
    """One kind of loop violation (derived from its :class:`Contract`)."""

    title: str
    contract: str

    @property
    def contract_name(self) -> str:
        return CONTRACTS[self.contract].sentence

    @property
    def error(self) -> type[ContractError]:
        return CONTRACTS[self.contract].error


#: Every contract, by key (``ContractError.contract``), in declaration order.
CONTRACTS: dict[str, Contract] = {}
#: Every kind of violation a ``jc.hot_loop`` raises or records (derived).
VIOLATIONS: dict[str, ViolationKind] = {}


def declare(contract: Contract) -> Contract:
    """Register ``contract``: every table that lists contracts reads it from here."""
    if contract.key in CONTRACTS:
        raise ValueError(f"contract {contract.key!r} is declared twice")
    CONTRACTS[contract.key] = contract
    for kind, title in contract.violations:
        VIOLATIONS[kind] = ViolationKind(title, contract.key)
    return contract


def contract_of_finding(kind: str) -> str:
    """The key of the contract an audit finding of ``kind`` breaks ("" if none)."""
    return next((c.key for c in CONTRACTS.values() if kind in c.findings), "")


def loop_options() -> dict[str, tuple[str, ...]]:
    """``jc.hot_loop``'s keywords and their values (the default first)."""
    return {
        **{c.option: c.choices for c in CONTRACTS.values() if c.option},
        "on_violation": ("raise", "record"),
    }


def hooked(hook: str) -> list[Contract]:
    """The contracts that declare ``hook`` (``"scan"``, ``"refuse"``, ``"fact"``, ``"verdict"``)."""
    return [c for c in CONTRACTS.values() if getattr(c, hook) is not None]


def violation_summary(kind: str, what: str, where: str, source: str = "") -> str:
    """``implicit transfer inside jc.hot_loop: float() of f32[]`` then
    ``  at loop.py:12:  x = float(s.t)``: a violation message's first lines."""
    return f"{VIOLATIONS[kind].title}: {what}\n  at {where}" + (f":  {source}" if source else "")


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
