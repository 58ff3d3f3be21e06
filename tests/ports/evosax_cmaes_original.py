"""evosax's CMA-ES ask/eval/tell loop, as its README writes it: a strategy
built from a dummy solution, its default params, init, then per generation a
jitted ask, a jitted fitness evaluation and a jitted tell."""
import jax
import jax.numpy as jnp
from evosax.algorithms import CMA_ES


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


num_dims = 6
es = CMA_ES(population_size=16, solution=jnp.zeros(num_dims))
params = es.default_params

key = jax.random.key(0)
key, key_init = jax.random.split(key)
state = es.init(key_init, jnp.zeros(num_dims), params)

ask = jax.jit(es.ask)
evaluate = jax.jit(jax.vmap(rosenbrock))
tell = jax.jit(es.tell)

for generation in range(50):
    key, key_ask, key_tell = jax.random.split(key, 3)
    population, state = ask(key_ask, state, params)
    fitness = evaluate(population)
    state, metrics = tell(key_tell, population, fitness, state, params)
    if generation % 10 == 0:
        print(f"generation {generation}: best fitness {metrics['best_fitness']:.6f}")

print(f"final best fitness {state.best_fitness:.6f}")
