"""equinox's stateful example ported to jaxcontracts: eqx.filter_jit replaced
by jc.hot_step naming the carried model, state and optimizer state, the loop
put in jc.hot_loop."""
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax

import jaxcontracts as jc


class Model(eqx.Module):
    norm1: eqx.nn.BatchNorm
    spectral_linear: eqx.nn.SpectralNorm[eqx.nn.Linear]
    norm2: eqx.nn.BatchNorm
    linear1: eqx.nn.Linear
    linear2: eqx.nn.Linear

    def __init__(self, key):
        key1, key2, key3, key4 = jr.split(key, 4)
        self.linear1 = eqx.nn.Linear(2, 32, key=key1)
        self.norm1 = eqx.nn.BatchNorm(32, axis_name="batch", mode="batch")
        self.spectral_linear = eqx.nn.SpectralNorm(
            layer=eqx.nn.Linear(32, 32, key=key2), weight_name="weight", key=key3
        )
        self.norm2 = eqx.nn.BatchNorm(32, axis_name="batch", mode="batch")
        self.linear2 = eqx.nn.Linear(32, 1, key=key4)

    def __call__(self, x, state):
        x = self.linear1(x)
        x, state = self.norm1(x, state)
        x = jax.nn.relu(x)
        x, state = self.spectral_linear(x, state)
        x = jax.nn.relu(x)
        x, state = self.norm2(x, state)
        x = self.linear2(x)
        return x, state


def compute_loss(model, state, xs, ys):
    batch_model = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    pred_ys, state = batch_model(xs, state)
    loss = jnp.mean((pred_ys - ys) ** 2)
    return loss, state


@jc.hot_step(state=("model", "state", "opt_state"))
def make_step(model, state, opt_state, xs, ys):
    grads, state = eqx.filter_grad(compute_loss, has_aux=True)(model, state, xs, ys)
    updates, opt_state = optim.update(grads, opt_state)
    model = eqx.apply_updates(model, updates)
    return model, state, opt_state


dataset_size, learning_rate, steps, seed = 10, 3e-4, 50, 5678
key = jr.PRNGKey(seed)
mkey, xkey, xkey2 = jr.split(key, 3)
model, state = eqx.nn.make_with_state(Model)(mkey)
xs = jr.normal(xkey, (dataset_size, 2))
ys = jnp.sin(xs).mean(axis=1, keepdims=True) + 0.1 * jr.normal(xkey2, (dataset_size, 1))
optim = optax.adam(learning_rate)
opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
with jc.hot_loop(compiles="warmup") as loop:
    for _ in loop.iterate(range(steps)):
        model, state, opt_state = make_step(model, state, opt_state, xs, ys)
inference_model = eqx.nn.inference_mode(model)
inference_model = eqx.Partial(inference_model, state=state)
print(round(float(jnp.mean((jax.vmap(inference_model)(xs)[0] - ys) ** 2)), 6))
