"""async: how long a call takes to *return* on a ~20 ms step (dispatch stays async).

What is measured
----------------
A state of two ``f32[n, n]`` matrices (``x`` and ``w``, both donated) and a
step that runs ``x = tanh(x @ w)`` ``k`` times in a ``fori_loop``, with ``k``
calibrated at start-up so that one step takes about 20 ms on this machine.
Each sample waits until the device is idle, then times how long
``out = f(state)`` takes to return control to Python (dispatch only, nothing
blocks), then how long until ``out`` is ready (the step itself). Variants,
interleaved in shuffled order: ``jax.jit`` (donated; the base),
``raw compiled`` and ``hot_step off|fast|full``.

If a hot_step call blocked on the device (a host read of a result, a sync in
a check), its return time would be the whole step (~20 ms) instead of tens of
microseconds.

Budget: a ``hot_step`` call (default ``full`` checks) returns as fast as a
``jax.jit`` call: return-time ratio ``<= 1.25`` (the ``full`` dispatch
budget), and the return takes under 10 % of the step (asynchronous).

Run: ``python -m benchmarks.async_dispatch`` (``--quick``: a ~2 ms step).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32

import jaxcontracts as jc
from benchmarks._common import Result, machine, parser, row

JIT = "jax.jit"
RAW = "raw compiled"
LEVELS = ("off", "fast", "full")
LIMIT = 1.25
ASYNC_FRACTION = 0.10


@jc.state
class Mats:
    x: Float32[Array, "n n"]
    w: Float32[Array, "n n"]


def make_step(k: int) -> Any:
    def step(s: Mats) -> Mats:
        x = jax.lax.fori_loop(0, k, lambda i, x: jnp.tanh(x @ s.w), s.x)
        return Mats(x=x, w=s.w)

    return step


def new_state(n: int) -> Mats:
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (n, n), jnp.float32)
    w = jax.random.normal(jax.random.fold_in(key, 1), (n, n), jnp.float32) / n**0.5
    return jax.block_until_ready(Mats(x=x, w=w))


def calibrate(n: int, target_s: float) -> int:
    """Matmuls per step so that one step takes about ``target_s``."""
    s = new_state(n)
    k = 1
    for _ in range(4):
        f = jax.jit(make_step(k))
        jax.block_until_ready(f(s))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(f(s))
            times.append(time.perf_counter() - t0)
        new_k = max(1, round(k * target_s / statistics.median(times)))
        if abs(new_k - k) <= 0.1 * k:
            return new_k
        k = new_k
    return k


def sample(f: Any, s: Any, level: str | None) -> tuple[float, float, Any]:
    """(return seconds, step seconds, new state), starting from an idle device."""
    if level is not None:
        jc.set_checks(level)  # type: ignore[arg-type]
    jax.block_until_ready(s)
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = f(s)
        t1 = time.perf_counter()
        jax.block_until_ready(out)
        t2 = time.perf_counter()
    finally:
        gc.enable()
    return t1 - t0, t2 - t0, out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--n", type=int, help="matrix size (default 512)")
    p.add_argument("--step-ms", type=float, help="target step time (default 20)")
    p.add_argument("--repeats", type=int, help="samples per variant (default 60)")
    args = p.parse_args(argv)
    n = args.n or (128 if args.quick else 512)
    step_ms = args.step_ms or (2.0 if args.quick else 20.0)
    repeats = args.repeats or (5 if args.quick else 60)
    start = time.perf_counter()
    initial = jc.get_checks()
    res = Result("async", "time for a call to return (not to finish) on a ~20 ms step")
    res.meta = machine()

    k = calibrate(n, step_ms / 1e3)
    jitted = jax.jit(make_step(k), donate_argnums=0)
    raw = jax.jit(make_step(k), donate_argnums=0).lower(new_state(n)).compile()
    hot = jc.hot_step(make_step(k), signature=Mats)
    hot.compile(Mats.spec(n=n))
    variants: dict[str, tuple[Any, str | None]] = {JIT: (jitted, None), RAW: (raw, None)}
    for level in LEVELS:
        variants[f"hot_step {level}"] = (hot, level)
    states = {name: new_state(n) for name in variants}
    returns: dict[str, list[float]] = {name: [] for name in variants}
    steps: dict[str, list[float]] = {name: [] for name in variants}
    for name, (f, level) in variants.items():  # warm up (jax.jit compiles here)
        for _ in range(2):
            _, _, states[name] = sample(f, states[name], level)

    rng = random.Random(args.seed)
    order = list(variants)
    for _ in range(repeats):
        gc.collect()
        rng.shuffle(order)
        for name in order:
            f, level = variants[name]
            ret, total, states[name] = sample(f, states[name], level)
            returns[name].append(ret * 1e6)
            steps[name].append(total * 1e3)
    jc.set_checks(initial)  # type: ignore[arg-type]

    case = f"f32[{n},{n}] x{k} matmuls"
    base = returns[JIT]
    for name in variants:
        res.rows.append(row(case, f"{name}: return", returns[name], "us", base=base, jit=base,
                            note="base" if name == JIT else ""))
    step_all = [x for xs in steps.values() for x in xs]
    res.rows.append(row(case, "the step itself (all variants)", step_all, "ms",
                        note="call to ready"))
    step_med = statistics.median(step_all)

    full = returns["hot_step full"]
    ratio = statistics.median(full) / statistics.median(base)
    frac = statistics.median(full) / 1e3 / step_med
    b = res.budget(
        f"hot_step full returns as fast as jax.jit: return <= {LIMIT:.2f}x jax.jit's",
        ratio, LIMIT, paired=[a / c for a, c in zip(full, base)], seed=args.seed,
        why=f"and asynchronous: the return takes {frac:.2%} of the {step_med:.1f} ms step "
        f"(must be < {ASYNC_FRACTION:.0%})",
    )
    if frac >= ASYNC_FRACTION:
        b["met"] = False
        b["verdict"] = "missed (blocks)"
    for level in ("off", "fast"):
        xs = returns[f"hot_step {level}"]
        res.notes.append(
            f"hot_step {level} return / jax.jit return: "
            f"{statistics.median(xs) / statistics.median(base):.3f}x"
        )
    res.notes.append(f"{k} matmuls of {n}x{n} per step; {repeats} samples per variant")
    res.check_clean("hot_step", hot)
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
