"""Ctrl-C, or an alarm whose handler raises, during a loop's entry or exit
leaves nothing engaged (issues 20 and 39).

About one signal in ten landed between a change and its record (ArrayImpl
patched, a loop entry pushed, JAX's guard at ``disallow``), so that
``jnp.zeros(3) + 1.0`` outside any loop then raised. Here a tracer delivers
SIGINT (``_thread.interrupt_main``), or SIGALRM to a handler that raises
KeyboardInterrupt, at every line, one after another, of the library's code
that a loop's entry and exit run; after each, nothing may be left: no patched
method or buffer export, no loop entry, no guard, no listener, no handler of
the library's in front of the user's.
"""

from __future__ import annotations

import _thread
import functools
import os
import signal
import sys
import threading

import jax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float32

import jaxcontracts as jc
from jaxcontracts import _runtime
from jaxcontracts._compat import arrays, threadguard
from jaxcontracts._loop import intercept as _intercept
from jaxcontracts._loop.interrupts import interrupts

PRIVATE = os.path.dirname(jc.__file__) + os.sep


@jc.state
class S:
    x: Float32[Array, "n"]


@jc.hot_step
def advance(s: S) -> S:
    return S(x=s.x + 1)


def _tracer_interrupting_at(
    n: int, counter: list[int], interrupt=_thread.interrupt_main, reruns: bool = True
):
    """Runs ``interrupt`` (the signal's handler runs at the next bytecode) at
    the ``n``-th line the library runs; with ``reruns=False`` a line run again
    in the same call is not counted again."""

    def local_for():
        ran: set[int] = set()

        def local(frame, event, arg):
            if event == "line" and (reruns or frame.f_lineno not in ran):
                ran.add(frame.f_lineno)
                counter[0] += 1
                if counter[0] == n:
                    interrupt()
            return local

        return local

    def calls(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(PRIVATE) and os.sep + "_" in name[len(PRIVATE) - 1 :]:
            return local_for()
        return None

    return calls


def _class_state() -> dict:
    """ArrayImpl's read methods and its buffer export (3.11: the C slot's address)."""
    state = arrays.read_methods()
    if sys.version_info >= (3, 12):
        state["buffer"] = type(jnp.zeros(())).__dict__["__buffer__"]
    else:
        state["buffer"] = arrays._buffer_slot().value
    state["guard"] = threadguard.levels(threadguard.current())  # JAX's guard levels, this thread
    return state


def _nothing_engaged(originals: dict) -> None:
    assert _runtime.local.stack.entries == []
    assert _runtime.local.loop is None
    assert _class_state() == originals  # every read method, the buffer export, JAX's guard levels
    assert _intercept._patches is None or _intercept._patches.depth == 0
    assert _runtime.tracking.count == 0
    assert float(jnp.zeros(()) + 1.0) == 1.0  # no guard of ours or JAX's
    jnp.zeros(3) + 1.0


def _interrupt_each_line(body: str, interrupt=_thread.interrupt_main, reruns: bool = True) -> None:
    """Run a loop (empty, or with one step call) once per line of the library's
    code its entry and exit run, interrupted at that line; after each, nothing
    may be engaged."""
    s = advance(jc.device_tree(S(x=jnp.zeros(3))))
    jax.block_until_ready(s)
    originals = _class_state()
    handlers = {sig: signal.getsignal(sig) for sig in signal.valid_signals()}
    interrupted = 0
    n = 0
    while True:
        n += 1
        counter = [0]
        # interrupted inside the call, after dispatch (not this test's matter)
        if s.__dict__["x"].is_deleted():
            s = advance(jc.device_tree(S(x=jnp.zeros(3))))
        try:
            sys.settrace(_tracer_interrupting_at(n, counter, interrupt, reruns))
            try:
                with jc.hot_loop():
                    if body == "step":
                        s = advance(s)
            finally:
                sys.settrace(None)
            # a late signal (delivered as the last line ran) arrives here
            for _ in range(3):
                pass
        except KeyboardInterrupt:
            interrupted += 1
        _nothing_engaged(originals)
        # every signal's handler the user's again, none of the library's left
        assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
        if counter[0] < n:  # the entry and exit ran fewer lines: every one was tried
            break
        assert n < 5000, "the loop's entry and exit should not run this many lines"
    assert interrupted >= n - 2, (interrupted, n)  # nearly every line was interrupted
    assert n > 20  # the tracer saw the entry's and exit's code


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt, as at a terminal. A process started in
    the background by a shell without job control (a CI script's `cmd &`)
    inherits SIGINT ignored, and interrupt_main() then does nothing."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        yield
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        yield


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="SIGINT: main thread"
)
@pytest.mark.parametrize("body", ["empty", "step"])
def test_an_interrupt_at_any_line_of_entry_or_exit_leaves_nothing_engaged(body, ctrl_c_raises):
    _interrupt_each_line(body)


@pytest.fixture
def alarm_raises():
    """SIGALRM's handler raises KeyboardInterrupt, as a timeout's alarm does."""

    def alarm(signum, frame):
        raise KeyboardInterrupt("alarm")

    previous = signal.signal(signal.SIGALRM, alarm)
    yield
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="no SIGALRM")
@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
@pytest.mark.parametrize("body", ["empty", "step"])
def test_an_alarm_raising_at_any_line_of_entry_or_exit_leaves_nothing_engaged(body, alarm_raises):
    """Issue 39: a KeyboardInterrupt raised by another signal's handler than
    SIGINT's (an alarm) left ArrayImpl patched, the buffer export swapped
    and JAX's guard at ``disallow``. Every Python handler is held during an
    entry or exit, then called once the entry is undone (or the exit whole).

    Each line counts at its first run in a call: a `with` block's exit runs
    at the line of its `with`, where a tracer's exception (not a signal's,
    which runs after the `__exit__` call) would leave a lock held: a hang."""
    _interrupt_each_line(body, functools.partial(signal.raise_signal, signal.SIGALRM), reruns=False)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="SIGINT: main thread"
)
def test_an_interrupt_inside_a_buffer_export_in_a_loop_is_delivered_and_leaks_nothing(
    ctrl_c_raises, capfd
):
    # np.asarray(x) inside a loop exports x's buffer through the library's
    # hook, from which no exception reaches the user (3.11: a ctypes callback
    # in the C slot; 3.12: numpy clears an export's error). A Ctrl-C at any
    # line of it is delivered once the export is whole: never swallowed,
    # never a failed export holding a reference to x (which every later
    # donation of x would count as a holder).
    import numpy as np

    x = jnp.arange(3.0)
    jax.block_until_ready(x)
    base = sys.getrefcount(x)
    n, delivered = 0, 0
    while True:
        n += 1
        counter = [0]
        try:
            with jc.hot_loop(transfers="allow"):
                sys.settrace(_tracer_interrupting_at(n, counter))
                try:
                    got = np.asarray(x)
                finally:
                    sys.settrace(None)
                for t in interrupts.reposts:  # one caught in the export's hook: raised once it returned
                    t.join()
                for _ in range(3):  # a late signal arrives here, inside the loop
                    pass
            assert got.tolist() == [0.0, 1.0, 2.0]
        except KeyboardInterrupt:
            delivered += 1
        got = None  # (an export made before the interrupt holds x: let go)
        assert sys.getrefcount(x) == base, f"interrupted at line {n}: a reference to x leaked"
        if counter[0] < n:
            break
        assert n < 2000
    assert delivered >= n - 1 and n > 3, (delivered, n)
    assert "Exception ignored" not in capfd.readouterr().err


def test_an_entry_that_fails_before_it_engages_anything_leaves_the_signal_handlers_as_they_were(
    monkeypatch,
):
    # A loop's entry puts the library's signal handler in front and counts
    # itself; an entry that fails before it engaged anything (here: at its
    # first line) must not stay counted: a later loop would take the handler
    # for already in front and leave a signal installed since (an alarm's)
    # unheld during its own entry and exit.
    from jaxcontracts._loop.guard import HotLoop

    depth = interrupts.depth

    def fails(self, counted, suspendable):
        raise RuntimeError("the entry failed at its first line")

    with monkeypatch.context() as patch:
        patch.setattr(HotLoop, "_enter", fails)
        with pytest.raises(RuntimeError, match="first line"):
            with jc.hot_loop():
                pass
    assert interrupts.depth == depth and (depth or not interrupts.originals)
    with jc.hot_loop():  # and the next loop enters and exits as ever
        pass
    assert interrupts.depth == depth
