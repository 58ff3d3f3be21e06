"""Signals on the main thread, held while a hot loop is entered or exited."""

from __future__ import annotations

import _signal  # signal's C functions: the module's wrappers convert to enums (µs per call)
import _thread
import contextlib
import signal
import sys
import threading
import time
from typing import Any

from .._compat.arrays import UNRAISING_CODES

__all__ = ["interrupts"]

MAIN_THREAD = threading.main_thread()

# Every signal a Python handler can be installed for.
_SIGNALS = tuple(
    int(s)
    for s in sorted(signal.valid_signals())
    if s not in {getattr(signal, name, None) for name in ("SIGKILL", "SIGSTOP")}
)


class _Interrupts:
    """Signals on the main thread, held while a loop's entry or exit runs.

    An entry or exit changes several things that must change together
    (ArrayImpl's methods, the loop stack, JAX's guard levels); a
    KeyboardInterrupt between two left some engaged. While loops are active
    on the main thread this handler stands in front of every Python handler,
    holds a signal arriving below ``HotLoop.__enter__`` or ``__exit__`` until
    that is whole, and passes any other straight on. A loop entered in a
    generator or coroutine may end on another thread, where no handler can be
    given back: it holds signals only while its own entry and exit run.
    """

    def __init__(self) -> None:
        # loops entered on the main thread and not yet exited (an exit, on any thread,
        # lowers it; after the last, the main thread's finish() gives the handlers back)
        self.depth = 0
        self.originals: dict[int, Any] = {}  # signal -> the Python handler this one is in front of
        self.noted: list[tuple[int, Any]] = []  # held: (signal, the handler it was meant for)
        self.codes: frozenset[Any] = frozenset()  # HotLoop.__enter__'s and __exit__'s (_loop.guard)
        # the threads raising again a signal caught in an export's hook
        self.reposts: list[threading.Thread] = []

    def handler(self, signum: int, frame: Any) -> None:
        original = self.originals.get(signum)
        f = frame
        while f is not None:
            if f.f_code in self.codes:
                if all(s != signum for s, _ in self.noted):
                    self.noted.append((signum, original))
                return
            if f.f_code in UNRAISING_CODES:  # an export's hook: raised there, it would be lost
                repost = threading.Thread(
                    target=_raise_after_callbacks, args=(signum,), daemon=True
                )
                self.reposts = [t for t in self.reposts if t.is_alive()] + [repost]
                repost.start()
                return
            f = f.f_back
        if callable(original):
            original(signum, frame)

    def entering(self, keep: bool = True) -> bool:
        """At a loop's entry or exit: on the main thread, put the handler in
        front (unless it is already). ``keep``: an entry that keeps it there
        until its exit, which then calls :meth:`leaving`. Whether it stands in
        front now (on the main thread); :meth:`finish` ends every such call."""
        if threading.current_thread() is not MAIN_THREAD:
            return False
        if not self.depth:  # else an entry that keeps it put it in front already
            try:
                self._hold()
            except (ValueError, OSError, TypeError):  # not the main interpreter
                return False
        self.depth += keep
        return True

    def _hold(self) -> None:
        try:
            for signum in _SIGNALS:
                current = _signal.getsignal(signum)
                if callable(current) and current != self.handler:
                    self.originals[signum] = current
                    _signal.signal(signum, self.handler)
        except BaseException:  # a signal not yet held raised: give back those that are
            self._give_back()
            raise

    def _give_back(self) -> None:
        """Each handler back where this one still stands in front of it (a
        handler the user installed meanwhile stays)."""
        for signum, original in list(self.originals.items()):
            with contextlib.suppress(ValueError, OSError, TypeError):
                if _signal.getsignal(signum) == self.handler:
                    _signal.signal(signum, original)
            del self.originals[signum]

    def finish(self) -> None:
        """The end of an entry or exit on the main thread: give the handlers
        back if no entry that keeps them is left there."""
        if self.depth != 0 or threading.current_thread() is not MAIN_THREAD:
            return
        self._give_back()

    def deliver(self) -> None:
        """The signals held during the entry or exit that just ended, delivered
        in order to the handlers they were meant for (one that raises leaves
        the rest held for the next entry or exit)."""
        while self.noted:
            signum, original = self.noted.pop(0)
            if callable(original):
                original(signum, None)


def _raise_after_callbacks(signum: int) -> None:
    """Raise ``signum`` again on the main thread once it runs no buffer export
    hook (:data:`UNRAISING_CODES`: microseconds). Posted from
    another thread: posted from the handler, it would run at the handler's own
    next bytecode, still inside the callback."""
    while _in_callback():
        time.sleep(0.0002)
    _thread.interrupt_main(signum)


def _in_callback() -> bool:
    """Whether the main thread runs a buffer export hook now (its frames are
    read and let go here: none is kept while this thread waits)."""
    f = sys._current_frames().get(MAIN_THREAD.ident)
    while f is not None:
        if f.f_code in UNRAISING_CODES:
            return True
        f = f.f_back
    return False


interrupts = _Interrupts()
