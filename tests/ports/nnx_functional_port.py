"""flax NNX's functional training loop, ported to jaxcontracts: the jax.jit
decorator replaced by jc.hot_step, the loop put in jc.hot_loop, the read made explicit."""
import jax
import numpy as np
import optax
from flax import nnx

import jaxcontracts as jc


class MLP(nnx.Module):
    def __init__(self, din, dhidden, dout, *, rngs):
        self.l1 = nnx.Linear(din, dhidden, rngs=rngs)
        self.l2 = nnx.Linear(dhidden, dout, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def loader(n, batch=32, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.normal(size=(batch, 8)).astype(np.float32)
        yield {"x": x, "y": (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)}


model = MLP(8, 32, 1, rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
graphdef, state = nnx.split((model, optimizer))


@jc.hot_step(state="state", host="batch")
def train_step(state, batch):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
        logits = model(batch["x"])
        return optax.sigmoid_binary_cross_entropy(logits, batch["y"]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss, nnx.state((model, optimizer))


losses = []
with jc.hot_loop(compiles="warmup") as loop:
    for step, batch in enumerate(loop.iterate(loader(200))):
        loss, state = train_step(state, batch)
        if step % 50 == 0:
            losses.append(float(jc.fetch(loss)))
print(losses)
