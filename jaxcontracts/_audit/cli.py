"""``python -m jaxcontracts audit [--json PATH] [--strict] SCRIPT.py [ARGS...]``.

Runs the script unchanged inside a watch; the ranked findings go to stderr (and
``--json``'s file). The exit status is the script's, or 1 with ``--strict`` when
anything was found.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import boot

__all__ = ["main"]


def main(argv: Sequence[str], progress_every: float = 2.0, fresh: bool = False) -> int:
    """``fresh`` (the command line, on POSIX): run the script in this process anew
    (``os.execv`` of ``boot.py``); else here, where JAX is imported already."""
    parser = argparse.ArgumentParser(
        prog="python -m jaxcontracts audit",
        description="Run a script unchanged and list, ranked, what its JAX code does again "
        "and again: host reads that wait on the device (float(loss), print(x), np.asarray(x) "
        "in the loop), recompiles (leaf by leaf), missed or wrong donations, and host data "
        "copied to the device at each call; each with its line and the fix.",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the findings to PATH as a JSON list"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 on any finding (for CI)")
    parser.add_argument("script", help="the script to run, as `python SCRIPT.py ARGS` would")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ns = parser.parse_args(list(argv))
    script = os.path.abspath(ns.script)
    if not os.path.isfile(script):
        parser.error(f"no such script: {ns.script}")
    json_path = os.path.abspath(ns.json) if ns.json else None  # the script may change its folder
    if fresh and os.name == "posix":
        sys.stdout.flush()
        sys.stderr.flush()
        args = [
            json_path or "",
            "1" if ns.strict else "0",
            str(progress_every),
            script,
            ns.script,
            *ns.args,
        ]
        os.execv(sys.executable, [sys.executable, *_interpreter_options(), boot.__file__, *args])
    from . import run  # here only: the command line's process imports no JAX before the script

    started: list[Any] = []  # (JAX is imported by now: begun before the script's first line)
    status, stopped = boot.run_script(
        script,
        ns.args,
        lambda: started.append(run.begin(progress_every)),
        fresh=False,
        argv0=ns.script,
    )
    return run.finish(started[0], status, stopped, json_path, ns.strict)


def _interpreter_options() -> list[str]:
    """This interpreter's options (``-W error``, ``-X dev``...), for the fresh one."""
    out, orig = [], list(getattr(sys, "orig_argv", []))[1:]
    i = 0
    while i < len(orig) and orig[i].startswith("-") and not orig[i].startswith(("-m", "-c")):
        takes_value = orig[i] in ("-W", "-X")
        out.extend(orig[i : i + 1 + takes_value])
        i += 1 + takes_value
    return out
