"""An RL rollout as gymnax's README writes it: a jitted env step and a
jitted policy in a Python loop, the key split each step, the episode's end
read on the host to reset (a sync each step), the env state not donated."""

import jax
import jax.numpy as jnp


def reset(key):
    return {"x": jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05), "t": jnp.int32(0)}


@jax.jit
def env_step(key, state, action):
    a = action.astype(jnp.float32)
    x = state["x"] + 0.02 * jnp.array([state["x"][1], a - 0.5, state["x"][3], 0.5 - a])
    x = x + 0.001 * jax.random.normal(key, (4,))
    done = (jnp.abs(x[0]) > 2.4) | (state["t"] >= 199)
    return {"x": x, "t": state["t"] + 1}, 1.0 - done.astype(jnp.float32), done


@jax.jit
def policy(params, obs):
    return (obs @ params > 0).astype(jnp.int32)  # a discrete action, as gymnax CartPole takes


key = jax.random.key(0)
params = jnp.array([0.0, 0.1, 1.0, 0.5])
key, sub = jax.random.split(key)
state = reset(sub)
total = jnp.float32(0)
for _ in range(30):
    key, k_act, k_step = jax.random.split(key, 3)
    action = policy(params, state["x"])
    state, reward, done = env_step(k_step, state, action)  # PLANT: missed_donation
    total = total + reward
    if done:  # PLANT: host_sync
        state = reset(k_act)
print(f"return {float(total):.1f}")
