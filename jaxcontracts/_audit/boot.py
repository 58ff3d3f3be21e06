"""How the audit runs a script as ``python SCRIPT.py`` would, JAX included.

JAX reads its environment (``JAX_PLATFORMS``, ...) when imported, so nothing may
import it before the script's first line: on POSIX the command line ``os.execv``s
this file, which imports the standard library only, runs the script, begins the
watch once the script's own ``import jax`` has finished, and reports as the
process exits (after the script's threads and exit handlers).
"""

from __future__ import annotations

import atexit
import builtins
import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import signal
import sys
import threading
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["run_script"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Calls ``begin`` once the outermost import of ``jax`` or this package has
    finished; finds this package at its own folder (the script and audit share it)."""

    def __init__(self, begin: Callable[[], None], package: bool) -> None:
        self.begin, self.package = begin, package
        self.pending, self.depth = True, 0
        self.loaders: dict[str, Any] = {}

    def find_spec(
        self, name: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name == "jaxcontracts" and self.package:
            spec = importlib.util.spec_from_file_location(
                name, os.path.join(_PACKAGE_DIR, "__init__.py"),
                submodule_search_locations=[_PACKAGE_DIR],
            )
        elif name == "jax" and self.pending:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        else:
            return None
        if spec is not None and spec.loader is not None and self.pending:
            self.loaders[name] = spec.loader
            spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loaders[spec.name].create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        loader = self.loaders[module.__name__]
        module.__loader__ = loader
        if module.__spec__ is not None:
            module.__spec__.loader = loader
        self.depth += 1
        try:
            loader.exec_module(module)
        finally:
            self.depth -= 1
        if self.depth == 0 and self.pending:
            self.pending = False
            self.begin()


def run_script(
    script: str, args: Sequence[str], begin: Callable[[], None], fresh: bool,
    argv0: str | None = None,
) -> tuple[int, str | None]:
    """Run ``script`` (an absolute path) as ``python SCRIPT.py ARGS`` does; ``begin``
    runs once JAX is imported. ``fresh``: this process is the script's own (nothing
    restored after it). Returns the exit status and the name of the exception that
    stopped the script, if one did."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [argv0 or script, *args]
    if fresh and sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this file's folder, which `python SCRIPT.py` would not have
    if not sys.flags.safe_path:
        sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    hook = _AfterImport(begin, package=fresh)
    if fresh or "jax" not in sys.modules:
        sys.meta_path.insert(0, hook)
    if "jax" in sys.modules:
        hook.pending = False
        begin()
    status, stopped = 0, None
    others = set(threading.enumerate())  # (in this process already: not the script's to wait for)
    try:
        try:
            with io.open_code(script) as fh:  # (none of this file's __future__ imports)
                code = compile(fh.read(), script, "exec", dont_inherit=True)
            module = types.ModuleType("__main__")
            module.__dict__.update(
                __file__=script, __cached__=None, __loader__=None, __package__=None, __spec__=None,
                __builtins__=builtins,
            )
            sys.modules["__main__"] = module  # and from then on: atexit handlers pickle its classes
            exec(code, module.__dict__)
        finally:
            # in its own process Python waits for them as it exits (thread pools first)
            for thread in threading.enumerate() if not fresh else ():
                if not thread.daemon and thread not in others and thread.is_alive():
                    thread.join()
    except SystemExit as exc:
        code_ = exc.code
        status = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
        if code_ is not None and not isinstance(code_, int):
            print(code_, file=sys.stderr)
    # the script's own failure: reported as Python would
    except BaseException as exc:  # noqa: BLE001
        tb = exc.__traceback__  # from the script's first frame, as `python SCRIPT.py` shows it
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
            tb = tb.tb_next
        if tb is None and not isinstance(exc, SyntaxError):  # (a SyntaxError shows its line alone)
            tb = exc.__traceback__
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        status, stopped = 1, type(exc).__name__
    finally:
        if not fresh:
            sys.argv, sys.path[:] = saved_argv, saved_path
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
    return status, stopped


def _flush_open_files() -> None:
    """Flush the files the script left open, as the interpreter's exit would."""
    for obj in gc.get_objects():
        try:
            if isinstance(obj, io.IOBase) and not obj.closed and obj.writable():
                obj.flush()
        except Exception:  # noqa: BLE001, S112 - a file that cannot flush: as at Python's own exit
            continue


def _fresh(argv: Sequence[str]) -> None:
    """``boot.py JSON STRICT PROGRESS SCRIPT ARGV0 ARGS...`` (``JSON`` empty for none,
    ``STRICT`` 0 or 1). A script stopped by Ctrl-C ends as Python's does, by SIGINT."""
    json_path, strict, every, script, argv0, *args = argv
    started: list[Any] = []

    def begin() -> None:
        from jaxcontracts._audit import run

        started.append(run.begin(float(every)))

    outcome: list[tuple[int, str | None]] = []
    pid = os.getpid()

    def end() -> None:
        """The report, after the script's threads and exit handlers (registered after
        this one, so run before it); not in a child the script forked."""
        if os.getpid() != pid:
            return
        status, stopped = outcome[0] if outcome else (1, None)
        try:
            final = _finish(started, status, stopped, json_path, strict == "1")
        except BaseException:  # noqa: BLE001 - the audit's own failure: said, and a failed run
            traceback.print_exc()
            final = status or 1
        sys.stdout.flush()
        sys.stderr.flush()
        if stopped == "KeyboardInterrupt" and hasattr(signal, "SIGINT"):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        if final != status:  # --strict: Python would exit with the script's status
            _flush_open_files()  # what Python's own exit would write, os._exit skips
            os._exit(final)

    atexit.register(end)
    status, stopped = run_script(script, args, begin, fresh=True, argv0=argv0)
    outcome.append((status, stopped))
    sys.exit(status)


def _finish(
    started: list[Any], status: int, stopped: str | None, json_path: str, strict: bool
) -> int:
    """The report and the exit status. JAX is not imported for a script that never
    did: the import can write to stderr and set environment variables."""
    if started:
        from jaxcontracts._audit import run

        return run.finish(started[0], status, stopped, json_path or None, strict)
    sys.stdout.flush()
    print(
        "jaxcontracts audit: 0 finding(s): the script never imported JAX, nothing to observe",
        file=sys.stderr,
    )
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            fh.write("[]\n")
    return status


if __name__ == "__main__":
    _fresh(sys.argv[1:])
