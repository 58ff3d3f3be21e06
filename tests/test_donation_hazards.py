"""A call given a buffer that no longer exists, or one buffer twice, is refused
before dispatch, naming the leaf, and before XLA prints an error line."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest
from helpers import Particles, advance_fn, make_particles
from jaxtyping import Array, Float32
from test_consumed_state import S, step  # the consumed-state tests' state and step

import jaxcontracts as jc


@jc.hot_step(signature=S)
def with_arg(s: S, k: Float32[Array, "n"]) -> S:
    return S(x=s.x + k, y=s.y, scale=s.scale)


def test_full_refuses_deleted_or_repeated_buffers_before_xla_prints(capfd):
    """XLA logs `ExecutePrepareWithOomRetries failed` before refusing a deleted
    or doubly donated buffer; at `full` every leaf is looked at first."""
    with jc.checks_level("full"):
        donor = S(x=jnp.zeros(3), y=jnp.ones(3))
        step(donor)
        gone = donor.__dict__["x"]  # deleted by the donation
        live = with_arg(S(x=jnp.zeros(3), y=jnp.ones(3)), jnp.ones(3))  # a returned state
        capfd.readouterr()
        mixed = S(x=jnp.zeros(3), y=gone)  # one deleted leaf, not the first
        with pytest.raises(jc.DonationError, match=r"s\.y: f32\[3\] was already"):
            step(mixed)
        with pytest.raises(jc.DonationError, match=r"passes a buffer that no longer exists(.|\n)*k: f32\[3\] was already"):
            with_arg(live, gone)  # a deleted argument that is not donated
        a = jnp.zeros(3)
        with pytest.raises(jc.DonationError, match=r"s\.x and s\.y are the same buffer") as e:
            step(S(x=a, y=a))
        # the user's own state holds one array twice: the fix is the copy, not "pass the returned state"
        assert e.value.fix.startswith("build the state with a copy where one array appears twice (jnp.copy(s.x) at s.y)"), e.value.fix
        assert "ExecutePrepare" not in capfd.readouterr().err
        assert with_arg(live, jnp.ones(3)).x.tolist() == [2.0] * 3


def test_stale_state_is_explained_without_an_xla_error_line(capfd):
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    q = advance(p)  # p is now stale
    capfd.readouterr()
    with pytest.raises(jc.DonationError, match="already"):
        advance(p)
    assert "ExecutePrepare" not in capfd.readouterr().err
    assert q.pos.shape == (4, 3)


@dataclasses.dataclass(frozen=True)
class _Inc:
    by: float = 1.0


def _bump_dict(s, *, config):
    return {k: v + config.by for k, v in s.items()}


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("shape", ["dict", "dict, keyword + static"])
def test_a_stale_foreign_state_is_explained_without_an_xla_error_line(capfd, level, shape):
    """A dict state (checked once per signature by the guarded C++ call) and a
    static config by keyword (static in that C++ call): a consumed state is
    looked at before the call, so XLA prints nothing."""
    with jc.checks_level(level):
        if shape == "dict":
            f = jc.hot_step(lambda s: {k: v + 1 for k, v in s.items()}, state="s")
            kw = {}
        else:
            f = jc.hot_step(_bump_dict, state="s", static="config")
            kw = {"config": _Inc()}
        s = {"a": jnp.zeros(3), "b": jnp.ones(2)}
        old = f(s, **kw)
        new = f(old, **kw)  # the C++ path: its signature is cached
        capfd.readouterr()
        for stale in (s, old):
            with pytest.raises(jc.DonationError, match="already"):
                f(stale, **kw)
        assert "ExecutePrepare" not in capfd.readouterr().err
        assert f(new, **kw)["a"].tolist() == [3.0] * 3
