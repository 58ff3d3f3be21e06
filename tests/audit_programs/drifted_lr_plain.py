"""The motivating loop as first written, with no jaxcontracts in it: two
plain jax.jit steps, an int32 counter, a print each step, `lr` inserted before
the state as a device scalar with `donate_argnums=(0,)` left as it was. JAX
refuses the second call (fn1's first call deleted `lr`)."""

import jax
import jax.numpy as jnp


def fn1(lr, state):
    return {"w": state["w"] - lr * state["w"], "n": state["n"] + 1}


def fn2(state):
    return {"w": state["w"] * 0.5, "n": state["n"]}


step1 = jax.jit(fn1, donate_argnums=(0,))  # was (0,) when the state came first
step2 = jax.jit(fn2, donate_argnums=(0,))
lr = jax.device_put(0.1)
state = {"w": jnp.ones(4), "n": jnp.array(0, jnp.int32)}
for i in range(5):
    state = step1(lr, state)
    state = step2(state)
    print(i, state["n"])
print("done", state["w"][0])
