"""``python -m jaxcontracts audit [--json PATH] [--strict] SCRIPT.py [ARGS...]``.

Runs the script as ``python SCRIPT.py ARGS`` would (``__name__ ==
"__main__"``, ``sys.argv``, its folder first on ``sys.path``), no line of it
changed, inside a :func:`~jaxcontracts._audit.watch.watch`; at its end the
ranked findings go to stderr (the script's stdout is untouched) and, with
``--json``, to a file. The exit status is the script's, or 1 with
``--strict`` when anything was found.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Sequence

from .session import watch

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxcontracts audit",
        description="Run a script unchanged and list what its jax.jit code recompiles, "
        "fails to donate and copies from the host.",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the findings to PATH as a JSON list")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any finding (for CI)")
    parser.add_argument("script", help="the script to run, as `python SCRIPT.py ARGS` would")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ns = parser.parse_args(list(argv))
    script = os.path.abspath(ns.script)
    if not os.path.isfile(script):
        parser.error(f"no such script: {ns.script}")
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(script))
    status = 0
    w = watch(loops=False)  # the script's own loops behave as they would alone
    try:
        with w:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exc:
                code = exc.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
                if code is not None and not isinstance(code, int):
                    print(code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - the script's own failure: printed as Python would
                traceback.print_exc()
                status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    report = w.report()
    sys.stdout.flush()
    print(report, file=sys.stderr)
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as fh:
            fh.write(report.to_json() + "\n")
    if ns.strict and not report.ok:
        return 1
    return status
