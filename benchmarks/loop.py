"""loop: what a ``jc.hot_loop`` costs a loop: 1,000 steps inside vs outside.

What is measured
----------------
Two hot steps (``fn1``, ``fn2``, default ``full`` checks) on a small particle
state run in a plain host loop ``p = fn2(fn1(p))`` of 1,000 iterations,
either bare or inside ``with jc.hot_loop():``. Entering the loop patches the
array class once and engages JAX's transfer guard; inside it, hot steps also
remember their last call (for messages). Each sample is one whole loop,
entering and leaving the ``with`` block included, ending in one
``block_until_ready``. The two variants are interleaved in shuffled order so
that machine drift cancels.

Budget: inside / outside ``<= 1.05`` (ratio of medians).

Run: ``python -m benchmarks.loop`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import gc
import random
import statistics
import time

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc
from benchmarks._common import Result, machine, parser, row

LIMIT = 1.05


@jc.state
class Particles:
    pos: Float32[Array, "n 3"]
    vel: Float32[Array, "n 3"]
    step: Int32[Array, ""]
    dt: float = jc.static(0.01)


@jc.hot_step(signature=Particles)
def fn1(p: Particles) -> Particles:
    return Particles(pos=p.pos + p.vel * p.dt, vel=p.vel, step=p.step + 1, dt=p.dt)


@jc.hot_step(signature=Particles)
def fn2(p: Particles) -> Particles:
    return Particles(pos=p.pos, vel=p.vel - p.pos * p.dt, step=p.step, dt=p.dt)


def run(p: Particles, steps: int, guarded: bool) -> tuple[float, Particles]:
    gc.disable()
    try:
        t0 = time.perf_counter()
        if guarded:
            with jc.hot_loop():
                for _ in range(steps):
                    p = fn2(fn1(p))
        else:
            for _ in range(steps):
                p = fn2(fn1(p))
        jax.block_until_ready(p)
        return time.perf_counter() - t0, p
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, help="loop iterations (default 1000)")
    p.add_argument("--repeats", type=int, help="loops per variant (default 41)")
    p.add_argument("--n", type=int, default=256, help="particles")
    args = p.parse_args(argv)
    steps = args.steps or (20 if args.quick else 1000)
    repeats = args.repeats or (3 if args.quick else 41)
    start = time.perf_counter()
    res = Result("loop", f"{steps} iterations of p = fn2(fn1(p)), inside vs outside hot_loop")
    res.meta = machine()

    state = Particles(
        pos=jax.random.normal(jax.random.PRNGKey(0), (args.n, 3), jnp.float32),
        vel=jnp.zeros((args.n, 3), jnp.float32),
        step=0,
    )
    state = fn2(fn1(state))  # compile both before timing
    samples: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):  # warm-up of both variants
        for guarded in (False, True):
            _, state = run(state, steps, guarded)
    rng = random.Random(args.seed)
    for _ in range(repeats):
        gc.collect()
        order = [False, True]
        rng.shuffle(order)
        for guarded in order:
            seconds, state = run(state, steps, guarded)
            samples[guarded].append(seconds * 1e3)

    case = f"{steps} x 2 steps, n={args.n}"
    outside, inside = samples[False], samples[True]
    res.rows.append(row(case, "outside hot_loop", outside, "ms/loop", base=outside, note="base"))
    res.rows.append(row(case, "inside hot_loop", inside, "ms/loop", base=outside))
    ratio = statistics.median(inside) / statistics.median(outside)
    res.budget(f"a loop inside hot_loop <= {LIMIT:.2f}x the same loop outside", ratio, LIMIT,
               paired=[a / b for a, b in zip(inside, outside)], seed=args.seed)
    per_step = statistics.median(outside) / steps / 2 * 1e3
    res.notes.append(f"{per_step:.1f} us per hot_step call outside the loop; {repeats} loops each")
    for f in (fn1, fn2):
        res.check_clean(f.__name__, f)
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
