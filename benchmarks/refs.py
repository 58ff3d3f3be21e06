"""refs: what a step that updates JAX refs in place costs a call, against the donated form.

JAX's training cookbook holds its train state in refs (``jax.new_ref``) and
updates them in place from a jitted step that returns nothing. The same step
written functionally takes its state and returns the new one, donated. Both
are compiled ahead of time (``jax.jit(f).trace(...).lower().compile()``) and
called in a loop over a dict of ``--leaves`` ``f32[4]`` leaves; so is the
ref step as a hot step (``jc.hot_step(state="state")``, at ``full`` and
``fast``), which passes the arrays the refs hold, donated, and puts the new
ones back. Interleaved block by block; printed: the median us per call of
each, and the ratios refs / donated and hot step / donated. Sizes are small,
so host dispatch dominates: the ratios are dispatch costs.

Run: ``python -m benchmarks.refs [--leaves 2 10 100] [--repeats 20] [--calls 300]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import jaxcontracts as jc


def _case(n: int, repeats: int, calls: int) -> dict[str, float]:
    x = jnp.ones(4)

    def in_place(state, x):
        for r in state.values():
            r[...] = r[...] + x

    def donated(state, x):
        return {k: v + x for k, v in state.items()}

    def make_refs():
        return {f"x{i}": jax.new_ref(jnp.zeros(4)) for i in range(n)}

    refs, arrays = make_refs(), {f"x{i}": jnp.zeros(4) for i in range(n)}
    ref_call = jax.jit(in_place).trace(refs, x).lower().compile()
    don_call = jax.jit(donated, donate_argnums=0).trace(arrays, x).lower().compile()
    hot = {level: (jc.hot_step(in_place, state="state"), make_refs()) for level in ("full", "fast")}
    ref_call(refs, x)
    arrays = don_call(arrays, x)
    for level, (step, r) in hot.items():
        with jc.checks_level(level):
            step(r, x)

    def refs_loop() -> None:
        for _ in range(calls):
            ref_call(refs, x)
        jax.block_until_ready(refs["x0"][...])

    def donated_loop() -> None:
        nonlocal arrays
        for _ in range(calls):
            arrays = don_call(arrays, x)
        jax.block_until_ready(arrays)

    def hot_loop(level: str):
        step, r = hot[level]

        def run() -> None:
            with jc.checks_level(level):
                for _ in range(calls):
                    step(r, x)
            jax.block_until_ready(r["x0"][...])

        return run

    loops = {
        "refs": refs_loop,
        "donated": donated_loop,
        "full": hot_loop("full"),
        "fast": hot_loop("fast"),
    }
    times: dict[str, list[float]] = {k: [] for k in loops}
    for _ in range(repeats):
        for name, run in loops.items():
            t0 = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    med = {k: statistics.median(v) for k, v in times.items()}
    med.update(
        {
            f"{k}/donated": statistics.median(a / b for a, b in zip(times[k], times["donated"]))
            for k in ("refs", "full", "fast")
        }
    )
    return med


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
    print("us per call (median), and ratios to the donated form (median of per-block ratios)")
    cols = ("refs", "donated", "full", "fast", "refs/donated", "full/donated", "fast/donated")
    print(f"{'state':<20}" + "".join(f"{c:>14}" for c in cols))
    for n in args.leaves:
        m = _case(n, args.repeats, args.calls)
        print(
            f"{f'dict of {n} leaves':<20}"
            + "".join(f"{m[c]:>14.{2 if '/' in c else 1}f}" for c in cols)
        )


if __name__ == "__main__":
    main()
