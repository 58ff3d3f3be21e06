"""``python -m jaxcontracts demo|info|audit|explain``: the command line (``jaxcontracts.demo``, ``_audit.cli``, ``_explain``)."""

import argparse
from collections.abc import Sequence

_HELP = (
    "demo: planted regressions; info: versions, capabilities; audit SCRIPT.py: what its jax.jit "
    "code should fix (recompiles, host reads, donations); explain NAME: an error's page, offline"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxcontracts", epilog="demo|audit --help: their options")
    parser.add_argument("command", nargs="?", choices=["demo", "info", "audit", "explain"], metavar="COMMAND", help=_HELP)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.command == "info":
        from ._info import info

        print(report := info())
        return 0 if report.ok else 1
    if ns.command == "explain":
        from ._explain import explain, topics

        if len(ns.args) != 1:
            print("python -m jaxcontracts explain NAME, where NAME is one of:\n  " + "\n  ".join(topics()))
            return 2
        try:
            print(explain(ns.args[0]))
        except KeyError as err:
            print(err.args[0])
            return 2
        return 0
    if ns.command in ("demo", "audit"):
        from ._audit.cli import main as audit
        from .demo import main as demo

        return (demo if ns.command == "demo" else audit)(ns.args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
