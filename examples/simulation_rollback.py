"""A particle simulation with field-level donation, an overflow flag and a rollback.

Springs pull particles to the origin (symplectic Euler). The ``System``
state donates only the fields the step rewrites (``pos``, ``vel``, ``t``,
``overflow``); ``mass`` is read every step and never donated. The force
buffer is a non-state argument donated by name (``donate_argnames``).

The step sets a sticky ``overflow`` flag when a speed exceeds a bound (the
jax-md neighbor-list pattern). Every chunk of steps, the host reads that one
flag explicitly (``jc.fetch``); on overflow it rolls back to the chunk's
snapshot and halves ``dt``, a static field: a new signature, compiled
outside the loop (``max_compiles=2``).

Run: python examples/simulation_rollback.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float32

import jaxcontracts as jc

N, CHUNK, CHUNKS, STIFFNESS, MAX_SPEED = 256, 25, 8, 400.0, 50.0


@jc.state
class System:
    pos: Float32[Array, "n 2"]
    vel: Float32[Array, "n 2"]
    mass: Float32[Array, " n"]
    t: Float32[Array, ""]
    overflow: Bool[Array, ""]
    dt: float = jc.static(0.12)


@jc.hot_step(stateless=True, max_compiles=2)  # one signature per dt
def forces_of(s: System) -> Float32[Array, "n 2"]:
    return -STIFFNESS * s.pos


@jc.hot_step(stateless=True, max_compiles=2)  # one signature per dt
def snapshot(s: System) -> System:
    """A copy of the state that the next chunk's donations cannot consume."""
    return jax.tree_util.tree_map(jnp.copy, s)


@jc.hot_step(
    signature=System,
    donate=("pos", "vel", "t", "overflow"),
    donate_argnames=("forces",),
    max_compiles=2,
)
def step(s: System, forces: Float32[Array, "n 2"]) -> tuple[System, Float32[Array, "n 2"]]:
    vel = s.vel + s.dt * forces / s.mass[:, None]
    pos = s.pos + s.dt * vel
    too_fast = (jnp.abs(vel) > MAX_SPEED).any()
    new = System(
        pos=pos, vel=vel, mass=s.mass, t=s.t + s.dt, overflow=s.overflow | too_fast, dt=s.dt
    )
    return new, -STIFFNESS * pos


def main() -> float:
    key = jax.random.PRNGKey(1)
    state = System(
        pos=jax.random.uniform(key, (N, 2), jnp.float32, -1.0, 1.0),
        vel=jnp.zeros((N, 2), jnp.float32),
        mass=jnp.linspace(1.0, 2.0, N, dtype=jnp.float32),
        t=jnp.float32(0),
        overflow=jnp.bool_(False),
    )
    rollbacks = 0
    chunk = 0
    while chunk < CHUNKS:
        saved = snapshot(state)
        forces = forces_of(state)
        step.compile(state, forces)  # a new dt compiles here; a known one is looked up
        with jc.hot_loop():  # raising: no read, transfer or compile per step
            for _ in range(CHUNK):
                state, forces = step(state, forces)
        if not jc.fetch(state.overflow):  # one explicit read per chunk
            chunk += 1
            continue
        rollbacks += 1
        dt = state.dt / 2
        print(f"overflow in chunk {chunk}: rolling back to t={float(jc.fetch(saved.t)):.2f}, dt -> {dt}")
        state = saved.replace(dt=dt)  # a new static value: compiled here, outside the loop
    t, speed = jc.fetch((state.t, jnp.abs(state.vel).max()))
    print(f"t={float(t):.2f} after {rollbacks} rollback(s); max speed {float(speed):.1f}")
    print(f"step: {step.stats.compiles} compiles, {step.stats.calls} calls")
    assert rollbacks >= 1 and step.stats.compiles == 2
    return float(t)


if __name__ == "__main__":
    main()
