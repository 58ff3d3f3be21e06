"""diffrax's manual stepping, as its docs write it: an ODE term, a solver
initialised once, and solver.step called from a Python while loop that
advances the time itself; the step jitted with eqx.filter_jit. Small; nothing
downloaded."""
import diffrax
import equinox as eqx
import jax.numpy as jnp


def vector_field(t, y, args):
    return -args * y


term = diffrax.ODETerm(vector_field)
solver = diffrax.Dopri5()
step = eqx.filter_jit(solver.step)

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
while tprev < t1:
    y, _, _, state, _ = step(term, tprev, tnext, y, args, state, made_jump=False)
    values.append(round(float(y[0]), 6))
    tprev = tnext
    tnext = min(tprev + dt0, t1)
print(values[::5], [round(v, 6) for v in y.tolist()])
