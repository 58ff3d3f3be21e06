# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # jaxcontracts in five minutes
#
# A host-driven JAX loop (`for i in range(n): state = step(state)`) is
# fast only while three things stay true: nothing in it copies device
# arrays to the host, every state buffer is donated (reused in place),
# and nothing recompiles. jaxcontracts turns those facts into contracts
# checked where it is cheapest: when a class is defined, when a step
# compiles, when it is called, and inside a guarded loop.
#
# This tour defines a state, compiles a step ahead of time, runs it in a
# guarded loop, reads the step's report and watches one mistake get
# caught.

# %%
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32

import jaxcontracts as jc


# %% [markdown]
# ## 1. A state: `@jc.state`
#
# A state class is a frozen dataclass and a pytree. Array fields carry a
# [jaxtyping](https://github.com/patrick-kidger/jaxtyping) annotation
# with a concrete dtype and named dimensions; a `jc.static` field is
# configuration: hashable, part of the tree structure, never a leaf.

# %%
@jc.state
class Particles:
    pos: Float32[Array, "n 3"]
    vel: Float32[Array, "n 3"]
    t: Float32[Array, ""]
    dt: float = jc.static(0.01)


# %% [markdown]
# `Particles.spec(n=...)` is the exact type of a state, with no device
# memory behind it (a tree of `jax.ShapeDtypeStruct`); `Particles.zeros`
# is a real one, placed on the device with the exact dtypes. A state's
# repr shows specs, never values, so printing one never reads the
# device.

# %%
Particles.spec(n=1024)

# %%
Particles.zeros(n=4)

# %% [markdown]
# Construction checks every field against its annotation, with the
# named dimensions bound across fields, and reports all problems at
# once:

# %% tags=["caught-spec"]
try:
    Particles(pos=jnp.zeros((4, 3)), vel=jnp.zeros((5, 3)), t=0.0)
except jc.SpecError as e:
    print(f"SpecError: {e}")


# %% [markdown]
# ## 2. A step: `@jc.hot_step`
#
# A hot step takes the state and returns the new one. `donate="all"`
# donates every leaf of the state, so XLA updates it in place instead of
# allocating a second copy. The step compiles ahead of time from the
# spec (no data needed); compiling checks that the step returns its
# state with exactly the spec it takes (otherwise the next call would
# recompile) and that XLA really aliases every donated buffer.

# %%
@jc.hot_step(signature=Particles, donate="all")
def advance(p: Particles) -> Particles:
    """One semi-implicit Euler step of a unit harmonic oscillator."""
    vel = p.vel - p.pos * p.dt
    return p.replace(pos=p.pos + vel * p.dt, vel=vel, t=p.t + p.dt)


advance.compile(Particles.spec(n=1024))
advance


# %% [markdown]
# ## 3. A guarded loop: `jc.hot_loop`
#
# Inside `with jc.hot_loop():` an implicit read of a device array
# (`float(x)`, `if x:`, `print(x)`, `np.asarray(x)`, ...), a compile,
# or a read of an array a step consumed is an error, on every backend,
# CPU included. `jc.fetch(tree)` is the deliberate way to read values:
# here every 250 steps, so the host can run ahead of the device in
# between.

# %%
def initial_state(n: int = 1024) -> Particles:
    pos = jax.random.normal(jax.random.key(0), (n, 3))
    return Particles(pos=pos, vel=jnp.zeros((n, 3)), t=0.0)


p = initial_state()
with jc.hot_loop():
    for i in range(1, 1001):
        p = advance(p)
        if i % 250 == 0:
            t, pos, vel = jc.fetch((p.t, p.pos, p.vel))
            energy = 0.5 * (pos**2 + vel**2).sum(axis=1).mean()
            print(f"step {i:4d}   t = {t:5.2f}   energy per particle = {energy:.4f}")

# %%
advance.stats

# %% [markdown]
# ## 4. The step's report
#
# `step.report()` returns a `jc.Report`: per leaf its spec, sharding,
# whether it is donated and whether XLA aliased it; the executable's
# memory analysis; compile time and calls; and every contract with
# pass/fail. `print(report)` gives a text table; in a notebook it
# renders as HTML.

# %% tags=["report", "expect-ok"]
advance.report()

# %% [markdown]
# ## 5. A caught mistake
#
# A stopping condition written the obvious way, `if float(p.t) > 2.5`,
# reads the device on every step: the host waits for each step to
# finish before it can dispatch the next one. Inside a hot loop it is
# caught at once, with the array named (which step produced it, and
# which field) and the line:

# %% tags=["caught-transfer"]
p = initial_state()
try:
    with jc.hot_loop():
        for _ in range(1000):
            p = advance(p)
            if float(p.t) > 2.5:
                break
except jc.TransferError as e:
    print(f"TransferError: {e}")

# %% [markdown]
# The fix is to read deliberately and rarely: one `jc.fetch` every 100
# steps costs one sync per 100 steps instead of one per step (and may
# run up to 99 steps past the condition; a step that must stop exactly
# can freeze itself with `jnp.where`).

# %%
p = initial_state()
with jc.hot_loop():
    for i in range(1, 1001):
        p = advance(p)
        if i % 100 == 0 and jc.fetch(p.t) > 2.5:
            break
print(f"stopped after {i} steps, at t = {jc.fetch(p.t):.2f}")

# %% [markdown]
# ## Next
#
# [`02_fixing_a_slow_loop.ipynb`](02_fixing_a_slow_loop.ipynb) takes a
# training loop with five such problems, finds them all in one run with
# `jc.hot_loop(on_violation="record")`, and fixes them one by one.
