"""The request's loop: lr inserted before state, donate_argnums not updated
(issue 40), a second function that donates nothing, numpy batches."""

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.jit, donate_argnums=(0,))  # PLANT: wrong_donation (the jit line)
def fn1(lr, state):
    return {"w": state["w"] - lr * state["w"], "t": state["t"] + 1}


@jax.jit
def fn2(state, batch):
    return {"w": state["w"] + batch.mean(), "t": state["t"]}


state = {"w": jnp.ones((256, 256)), "t": jnp.int32(0)}
for _ in range(10):
    state = fn1(0.5, state)  # PLANT: wrong_donation, missed_donation, host_transfer
    state = fn2(state, np.ones(8, np.float32))  # PLANT: missed_donation, host_transfer
state = fn2(state, np.ones(8, np.float32))
print("done", int(state["t"]))
