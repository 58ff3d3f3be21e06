"""flax linen's MNIST example, ported to jaxcontracts: the jax.jit decorators
replaced by jc.hot_step, the epoch loop put in jc.hot_loop. The reads were
already explicit (jax.device_get)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state

import jaxcontracts as jc


class CNN(nn.Module):
    """A simple CNN model."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=8, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=16, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten
        x = nn.Dense(features=32)(x)
        x = nn.relu(x)
        x = nn.Dense(features=10)(x)
        return x


def get_datasets(num_train=320, num_test=128, seed=0):
    """Synthetic MNIST-shaped data: label k lights rows 2k+4 and 2k+5."""
    rng = np.random.default_rng(seed)

    def make(n):
        label = rng.integers(0, 10, size=n).astype(np.int32)
        image = rng.uniform(0.0, 0.5, size=(n, 28, 28, 1)).astype(np.float32)
        for i, k in enumerate(label):
            image[i, 2 * k + 4 : 2 * k + 6, 4:24, 0] += 1.0
        return {"image": image, "label": label}

    return make(num_train), make(num_test)


def compute_metrics(*, logits, labels):
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return {"loss": loss, "accuracy": accuracy}


def create_train_state(rng, learning_rate, momentum):
    """Creates initial `TrainState`."""
    cnn = CNN()
    params = cnn.init(rng, jnp.ones([1, 28, 28, 1]))["params"]
    tx = optax.sgd(learning_rate, momentum)
    return train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=tx)


@jc.hot_step(state="state", host="batch")
def train_step(state, batch):
    """Train for a single step."""

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["image"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, logits

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, logits), grads = grad_fn(state.params)
    state = state.apply_gradients(grads=grads)
    metrics = compute_metrics(logits=logits, labels=batch["label"])
    return state, metrics


@jc.hot_step(stateless=True, host="batch")
def eval_step(params, batch):
    logits = CNN().apply({"params": params}, batch["image"])
    return compute_metrics(logits=logits, labels=batch["label"])


def train_epoch(state, train_ds, batch_size, epoch, rng):
    """Train for a single epoch."""
    train_ds_size = len(train_ds["image"])
    steps_per_epoch = train_ds_size // batch_size

    perms = rng.permutation(train_ds_size)
    perms = perms[: steps_per_epoch * batch_size]  # skip incomplete batch
    perms = perms.reshape((steps_per_epoch, batch_size))
    batch_metrics = []
    for perm in perms:
        batch = {k: v[perm, ...] for k, v in train_ds.items()}
        state, metrics = train_step(state, batch)
        batch_metrics.append(metrics)

    # compute mean of metrics across each batch in epoch.
    batch_metrics_np = jax.device_get(batch_metrics)
    epoch_metrics_np = {
        k: np.mean([metrics[k] for metrics in batch_metrics_np]) for k in batch_metrics_np[0]
    }
    print(
        f"train epoch: {epoch}, loss: {epoch_metrics_np['loss']:.4f}, "
        f"accuracy: {epoch_metrics_np['accuracy'] * 100:.2f}"
    )
    return state


def eval_model(params, test_ds):
    metrics = eval_step(params, test_ds)
    metrics = jax.device_get(metrics)
    summary = jax.tree_util.tree_map(lambda x: x.item(), metrics)
    return summary["loss"], summary["accuracy"]


train_ds, test_ds = get_datasets()
rng = np.random.default_rng(0)
state = create_train_state(jax.random.PRNGKey(0), learning_rate=0.1, momentum=0.9)
state = jc.device_tree(state)  # needed: TrainState.create's step is a Python int, refused by train_step's first call
with jc.hot_loop(compiles="warmup") as loop:
    for epoch in loop.iterate(range(1, 4)):
        state = train_epoch(state, train_ds, 32, epoch, rng)
        test_loss, test_accuracy = eval_model(state.params, test_ds)
        print(f" test epoch: {epoch}, loss: {test_loss:.4f}, accuracy: {test_accuracy * 100:.2f}")
