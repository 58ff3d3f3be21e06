"""A loop that reads a metric on the host at every step (a sync each
time), and once after the loop (not a finding); an explicit jax.device_get
every 5 steps (not a finding either)."""

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, donate_argnames=("state",))
def step(state):
    return {"w": state["w"] * 0.9, "loss": jnp.sum(state["w"])}


state = {"w": jnp.ones(16), "loss": jnp.float32(0)}
history = []
for i in range(8):
    state = step(state)
    if float(state["loss"]) < 0:  # PLANT: host_sync
        break
    if i % 5 == 0:
        history.append(jax.device_get(state["loss"]))
print(f"final loss {float(state['loss']):.3f}", len(history))
