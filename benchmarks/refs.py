"""refs: what a step that updates JAX refs in place costs a call, against the donated form.

JAX's training cookbook holds its train state in refs (``jax.new_ref``) and
updates them in place from a jitted step that returns nothing. The same step
written functionally takes its state and returns the new one, donated. Both
are compiled ahead of time (``jax.jit(f).trace(...).lower().compile()``) and
called in a loop over a dict of ``--leaves`` ``f32[4]`` leaves, interleaved
block by block; printed: the median us per call of each and the ratio
refs / donated. Sizes are small, so host dispatch dominates: the ratio is
the dispatch cost of passing refs.

Run: ``python -m benchmarks.refs [--leaves 2 10 100] [--repeats 20] [--calls 300]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp


def _case(n: int, repeats: int, calls: int) -> tuple[float, float, float]:
    x = jnp.ones(4)

    def in_place(state, x):
        for r in state.values():
            r[...] = r[...] + x

    def donated(state, x):
        return {k: v + x for k, v in state.items()}

    refs = {f"x{i}": jax.new_ref(jnp.zeros(4)) for i in range(n)}
    arrays = {f"x{i}": jnp.zeros(4) for i in range(n)}
    ref_call = jax.jit(in_place).trace(refs, x).lower().compile()
    don_call = jax.jit(donated, donate_argnums=0).trace(arrays, x).lower().compile()
    ref_call(refs, x)
    arrays = don_call(arrays, x)
    a_times, b_times, ratios = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            ref_call(refs, x)
        jax.block_until_ready(refs["x0"][...])
        t1 = time.perf_counter()
        for _ in range(calls):
            arrays = don_call(arrays, x)
        jax.block_until_ready(arrays)
        t2 = time.perf_counter()
        a, b = (t1 - t0) / calls * 1e6, (t2 - t1) / calls * 1e6
        a_times.append(a)
        b_times.append(b)
        ratios.append(a / b)
    return statistics.median(a_times), statistics.median(b_times), statistics.median(ratios)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.refs")
    p.add_argument("--leaves", type=int, nargs="+", default=[2, 10, 100])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    if not hasattr(jax, "new_ref"):
        print("this jax has no jax.new_ref")
        return
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    print(f"{'state':<22}{'refs us/call':>14}{'donated us/call':>17}{'refs/donated':>14}")
    for n in args.leaves:
        a, b, r = _case(n, args.repeats, args.calls)
        print(f"{f'dict of {n} leaves':<22}{a:>14.1f}{b:>17.1f}{r:>14.2f}")


if __name__ == "__main__":
    main()
