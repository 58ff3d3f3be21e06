"""Host callbacks a hot step runs, inside ``jc.hot_loop`` (issue 20).

On CPU, XLA runs a step's host callbacks on the thread that dispatched it,
inside its loop. A ``jax.debug.callback`` doing a ``jnp`` op on its argument
was refused there, and the refusal failed the whole step after XLA had taken
its donated buffers: the state was gone and no output came back. A callback is
the user's deliberate host code: it runs with the loop's guards lifted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jaxtyping import Array, Float32

import jaxcontracts as jc
from jaxcontracts._compat import callbacks


@jc.state
class S:
    x: Float32[Array, "n"]


def _fresh():
    return jc.device_tree(S(x=jnp.arange(3.0)))


def test_a_debug_callback_with_eager_ops_runs_in_a_loop_and_loses_nothing():
    seen = []

    def show(x):
        # a cold eager op (compiles), a Python constant (a host-to-device
        # transfer) and a read, all inside the executable's callback
        seen.append(float(jnp.sum(x * 2.0)))

    @jc.hot_step
    def advance(s: S) -> S:
        jax.debug.callback(show, s.x)
        return S(x=s.x + 1)

    advance.compile(S.spec(n=3))  # the callback has never run: its ops are cold
    s = _fresh()
    with jc.hot_loop():
        for _ in range(3):
            s = advance(s)
    jax.effects_barrier()  # an accelerator runs the callbacks as the device reaches them
    assert seen == [6.0, 12.0, 18.0]
    assert not s.x.is_deleted() and np.allclose(jc.fetch(s.x), [3.0, 4.0, 5.0])


def test_a_pure_callback_and_an_io_callback_run_their_jnp_code_in_a_loop():
    def host_norm(x):
        return np.asarray(jnp.linalg.norm(x * 1.0), np.float32)

    log = []

    def record(x):
        log.append(float(jnp.max(x)))
        return np.float32(0)

    @jc.hot_step
    def advance(s: S) -> S:
        n = jax.pure_callback(host_norm, jax.ShapeDtypeStruct((), jnp.float32), s.x)
        # (ordered=True: see test_an_ordered_io_callback_first_called_in_a_loop_is_not_refused)
        io_callback(record, jax.ShapeDtypeStruct((), jnp.float32), s.x, ordered=False)
        return S(x=s.x / n)

    advance.compile(S.spec(n=3))
    s = _fresh()
    with jc.hot_loop():
        s = advance(s)
    assert np.isclose(np.linalg.norm(jc.fetch(s.x)), 1.0) and log == [2.0]


def test_the_loop_still_refuses_the_same_op_outside_the_callback():
    @jc.hot_step
    def advance(s: S) -> S:
        jax.debug.callback(lambda x: None, s.x)
        return S(x=s.x + 1)

    s = advance(_fresh())
    with pytest.raises(jc.TransferError), jc.hot_loop():
        s = advance(s)
        float(jnp.sum(s.x * 3.0))  # the loop's own code: refused as before


def test_the_hook_is_installed_on_every_runner_jax_has():
    (cap,) = [c for c in jc.capabilities() if c.name == "host-callback-hook"]
    assert cap.available
    jax.block_until_ready(jnp.zeros(1))
    with jc.hot_loop():
        pass
    assert {name for _, name, _ in callbacks._hooked} == {"impl", "pure_callback_impl", "io_callback_impl"}


def _ordered_step():
    log = []

    def record(x):
        log.append(float(x))

    @jc.hot_step
    def advance(s: S) -> S:
        io_callback(record, None, s.x.sum(), ordered=True)
        return S(x=s.x + 1)

    return advance, log


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_an_ordered_io_callback_first_called_in_a_loop_is_not_refused(level):
    # An ordered effect takes a runtime token, which JAX makes on a thread's
    # first call (and after jax.effects_barrier()) by transferring a bool[0]
    # numpy array: refused by the loop as a TransferError for bool[0] whose fix
    # the user cannot apply. The step makes it outside the guard, first.
    import threading

    with jc.checks_level(level):
        advance, log = _ordered_step()
        advance.compile(S.spec(n=3))
        s = _fresh()
        with jc.hot_loop():
            s = advance(s)
            jax.effects_barrier()  # clears this thread's tokens: made again at the next call
            s = advance(s)
        errors = []

        def on_another_thread(s):  # runtime tokens are per thread
            try:
                with jc.hot_loop():
                    advance(s)
                jax.effects_barrier()  # this thread's effects, done (an accelerator runs them later)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=on_another_thread, args=(s,))
        t.start()
        t.join()
        assert not errors, errors
        jax.effects_barrier()
        assert log == [3.0, 6.0, 9.0]  # in order
        other = _fresh()
        with pytest.raises(jc.TransferError, match="host-to-device"), jc.hot_loop():
            other.x + np.ones(3, np.float32)  # the loop still refuses the user's own transfer


def test_without_the_mechanism_the_ordered_token_is_the_transfer_refused(monkeypatch):
    from jaxcontracts._step import callpath as _callpath

    monkeypatch.setattr(_callpath, "effect_tokens", lambda compiled: None)
    advance, _ = _ordered_step()
    advance.compile(S.spec(n=3))
    s = _fresh()
    jax.effects_barrier()
    from jax._src import dispatch

    dispatch.runtime_tokens.clear()
    with pytest.raises(jc.TransferError, match=r"bool\[0\]"), jc.hot_loop():
        advance(s)
    assert not s.x.is_deleted()  # refused before the executable ran

