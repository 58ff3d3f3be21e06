"""Issue 10, sections 3 and 4: calls and definitions that were refused wrongly."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float32

import jaxcontracts as jc


@jc.state
class S:
    u: Float32[Array, "n"]


# -- keywords and defaults at every checks level -----------------------------


ZERO = jnp.float32(0)


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_keywords_and_omitted_defaults_work_at_every_level(level):
    def scale_fn(s: S, k: Float32[Array, ""], *, bias: Float32[Array, ""] = ZERO) -> S:
        return S(u=s.u * k + bias)

    jc.set_checks(level)
    step = jc.hot_step(scale_fn)
    k = jnp.float32(2)
    s = step(S.zeros(n=3), k)
    s = step(s, k=k)  # a keyword, the default omitted
    s = step(s=s, k=k, bias=jnp.float32(1))
    s = step(s, k, bias=jnp.float32(1))
    assert step.stats.compiles == 1
    assert jnp.all(s.u == 3)
