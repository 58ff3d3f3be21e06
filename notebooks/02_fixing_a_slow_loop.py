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
# # Fixing a slow training loop
#
# A host-driven loop stays fast only while the host never waits for the
# device: no values read back, nothing compiled, every state buffer
# donated and never touched again. This notebook takes a small training
# loop (linear regression with hand-written SGD with momentum) that
# breaks those rules in five places. Four of them only make it slow,
# each forcing a device sync or a compile on every iteration; one is an
# outright bug.
#
# Instead of hunting for them one at a time, we run the loop once inside
# `jc.hot_loop(on_violation="record")`, which records every violation
# (kind, line, count) instead of raising, and read the report. Then we
# fix the problems one by one, recording again after each fix, until the
# report reads OK.

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float32, Int32, PyTree

import jaxcontracts as jc

# %% [markdown]
# ## The problem
#
# Noisy linear data, `y = x @ w_true + 0.5 + noise`, and a state holding
# the parameters and the optimiser's momentum as `PyTree` fields (their
# spec comes from an instance), a step counter, and a sticky flag that
# records whether every loss so far was finite. The learning rate and
# momentum are `jc.static`: configuration, not data.

# %%
N, D = 512, 8
kx, kw, kn = jax.random.split(jax.random.key(0), 3)
x = jax.random.normal(kx, (N, D))
w_true = jax.random.normal(kw, (D,))
y = x @ w_true + 0.5 + 0.1 * jax.random.normal(kn, (N,))


@jc.state
class Train:
    params: PyTree[Float32[Array, "..."]]    # {"w": f32[D], "b": f32[]}
    velocity: PyTree[Float32[Array, "..."]]  # momentum, same structure
    step: Int32[Array, ""]
    finite: Bool[Array, ""]  # has every loss so far been finite?
    lr: float = jc.static(0.05)
    beta: float = jc.static(0.9)


def init_params() -> dict:
    return {"w": jnp.zeros(D), "b": jnp.zeros(())}


def init_state() -> Train:
    params = init_params()
    velocity = jax.tree.map(jnp.zeros_like, params)
    return Train(params=params, velocity=velocity, step=0, finite=True)


param_spec = jc.spec_of(init_params())
SPEC = Train.spec(params=param_spec, velocity=param_spec)
SPEC


# %% [markdown]
# The step computes the loss and its gradient, applies SGD with
# momentum, and returns the new state together with a dict of metrics.
# The metrics are a second output, not part of the state, so they are
# not donated: they are safe to keep.

