"""A flax NNX loop as flax's docs write it first: nnx.jit, the model and
optimizer updated in place, nothing donated; numpy batches."""

import numpy as np
import optax
from flax import nnx

model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return ((model(x) - y) ** 2).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


rng = np.random.default_rng(0)
for _ in range(6):
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = rng.normal(size=(8, 2)).astype(np.float32)
    loss = train_step(model, optimizer, x, y)  # PLANT: missed_donation, missed_donation
print(f"loss {float(loss):.3f}")
