"""A flax/optax training loop with an eval step, as hot steps.

A linen MLP classifies synthetic data. ``train_step`` carries flax's
``TrainState`` (donated, compiled once); ``eval_step`` only reads it (not
returned: read-only, never donated or copied). Both run inside a raising
``jc.hot_loop``: no device-to-host read, no implicit transfer, no compile.

Run: python examples/flax_training.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training.train_state import TrainState
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc

BATCH, FEATURES, CLASSES, STEPS_PER_EPOCH, EPOCHS = 64, 16, 4, 20, 3


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(CLASSES)(x)


def loss_and_accuracy(state: TrainState, params, x, y) -> tuple[jax.Array, jax.Array]:
    logits = state.apply_fn({"params": params}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, (logits.argmax(-1) == y).mean()


@jc.hot_step(signature=TrainState)
def train_step(
    state: TrainState, x: Float32[Array, "b f"], y: Int32[Array, " b"]
) -> tuple[TrainState, jax.Array]:
    """One optimizer step; returns the new state (carried) and the loss."""
    grad_fn = jax.value_and_grad(loss_and_accuracy, argnums=1, has_aux=True)
    (loss, _), grads = grad_fn(state, state.params, x, y)
    return state.apply_gradients(grads=grads), loss


@jc.hot_step(signature=TrainState)
def eval_step(state: TrainState, x: Float32[Array, "b f"], y: Int32[Array, " b"]) -> jax.Array:
    """Accuracy on a batch; the state is read, not returned: read-only."""
    return loss_and_accuracy(state, state.params, x, y)[1]


def make_data(rng: np.random.Generator, centers: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, CLASSES, size=n).astype(np.int32)
    x = centers[y] + rng.normal(size=(n, FEATURES)).astype(np.float32)
    return x, y


def main() -> float:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32) * 2
    x_train, y_train = make_data(rng, centers, BATCH * STEPS_PER_EPOCH)
    x_test, y_test = make_data(rng, centers, BATCH * 4)
    # Batches go to the device once, before the loop.
    train = [
        (jax.device_put(x_train[i : i + BATCH]), jax.device_put(y_train[i : i + BATCH]))
        for i in range(0, len(x_train), BATCH)
    ]
    test = [
        (jax.device_put(x_test[i : i + BATCH]), jax.device_put(y_test[i : i + BATCH]))
        for i in range(0, len(x_test), BATCH)
    ]

    model = MLP()
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, FEATURES), jnp.float32))["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    # The state holds that params dict itself: train_step donates its arrays,
    # so a variable still naming it would hold deleted arrays (refused at the
    # first call). Let go of it.
    del params
    # TrainState.create makes `step` a Python int: make it a device int32,
    # the dtype the step returns, so the carry keeps one signature.
    state = state.replace(step=jnp.int32(0))
    train_step.compile(state, *train[0])  # ahead of the loop: no compile inside
    eval_step.compile(state, *test[0])

    accuracy = 0.0
    for epoch in range(EPOCHS):
        losses, accs = [], []
        with jc.hot_loop():
            for x, y in train:
                state, loss = train_step(state, x, y)
                losses.append(loss)
            for x, y in test:
                accs.append(eval_step(state, x, y))
        losses_host, accs_host = jc.fetch((losses, accs))  # one explicit transfer
        accuracy = float(np.mean(accs_host))
        print(f"epoch {epoch}: loss {np.mean(losses_host):.3f}, test accuracy {accuracy:.3f}")
    print(f"train_step: {train_step.stats.compiles} compile, {train_step.stats.calls} calls")
    print(f"eval_step:  {eval_step.stats.compiles} compile, {eval_step.stats.calls} calls")
    assert accuracy > 0.9, accuracy
    return accuracy


if __name__ == "__main__":
    main()
