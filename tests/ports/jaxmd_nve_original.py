"""A jax-md NVE simulation with a neighbor list, as jax-md's docs write it: a
periodic space, a Lennard-Jones neighbor-list energy, simulate.nve, a jitted
fori_loop of steps that also updates the neighbor list, and a host check of
nbrs.did_buffer_overflow after each chunk (reallocate and redo the chunk)."""
import jax
import jax.numpy as jnp
from jax import lax, random
from jax_md import energy, quantity, simulate, space

N = 64
dimension = 2
box_size = quantity.box_size_at_number_density(N, 0.8, dimension)
displacement, shift = space.periodic(box_size)

key = random.PRNGKey(0)
key, split = random.split(key)
side = int(N ** (1 / dimension))
lattice = jnp.stack(jnp.meshgrid(jnp.arange(side), jnp.arange(side)), axis=-1).reshape(N, dimension)
R = (lattice + 0.5) * (box_size / side) + 0.05 * random.normal(split, (N, dimension))

neighbor_fn, energy_fn = energy.lennard_jones_neighbor_list(displacement, box_size, capacity_multiplier=1.05)
init, apply = simulate.nve(energy_fn, shift, dt=5e-3)

nbrs = neighbor_fn.allocate(R)
state = init(key, R, kT=1.0, neighbor=nbrs)


def body_fn(i, state_and_nbrs):
    state, nbrs = state_and_nbrs
    state = apply(state, neighbor=nbrs)
    nbrs = nbrs.update(state.position)
    return state, nbrs


@jax.jit
def simulation_step(state, nbrs):
    return lax.fori_loop(0, 50, body_fn, (state, nbrs))


@jax.jit
def total_energy(state, nbrs):
    return energy_fn(state.position, neighbor=nbrs) + quantity.kinetic_energy(
        momentum=state.momentum, mass=state.mass
    )


step = 0
for _ in range(20):
    new_state, nbrs = simulation_step(state, nbrs)
    if nbrs.did_buffer_overflow:
        print("Neighbor list overflowed, reallocating.")
        nbrs = neighbor_fn.allocate(state.position)
    else:
        state = new_state
        step += 1
        print(f"step {step}: E = {float(total_energy(state, nbrs)):.6f}")
