"""flax NNX's MNIST tutorial, as its docs write it first: @nnx.jit steps that
update the model, the optimizer and the metrics in place and return nothing,
model.train() / model.eval() around them. Small: 8x8 synthetic digits made here."""
from functools import partial

import numpy as np
import optax
from flax import nnx


class CNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm = nnx.BatchNorm(8, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear = nnx.Linear(8 * 4 * 4, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.batch_norm(self.conv1(x))))
        x = x.reshape(x.shape[0], -1)
        return self.linear(self.dropout(x))


def dataset(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = rng.normal(size=(n, 8, 8, 1)).astype(np.float32) * 0.5
    images[np.arange(n), labels % 8, labels // 8 * 4, 0] += 3.0
    return [
        {"image": images[i : i + 32], "label": labels[i : i + 32].astype(np.int32)}
        for i in range(0, n, 32)
    ]


train_ds, test_ds = dataset(640, 0), dataset(128, 1)
model = CNN(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(0.005, 0.9), wrt=nnx.Param)
metrics = nnx.MultiMetric(
    accuracy=nnx.metrics.Accuracy(),
    loss=nnx.metrics.Average("loss"),
)


def loss_fn(model: CNN, batch):
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])
    optimizer.update(model, grads)


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
    loss, logits = loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])


history = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}
eval_every = 10
for step, batch in enumerate(train_ds * 3):
    model.train()
    train_step(model, optimizer, metrics, batch)
    if step > 0 and step % eval_every == 0:
        for metric, value in metrics.compute().items():
            history[f"train_{metric}"].append(float(value))
        metrics.reset()
        model.eval()
        for test_batch in test_ds:
            eval_step(model, metrics, test_batch)
        for metric, value in metrics.compute().items():
            history[f"test_{metric}"].append(float(value))
        metrics.reset()
print({k: [round(v, 6) for v in vs] for k, vs in history.items()})
print(int(optimizer.step[...]))
