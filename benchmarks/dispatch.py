"""dispatch: per-call time of ``jc.hot_step`` against raw JAX and its peers.

What is measured
----------------
For states of 1, 10, 100 and 1,000 leaves of ``f32[4]`` (so the computation
is negligible and host-side dispatch dominates), the same step ``s -> s + 1``
(every leaf, carry-invariant, everything donated, so every loop is
``s = f(s)``) is called through:

* ``raw compiled``: ``jax.jit(step, donate_argnums=0).lower(s).compile()``
  called directly, the floor (JAX's compiled-executable fast path); the base;
* ``jax.jit``: ``jax.jit(step, donate_argnums=0)``;
* ``hot_step off|fast|full``: ``jc.hot_step(step, signature=S)`` at each
  checks level. A step builds one call path per level when the level is
  set (``jc.set_checks``); after the warm-up each level's path is taken
  once and timed as is, so a block does not pay a rebuild and its cold
  first call (tens of us, which a real loop pays once per level change);
* the peers a user would otherwise pick, each donating too:
  ``eqx.filter_jit(step, donate="all")``; ``jax.jit(chex.assert_max_traces(
  step, n=1))`` (chex's documented form: the assertion wraps the traced
  function, inside jit; around a jitted function it would count calls, not
  traces); ``jaxtyped(typechecker=beartype)`` around a call of the donated
  ``jax.jit`` (runtime type checking of the state argument and result).
  A peer that is not installed shows ``not installed``.

All variants take the same ``@jc.state`` class, so pytree flattening costs the
same everywhere.

How
---
After warming every variant up, each repeat times one block of calls of every
variant (all leaf counts), in a freshly shuffled order: a block is ``s = f(s)``
``calls`` times with dispatch left asynchronous, then one
``jax.block_until_ready(s)``, inside the timed region for every variant alike.
``calls`` is set per leaf count so that a raw block lasts about 5 ms: short,
adjacent, shuffled blocks see the same machine, so their ratios are stable even
when block times swing by +-50 %. The garbage collector runs between repeats
and is off inside blocks (as ``timeit`` does).

Budgets (x raw compiled, ratio of medians, at 10 and 100 leaves):
``off <= 1.02``, ``fast <= 1.10``, ``full <= 1.25``.

The notes give the paired per-call overhead over the raw call (median of
per-repeat differences) at every leaf count, which shows how the cost of the
checks grows with the number of leaves.

Run: ``python -m benchmarks.dispatch`` (``--quick``: tiny; ``--leaves 10``).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jaxtyping import Array, Float32

import jaxcontracts as jc
from benchmarks._common import Result, donated_block, machine, parser, row

RAW = "raw compiled"
JIT = "jax.jit"
LEVELS = ("off", "fast", "full")
EQX = "eqx.filter_jit(donate=all)"
CHEX = "jax.jit(chex.assert_max_traces)"
TYPED = "jaxtyped(beartype)(jax.jit)"
BUDGETS = {"off": 1.02, "fast": 1.10, "full": 1.25}
BUDGET_LEAVES = (10, 100)


def make_state_class(n_leaves: int) -> type:
    """A ``@jc.state`` class with ``n_leaves`` fields ``x0..`` of ``f32[4]``."""
    annotations = {f"x{i}": Float32[Array, "4"] for i in range(n_leaves)}

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = annotations
        ns["__module__"] = __name__

    return jc.state(types.new_class(f"State{n_leaves}", (), {}, body))


def make_step(state_cls: type, n_leaves: int) -> Callable[[Any], Any]:
    """A fresh ``def step(s: S) -> S``: every leaf + 1 (dtype, shape, weak type kept)."""

    def step(s: Any) -> Any:
        return jax.tree_util.tree_map(lambda x: x + 1, s)

    step.__annotations__ = {"s": state_cls, "return": state_cls}
    step.__name__ = step.__qualname__ = f"step_{n_leaves}_leaves"
    return step


def new_state(state_cls: type, n_leaves: int) -> Any:
    """A fresh device state (every field strongly typed f32[4])."""
    return state_cls(**{f"x{i}": np.full(4, i, np.float32) for i in range(n_leaves)})


@dataclass
class Variant:
    """One thing to time: a callable, the checks level it needs, its state."""

    leaves: int
    name: str
    fn: Callable[[Any], Any] | None  # None: not installed
    level: str | None  # jc.set_checks level to set before a block, or None
    state: Any = None
    note: str = ""
    samples: list[float] = field(default_factory=list)  # us per call, per repeat


def build_variants(n: int) -> tuple[list[Variant], jc.HotStep[Any, Any]]:
    S = make_state_class(n)
    raw = jax.jit(make_step(S, n), donate_argnums=0).lower(new_state(S, n)).compile()
    hot = jc.hot_step(make_step(S, n), signature=S, donate="all")
    variants = [
        Variant(n, RAW, raw, None),
        Variant(n, JIT, jax.jit(make_step(S, n), donate_argnums=0), None),
        *(Variant(n, f"hot_step {level}", hot, level) for level in LEVELS),
    ]
    try:
        import equinox as eqx
    except ImportError:
        variants.append(Variant(n, EQX, None, None, note="not installed"))
    else:
        variants.append(Variant(n, EQX, eqx.filter_jit(make_step(S, n), donate="all"), None))
    try:
        import chex
    except ImportError:
        variants.append(Variant(n, CHEX, None, None, note="not installed"))
    else:
        traced = chex.assert_max_traces(make_step(S, n), n=1)
        variants.append(Variant(n, CHEX, jax.jit(traced, donate_argnums=0), None))
    try:
        from beartype import beartype
        from jaxtyping import jaxtyped
    except ImportError:
        variants.append(Variant(n, TYPED, None, None, note="not installed"))
    else:
        jitted = jax.jit(make_step(S, n), donate_argnums=0)

        def typed_call(s: Any) -> Any:
            return jitted(s)

        typed_call.__annotations__ = {"s": S, "return": S}
        variants.append(Variant(n, TYPED, jaxtyped(typechecker=beartype)(typed_call), None))
    for v in variants:
        if v.fn is not None:
            v.state = new_state(S, n)
    return variants, hot


run_block = donated_block  # benchmarks._common: one timed block of s = f(s)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--leaves", type=int, nargs="+", help="leaf counts (default 1 10 100 1000)")
    p.add_argument("--repeats", type=int, help="timed blocks per variant (default 150)")
    p.add_argument("--block-ms", type=float, help="target length of a raw block (default 5)")
    args = p.parse_args(argv)
    leaves = args.leaves or ([1, 10, 100] if args.quick else [1, 10, 100, 1000])
    repeats = args.repeats or (5 if args.quick else 150)
    block_ms = args.block_ms or (0.5 if args.quick else 5.0)
    start = time.perf_counter()
    initial = jc.get_checks()
    res = Result("dispatch", "per-call time of a donated s = f(s) step, f32[4] leaves")
    res.meta = machine()

    variants: list[Variant] = []
    hot_steps: dict[int, jc.HotStep[Any, Any]] = {}
    calls: dict[int, int] = {}
    for n in leaves:
        vs, hot = build_variants(n)
        variants.extend(vs)
        hot_steps[n] = hot
    timed = [v for v in variants if v.fn is not None]
    for v in timed:  # first call (compiles), then warm up
        run_block(v, 2)
        run_block(v, 20 if args.quick else 100)
        if v.level is not None:
            # This level's call path, as the warm-up built it, timed as is:
            # jc.set_checks(level) makes every step rebuild its path at its
            # next call, and doing that before every block would time the
            # rebuild and its cold first call too (a loop pays that once,
            # when the level changes).
            v.fn, v.level = hot_steps[v.leaves]._call, None
    for n in leaves:  # calls per block: a raw block lasts about block_ms
        raw = next(v for v in timed if v.leaves == n and v.name == RAW)
        per_call = statistics.median(run_block(raw, 10) for _ in range(3))
        calls[n] = int(min(2000, max(2, round(block_ms * 1e3 / per_call))))

    rng = random.Random(args.seed)
    order = list(timed)
    for _ in range(repeats):
        gc.collect()
        rng.shuffle(order)
        for v in order:
            v.samples.append(run_block(v, calls[v.leaves]))
    jc.set_checks(initial)  # type: ignore[arg-type]

    by_key = {(v.leaves, v.name): v for v in variants}
    overhead: dict[str, list[str]] = {"fast": [], "full": [], "off": []}
    for n in leaves:
        case = f"{n} leaf" if n == 1 else f"{n} leaves"
        raw = by_key[(n, RAW)].samples
        jit = by_key[(n, JIT)].samples
        for v in variants:
            if v.leaves != n:
                continue
            note = v.note or ("base" if v.name == RAW else "")
            res.rows.append(row(case, v.name, v.samples, "us/call", base=raw, jit=jit, note=note))
        for level in LEVELS:
            diffs = [a - b for a, b in zip(by_key[(n, f"hot_step {level}")].samples, raw)]
            overhead[level].append(f"{n}: {statistics.median(diffs):+.2f}")
    for level in ("off", "fast", "full"):
        res.notes.append(
            f"hot_step {level} minus raw compiled, us/call (median of paired differences), "
            f"by leaves: {', '.join(overhead[level])}"
        )
    res.notes.append(
        "calls per block: " + ", ".join(f"{n} {'leaf' if n == 1 else 'leaves'}: {c}" for n, c in calls.items())
        + f"; {repeats} repeats"
    )

    for n in BUDGET_LEAVES:
        for level, limit in BUDGETS.items():
            v = by_key.get((n, f"hot_step {level}"))
            line = f"{n} leaves: hot_step {level} <= {limit:.2f}x raw compiled"
            if v is None:
                res.budget(line, None, limit, why=f"{n} leaves were not run")
                continue
            raw = by_key[(n, RAW)].samples
            value = statistics.median(v.samples) / statistics.median(raw)
            paired = [a / b for a, b in zip(v.samples, raw)]
            res.budget(line, value, limit, paired=paired, seed=args.seed)

    for n, hot in hot_steps.items():
        res.check_clean(f"hot_step at {n} leaves", hot)
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
