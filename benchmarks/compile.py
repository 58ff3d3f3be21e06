"""compile: compiling a hot_step from ``Cls.spec(...)`` vs jax.jit's first call.

What is measured
----------------
For states of 10 and 100 leaves of ``f32[1024]`` and the step
``x -> tanh(x) * 0.5 + 1`` on every leaf, each sample builds a *fresh*
function (so no per-function cache can answer) after ``jax.clear_caches()``
(so JAX's in-memory tracing, lowering and compilation caches cannot either),
then times one of:

* ``jax.jit first call``: ``jax.jit(step, donate_argnums=0)(state)`` until
  the result is ready (trace, lower, compile, run); the base;
* ``hot_step.compile(spec)``: ``jc.hot_step(step, signature=S)`` and
  ``.compile(S.spec(n=1024))``: decoration, spec, trace, lower, compile and
  the compile-time contracts (carry invariance, verified donation), with no
  data at all;
* ``hot_step first call``: the hot_step decorated and called on the state
  (compiles from the argument's spec, then runs), for reference;
* ``jax AOT from spec``: ``jax.jit(step, donate_argnums=0).trace(spec)
  .lower().compile()``, JAX alone compiling from the same spec: the
  difference to ``hot_step.compile(spec)`` is what jaxcontracts adds
  (decoration, the spec, the contracts), for reference.

The state given to the calls is made before the clock starts. Variants are
interleaved in shuffled order.

Budget: ``hot_step.compile(spec) <= 1.00x`` jax.jit's first call.

Run: ``python -m benchmarks.compile`` (``--quick``: 10 leaves, 2 repeats).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32

import jaxcontracts as jc
from benchmarks._common import Result, machine, parser, row

JIT = "jax.jit first call"
SPEC = "hot_step.compile(spec)"
HOT = "hot_step first call"
AOT = "jax AOT from spec"
VARIANTS = (JIT, SPEC, HOT, AOT)
LIMIT = 1.00


def make_state_class(n_leaves: int) -> type:
    annotations = {f"x{i}": Float32[Array, "n"] for i in range(n_leaves)}

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = annotations
        ns["__module__"] = __name__

    return jc.state(types.new_class(f"State{n_leaves}", (), {}, body))


def fresh_step(state_cls: type) -> Callable[[Any], Any]:
    """A new function object every time (no cache keyed on it can hit)."""

    def step(s: Any) -> Any:
        return jax.tree_util.tree_map(lambda x: jnp.tanh(x) * 0.5 + 1, s)

    step.__annotations__ = {"s": state_cls, "return": state_cls}
    return step


def sample(name: str, S: type, n: int) -> float:
    state = S.zeros(n=n)
    jax.block_until_ready(state)
    jax.clear_caches()
    gc.collect()
    fn = fresh_step(S)
    t0 = time.perf_counter()
    if name == JIT:
        jax.block_until_ready(jax.jit(fn, donate_argnums=0)(state))
    elif name == SPEC:
        jc.hot_step(fn, signature=S).compile(S.spec(n=n))
    elif name == AOT:
        jax.jit(fn, donate_argnums=0).trace(S.spec(n=n)).lower().compile()
    else:
        jax.block_until_ready(jc.hot_step(fn, signature=S)(state))
    return (time.perf_counter() - t0) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--leaves", type=int, nargs="+", help="leaf counts (default 10 100)")
    p.add_argument("--n", type=int, default=1024, help="elements per leaf")
    p.add_argument("--repeats", type=int, help="samples per variant (default 40)")
    args = p.parse_args(argv)
    leaves = args.leaves or ([10] if args.quick else [10, 100])
    repeats = args.repeats or (2 if args.quick else 40)
    start = time.perf_counter()
    res = Result("compile", "compile from a spec (no data) vs jax.jit's first call")
    res.meta = machine()

    classes = {n: make_state_class(n) for n in leaves}
    variants = [(n, name) for n in leaves for name in VARIANTS]
    for n, name in variants:  # warm up the machinery (imports, first-use caches)
        sample(name, classes[n], args.n)
    times: dict[tuple[int, str], list[float]] = {v: [] for v in variants}
    rng = random.Random(args.seed)
    for _ in range(repeats):
        rng.shuffle(variants)
        for n, name in variants:
            times[(n, name)].append(sample(name, classes[n], args.n))

    for n in leaves:
        case = f"{n} leaves"
        base = times[(n, JIT)]
        for name in VARIANTS:
            res.rows.append(row(case, name, times[(n, name)], "ms", base=base, jit=base,
                                note="base" if name == JIT else ""))
        spec = times[(n, SPEC)]
        added = statistics.median([a - b for a, b in zip(spec, times[(n, AOT)])])
        res.notes.append(f"{n} leaves: hot_step.compile(spec) minus JAX's own compile from the "
                         f"spec: {added:+.1f} ms (median of paired differences)")
        res.budget(f"{n} leaves: hot_step.compile(spec) <= {LIMIT:.2f}x jax.jit first call",
                   statistics.median(spec) / statistics.median(base), LIMIT,
                   paired=[a / b for a, b in zip(spec, base)], seed=args.seed)
    res.notes.append(f"{repeats} samples per variant, each after jax.clear_caches() "
                     f"with a fresh function; f32[{args.n}] leaves")
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
