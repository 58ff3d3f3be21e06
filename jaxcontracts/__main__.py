"""``python -m jaxcontracts demo|info``: the command line (the demo is ``jaxcontracts.demo``)."""

import argparse
from collections.abc import Sequence

_HELP = "demo: a simulation with planted regressions; info: versions and capabilities"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxcontracts", epilog="demo --help: its options")
    parser.add_argument("command", nargs="?", choices=["demo", "info"], metavar="COMMAND", help=_HELP)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.command == "info":
        from ._info import info

        print(report := info())
        return 0 if report.ok else 1
    if ns.command == "demo":
        from .demo import main as demo

        return demo(ns.args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
