"""Ctrl-C during a loop's entry or exit leaves nothing engaged (issue 20).

About one signal in ten landed between a change and its record (ArrayImpl
patched, a loop entry pushed, JAX's guard at ``disallow``), so that
``jnp.zeros(3) + 1.0`` outside any loop then raised. Here a tracer delivers
SIGINT (``_thread.interrupt_main``) at every line, one after another, of the
library's code that a loop's entry and exit run; after each, nothing may be
left: no patched method, no loop entry, no guard, no listener.
"""

from __future__ import annotations

import _thread
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
from jaxcontracts._compat import arrays
from jaxcontracts._loop import intercept as _intercept

PRIVATE = os.path.dirname(jc.__file__) + os.sep


@jc.state
class S:
    x: Float32[Array, "n"]


@jc.hot_step
def advance(s: S) -> S:
    return S(x=s.x + 1)


def _tracer_interrupting_at(n: int, counter: list[int]):
    def local(frame, event, arg):
        if event == "line":
            counter[0] += 1
            if counter[0] == n:
                _thread.interrupt_main()  # SIGINT's handler runs at the next bytecode
        return local

    def calls(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(PRIVATE) and os.sep + "_" in name[len(PRIVATE) - 1 :]:
            return local
        return None

    return calls


def _nothing_engaged(originals: dict) -> None:
    assert _runtime.local.stack.entries == []
    assert _runtime.local.loop is None
    assert arrays.read_methods() == originals  # every read method the original
    assert _intercept._patches is None or _intercept._patches.depth == 0
    assert _runtime.tracking.count == 0
    assert float(jnp.zeros(()) + 1.0) == 1.0  # no guard of ours or JAX's
    jnp.zeros(3) + 1.0


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


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="SIGINT: main thread")
@pytest.mark.parametrize("body", ["empty", "step"])
def test_an_interrupt_at_any_line_of_entry_or_exit_leaves_nothing_engaged(body, ctrl_c_raises):
    s = advance(jc.device_tree(S(x=jnp.zeros(3))))
    jax.block_until_ready(s)
    originals = arrays.read_methods()
    interrupted = 0
    n = 0
    while True:
        n += 1
        counter = [0]
        if s.__dict__["x"].is_deleted():  # interrupted inside the call, after dispatch (not this test's matter)
            s = advance(jc.device_tree(S(x=jnp.zeros(3))))
        try:
            sys.settrace(_tracer_interrupting_at(n, counter))
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
        if counter[0] < n:  # the entry and exit ran fewer lines: every one was tried
            break
        assert n < 5000, "the loop's entry and exit should not run this many lines"
    assert interrupted >= n - 2, (interrupted, n)  # nearly every line was interrupted
    assert n > 20  # the tracer saw the entry's and exit's code
