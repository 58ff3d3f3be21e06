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
  annotations; no validation needed).

No budget: the figures say what construction costs, which matters outside a
hot loop (inside one, a hot_step returns states without validating them).

Run: ``python -m benchmarks.construction`` (``--quick``: tiny).
"""

from __future__ import annotations

import dataclasses
import gc
import random
import time
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32

import jaxcontracts as jc
from benchmarks._common import Result, machine, parser, row


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
    return {
        ("from arrays", "plain(...)"): lambda: plain(**arrays),
        ("from arrays", "Cls(...)"): lambda: S(**arrays),
        ("zeros", "plain(jnp.zeros...)"): lambda: plain(**{k: jnp.zeros(shape, f32) for k in names}),
        ("zeros", "Cls.zeros(...)"): lambda: S.zeros(),
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
        for case in ("from arrays", "zeros"):
            keys = [k for k in fns if k[0] == n and k[1] == case]
            base = samples[keys[0]]
            for k in keys:
                res.rows.append(row(f"{n} field{'s' if n != 1 else ''}, {case}", k[2], samples[k],
                                    "us/call", base=base, note="base" if k == keys[0] else ""))
    res.notes.append(f"{repeats} blocks per variant; no budget (reported only)")
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
