"""An audited run begun and finished: the watch, its progress line, the report."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from .session import watch

__all__ = ["begin", "finish"]


class _Progress:
    """One line on a terminal's stderr, rewritten every ``interval`` seconds and
    cleared at the end; nothing where stderr is not a terminal (a log, CI)."""

    def __init__(self, w: Any, stream: Any, interval: float = 2.0) -> None:
        self.w, self.stream, self.interval = w, stream, interval
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(callable(isatty) and isatty())
        self.stop = threading.Event()
        self.shown = False
        self.thread = threading.Thread(
            target=self._run, name="jaxcontracts-audit-progress", daemon=True
        )

    def __enter__(self) -> _Progress:
        if self.tty:
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


def begin(progress_every: float = 2.0) -> tuple[Any, _Progress]:
    """The watch, begun (leaving the script's own loops alone), and its progress line."""
    w = watch(loops=False)
    # a terminal? asked before the watch takes stderr
    progress = _Progress(w, sys.stderr, progress_every)
    w.__enter__()
    progress.__enter__()
    return w, progress


def finish(
    started: tuple[Any, _Progress],
    status: int,
    stopped: str | None,
    json_path: str | None,
    strict: bool,
) -> int:
    """The watch ended and its report written; the exit status."""
    w, progress = started
    progress.__exit__()
    w.__exit__(None, None, None)
    report = w.report()
    report.stopped = stopped
    sys.stdout.flush()
    print(report, file=sys.stderr)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            fh.write(report.to_json() + "\n")
    if strict and not report.ok:
        return 1
    return status
