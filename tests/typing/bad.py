"""Mistakes that type checkers must report, each on a line marked `# expect-error`.

tests/test_typing.py runs mypy and pyright on this file and asserts that the
lines they report are exactly the marked ones. Never run: it is wrong on purpose.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc


class Particles(jc.State):
    pos: Float32[Array, "n 3"]
    vel: Float32[Array, "n 3"]
    t: Float32[Array, ""]
    dt: float = jc.static(default=0.01)


class Metrics(jc.State):
    energy: Float32[Array, ""]


class Legacy(jc.State):
    # Runs, but checkers read a field specifier's arguments by keyword only.
    dt: float = jc.static(0.01)  # expect-error


@jc.state
class Counter:
    x: Float32[Array, "n"]
    count: Int32[Array, ""]


@jc.hot_step
def advance(p: Particles, k: jax.Array) -> tuple[Particles, Metrics]:
    return p, Metrics(energy=jnp.sum(p.vel * p.vel * k))


def mistakes(x: jax.Array, t: jax.Array, k: jax.Array) -> None:
    # A wrong field name in a constructor, with either form.
    Particles(pos=x, velocity=x, t=t)  # expect-error
    Counter(x=x, counter=t)  # expect-error
    # A wrong field type, where checkers can see it (a jaxtyping dtype or shape
    # cannot be seen: Float32[Array, "n 3"] is jax.Array to a type checker).
    Particles(pos=x, vel=x, t=t, dt="fast")  # expect-error
    Particles(pos=x, vel=x, t="zero")  # expect-error
    p = Particles.zeros(n=4)
    # A wrong attribute read on a state, and on a step's unpacked result.
    print(p.position)  # expect-error
    q, m = advance(p, k)
    print(m.pos)  # expect-error
    # States are frozen.
    p.t = t  # expect-error
    # replace() and spec() return the class they are called on.
    wrong: Metrics = p.replace(t=t)  # expect-error
    also_wrong: Metrics = Particles.spec(n=4)  # expect-error
    # A hot step is called like the function it wraps.
    advance(p)  # expect-error
    print(q, wrong, also_wrong)
