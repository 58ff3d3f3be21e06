"""evosax's CMA-ES ask/eval/tell loop, ported to jaxcontracts: the three
jax.jit steps replaced by jc.hot_step, the loop put in jc.hot_loop, the read
made explicit."""
import jax
import jax.numpy as jnp
from evosax.algorithms import CMA_ES

import jaxcontracts as jc


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


num_dims = 6
es = CMA_ES(population_size=16, solution=jnp.zeros(num_dims))
params = es.default_params
params = jc.device_tree(params)  # needed: std_min, std_max, c_mean are Python floats (TransferError at the call)

key = jax.random.key(0)
key, key_init = jax.random.split(key)
state = es.init(key_init, jnp.zeros(num_dims), params)
state = jc.device_tree(state)  # needed: init returns weakly typed best_solution/best_fitness that tell returns strongly typed (RecompileError at tell's compile)

ask = jc.hot_step(es.ask, state="state")
evaluate = jc.hot_step(jax.vmap(rosenbrock), stateless=True)
tell = jc.hot_step(es.tell, state="state")

with jc.hot_loop(compiles="warmup") as loop:
    for generation in loop.iterate(range(50)):
        key, key_ask, key_tell = jax.random.split(key, 3)
        population, state = ask(key_ask, state, params)
        fitness = evaluate(population)
        state, metrics = tell(key_tell, population, fitness, state, params)
        if generation % 10 == 0:
            print(f"generation {generation}: best fitness {jc.fetch(metrics['best_fitness']):.6f}")

print(f"final best fitness {state.best_fitness:.6f}")
