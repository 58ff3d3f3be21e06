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

Entry and exit against the number of live steps: an empty
``with jc.hot_loop():``, with 2, 102 and 1,002 live hot steps (the extra ones
compiled and called once outside any loop, as a sweep or a test suite leaves
them; a step call itself is left out: XLA's own call slows down with many
live executables on CPU, which is not the loop's cost). Budget: the cost at 1,002 live steps ``<= 1.25x`` the cost at
2 (constant time in the number of live steps; it was about 2 us per live
step, 40x at 1,002).

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


def _make_step(i: int) -> jc.HotStep:
    def extra(p: Particles) -> Particles:
        return Particles(pos=p.pos * 1.0, vel=p.vel, step=p.step + i, dt=p.dt)

    extra.__qualname__ = f"extra_{i}"
    return jc.hot_step(signature=Particles)(extra)


def _entry_us(p: Particles, repeats: int) -> tuple[list[float], Particles]:
    """Per sample: one empty `with jc.hot_loop():`, in us."""
    out = []
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            with jc.hot_loop():
                pass
            out.append((time.perf_counter() - t0) * 1e6)
    finally:
        gc.enable()
    return out, p


def entry_rows(res: Result, p: Particles, repeats: int, sizes: tuple[int, ...], seed: int) -> Particles:
    """Entry + exit against the number of live steps, sizes interleaved.

    The extra steps are made (compiled, called once) up front; a block at
    size n registers the first n - 2 of them as live (the library's own
    registry, ``_steps``) and unregisters the rest, so the sizes can be
    timed in shuffled blocks like every other comparison here.
    """
    from jaxcontracts import _steps

    extra: list[jc.HotStep] = []
    while len(extra) + 2 < sizes[-1]:
        step = _make_step(len(extra))
        p = step(p)  # compiled and called once, outside any loop
        extra.append(step)

    def live(n: int) -> None:
        for i, step in enumerate(extra):
            if i < n - 2:
                _steps.register(step)
            else:
                _steps._live.discard(step)

    samples: dict[int, list[float]] = {n: [] for n in sizes}
    rng = random.Random(seed)
    for n in sizes:  # warm
        live(n)
        _entry_us(p, 20)
    for _ in range(repeats):
        order = list(sizes)
        rng.shuffle(order)
        for n in order:
            live(n)
            block, p = _entry_us(p, 10)
            samples[n].append(statistics.median(block))
    live(sizes[-1])
    base = samples[sizes[0]]
    for n in sizes:
        res.rows.append(row("empty with hot_loop:", f"{n} live steps", samples[n], "us/entry",
                            base=base, note="base" if n == sizes[0] else ""))
    ratio = statistics.median(samples[sizes[-1]]) / statistics.median(base)
    res.budget(f"loop entry+exit at {sizes[-1]} live steps <= 1.25x at {sizes[0]}", ratio, 1.25,
               paired=[a / b for a, b in zip(samples[sizes[-1]], base)], seed=seed)
    del extra
    return p


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
    sizes = (2, 12) if args.quick else (2, 102, 1002)
    state = entry_rows(res, state, 5 if args.quick else 60, sizes, args.seed)
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
