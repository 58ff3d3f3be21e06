"""``python -m jaxcontracts demo|info``: the command line. The demo is ``jaxcontracts.demo``."""

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxcontracts",
        description="jaxcontracts command line.",
        epilog="Run `python -m jaxcontracts demo --help` for the demo's options.",
    )
    text = (
        "demo: a particle simulation, its reports, and three planted regressions caught; "
        "info: versions and the private JAX mechanisms (capabilities) in force"
    )
    parser.add_argument("command", nargs="?", choices=["demo", "info"], metavar="COMMAND", help=text)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return 2
    if ns.command == "info":
        from ._info import info

        report = info()
        print(report)
        return 0 if report.ok else 1
    from .demo import main as demo

    return demo(ns.args)


if __name__ == "__main__":
    raise SystemExit(main())
