"""What a ``jc.hot_loop`` costs a loop: 1,000 steps inside vs outside.

Two hot steps (``fn1``, ``fn2``) on a small particle state run in a plain host
loop, either bare or inside ``with jc.hot_loop():``. Entering the loop patches
the array class once and engages JAX's transfer guard; inside it, hot steps
also remember their last call (for messages). The two variants are
interleaved, in shuffled order, so machine drift cancels; each sample is one
whole loop of ``--steps`` steps ending in one ``block_until_ready``, and the
ratio is of the medians. Budget: inside / outside <= 1.05.

Run: ``python benchmarks/loop.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--n", type=int, default=256, help="particles")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 20, 3

    p = Particles(
        pos=jax.random.normal(jax.random.PRNGKey(0), (args.n, 3), jnp.float32),
        vel=jnp.zeros((args.n, 3), jnp.float32),
        step=0,
    )
    p = fn2(fn1(p))  # compile both before timing
    samples: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):  # warm-up of both variants
        for guarded in (False, True):
            _, p = run(p, args.steps, guarded)
    for _ in range(args.repeats):
        order = [False, True]
        random.shuffle(order)
        for guarded in order:
            seconds, p = run(p, args.steps, guarded)
            samples[guarded].append(seconds)

    outside = statistics.median(samples[False])
    inside = statistics.median(samples[True])
    ratios = sorted(i / o for i, o in zip(samples[True], samples[False]))
    print(
        f"jax {jax.__version__}, python {sys.version.split()[0]}, {args.steps} steps "
        f"(2 hot steps each) x {args.repeats} interleaved repeats, n={args.n}"
    )
    print(f"{'variant':<20}{'median ms/loop':>16}{'us/step':>10}")
    print(f"{'outside hot_loop':<20}{outside * 1e3:>16.2f}{outside / args.steps * 1e6:>10.1f}")
    print(f"{'inside hot_loop':<20}{inside * 1e3:>16.2f}{inside / args.steps * 1e6:>10.1f}")
    ratio = inside / outside
    paired = statistics.median(ratios)
    verdict = "met" if ratio <= 1.05 else "missed"
    print(f"inside/outside: {ratio:.3f}x (median of paired ratios {paired:.3f}x); budget <= 1.05x: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
