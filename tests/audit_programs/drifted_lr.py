"""The motivating loop (issue 51): two steps, an int32 counter, a print;
`lr` inserted before the state and made a device scalar (the library's own
advice for a Python float), `donate_argnums=(0,)` not updated, so index 0
donates `lr`. Run alone it is a `jc.hot_loop(compiles="warmup")`; under the
audit, the same loop."""

import functools

import jax
import jax.numpy as jnp

import jaxcontracts as jc


@functools.partial(jax.jit, donate_argnums=(0,))  # PLANT: wrong_donation (the jit line)
def fn1(lr, state):
    return {"w": state["w"] - lr * state["w"], "t": state["t"] + 1, "loss": jnp.mean(state["w"])}


@functools.partial(jax.jit, donate_argnames=("state",))
def fn2(state):
    return {"w": state["w"] * 0.5, "t": state["t"], "loss": state["loss"]}


lr = jax.device_put(jnp.float32(0.1))
state = {"w": jnp.ones((256,), jnp.float32), "t": jnp.int32(0), "loss": jnp.float32(0)}
with jc.hot_loop(compiles="warmup"):
    for i in range(5):
        state = fn1(lr, state)  # PLANT: wrong_donation, missed_donation
        state = fn2(state)
        if i % 2 == 0:
            print("step", i, jc.fetch(state["loss"]))
print("done", int(state["t"]))
