"""Ctrl-C on the main thread, held while a hot loop is entered or exited.

See :class:`_Interrupts`. ``_guard`` sets ``interrupts.codes`` to the code of
``HotLoop.__enter__`` and ``__exit__`` once the class exists.
"""

from __future__ import annotations

import _signal  # signal's C functions: the module's wrappers convert to enums (µs per call)
import contextlib
import signal
import threading
from typing import Any

__all__ = ["MAIN_THREAD", "interrupts"]

MAIN_THREAD = threading.main_thread()


class _Interrupts:
    """Ctrl-C on the main thread, held while a loop's entry or exit runs.

    A loop's entry and exit change several things (ArrayImpl's methods, the
    thread's loop stack, JAX's guard levels) that must change together; a
    KeyboardInterrupt between two of them left some engaged, so that
    ``jnp.zeros(3) + 1.0`` outside any loop then raised. Python runs signal
    handlers on the main thread, between bytecodes, and hands them the frame
    it is running: while loops are active there, SIGINT's handler is this
    one, which holds a signal arriving in a ``HotLoop.__enter__`` or
    ``__exit__`` (at any depth below it, from the very first bytecode of
    ``__exit__``), to be delivered once that entry or exit is whole, and
    passes any other straight to the handler it replaced (a Ctrl-C in the
    loop's body interrupts it as ever).
    """

    def __init__(self) -> None:
        self.depth = 0  # loops entered on the main thread and not yet exited
        self.original: Any = None
        self.noted = False
        self.restore_due = False
        self.codes: frozenset[Any] = frozenset()

    def handler(self, signum: int, frame: Any) -> None:
        f = frame
        while f is not None:
            if f.f_code in self.codes:
                self.noted = True
                return
            f = f.f_back
        self.call_original(signum, frame)

    def call_original(self, signum: int, frame: Any) -> None:
        """What SIGINT would have done: Python's default raises KeyboardInterrupt."""
        old = self.original
        if callable(old):
            old(signum, frame)
        elif old == signal.SIG_DFL:  # pragma: no cover - a process without Python's handler
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.raise_signal(signal.SIGINT)

    def entering(self) -> bool:
        """At a loop's entry: install the handler (the outermost entry on the main
        thread). Whether this entry counts (it was on the main thread)."""
        if threading.current_thread() is not MAIN_THREAD:
            return False
        if self.depth == 0:
            try:
                current = _signal.getsignal(signal.SIGINT)
                if current != self.handler:
                    self.original = _signal.signal(signal.SIGINT, self.handler)
            except (ValueError, OSError, TypeError):  # not the main interpreter
                return False
        self.depth += 1
        return True

    def leaving(self) -> None:
        """At the exit of an entry that counted: after the last one, SIGINT is
        given back by :meth:`finish`, the last thing the exit does."""
        self.depth -= 1
        if self.depth == 0:
            self.restore_due = True

    def finish(self) -> None:
        """The end of an entry or exit on the main thread: give SIGINT back if
        no loop is left there (and nobody replaced the handler meanwhile)."""
        if not self.restore_due or self.depth != 0 or threading.current_thread() is not MAIN_THREAD:
            return
        self.restore_due = False
        with contextlib.suppress(ValueError, OSError, TypeError):
            if _signal.getsignal(signal.SIGINT) == self.handler:
                _signal.signal(signal.SIGINT, self.original if self.original is not None else signal.SIG_DFL)

    def deliver(self) -> None:
        """A SIGINT held during the entry or exit that just ended, delivered."""
        if self.noted:
            self.noted = False
            self.call_original(signal.SIGINT, None)


interrupts = _Interrupts()
