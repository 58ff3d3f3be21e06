"""``python -m jaxcontracts demo|info|audit``: the command line (the demo is
``jaxcontracts.demo``, the audit ``jaxcontracts._audit.cli``)."""

import argparse
from collections.abc import Sequence

_HELP = (
    "demo: a simulation with planted regressions; info: versions and capabilities; "
    "audit SCRIPT.py: run a script unchanged and list what its jax.jit code should fix"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxcontracts", epilog="demo --help: its options")
    parser.add_argument("command", nargs="?", choices=["demo", "info", "audit"], metavar="COMMAND", help=_HELP)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.command == "info":
        from ._info import info

        print(report := info())
        return 0 if report.ok else 1
    if ns.command == "audit":
        from ._audit.cli import main as audit

        return audit(ns.args)
    if ns.command == "demo":
        from .demo import main as demo

        return demo(ns.args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
