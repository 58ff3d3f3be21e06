"""The command line, ``python -m jaxcontracts demo|info|audit|explain`` (modules: _COMMANDS)."""

import argparse
import importlib
from collections.abc import Sequence

_HELP = ("demo: planted regressions; info: versions, capabilities; audit SCRIPT.py: what its "
         "jax.jit code should fix (recompiles, host reads, donations); explain NAME: an error's "
         "page, offline")
_COMMANDS = {"demo": ".demo", "info": "._info", "audit": "._audit.cli", "explain": "._explain"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxcontracts",
                                     epilog="demo|audit --help: their options")
    parser.add_argument("command", nargs="?", choices=list(_COMMANDS), metavar="COMMAND",
                        help=_HELP)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(_COMMANDS[ns.command], "jaxcontracts")
    if ns.command == "audit":  # the script in a fresh process, where nothing imported JAX before it
        return module.main(ns.args, fresh=True)  # type: ignore[no-any-return]
    return module.main(ns.args)  # type: ignore[no-any-return]


if __name__ == "__main__":
    raise SystemExit(main())
