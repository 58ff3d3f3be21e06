"""BlackJAX's NUTS loop, as its docs write it: a log-density, blackjax.nuts,
nuts.init, a jax.jit of nuts.step, a Python loop that splits the key, steps
and keeps each sample in a list, stacked after the loop."""
import blackjax
import jax
import jax.numpy as jnp
import jax.scipy.stats as stats
import numpy as np

# Observations of a normal with unknown location and scale.
observed = np.random.default_rng(0).normal(3.0, 2.0, size=200).astype(np.float32)


def logdensity(theta):
    loc, log_scale = theta[0], theta[1]
    logprior = stats.norm.logpdf(loc, 0.0, 10.0) + stats.norm.logpdf(log_scale, 0.0, 2.0)
    return logprior + jnp.sum(stats.norm.logpdf(observed, loc, jnp.exp(log_scale)))


step_size = 0.1
inverse_mass_matrix = jnp.array([1.0, 1.0])
nuts = blackjax.nuts(logdensity, step_size, inverse_mass_matrix)

state = nuts.init(jnp.array([1.0, 1.0]))
step = jax.jit(nuts.step)

key = jax.random.key(0)
samples = []
for _ in range(300):
    key, sub = jax.random.split(key)
    state, info = step(sub, state)
    samples.append(state.position)

samples = jnp.stack(samples)
print(samples[100:].mean(axis=0))
print(samples[100:].std(axis=0))
