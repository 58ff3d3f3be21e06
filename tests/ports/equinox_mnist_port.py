"""equinox's MNIST CNN, ported to jaxcontracts: eqx.filter_jit replaced by
jc.hot_step (the Module's functions static, its arrays donated), the loop put in
jc.hot_loop, the read made explicit."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxcontracts as jc

BATCH_SIZE = 16
LEARNING_RATE = 3e-3
STEPS = 60
PRINT_EVERY = 20


class CNN(eqx.Module):
    layers: list

    def __init__(self, key):
        key1, key2, key3 = jax.random.split(key, 3)
        self.layers = [
            eqx.nn.Conv2d(1, 3, kernel_size=4, key=key1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(3 * 12 * 12, 32, key=key2),
            jax.nn.sigmoid,
            eqx.nn.Linear(32, 10, key=key3),
            jax.nn.log_softmax,
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def loss(model, x, y):
    pred_y = jax.vmap(model)(x)
    return cross_entropy(y, pred_y)


def cross_entropy(y, pred_y):
    pred_y = jnp.take_along_axis(pred_y, jnp.expand_dims(y, 1), axis=1)
    return -jnp.mean(pred_y)


def dataloader(seed):
    rng = np.random.default_rng(seed)
    while True:
        y = rng.integers(0, 10, size=BATCH_SIZE)
        x = rng.normal(size=(BATCH_SIZE, 1, 16, 16)).astype(np.float32) * 0.1
        x[np.arange(BATCH_SIZE), 0, y, :] += 1.0  # the label is the bright row
        yield x, y.astype(np.int32)


model = CNN(jax.random.PRNGKey(5678))
optim = optax.adamw(LEARNING_RATE)
opt_state = optim.init(eqx.filter(model, eqx.is_array))


@jc.hot_step(state=("model", "opt_state"), host=("x", "y"))
def make_step(model, opt_state, x, y):
    loss_value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    model = eqx.apply_updates(model, updates)
    return model, opt_state, loss_value


def infinite_trainloader():
    yield from dataloader(0)


with jc.hot_loop(compiles="warmup") as loop:
    for step, (x, y) in loop.iterate(zip(range(STEPS), infinite_trainloader())):
        model, opt_state, train_loss = make_step(model, opt_state, x, y)
        if (step % PRINT_EVERY) == 0 or (step == STEPS - 1):
            print(f"step={step}, train_loss={jc.fetch(train_loss).item():.6f}")
