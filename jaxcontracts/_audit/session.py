"""``jc.watch()``: a :class:`~jaxcontracts._audit.watch.Watch`, and a recording hot
loop around the same code whose device-to-host reads at the user's lines are its
``host_sync`` findings (the loop raises nothing, lets compiles through, and passes
none of its options on to the loops the code opens).
"""

from __future__ import annotations

from typing import Any

from .._compat import frames
from .._loop.guard import HotLoop
from .._tracebacks import is_jax_or_ours, is_library
from .._userline import user_frame, where
from .watch import Watch

__all__ = ["watch"]


class _Reads(HotLoop):
    """A recording loop that hands each device-to-host read to its watch."""

    def __init__(self, owner: Watch) -> None:
        # host-to-device copies are the watch's findings: JAX's guard allows them (logging
        # each would cost a stderr line, and the script a thread reading its stderr)
        super().__init__(on_violation="record", compiles="allow", transfers="allow_host_to_device")
        self.audit = True
        self._owner = owner
        self._last: str | None = None  # the line of the read being made
        self.read_timer = self._blocked
        self._clock.on_wait = self._waited  # each block_until_ready while it is open on a thread

    def _waited(self, seconds: float, value: Any) -> None:
        """``block_until_ready`` returned after ``seconds``: a wait at the user's line
        (not an installed package's: equinox's filter_jit waits after each call)."""
        at = frames.caller_frame(1)
        while at is not None and is_jax_or_ours(at.f_code.co_filename):
            at = at.f_back
        if at is not None and not is_library(at.f_code.co_filename, True, at.f_code.co_name):
            self._owner.waited(where(at)[0], seconds, value, _function_of(at), at)

    def violation(
        self, kind: str, what: str, fix: str, frame: Any = None, before_call: bool = False
    ) -> None:
        if self._last is not None:  # the read before never finished: numpy, refused a buffer
            self._owner.read_stamps[self._last].pop()  # export, reads another way (one read)
        self._last = None
        if kind == "transfer" and what.startswith("device-to-host"):
            at = user_frame(frame)
            line = where(at)[0]
            if self._owner.read(line, what, fix, _function_of(at), at):
                self._last = line

    def _blocked(self, seconds: float, x: Any, name: str) -> None:
        """A recorded read finished after ``seconds``; one that stalled nothing
        (:meth:`Watch.stalls`) is not a sync."""
        if self._last is not None:
            if self._owner.stalls(x, name):
                self._owner.read_seconds[self._last] = (
                    self._owner.read_seconds.get(self._last, 0.0) + seconds
                )
            else:
                self._owner.read_stamps[self._last].pop()
            self._last = None


def watch(*, loops: bool = True) -> Watch:
    """Observe, inside the ``with``, every function ``jax.jit`` makes, and the
    device-to-host reads between their calls::

        with jc.watch() as w:
            train()
        print(w.report())      # a table in a notebook

    The findings are those of ``python -m jaxcontracts audit`` (its page in
    the guides: "Audit a loop you already have"): ``recompile``,
    ``missed_donation``, ``wrong_donation``, ``host_sync``,
    ``host_transfer``, ``compile_in_loop``. Functions jitted before the
    ``with`` are not observed. One watch at a time.

    Inside a ``jc.hot_loop()`` in the watched code, a missed donation the
    watch proves (the caller dropped the argument by the function's next
    call) is also that loop's violation: in raise mode a ``DonationError``
    before that next call runs; ``loops=False`` leaves the loops alone (the
    audit's choice: a script runs as it would without it)."""
    return Watch(reads=_Reads, loops=loops)


def _function_of(frame: Any) -> str:
    """The user's function a frame runs in (3.11's comprehension frames: the enclosing)."""
    while (
        frame is not None
        and frame.f_code.co_name in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")
    ):
        frame = frame.f_back
    return frame.f_code.co_name if frame is not None else "<unknown>"
