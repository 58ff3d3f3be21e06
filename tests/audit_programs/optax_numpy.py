"""An optax loop as its docs write it: params and opt_state not donated,
numpy batches sliced from one dataset (given again at the second epoch), one
recompile from a short last batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

optimizer = optax.adam(1e-2)


def loss_fn(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


@jax.jit
def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


rng = np.random.default_rng(0)
data_x = rng.normal(size=(70, 4)).astype(np.float32)
data_y = rng.normal(size=(70, 1)).astype(np.float32)
params = {"w": jnp.zeros((4, 1)), "b": jnp.zeros((1,))}
opt_state = optimizer.init(params)
losses = []
for _epoch in range(2):
    for i in range(0, 70, 16):  # the last batch has 6 rows
        params, opt_state, loss = train_step(params, opt_state, data_x[i : i + 16], data_y[i : i + 16])  # PLANT: missed_donation, missed_donation, recompile, host_transfer, host_transfer
        losses.append(loss)
print(f"loss {float(losses[-1]):.3f}")
