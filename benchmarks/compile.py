"""compile: compiling a hot_step from ``Cls.spec(...)`` vs JAX's own AOT compile.

What is measured
----------------
For states of 10, 100 and 1,000 leaves of ``f32[1024]`` and the step
``x -> tanh(x) * 0.5 + 1`` on every leaf, each sample builds a *fresh*
function (so no per-function cache can answer) after ``jax.clear_caches()``
(so JAX's in-memory tracing, lowering and compilation caches cannot either),
then times one of:

* ``jax AOT from spec``: ``jax.jit(step, donate_argnums=0).trace(spec)
  .lower().compile()``, JAX alone compiling from the same spec; the base;
* ``jax AOT from spec (A/A)``: the same again, as its own variant: its ratio
  to the base is the method's resolution (it should read 1.00);
* ``hot_step.compile(spec)``: ``jc.hot_step(step, signature=S)`` and
  ``.compile(S.spec(n=1024))``: decoration, spec, trace, lower, compile and
  the compile-time contracts (carry invariance, verified donation), with no
  data at all;
* ``jax AOT, keep_unused=True``: the program jaxcontracts compiles (it keeps
  every parameter, so that an unused donated leaf is still donated); JAX's
  default prunes unused parameters, a pass over the jaxpr that this skips, for
  reference;
* ``jax.jit first call`` and ``hot_step first call``: the same compiled and
  run on a state (trace, lower, compile, run), for reference.

The state given to the calls is made before the clock starts. Variants are
interleaved in shuffled order.

Our own work against the program's size
---------------------------------------
A second table keeps 10 leaves and grows the program (``--ops``: a chain of
4, 64 and 1,024 ``tanh``/``mul``/``add`` ops per leaf, 120 to 30,720 HLO
ops). Each hot_step sample splits its time into what JAX did (trace, lower,
compile: the step's own ``compile_seconds``) and the rest; the rest includes
freeing JAX's trace and lowering as the compile returns, which JAX's AOT
compile pays too (timed there apart, as ``del traced, lowered``). The rest
less that (and less ``S.spec(...)``, which both make) is jaxcontracts' own
work (decoration, contracts, the call path). Differences of two second-long compiles are too noisy to show a
millisecond, so this is timed directly; it must not grow with the program
(donation is proven from one attribute per entry parameter, not from the
program's text).

Budget: ``hot_step.compile(spec) <= 1.02x`` JAX's own AOT compile at each
leaf count.

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
AA = "jax AOT from spec (A/A)"
KEEP = "jax AOT, keep_unused=True"
VARIANTS = (AOT, AA, SPEC, KEEP, JIT, HOT)
LIMIT = 1.02


def make_state_class(n_leaves: int) -> type:
    annotations = {f"x{i}": Float32[Array, "n"] for i in range(n_leaves)}

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = annotations
        ns["__module__"] = __name__

    return jc.state(types.new_class(f"State{n_leaves}", (), {}, body))


def fresh_step(state_cls: type, ops: int = 1) -> Callable[[Any], Any]:
    """A new function object every time (no cache keyed on it can hit);
    ``ops``: how many times the leaf update is chained (the program's size)."""

    def update(x: Any) -> Any:
        for _ in range(ops):
            x = jnp.tanh(x) * 0.5 + 1
        return x

    def step(s: Any) -> Any:
        return jax.tree_util.tree_map(update, s)

    step.__annotations__ = {"s": state_cls, "return": state_cls}
    return step


def sample(name: str, S: type, n: int, ops: int = 1) -> tuple[float, float]:
    """(milliseconds, of which jaxcontracts' own work), for hot_step variants;
    for JAX's AOT compile, the second is the time it takes to free the trace
    and the lowering (a hot_step frees them as its compile returns)."""
    state = S.zeros(n=n)
    jax.block_until_ready(state)
    jax.clear_caches()
    gc.collect()
    # Held by what compiles it only: JAX's caches of its trace and lowering
    # die with the compile in every variant, as they do with a hot_step's.
    fns = [fresh_step(S, ops)]
    step, t_spec = None, 0.0
    t0 = time.perf_counter()
    if name == JIT:
        jax.block_until_ready(jax.jit(fns.pop(), donate_argnums=0)(state))
    elif name == SPEC:
        step = jc.hot_step(fns.pop(), signature=S)
        t_spec = time.perf_counter()
        spec = S.spec(n=n)
        t_spec = time.perf_counter() - t_spec  # JAX's AOT compile makes the spec too
        step.compile(spec)
    elif name in (AOT, AA):
        jitted = jax.jit(fns.pop(), donate_argnums=0)
        traced = jitted.trace(S.spec(n=n))
        lowered = traced.lower()
        compiled = lowered.compile()
        t1 = time.perf_counter()
        del traced, lowered, jitted  # what a hot_step's compile frees as it returns
        freed = time.perf_counter() - t1
        seconds = time.perf_counter() - t0
        del compiled
        return seconds * 1e3, freed * 1e3
    elif name == KEEP:
        jax.jit(fns.pop(), donate_argnums=0, keep_unused=True).trace(S.spec(n=n)).lower().compile()
    else:
        step = jc.hot_step(fns.pop(), signature=S)
        jax.block_until_ready(step(state))
    seconds = time.perf_counter() - t0
    own = seconds - step.stats.compile_seconds - t_spec if step is not None else 0.0
    return seconds * 1e3, own * 1e3


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--leaves", type=int, nargs="+", help="leaf counts (default 10 100 1000)")
    p.add_argument("--ops", type=int, nargs="+", help="ops per leaf of the size table (default 4 64 1024)")
    p.add_argument("--n", type=int, default=1024, help="elements per leaf")
    p.add_argument("--repeats", type=int, help="samples per variant (default 30)")
    args = p.parse_args(argv)
    leaves = args.leaves or ([10] if args.quick else [10, 100, 1000])
    sizes = args.ops or ([4, 16] if args.quick else [4, 64, 1024])
    repeats = args.repeats or (2 if args.quick else 30)
    start = time.perf_counter()
    res = Result("compile", "compile from a spec (no data) vs JAX's own AOT compile")
    res.meta = machine()

    classes = {n: make_state_class(n) for n in {*leaves, 10}}
    variants = [(n, name, 1) for n in leaves for name in VARIANTS]
    variants += [(10, name, ops) for ops in sizes for name in (AOT, SPEC)]
    for n, name, ops in variants:  # warm up the machinery (imports, first-use caches)
        sample(name, classes[n], args.n, ops)
    times: dict[tuple[int, str, int], list[tuple[float, float]]] = {v: [] for v in variants}
    rng = random.Random(args.seed)
    for _ in range(repeats):
        rng.shuffle(variants)
        for n, name, ops in variants:
            times[(n, name, ops)].append(sample(name, classes[n], args.n, ops))

    def ms(key: tuple[int, str, int]) -> list[float]:
        return [t for t, _ in times[key]]

    for n in leaves:
        case = f"{n} leaves"
        base = ms((n, AOT, 1))
        for name in VARIANTS:
            res.rows.append(row(case, name, ms((n, name, 1)), "ms", base=base, jit=ms((n, JIT, 1)),
                                note="base" if name == AOT else "control" if name == AA else ""))
        spec = ms((n, SPEC, 1))
        own = statistics.median(o for _, o in times[(n, SPEC, 1)])
        own -= statistics.median(f for _, f in times[(n, AOT, 1)])
        res.notes.append(f"{n} leaves: jaxcontracts' own work in hot_step.compile(spec) (outside "
                         f"JAX's phases, less JAX freeing its trace and lowering): {own:.2f} ms "
                         f"({own / statistics.median(base) * 100:.1f}% of JAX's AOT compile)")
        res.budget(f"{n} leaves: hot_step.compile(spec) <= {LIMIT:.2f}x JAX's AOT compile",
                   statistics.median(spec) / statistics.median(base), LIMIT,
                   paired=[a / b for a, b in zip(spec, base)], seed=args.seed)
    owns = []
    for ops in sizes:
        case = f"10 leaves x {ops} ops"
        base = ms((10, AOT, ops))
        res.rows.append(row(case, AOT, base, "ms", base=base, note="base"))
        res.rows.append(row(case, SPEC, ms((10, SPEC, ops)), "ms", base=base))
        own = [o for _, o in times[(10, SPEC, ops)]]
        freed = statistics.median(f for _, f in times[(10, AOT, ops)])
        owns.append(statistics.median(own) - freed)
        res.rows.append(row(case, "  outside JAX's trace/lower/compile", own, "ms", base=base,
                            note=f"{30 * ops} HLO ops"))
        res.rows.append(row(case, "  JAX freeing its trace, lowering", [f for _, f in times[(10, AOT, ops)]],
                            "ms", base=base, note="paid by both"))
        res.notes.append(f"{case}: jaxcontracts' own work (outside JAX's phases, less JAX "
                         f"freeing its trace and lowering): {owns[-1]:.2f} ms")
    if len(sizes) > 1:
        res.notes.append(
            f"own work at {30 * sizes[-1]:,} HLO ops / at {30 * sizes[0]:,}: "
            f"{owns[-1] / owns[0]:.2f}x for a {sizes[-1] / sizes[0]:.0f}x larger program")
    res.notes.append(f"{repeats} samples per variant, each after jax.clear_caches() "
                     f"with a fresh function; f32[{args.n}] leaves")
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
