"""diffrax's manual stepping ported to jaxcontracts: eqx.filter_jit(solver.step)
replaced by jc.hot_step naming the carried solution and solver state (the
times are Python floats: host data), the loop put in jc.hot_loop, the read
made explicit."""
import diffrax
import jax.numpy as jnp

import jaxcontracts as jc


def vector_field(t, y, args):
    return -args * y


term = diffrax.ODETerm(vector_field)
solver = diffrax.Dopri5()
step = jc.hot_step(solver.step, state=("y0", "solver_state"), host=("t0", "t1"), static="made_jump")

t0 = 0.0
dt0 = 0.05
t1 = 1.0
y0 = jnp.array([1.0, 2.0, 3.0])
args = jnp.array(0.5)

tprev = t0
tnext = t0 + dt0
y = y0
state = solver.init(term, tprev, tnext, y0, args)

values = []
with jc.hot_loop(compiles="warmup"):
    while tprev < t1:
        y, _, _, state, _ = step(term, tprev, tnext, y, args, state, made_jump=False)
        values.append(round(float(jc.fetch(y)[0]), 6))
        tprev = tnext
        tnext = min(tprev + dt0, t1)
print(values[::5], [round(v, 6) for v in y.tolist()])
