"""A jax-md NVE simulation with a neighbor list, ported to jaxcontracts: the
jax.jit decorators replaced by jc.hot_step, the loop put in jc.hot_loop, the
reads made explicit."""
import jax  # noqa: F401 - the original's import, kept
import jax.numpy as jnp
from jax import lax, random
from jax_md import energy, quantity, simulate, space

import jaxcontracts as jc

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


# needed: donate="none" (jax.jit donated nothing; a donated state could not be rolled back to on overflow),
# max_compiles=2 (the reallocated list has a new static max_occupancy)
@jc.hot_step(state=("state", "nbrs"), donate="none", max_compiles=2)
def simulation_step(state, nbrs):
    return lax.fori_loop(0, 50, body_fn, (state, nbrs))


@jc.hot_step(stateless=True, max_compiles=2)  # needed: max_compiles=2 (the reallocated list)
def total_energy(state, nbrs):
    return energy_fn(state.position, neighbor=nbrs) + quantity.kinetic_energy(
        momentum=state.momentum, mass=state.mass
    )


step = 0
# needed: transfers="allow_host_to_device" (nbrs.did_buffer_overflow is an eager `code & <Python int>`)
with jc.hot_loop(compiles="warmup", transfers="allow_host_to_device") as loop:
    for _ in loop.iterate(range(20)):
        new_state, nbrs = simulation_step(state, nbrs)
        if jc.fetch(nbrs.did_buffer_overflow):
            print("Neighbor list overflowed, reallocating.")
            with jc.hot_loop(transfers="allow", compiles="allow"):  # needed: allocate reads the device to size the list
                nbrs = neighbor_fn.allocate(state.position)
                # needed: a new signature is refused in the hot loop after its first pass;
                # compile the reallocated list's here, in the cold branch
                simulation_step.compile(state, nbrs)
                total_energy.compile(state, nbrs)
        else:
            state = new_state
            step += 1
            print(f"step {step}: E = {float(jc.fetch(total_energy(state, nbrs))):.6f}")
