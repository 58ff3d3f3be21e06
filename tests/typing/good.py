"""A user's file that type checkers must pass with zero errors (tests/test_typing.py)."""

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
    steps: Int32[Array, ""]


@jc.state
class Counter:
    x: Float32[Array, "n"]
    count: Int32[Array, ""]


@jc.hot_step
def advance(p: Particles, k: jax.Array) -> tuple[Particles, Metrics]:
    vel = p.vel - p.pos * p.dt * k
    q = p.replace(pos=p.pos + vel * p.dt, vel=vel, t=p.t + p.dt)
    m = Metrics(energy=jnp.sum(vel * vel), steps=jnp.int32(1))
    return q, m


@jc.hot_step(signature=Counter, donate="all")
def count(scale: jax.Array, c: Counter) -> Counter:
    return Counter(x=c.x * scale, count=c.count + 1)


@jc.hot_step(stateless=True, static=("n",), donate_argnames=("x",))
def power(x: Float32[Array, "k"], n: int) -> Float32[Array, "k"]:
    return x**n


@jc.hot_step(signature=Particles)
def kinetic(p: Particles) -> jax.Array:  # read-only: not returned, not donated
    return jnp.sum(p.vel * p.vel)


def main() -> float:
    n = 8
    p = Particles(
        pos=jnp.zeros((n, 3), jnp.float32),
        vel=jnp.ones((n, 3), jnp.float32),
        t=jnp.zeros((), jnp.float32),
    )
    spec: Particles = Particles.spec(n=n)
    zeros: Particles = Particles.zeros(n=n, dt=0.02)
    p = p.replace(t=jnp.ones((), jnp.float32))
    dt: float = zeros.dt
    pos: jax.Array = p.pos
    assert spec.pos.shape == pos.shape
    del pos  # a donating call refuses a leaf held elsewhere (it would delete it)

    c = Counter(x=jnp.ones(n, jnp.float32), count=jnp.zeros((), jnp.int32))
    k, scale = jnp.float32(1.0), jnp.float32(2.0)
    advance.compile(spec, k)
    count.compile(scale, c)
    total = 0.0
    with jc.hot_loop() as loop:
        for i in range(4):
            p, m = advance(p, k)
            energy: jax.Array = m.energy
            c = count(scale, c)
            if i == 3:
                host: Metrics = jc.fetch(m)
                total = float(host.energy) + float(jc.fetch(energy)) + dt
    snap: jc.Snapshot = jc.snapshot(advance, count)
    unchanged: jc.SnapshotDiff = snap.diff(jc.snapshot(advance), tolerances={"temporaries": 0.1})
    assert unchanged.ok or unchanged.changes[0].before != ""
    cubed: jax.Array = power(jnp.ones(3, jnp.float32), 3)
    e: jax.Array = kinetic(p)
    timing: jc.LoopTiming = loop.timing
    per_call: float = timing.steps[0].host_us_per_call if timing.steps else 0.0
    current = advance.describe().current
    cache: str | None = current.cache if current is not None else None
    verdict: str = f"{timing.verdict} {per_call} {cache}"
    fetched: Particles = jc.fetch(p)
    brought: Particles = jc.device_tree(p)
    again, changes = jc.device_tree(brought, changes=True)
    changed: tuple[str, ...] = changes.paths
    assert isinstance(again, Particles) and not changed
    counted: jax.Array = c.count
    total += len(verdict)
    return total + float(fetched.t) + float(jc.fetch(counted)) + float(jc.fetch(cubed)[0] + jc.fetch(e))


if __name__ == "__main__":
    print(main())
