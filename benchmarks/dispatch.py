"""Per-call dispatch cost of ``jc.hot_step`` against raw JAX, in one process.

What is measured
----------------
For each state size (``--leaves``, default 10 and 100 leaves of ``f32[4]``, so
the computation is negligible and the host-side dispatch dominates), the same
step ``s -> s + 1`` (every leaf, carry-invariant, everything donated) is called
through five variants:

* ``raw compiled``  ``jax.jit(step, donate_argnums=0).lower(s).compile()``,
  called directly: the floor, JAX's compiled-executable fast path;
* ``jax.jit``       ``jax.jit(step, donate_argnums=0)``, called directly;
* ``hot_step off``  ``jc.hot_step(step, signature=S, donate="all")`` with
  ``jc.set_checks("off")``;
* ``hot_step fast`` the same hot_step with ``jc.set_checks("fast")``;
* ``hot_step full`` the same hot_step with ``jc.set_checks("full")``.

All variants take the same ``@jc.state`` class, so pytree flattening costs the
same everywhere, and all donate, so every loop is ``s = f(s)``.

How
---
The machine is assumed noisy, so drift has to cancel rather than average out:
after warming every variant up, each repeat (``--repeats``) times one block of
``--calls`` calls of every variant, in a freshly shuffled order, and records
the block's microseconds per call. A block is ``s = f(s)`` ``calls`` times with
dispatch left asynchronous, then one ``jax.block_until_ready(s)``; the timed
region includes that final wait (amortised over the block), identically for
every variant. The garbage collector runs once per repeat, between blocks, and
is disabled during each block (as ``timeit`` does), identically for every
variant. Many short blocks (default 200 calls x 100 repeats) beat a few long
ones here: on a shared 2-core machine block times swing by +-50 %, and short,
adjacent, shuffled blocks see the same conditions, so their ratios are stable.

How to read the table
---------------------
``median_us`` is the median over repeats of the per-call time of a block.
``x_raw_compiled`` and ``x_jax_jit`` are ratios of those medians (same run,
same process); the budgets use them. ``paired_x_raw`` is the median over
repeats of the ratio to the raw compiled block *of the same repeat*; it
cancels slow drift best, and when it disagrees with ``x_raw_compiled`` the run
was too noisy to trust at that precision. ``spread_%`` is the interquartile
range of the per-repeat times as a percentage of the median.

The budget lines compare the hot_step levels at 10 leaves with the raw
compiled call: ``off <= 1.02x``, ``fast <= 1.10x``, ``full <= 1.25x``. Each is
marked ``met``/``missed`` on the ratio of medians, and also shows the paired
ratio with a bootstrap 95 % interval; ``(uncertain)`` is appended when that
interval straddles the budget or lies on the other side of it than the ratio
of medians, i.e. this run cannot tell.

Usage::

    python benchmarks/dispatch.py                  # 10 and 100 leaves
    python benchmarks/dispatch.py --leaves 10 --calls 5000 --repeats 25
    python benchmarks/dispatch.py --quick          # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jaxtyping import Array, Float32

import jaxcontracts as jc

RAW = "raw compiled"
JIT = "jax.jit"
LEVELS = ("off", "fast", "full")
VARIANTS = (RAW, JIT, *(f"hot_step {level}" for level in LEVELS))
BUDGETS = {"off": 1.02, "fast": 1.10, "full": 1.25}  # x raw compiled, at 10 leaves
BUDGET_LEAVES = 10


def make_state_class(n_leaves: int) -> type:
    """A ``@jc.state`` class with ``n_leaves`` fields ``x0..`` of ``f32[4]``."""
    annotations = {f"x{i}": Float32[Array, "4"] for i in range(n_leaves)}

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = annotations
        ns["__module__"] = __name__

    return jc.state(types.new_class(f"State{n_leaves}", (), {}, body))


def make_step(state_cls: type) -> Callable[[Any], Any]:
    """``def step(s: S) -> S``: every leaf + 1 (dtype, shape, weak type kept)."""

    def step(s: Any) -> Any:
        return jax.tree_util.tree_map(lambda x: x + 1, s)

    step.__annotations__ = {"s": state_cls, "return": state_cls}
    return step


@dataclass
class Variant:
    """One thing to time: a callable, the checks level it needs, its state."""

    leaves: int
    name: str
    fn: Callable[[Any], Any]
    level: str | None  # jc.set_checks level to set before a block, or None
    state: Any
    samples: list[float] = field(default_factory=list)  # us per call, per repeat


def new_state(state_cls: type, n_leaves: int) -> Any:
    """A fresh device state (every field strongly typed f32[4])."""
    values = {f"x{i}": np.full(4, i, np.float32) for i in range(n_leaves)}
    return state_cls(**values)


def build_variants(n_leaves: int) -> tuple[list[Variant], jc.HotStep[Any, Any]]:
    state_cls = make_state_class(n_leaves)
    step = make_step(state_cls)
    step.__name__ = step.__qualname__ = f"step_{n_leaves}_leaves"

    raw = jax.jit(step, donate_argnums=0).lower(new_state(state_cls, n_leaves)).compile()
    jitted = jax.jit(step, donate_argnums=0)
    hot = jc.hot_step(step, signature=state_cls, donate="all")

    variants = [
        Variant(n_leaves, RAW, raw, None, new_state(state_cls, n_leaves)),
        Variant(n_leaves, JIT, jitted, None, new_state(state_cls, n_leaves)),
    ]
    for level in LEVELS:
        variants.append(
            Variant(n_leaves, f"hot_step {level}", hot, level, new_state(state_cls, n_leaves))
        )
    return variants, hot


def run_block(v: Variant, calls: int) -> float:
    """Time ``calls`` donated calls of ``v``; return microseconds per call."""
    if v.level is not None:
        jc.set_checks(v.level)  # type: ignore[arg-type]  # rebuilds the call path
    f = v.fn
    s = v.state
    v.state = None  # the only live reference is `s`: donation can consume it
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            s = f(s)
        jax.block_until_ready(s)
        t1 = time.perf_counter()
    finally:
        gc.enable()
    v.state = s
    return (t1 - t0) / calls * 1e6


def quantile(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


def median_ci(xs: list[float], seed: int, n_boot: int = 2000) -> tuple[float, float]:
    """Bootstrap 95 % interval of the median of ``xs``."""
    a = np.asarray(xs)
    idx = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
    meds = np.median(a[idx], axis=1)
    return float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--leaves", type=int, nargs="+", default=[10, 100], help="leaf counts")
    p.add_argument("--calls", type=int, default=200, help="calls per timed block")
    p.add_argument("--repeats", type=int, default=100, help="timed blocks per variant")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled block order")
    p.add_argument("--quick", action="store_true", help="tiny smoke run (< 20 s)")
    args = p.parse_args(argv)
    if args.quick:
        args.calls, args.repeats = min(args.calls, 100), min(args.repeats, 5)
    if args.calls < 1 or args.repeats < 1:
        p.error("--calls and --repeats must be >= 1")

    start = time.perf_counter()
    initial_level = jc.get_checks()
    print(
        f"jax {jax.__version__}, jaxcontracts {jc.__version__}, python "
        f"{platform.python_version()}, device {jax.devices()[0]}, "
        f"{args.calls} calls x {args.repeats} repeats, initial checks={initial_level}"
    )

    variants: list[Variant] = []
    hot_steps: dict[int, jc.HotStep[Any, Any]] = {}
    for n in args.leaves:
        vs, hot = build_variants(n)
        variants.extend(vs)
        hot_steps[n] = hot
    for v in variants:  # first call (compile for hot_step / jax.jit), then warm up
        for _ in range(2):
            run_block(v, max(50, min(args.calls, 500)))

    rng = random.Random(args.seed)
    order = list(variants)
    for _ in range(args.repeats):
        gc.collect()
        rng.shuffle(order)
        for v in order:
            v.samples.append(run_block(v, args.calls))
    jc.set_checks(initial_level)  # type: ignore[arg-type]

    by_key = {(v.leaves, v.name): v for v in variants}
    header = (
        f"{'leaves':>6}  {'variant':<14} {'median_us':>10} {'x_raw_compiled':>15} "
        f"{'x_jax_jit':>10} {'paired_x_raw':>13} {'spread_%':>9}"
    )
    print()
    print(header)
    print("-" * len(header))
    ratios: dict[tuple[int, str], float] = {}
    paired: dict[tuple[int, str], list[float]] = {}
    for n in args.leaves:
        raw = by_key[(n, RAW)]
        raw_med = statistics.median(raw.samples)
        jit_med = statistics.median(by_key[(n, JIT)].samples)
        for name in VARIANTS:
            v = by_key[(n, name)]
            med = statistics.median(v.samples)
            ratios[(n, name)] = med / raw_med
            paired[(n, name)] = [a / b for a, b in zip(v.samples, raw.samples, strict=True)]
            spread = (quantile(v.samples, 0.75) - quantile(v.samples, 0.25)) / med * 100
            print(
                f"{n:>6}  {name:<14} {med:>10.2f} {med / raw_med:>15.3f} "
                f"{med / jit_med:>10.3f} {statistics.median(paired[(n, name)]):>13.3f} "
                f"{spread:>9.1f}"
            )
        print()

    if BUDGET_LEAVES in args.leaves:
        print(f"budgets at {BUDGET_LEAVES} leaves (x raw compiled, ratio of medians):")
        for level, limit in BUDGETS.items():
            r = ratios[(BUDGET_LEAVES, f"hot_step {level}")]
            pr = paired[(BUDGET_LEAVES, f"hot_step {level}")]
            lo, hi = median_ci(pr, args.seed)
            verdict = "met" if r <= limit else "missed"
            if (lo <= limit) != (r <= limit) or (hi <= limit) != (r <= limit):
                verdict += " (uncertain)"  # the paired interval disagrees or straddles
            print(
                f"  {level:<4} <= {limit:.2f}x: {r:.3f}x   paired {statistics.median(pr):.3f}x "
                f"[95% {lo:.3f}, {hi:.3f}]   {verdict}"
            )
    else:
        print(f"(budgets are defined at {BUDGET_LEAVES} leaves, which were not run)")

    for n, hot in hot_steps.items():
        st = hot.stats
        if st.compiles != 1 or st.refused:
            print(f"WARNING: hot_step at {n} leaves: {st}", file=sys.stderr)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
