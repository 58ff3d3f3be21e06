"""Recompiles of three kinds: a carry whose dtype changes, a static value
that changes per call, and a Python number one call and an array the next;
and a jax.jit made inside the loop."""

import functools

import jax
import jax.numpy as jnp


@jax.jit
def accumulate(state, x):
    return {"result": state["result"] + x.sum(), "n": state["n"] + 1}


@functools.partial(jax.jit, static_argnames=("k",))
def top(x, k):
    return jax.lax.top_k(x, k)[0]


@jax.jit
def scale(x, lr):
    return x * lr


state = {"result": jnp.int32(0), "n": jnp.int32(0)}
x = jnp.arange(10.0)
for i in range(3):
    state = accumulate(state, jnp.full((2,), i, jnp.float32))  # PLANT: recompile, missed_donation
    top(x, k=i + 1)  # PLANT: recompile
    x = scale(x, 0.5 if i == 0 else jnp.float32(0.5))  # PLANT: recompile, missed_donation
    y = jax.jit(lambda v: v * 2)(x)  # PLANT: compile_in_loop
print(int(state["n"]), float(y[0]))
