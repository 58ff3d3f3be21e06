"""state: what building a state costs: ``Cls(...)`` and ``Cls.zeros(...)`` per call.

What is measured
----------------
For 1, 10 and 100 fields of ``f32[4]``, per call (median over interleaved,
shuffled blocks of calls):

* ``plain(...)``: a frozen dataclass registered with
  ``jax.tree_util.register_dataclass``, built from existing device arrays; the
  base of the "from arrays" case;
* ``Cls(...)``: the ``@jc.state`` class built from the same arrays (validation:
  dtype, shape and named dims of every field, with jaxtyping);
* ``plain(jnp.zeros...)``: the plain dataclass with ``jnp.zeros(shape,
  float32)`` per field; the base of the "zeros" case;
* ``Cls.zeros(...)``: the ``@jc.state`` class's zeros (exact dtypes, from the
  annotations; no validation needed);
* ``dataclasses.replace(plain)``: one field of the plain dataclass replaced by
  another existing array; the base of the "replace" case;
* ``s.replace(x0=...)``: the same on the ``@jc.state`` instance (validated
  like construction).

Budget: building from existing arrays and ``replace()`` within 3x the plain
dataclass at 10 and 100 fields. A state validates every field, but a
signature (each field's aval: shape, dtype, weak type, sharding) that passed
before is not re-proven, so a loop that rebuilds a state from arrays of the
shapes it saw before pays a dictionary lookup, not jaxtyping. The budget
lines are measured with that cache warm, which is the repeated case; the
first construction of a signature costs what the "no cache" note says.

Run: ``python -m benchmarks.construction`` (``--quick``: tiny).
"""

from __future__ import annotations

import dataclasses
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
from jaxcontracts._state.validate import clear_validation_cache

LIMIT = 3.0


def make_classes(n: int) -> tuple[type, type]:
    names = [f"x{i}" for i in range(n)]
    annotations = {name: Float32[Array, "4"] for name in names}

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = dict(annotations)
        ns["__module__"] = __name__

    state_cls = jc.state(types.new_class(f"State{n}", (), {}, body))
    plain = dataclasses.dataclass(frozen=True)(
        types.new_class(f"Plain{n}", (), {}, lambda ns: ns.update(
            __annotations__={name: jax.Array for name in names}, __module__=__name__))
    )
    plain = jax.tree_util.register_dataclass(plain, data_fields=names, meta_fields=[])
    return state_cls, plain


def variants(n: int) -> dict[tuple[str, str], Callable[[], Any]]:
    S, plain = make_classes(n)
    arrays = {f"x{i}": jnp.full(4, i, jnp.float32) for i in range(n)}
    shape, f32 = (4,), jnp.float32
    names = list(arrays)
    p0, s0, other = plain(**arrays), S(**arrays), jnp.full(4, -1, jnp.float32)
    return {
        ("from arrays", "plain(...)"): lambda: plain(**arrays),
        ("from arrays", "Cls(...)"): lambda: S(**arrays),
        ("zeros", "plain(jnp.zeros...)"): lambda: plain(**{k: jnp.zeros(shape, f32) for k in names}),
        ("zeros", "Cls.zeros(...)"): lambda: S.zeros(),
        ("replace", "dataclasses.replace(plain)"): lambda: dataclasses.replace(p0, x0=other),
        ("replace", "s.replace(x0=...)"): lambda: s0.replace(x0=other),
    }


def block(f: Callable[[], Any], calls: int) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            out = f()
        jax.block_until_ready(out)
        t1 = time.perf_counter()
    finally:
        gc.enable()
    return (t1 - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--fields", type=int, nargs="+", help="field counts (default 1 10 100)")
    p.add_argument("--repeats", type=int, help="blocks per variant (default 30)")
    args = p.parse_args(argv)
    fields = args.fields or ([1, 10] if args.quick else [1, 10, 100])
    repeats = args.repeats or (3 if args.quick else 30)
    start = time.perf_counter()
    res = Result("state", "building a state per call vs a plain registered dataclass")
    res.meta = machine()

    fns: dict[tuple[int, str, str], Callable[[], Any]] = {}
    for n in fields:
        for (case, name), f in variants(n).items():
            fns[(n, case, name)] = f
    calls: dict[tuple[int, str, str], int] = {}
    for key, f in fns.items():  # warm up, and size blocks to about 5 ms
        block(f, 3)
        per_call = block(f, 10)
        calls[key] = int(min(2000, max(3, round((500 if args.quick else 5000) / per_call))))
    samples: dict[tuple[int, str, str], list[float]] = {k: [] for k in fns}
    rng = random.Random(args.seed)
    order = list(fns)
    for _ in range(repeats):
        gc.collect()
        rng.shuffle(order)
        for key in order:
            samples[key].append(block(fns[key], calls[key]))

    for n in fields:
        for case in ("from arrays", "zeros", "replace"):
            keys = [k for k in fns if k[0] == n and k[1] == case]
            base = samples[keys[0]]
            for k in keys:
                res.rows.append(row(f"{n} field{'s' if n != 1 else ''}, {case}", k[2], samples[k],
                                    "us/call", base=base, note="base" if k == keys[0] else ""))
    for n in fields:
        if n < 10:
            continue
        for case in ("from arrays", "replace"):
            keys = [k for k in fns if k[0] == n and k[1] == case]
            base, mine = samples[keys[0]], samples[keys[1]]
            res.budget(f"{n} fields, {case}: {keys[1][2]} <= {LIMIT:.0f}x {keys[0][2]}",
                       statistics.median(mine) / statistics.median(base), LIMIT,
                       paired=[a / b for a, b in zip(mine, base)], seed=args.seed)
    cold = []
    for n in fields:
        S, _ = make_classes(n)
        arrays = {f"x{i}": jnp.full(4, i, jnp.float32) for i in range(n)}

        def uncached(S: Any = S, arrays: dict[str, Any] = arrays) -> Any:
            clear_validation_cache(S)
            return S(**arrays)

        block(uncached, 3)
        cold.append(f"{n} fields: {statistics.median(block(uncached, 20) for _ in range(5)):.0f} us")
    res.notes.append("a signature's first construction (no cache): " + ", ".join(cold))
    res.notes.append(f"{repeats} blocks per variant; budget: from arrays and replace() "
                     f"<= {LIMIT:.0f}x the plain dataclass at 10 and 100 fields")
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
