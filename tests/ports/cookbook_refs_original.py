"""JAX's training cookbook, in its ref form: the train state (parameters and
Adam moments) held in refs made once with jax.tree.map(jax.new_ref, ...), a
jitted step that reads them, updates them in place and returns its metrics,
a numpy data pipeline. A small MLP; data made here."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Config:
    learning_rate: float = 1e-2
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    batch_size: int = 64
    steps: int = 100


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: dict
    mu: dict
    nu: dict
    step: jax.Array


def init_train_state(key):
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (8, 32)) / jnp.sqrt(8.0),
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 1)) / jnp.sqrt(32.0),
        "b2": jnp.zeros(1),
    }
    zeros = jax.tree.map(jnp.zeros_like, params)
    return TrainState(
        params=params, mu=zeros, nu=jax.tree.map(jnp.zeros_like, params), step=jnp.int32(0)
    )


def model_apply(params, x):
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params, batch):
    return jnp.mean((model_apply(params, batch["x"]) - batch["y"]) ** 2)


@functools.partial(jax.jit, static_argnums=0)
def train_step(config, train_state, batch):
    params = jax.tree.map(lambda r: r[...], train_state.params)
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    train_state.step[...] += 1
    t = train_state.step[...].astype(jnp.float32)

    def update(p, m, v, g):
        m[...] = config.b1 * m[...] + (1 - config.b1) * g
        v[...] = config.b2 * v[...] + (1 - config.b2) * g * g
        m_hat = m[...] / (1 - config.b1**t)
        v_hat = v[...] / (1 - config.b2**t)
        p[...] = p[...] - config.learning_rate * m_hat / (jnp.sqrt(v_hat) + config.eps)

    jax.tree.map(update, train_state.params, train_state.mu, train_state.nu, grads)
    return {"loss": loss}


def batches(config, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(8, 1)).astype(np.float32)
    while True:
        x = rng.normal(size=(config.batch_size, 8)).astype(np.float32)
        yield {"x": x, "y": np.tanh(x @ w)}


config = Config()
train_state = init_train_state(jax.random.key(0))
train_state = jax.tree.map(jax.new_ref, train_state)
data = batches(config)
history = []
for step in range(config.steps):
    batch = next(data)
    metrics = train_step(config, train_state, batch)
    if step % 20 == 0:
        history.append(round(float(metrics["loss"]), 5))
print(history, int(train_state.step[...]))
