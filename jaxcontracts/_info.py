"""``python -m jaxcontracts info``: versions, the contracts, and the capabilities in force."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from . import _contracts  # noqa: F401 - every contract declared
from ._compat import capabilities
from ._errors import CONTRACTS
from ._report.render import Contract, Report

__all__ = ["info", "main"]

_PACKAGES = ("jaxcontracts", "jax", "jaxlib", "jaxtyping", "beartype", "numpy")


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def info() -> Report:
    """A report of the installed versions and every capability, probed (a
    missing one is a failed row saying what is no longer checked)."""
    import jax

    report = Report(title="jaxcontracts info")
    report.facts = [(name, _version(name)) for name in _PACKAGES]
    report.facts += [("python", platform.python_version()), ("backend", jax.default_backend())]
    report.facts.append((
        "contracts",
        ", ".join(
            c.key + (f" (jc.hot_loop({c.option}=...))" if c.option else "")
            for c in CONTRACTS.values()
        ),
    ))
    report.contracts = [
        Contract(
            f"{c.name}: {c.mechanism}",
            c.available,
            f"checks {c.checks}"
            if c.available
            else f"MISSING ({c.detail}): no longer checked: {c.checks}",
        )
        for c in capabilities()
    ]
    return report


def main(args: list[str]) -> int:
    """``python -m jaxcontracts info``: the report; 1 where a capability is missing."""
    if args:
        print("python -m jaxcontracts info: the versions, the checks level and each capability "
              "in force (exit status 1 where one is missing); it takes no arguments")
        return 0 if args[0] in ("-h", "--help") else 2
    print(report := info())
    return 0 if report.ok else 1
