"""jc.fetch: the deliberate read inside a hot loop, next to JAX's explicit transfers.

``jc.fetch``, ``jax.device_get`` and ``jax.device_put`` are allowed in a loop.
``jc.fetch`` returns a copy, so a result kept across the next step never pins
a buffer that the step donates; a fetch of a donated array names the step.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, advance_fn, make_particles

import jaxcontracts as jc


def test_explicit_transfers_are_allowed():
    x = jnp.arange(3.0)
    with jc.hot_loop():
        host = jc.fetch({"x": x})
        also = jax.device_get(x)
        y = jax.device_put(np.ones(3, np.float32))
    assert host["x"].tolist() == [0.0, 1.0, 2.0]
    assert isinstance(also, np.ndarray) and y.shape == (3,)


def test_fetch_copies_so_a_kept_result_never_pins_a_donated_buffer():
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with jc.hot_loop():
        kept = jc.fetch(p.pos)  # kept across the next step
        p = advance(p)  # at checks level full, a pinned buffer would raise here
    assert kept.flags.owndata and kept.shape == (4, 3)
    with pytest.raises(jc.DonationError, match="was donated to advance_fn"):
        with jc.hot_loop():
            old = p
            p = advance(p)
            jc.fetch(old.t)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "int4"])
def test_fetch_of_narrow_dtypes_while_a_loop_is_open(dtype):
    # On 3.11 the loop's buffer hook turned their failed export into
    # "SystemError: memoryview returned NULL without setting an exception".
    x = jnp.arange(4).astype(getattr(jnp, dtype))
    with jc.hot_loop():
        inside = jc.fetch(x)
    got: list = []
    with jc.hot_loop():  # open on this thread while another thread fetches
        t = threading.Thread(target=lambda: got.append(jc.fetch(x)))
        t.start()
        t.join()
    for v in (inside, got[0]):
        assert str(v.dtype) == dtype and v.astype(np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_device_get_kept_in_a_loop_never_makes_the_next_step_fail():
    """Issue 20: on CPU, jax.device_get returned a view that pinned the buffer
    (cached on the array), so the next donating call copied instead and was
    refused (DonationError: not consumed) on jax 0.11.2, 0.12 and 0.10.2 on
    several devices. Inside a loop it now returns copies without a view."""
    from jaxtyping import Array, Float32

    @jc.state
    class Clocked:
        x: Float32[Array, "n"]
        clock: Float32[Array, ""]

    @jc.hot_step
    def tick(s: Clocked) -> Clocked:
        return Clocked(x=s.x + 1, clock=s.clock + 1)

    original = jax.device_get
    s = tick(jc.device_tree(Clocked(x=jnp.zeros(3), clock=jnp.float32(0))))
    q = jax.device_put(jnp.arange(4, dtype=jnp.int4))  # sub-byte: JAX's own copy path
    kept = []
    with jc.hot_loop():
        for _ in range(4):
            s = tick(s)
            kept.append(jax.device_get(s.clock))
            kept.append(jax.device_get({"x": s.x, "n": 3}))  # a pytree, a Python leaf
            kept.append(jax.device_get(q))
    assert [float(k) for k in kept[::3]] == [2.0, 3.0, 4.0, 5.0]
    assert kept[1]["n"] == 3 and kept[1]["x"].tolist() == [2.0, 2.0, 2.0]
    assert kept[2].tolist() == [0, 1, 2, 3]
    assert jax.device_get is original  # restored outside the loop


def test_device_get_in_a_loop_is_read_only_as_jax_s_own_result():
    # An in-place edit of what jax.device_get returned fails alone (JAX's host
    # value is read-only); the loop's copy must not let it succeed.
    w, s = jnp.linspace(-1.0, 1.0, 8) + 0, jnp.float32(2) + 0
    alone = jax.device_get({"w": w, "s": s})
    with jc.hot_loop():
        inside = jax.device_get({"w": w, "s": s})
    assert [a.flags.writeable for a in (*alone.values(), *inside.values())] == [False] * 4
    with pytest.raises(ValueError, match="read-only"):
        inside["w"][np.abs(inside["w"]) < 0.5] = 0.0


# -- jc.fetch_async: a lagged read that never stalls the loop (issue 38 item 4)


def _counter_step():
    @jc.hot_step(state="s")
    def step(s):
        return {"x": s["x"] + 1, "n": s["n"] + 1}, {"loss": s["x"].sum()}

    return step


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_lagged_read_gives_each_steps_values_after_the_state_was_donated(level):
    step = _counter_step()
    s = {"x": jnp.zeros(3), "n": jnp.int32(0)}
    pending, seen = None, []
    with jc.checks_level(level), jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(5)):
            s, metrics = step(s)
            if pending is not None:
                seen.append(pending.result())  # the previous step's values
            # a state leaf too: the next call donates it, the copy is the fetch's own
            pending = jc.fetch_async({"loss": metrics["loss"], "n": s["n"]})
    seen.append(pending.result())
    assert [int(v["n"]) for v in seen] == [1, 2, 3, 4, 5]
    assert [float(v["loss"]) for v in seen] == [0.0, 3.0, 6.0, 9.0, 12.0]
    assert all(isinstance(v["n"], np.ndarray) for v in seen)
    if level != "off":  # (at off a loop keeps no timing)
        assert "jc.fetch_async" in loop.timing.blocked  # counted where the loop's time went
    assert loop.violations == [] and step.stats.calls == (0 if level == "off" else 5)  # off counts nothing


def test_a_pending_fetch_says_whether_it_arrived_without_waiting_and_reads_once():
    x = jnp.arange(4.0)
    pending = jc.fetch_async({"x": x, "k": jax.random.key(0), "host": np.ones(2)})
    assert isinstance(pending.done(), bool)
    first = pending.result()
    assert first["x"].tolist() == [0.0, 1.0, 2.0, 3.0] and first["k"].dtype == np.uint32
    assert pending.done() and pending.result() is first
    assert "done" in repr(pending)


def test_a_lagged_read_of_a_donated_array_is_refused_at_once_naming_it():
    step = _counter_step()
    s = {"x": jnp.zeros(3), "n": jnp.int32(0)}
    new, _ = step(s)
    with pytest.raises(jc.DonationError, match=r"jc\.fetch_async\(\): \['n'\]: i32\[\] was donated to step"):
        jc.fetch_async(s)


@pytest.mark.parametrize("wrap", ["hot_step", "jax.jit"])
def test_a_fetch_inside_a_traced_function_says_it_has_no_value_yet(wrap):
    # JAX's ConcretizationTypeError about `is_fully_addressable` on a traced
    # array, raised from the library's frame, said nothing of the fetch
    def step(s):
        jc.fetch(s["loss"])  # a read moved into the step by mistake
        return {"loss": s["loss"] * 0.5}

    run = jc.hot_step(step, state="s") if wrap == "hot_step" else jax.jit(step)
    with pytest.raises(jc.TransferError, match=r"jc\.fetch\(\): a traced f32\[\], inside a function JAX is tracing") as e:
        run({"loss": jnp.float32(1.0) + 0})
    assert "return it from the step and fetch the output" in str(e.value)