# %% tags=["report", "expect-ok"]
def loss_fn(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def global_norm(tree):
    return jnp.sqrt(sum(jnp.vdot(v, v) for v in jax.tree.leaves(tree)))


def sgd_momentum(s: Train, loss, grads) -> Train:
    velocity = jax.tree.map(lambda v, g: s.beta * v + g, s.velocity, grads)
    params = jax.tree.map(lambda p, v: p - s.lr * v, s.params, velocity)
    finite = s.finite & jnp.isfinite(loss)  # sticky: one NaN sets it for good
    return s.replace(params=params, velocity=velocity, step=s.step + 1, finite=finite)


@jc.hot_step(signature=Train, donate="all")
def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
    return sgd_momentum(s, loss, grads), {"loss": loss}


train_step.compile(SPEC, x, y)
N_STEPS, LOG_EVERY = 100, 25
train_step.report()

# %% [markdown]
# The step itself is in order: every state leaf is donated and aliased
# by XLA, the data `x`, `y` are plain inputs. Whatever is slow is in the
# loop.
#
# ## The loop as first written
#
# It logs the loss, stops if training diverges, tracks the parameter
# norm, keeps the weight trajectory for a plot, and at the end reports
# how far the last update moved the weights. It looks harmless. We run
# it once in record mode:

# %% tags=["report", "expect-violations-5"]
s = init_state()
losses, norms, weights = [], [], []
try:
    with jc.hot_loop(on_violation="record") as loop:
        for i in range(N_STEPS):
            prev = s
            s, metrics = train_step(s, x, y)
            losses.append(float(metrics["loss"]))
            if not s.finite:
                raise FloatingPointError(f"the loss is not finite at step {i}")
            norms.append(jax.jit(lambda p: global_norm(p))(s.params))
            weights.append(s.params["w"].tolist())
        # How far did the last update move the weights?
        last_move = np.linalg.norm(np.subtract(weights[-1], prev.params["w"].tolist()))
except jc.DonationError as e:
    print(f"DonationError: {e}")

loop.report()


# %% [markdown]
# One run, five rows: one per line at fault, with how often it happened
# (`where` is file:line; in a notebook the file is the kernel's name for
# the cell):
#
# | row | line | what it costs |
# |---|---|---|
# | transfer, `float()` | `losses.append(float(metrics["loss"]))` | a device sync every step |
# | transfer, `bool()` | `if not s.finite:` | a device sync every step |
# | compile | `jax.jit(lambda p: ...)(s.params)` | a trace and a compile every step |
# | transfer, `.tolist()` | `weights.append(s.params["w"].tolist())` | a sync and a copy every step |
# | donation | `prev.params["w"].tolist()` | a crash: that buffer no longer exists |
#
# The last one also stopped the run: a donated buffer is gone, so the
# read cannot go on even in record mode, and the error surfaces when the
# block exits (the violations recorded up to then are kept). We fix it
# first.
#
# ## Fix 1: don't keep the state you passed to the step
#
# `prev = s` keeps a reference to the state that the next call consumes:
# `donate="all"` lets XLA reuse its buffers for the new state, so `prev`
# points at deleted arrays (outside `jc.hot_loop` this is a bare
# `RuntimeError: Array has been deleted`). Keeping old states alive would
# also double the loop's memory. The step is the one place where the old
# and the new parameters both exist, so compute what you wanted there,
# the size of the update, and return it as a metric.

# %%
@jc.hot_step(signature=Train, donate="all")
def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
    new = sgd_momentum(s, loss, grads)
    update = jax.tree.map(jnp.subtract, new.params, s.params)
    return new, {"loss": loss, "update_norm": global_norm(update)}


train_step.compile(SPEC, x, y);

# %% tags=["report", "expect-violations-4"]
s = init_state()
losses, norms, weights = [], [], []
with jc.hot_loop(on_violation="record") as loop:
    for i in range(N_STEPS):
        s, metrics = train_step(s, x, y)  # fix 1: no `prev`
        losses.append(float(metrics["loss"]))
        if not s.finite:
            raise FloatingPointError(f"the loss is not finite at step {i}")
        norms.append(jax.jit(lambda p: global_norm(p))(s.params))
        weights.append(s.params["w"].tolist())
print(f"the last update moved the parameters by {jc.fetch(metrics['update_norm']):.2e}")

loop.report()


# %% [markdown]
# ## Fix 2: no `jax.jit` inside the loop
#
# `jax.jit(lambda p: ...)` makes a new function on every iteration, and
# jax caches compiled code per function, so the loop traces and compiles
# the norm on every step: the compile row's count is the number of
# steps. Creating the jitted function once before the loop (and calling
# it once there, so that its first compile is not in the loop either)
# would fix that. Better still, compute the norm in the step, which has
# the parameters at hand: no extra dispatch at all.

# %%
@jc.hot_step(signature=Train, donate="all")
def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
    new = sgd_momentum(s, loss, grads)
    update = jax.tree.map(jnp.subtract, new.params, s.params)
    return new, {
        "loss": loss,
        "update_norm": global_norm(update),
        "param_norm": global_norm(new.params),
    }


train_step.compile(SPEC, x, y);

# %% tags=["report", "expect-violations-3"]
s = init_state()
losses, norms, weights = [], [], []
with jc.hot_loop(on_violation="record") as loop:
    for i in range(N_STEPS):
        s, metrics = train_step(s, x, y)
        losses.append(float(metrics["loss"]))
        if not s.finite:
            raise FloatingPointError(f"the loss is not finite at step {i}")
        norms.append(metrics["param_norm"])  # fix 2: computed in the step
        weights.append(s.params["w"].tolist())
print(f"the last update moved the parameters by {jc.fetch(metrics['update_norm']):.2e}")

loop.report()


# %% [markdown]
# ## Fix 3: keep the history on the device, fetch it once
#
# `.tolist()` copies the weights to the host on every step, and the host
# waits for the step to finish before it can. Keeping
# `s.params["w"]` itself in the list would not work either: the next
# step donates it (that would be the donation row again). Instead the
# step returns a copy of the weights among its metrics, which are not
# donated; the loop keeps the metrics as device arrays and fetches the
# whole history in one transfer after the loop. (`np.asarray` instead
# of `.tolist()` would be worse on CPU: it is a view of the device
# buffer, not a copy, so XLA could not reuse that buffer in the next
# step, and the step would raise a `DonationError`.)

# %%
@jc.hot_step(signature=Train, donate="all")
def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
    new = sgd_momentum(s, loss, grads)
    update = jax.tree.map(jnp.subtract, new.params, s.params)
    return new, {
        "loss": loss,
        "update_norm": global_norm(update),
        "param_norm": global_norm(new.params),
        "w": new.params["w"],  # an output, not the state's buffer: a copy
    }


train_step.compile(SPEC, x, y);

# %% tags=["report", "expect-violations-2"]
s = init_state()
losses, history = [], []
with jc.hot_loop(on_violation="record") as loop:
    for i in range(N_STEPS):
        s, metrics = train_step(s, x, y)
        losses.append(float(metrics["loss"]))
        if not s.finite:
            raise FloatingPointError(f"the loss is not finite at step {i}")
        history.append(metrics)  # fix 3: device arrays, no transfer
history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))
print({k: v.shape for k, v in history.items()})

