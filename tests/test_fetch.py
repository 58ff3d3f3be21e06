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
