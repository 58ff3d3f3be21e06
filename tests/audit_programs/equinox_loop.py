"""An equinox loop as its docs write it: eqx.filter_jit, the model and the
optimizer state returned and rebound each step (not donated), numpy
batches."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

model = eqx.nn.MLP(4, 1, 16, 2, key=jax.random.key(0))
optim = optax.sgd(1e-2)
opt_state = optim.init(eqx.filter(model, eqx.is_array))


@eqx.filter_jit
def make_step(model, opt_state, x, y):
    def loss(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    updates, opt_state = optim.update(grads, opt_state)
    return eqx.apply_updates(model, updates), opt_state, value


rng = np.random.default_rng(0)
for _ in range(6):
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    model, opt_state, value = make_step(model, opt_state, x, y)  # PLANT: missed_donation
print(f"loss {float(value):.3f}")
