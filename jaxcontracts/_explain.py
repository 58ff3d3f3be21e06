"""Help that resolves offline: ``python -m jaxcontracts explain DonationError``
(or ``jc.explain(err)``) prints the section of ``_pages/errors.md`` a message
points to, as ``rustc --explain`` does; ``docs/errors.md`` includes the file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from functools import cache
from importlib import resources

from ._errors import CONTRACTS, VIOLATIONS, error_name

__all__ = ["Explanation", "explain", "main"]

_HEADING = re.compile(r"^(#{2,3}) (.*?)\s*\{#([\w-]+)\}\s*$", re.MULTILINE)
_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")
_ANCHOR = re.compile(r"\s*\{#[\w-]+\}[ \t]*$", re.MULTILINE)


@cache
def _page() -> str:
    return (
        resources.files("jaxcontracts").joinpath("_pages", "errors.md").read_text(encoding="utf-8")
    )


@cache
def _sections() -> dict[str, tuple[str, str]]:
    """anchor -> (title, markdown from its heading to the next one as deep or less)."""
    page = _page()
    heads = list(_HEADING.finditer(page))
    out: dict[str, tuple[str, str]] = {}
    for i, head in enumerate(heads):
        depth = len(head.group(1))
        end = next((h.start() for h in heads[i + 1 :] if len(h.group(1)) <= depth), len(page))
        body = page[head.end() : end].strip("\n")
        out[head.group(3)] = (head.group(2), f"{head.group(1)} {head.group(2)}\n\n{body}\n")
    return out


def _anchor(name: str) -> str | None:
    """The page's anchor for a class, anchor, violation kind or contract key."""
    key = name.strip().lower()
    sections = _sections()
    if key in sections:
        return key
    kind = VIOLATIONS.get(key) or VIOLATIONS.get(key.replace("-", "_"))
    contract = CONTRACTS.get(key if kind is None else kind.contract) or next(
        (c for c in CONTRACTS.values() if key.replace("-", "_") in c.findings), None
    )  # an audit finding's kind (host_sync): the contract it breaks
    if contract is not None and contract.key in sections:  # a section of its own
        return contract.key
    if contract is not None and contract.error.__name__.lower() in sections:
        return contract.error.__name__.lower()
    return None


def topics() -> list[str]:
    """What ``explain`` takes: the page's sections, the violation kinds, the
    contract keys, the audit's finding kinds."""
    names = [
        title if title.isidentifier() else anchor for anchor, (title, _) in _sections().items()
    ]
    findings = [kind for c in CONTRACTS.values() for kind in c.findings]
    return list(dict.fromkeys([*names, *VIOLATIONS, *CONTRACTS, *findings]))


@dataclasses.dataclass(frozen=True)
class Explanation:
    """One section of the errors page: plain text in a terminal, markdown in a notebook."""

    name: str
    markdown: str

    def __str__(self) -> str:
        return re.sub(r"^#{2,3} ", "", self._repr_markdown_(), flags=re.MULTILINE)

    def _repr_markdown_(self) -> str:  # without links (relative to the site) and anchors
        return _ANCHOR.sub("", _LINK.sub(r"\1", self.markdown))

    def __repr__(self) -> str:
        return str(self)


def explain(what: object) -> Explanation:
    """The section of the errors page on ``what``: an error raised by
    jaxcontracts (or its class), or a name: an error class
    (``"DonationError"``), a kind of loop violation (``"transfer"``), a
    contract key (``"donation-hazard"``) or a section (``"kept-reference"``).

    Args:
        what: the error, its class, or a name.

    Returns:
        An :class:`Explanation`: text in a terminal, rendered in a notebook.

    Raises:
        KeyError: for a name the page has no section on (the message lists those it has).

    Examples:
        >>> import jaxcontracts as jc
        >>> str(jc.explain("transfer")).splitlines()[0]
        'TransferError'
        >>> str(jc.explain("kept-reference")).splitlines()[0]
        'Kept references'
    """
    if isinstance(what, BaseException):
        what = type(what)
    if isinstance(what, type):
        what = error_name(what) or what.__name__
    name = str(what)
    anchor = _anchor(name)
    if anchor is None:
        raise KeyError(f"no section on {name!r}; the errors page explains: {', '.join(topics())}")
    return Explanation(name, _sections()[anchor][1])


def main(args: list[str]) -> int:
    """``python -m jaxcontracts explain NAME``: the section, or what there is (2)."""
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(
            "python -m jaxcontracts explain NAME, where NAME is one of:\n  " + "\n  ".join(topics())
        )
        return 0 if args in (["-h"], ["--help"]) else 2
    try:
        print(explain(args[0]), flush=True)
    except KeyError as err:
        print(err.args[0])
        return 2
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as Python's docs advise
    return 0
