"""A loop with nothing to fix: the state donated by name, batches on the
device before the loop, one signature."""

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, donate_argnames=("state",))
def step(state, batch):
    return {"w": state["w"] + batch.mean(), "t": state["t"] + 1}


@jax.jit
def evaluate(state, batch):
    return jnp.sum(state["w"]) + batch.sum()


batches = [jax.device_put(jnp.full((8,), float(i))) for i in range(5)]
state = {"w": jnp.ones((64,)), "t": jnp.int32(0)}
for _ in range(3):
    for batch in batches:
        state = step(state, batch)
        score = evaluate(state, batch)
print("t =", int(state["t"]), "score", float(score))