loop.report()

# %% [markdown]
# ## Fix 4: log with `jc.fetch` every `LOG_EVERY` steps
#
# `float()` on a device array waits for the step that produces it and
# copies the value: the host can no longer run ahead of the device, so
# every step pays the whole round trip. The full loss curve is in the
# history now; for a progress line, read the loss deliberately with
# `jc.fetch` every `LOG_EVERY` steps: one sync per 25 steps instead of
# one per step.

# %% tags=["report", "expect-violations-1"]
s = init_state()
history = []
with jc.hot_loop(on_violation="record") as loop:
    for i in range(N_STEPS):
        s, metrics = train_step(s, x, y)
        if i % LOG_EVERY == 0:  # fix 4: a deliberate read, now and then
            print(f"step {i:3d}   loss {jc.fetch(metrics['loss']):.4f}")
        if not s.finite:
            raise FloatingPointError(f"the loss is not finite at step {i}")
        history.append(metrics)
history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))

loop.report()


# %% [markdown]
# ## Fix 5: no `if` on a device array
#
# `if not s.finite:` calls `bool()` on a device array: a read and a sync
# on every step, just like `float()`. The step already folds every loss
# into a sticky flag (`finite = s.finite & jnp.isfinite(loss)`), so
# checking it now and then loses nothing: a NaN at step 3 still shows up
# at the next check. Fetch it together with the loss at the logging
# points, and once more after the loop. (A condition that must act at
# once belongs in the step: `jnp.where` or `jax.lax.cond`, e.g. to skip
# the update when the loss is not finite.)

# %% tags=["report", "expect-violations-0", "expect-ok"]
def check_finite(s: Train, i: int) -> None:
    if not jc.fetch(s.finite):
        raise FloatingPointError(f"a loss was not finite by step {i}")


s = init_state()
history = []
with jc.hot_loop(on_violation="record") as loop:
    for i in range(N_STEPS):
        s, metrics = train_step(s, x, y)
        if i % LOG_EVERY == 0:
            print(f"step {i:3d}   loss {jc.fetch(metrics['loss']):.4f}")
            check_finite(s, i)  # fix 5: checked with the log line
        history.append(metrics)
check_finite(s, N_STEPS)
history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))

loop.report()

# %% [markdown]
# The report reads OK: in a hundred steps the host read nothing it did
# not ask for, compiled nothing, and never touched a donated buffer. The
# results are all there, fetched in one go after the loop:

# %%
w_final = history["w"][-1]
print(f"loss          {history['loss'][0]:.4f} -> {history['loss'][-1]:.4f}")
print(f"|w - w_true|  {np.linalg.norm(w_final - np.asarray(w_true)):.4f}")
print(f"b             {jc.fetch(s.params['b']):.4f}   (true: 0.5)")
print(f"param norm    {history['param_norm'][-1]:.4f}")
print(f"last update   {history['update_norm'][-1]:.2e}")

# %% [markdown]
# ## Keep the guard on
#
# Record mode is for finding problems; once the loop is clean, the
# default `jc.hot_loop()` raises at the first violation, so a problem
# that creeps back in later fails loudly instead of quietly slowing the
# loop down. Here is the clean loop for 1000 steps, guarded:

# %%
import time

s = init_state()
history = []
start = time.perf_counter()
with jc.hot_loop():
    for i in range(1000):
        s, metrics = train_step(s, x, y)
        if i % 250 == 0:
            check_finite(s, i)
        history.append(metrics)
history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))
elapsed = time.perf_counter() - start
print(f"1000 steps in {elapsed * 1e3:.0f} ms: {elapsed * 1e3:.0f} µs per step, the final fetch included")

# %% [markdown]
# ## Summary
#
# | problem | symptom in the report | fix |
# |---|---|---|
# | reading a state after the step donated it | `donation` | compute what you need in the step and return it |
# | `jax.jit(lambda ...)` inside the loop | `compile`, once per step | jit once before the loop, or compute it in the step |
# | `.tolist()` / `np.asarray` history | `transfer`, once per step | return it from the step, keep it on the device, fetch after the loop |
# | `float(loss)` for logging | `transfer`, once per step | `jc.fetch` every `LOG_EVERY` steps |
# | `if` on a device array | `transfer`, `bool()` | a sticky flag in the step, checked periodically; or `jnp.where` / `lax.cond` |
