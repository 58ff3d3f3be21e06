"""jc.fetch: the deliberate read inside a hot loop, next to JAX's explicit transfers.

``jc.fetch``, ``jax.device_get`` and ``jax.device_put`` are allowed in a loop.
``jc.fetch`` returns a copy, so a result kept across the next step never pins
a buffer that the step donates; a fetch of a donated array names the step.
"""

from __future__ import annotations

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
