"""flax's Gemma trainer, in its shape: NNX Modules through a jax.jit that
donates them (donate_argnames), absl logging every N steps, orbax checkpoints
every M steps. A small model; tokens made here."""
import functools
import tempfile

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx

VOCAB, DIM, SEQ = 32, 16, 8


class TinyLM(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, DIM, rngs=rngs)
        self.norm = nnx.LayerNorm(DIM, rngs=rngs)
        self.hidden = nnx.Linear(DIM, DIM, rngs=rngs)
        self.out = nnx.Linear(DIM, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.norm(self.embed(tokens))
        return self.out(jax.nn.gelu(self.hidden(x)))


def batches(seed=0):
    rng = np.random.default_rng(seed)
    while True:
        tokens = rng.integers(0, VOCAB, size=(4, SEQ + 1)).astype(np.int32)
        yield {"tokens": tokens[:, :-1], "targets": (tokens[:, 1:] + 1) % VOCAB}


@functools.partial(jax.jit, donate_argnames=("model", "optimizer"))
def train_step(model, optimizer, batch):
    def loss_fn(model):
        logits = model(batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return model, optimizer, loss


model = TinyLM(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
manager = ocp.CheckpointManager(tempfile.mkdtemp(), options=ocp.CheckpointManagerOptions(max_to_keep=2))
data = batches()
losses = []
for step in range(60):
    batch = next(data)
    model, optimizer, loss = train_step(model, optimizer, batch)
    if step % 10 == 0:
        losses.append(round(float(loss), 5))
        logging.info("step %d: loss %.5f", step, losses[-1])
    if step % 20 == 0:
        manager.save(step, args=ocp.args.StandardSave(nnx.state(model)))
manager.wait_until_finished()
print(losses, list(manager.all_steps()))
