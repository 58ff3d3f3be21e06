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
import io
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Sequence
from typing import Any

from .session import watch

__all__ = ["main"]


class _Progress:
    """One line on a terminal's stderr while the script runs, rewritten in
    place every ``interval`` seconds (calls seen, jitted functions), cleared
    at the end; nothing where stderr is not a terminal (a log, CI, a pipe).
    It reads two counters of the watch: it never touches the device."""

    def __init__(self, w: Any, stream: Any, interval: float = 2.0) -> None:
        self.w, self.stream, self.interval = w, stream, interval
        self.stop = threading.Event()
        self.shown = False
        self.thread = threading.Thread(target=self._run, name="jaxcontracts-audit-progress", daemon=True)

    def __enter__(self) -> _Progress:
        isatty = getattr(self.stream, "isatty", None)
        if callable(isatty) and isatty():
            self.thread.start()
        return self

    def _run(self) -> None:
        start = time.monotonic()
        while not self.stop.wait(self.interval):
            calls, functions = self.w.calls, self.w.function_count
            self.stream.write(
                f"\r\x1b[Kjaxcontracts audit: {time.monotonic() - start:.0f} s, {calls:,} calls "
                f"of {functions} jitted function{'s' if functions != 1 else ''}"
            )
            self.stream.flush()
            self.shown = True

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _run_as_main(script: str) -> None:
    """Run the script as ``python SCRIPT.py`` does: in a module that is
    ``__main__`` from then on (``runpy.run_path`` puts the old one back as the
    body ends, where an ``atexit`` handler or a thread still running may
    pickle a class the script defined)."""
    with io.open_code(script) as fh:
        code = compile(fh.read(), script, "exec")
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __cached__=None, __loader__=None, __package__=None, __spec__=None)
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def main(argv: Sequence[str], progress_every: float = 2.0) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxcontracts audit",
        description="Run a script unchanged and list, ranked, what its JAX code does again "
        "and again: host reads that wait on the device (float(loss), print(x), np.asarray(x) "
        "in the loop), recompiles (leaf by leaf), missed or wrong donations, and host data "
        "copied to the device at each call; each with its line and the fix.",
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
    status, stopped = 0, None
    w = watch(loops=False)  # the script's own loops behave as they would alone
    try:
        with w, _Progress(w, sys.stderr, progress_every):
            try:
                _run_as_main(script)
            except SystemExit as exc:
                code = exc.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
                if code is not None and not isinstance(code, int):
                    print(code, file=sys.stderr)
            except BaseException as exc:  # noqa: BLE001 - the script's own failure: printed as Python would
                tb = exc.__traceback__  # from the script's first frame, as `python SCRIPT.py` shows it
                while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
                    tb = tb.tb_next
                traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
                status, stopped = 1, type(exc).__name__
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    report = w.report()
    report.stopped = stopped
    sys.stdout.flush()
    print(report, file=sys.stderr)
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as fh:
            fh.write(report.to_json() + "\n")
    if ns.strict and not report.ok:
        return 1
    return status
