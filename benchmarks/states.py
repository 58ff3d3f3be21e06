"""states: per-call time of ``jc.hot_step`` on the state kinds users carry.

What is measured
----------------
The same donated step ``s -> s + 1`` (every leaf; dtype, shape and weak type
kept, so every loop is ``s = f(s)``) on states of 10, 100, 1,000 and 3,000
leaves of ``f32[4]``, in each of the shapes users write:

* ``sealed``: a ``@jc.state`` class with one field per leaf (the reference);
* ``PyTree field``: a ``@jc.state`` class with a step counter and a
  ``params: PyTree`` field holding a dict of the other leaves;
* ``TrainState``: flax's ``TrainState`` (``optax.sgd``: its state has no
  leaves), a step counter plus a dict of parameters, declared with
  ``jc.hot_step(step, state="s")`` and no annotation (needs flax and optax);
* ``NamedTuple`` and ``dict``: one item per leaf;
* ``dict, keyword + static``: a dict state passed as ``f(s, config=cfg)``
  with ``static="config"`` (a frozen dataclass): the call with keyword and
  static arguments, against a raw executable called with the state alone.

Variants, for each kind and size: ``raw compiled`` (``jax.jit(step,
donate_argnums=0).lower(s).compile()`` called directly: JAX's compiled fast
path, the base); ``raw A/A`` (the same executable timed as a second variant
with its own state: the method's resolution); ``raw committed`` (compiled
from a committed state, as a hot step compiles its exact specs: its outputs
are committed, and JAX's C++ call costs more per committed leaf than per
uncommitted one; the notes give each level's cost over it, placement
aside); ``hot_step off|fast|full``;
``jax.jit`` donated and plain; ``eqx.filter_jit(donate="all")`` (``not
installed`` without equinox).

How: as ``benchmarks.dispatch``: every variant warmed up, then each repeat
times one block of every variant (all kinds and sizes) in a freshly shuffled
order; a block is ``calls`` calls then one ``block_until_ready``, ``calls``
set per size so that a raw block lasts about 5 ms (at least 2 calls).

Budgets (x raw compiled, ratio of medians, at every size of a kind; the line
shows the worst size and its paired 95 % interval): ``off <= 1.02``,
``fast <= 1.05``, ``full <= 1.10``, for every kind.

The result's ``meta["overhead"]`` holds each kind's ratio against leaves per
variant, which ``python -m benchmarks --plot`` draws (``benchmarks/_plot.py``).

Run: ``python -m benchmarks.states`` (``--quick``: 10 leaves; ``--leaves 10
1000``; ``--kinds dict TrainState``).
"""

from __future__ import annotations

import dataclasses
import gc
import random
import statistics
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jaxtyping import Array, Float32, Int32, PyTree

import jaxcontracts as jc
from benchmarks._common import Result, donated_block, machine, parser, row

RAW, AA, JIT, PLAIN, EQX = "raw compiled", "raw A/A", "jax.jit donated", "jax.jit plain", "eqx.filter_jit"
COMMITTED = "raw committed"
LEVELS = ("off", "fast", "full")
BUDGETS = {"off": 1.02, "fast": 1.05, "full": 1.10}
KINDS = ("sealed", "PyTree field", "TrainState", "NamedTuple", "dict", "dict, keyword + static")


@dataclasses.dataclass(frozen=True)
class Config:
    """A static configuration passed by keyword (hashable, as ``static_argnames`` needs)."""

    inc: int = 1


def _leaves(n: int) -> dict[str, np.ndarray]:
    return {f"x{i}": np.full(4, i, np.float32) for i in range(n)}


def _sealed_class(n: int) -> type:
    annotations = {f"x{i}": Float32[Array, "4"] for i in range(n)}

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = annotations
        ns["__module__"] = __name__

    return jc.state(types.new_class(f"Sealed{n}", (), {}, body))


def _pytree_class() -> type:
    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = {"step": Int32[Array, ""], "params": PyTree[Float32[Array, "4"]]}
        ns["__module__"] = __name__

    return jc.state(types.new_class("WithParams", (), {}, body))


@dataclass
class Kind:
    """How one kind's state is made and its step declared."""

    name: str
    make: Callable[[], Any]  # a fresh host-built state
    hot: Callable[[Callable[..., Any]], Any]  # the step -> its jc.hot_step
    static: bool = False  # called f(s, config=cfg)


def build_kind(name: str, n: int) -> Kind | str:
    """The kind ``name`` at ``n`` leaves, or why it cannot be built here."""
    if name == "sealed":
        S = _sealed_class(n)
        return Kind(name, lambda: S(**_leaves(n)), lambda f: jc.hot_step(f, signature=S, state="s", donate="all"))
    if name == "PyTree field":
        P = _pytree_class()
        return Kind(
            name,
            lambda: P(step=np.int32(0), params=_leaves(n - 1)),
            lambda f: jc.hot_step(f, signature=P, state="s", donate="all"),
        )
    if name == "TrainState":
        try:
            import optax
            from flax.training.train_state import TrainState
        except ImportError:
            return "not installed (flax, optax)"
        tx = optax.sgd(0.1)  # one object: a new one would be a new static value
        return Kind(
            name,
            lambda: jc.device_tree(TrainState.create(apply_fn=None, params=_leaves(n - 1), tx=tx)),
            lambda f: jc.hot_step(f, state="s"),
        )
    if name == "NamedTuple":
        NT = typing.NamedTuple(f"Tuple{n}", [(f"x{i}", Any) for i in range(n)])  # type: ignore[misc]
        return Kind(name, lambda: NT(**_leaves(n)), lambda f: jc.hot_step(f, state="s"))
    if name == "dict":
        return Kind(name, lambda: _leaves(n), lambda f: jc.hot_step(f, state="s"))
    if name == "dict, keyword + static":
        return Kind(name, lambda: _leaves(n), lambda f: jc.hot_step(f, state="s", static="config"), static=True)
    raise ValueError(f"unknown kind {name!r}; choose from {', '.join(KINDS)}")


def _step(kind: Kind) -> Callable[..., Any]:
    """A fresh step function (no annotations: the kinds declare their state)."""
    if kind.static:

        def step_static(s: Any, *, config: Config) -> Any:
            return jax.tree_util.tree_map(lambda x: x + config.inc, s)

        return step_static

    def step(s: Any) -> Any:
        return jax.tree_util.tree_map(lambda x: x + 1, s)

    return step


@dataclass
class Variant:
    """One thing to time: a call, its keyword arguments, its state."""

    kind: str
    leaves: int
    name: str
    fn: Callable[..., Any] | None  # None: not installed
    kwargs: dict[str, Any]
    level: str | None = None  # jc.set_checks level the warm-up sets
    state: Any = None
    note: str = ""
    samples: list[float] = field(default_factory=list)  # us per call, per repeat


def build_variants(kind: Kind, n: int) -> tuple[list[Variant], Any]:
    s0 = kind.make()
    cfg = {"config": Config()} if kind.static else {}
    statics = {"static_argnames": "config"} if kind.static else {}
    dev = jax.device_put(s0)
    raw = jax.jit(_step(kind), donate_argnums=0, **statics).lower(dev, **cfg).compile()
    committed = jax.jit(_step(kind), donate_argnums=0, **statics).lower(jc.device_tree(s0), **cfg).compile()
    hot = kind.hot(_step(kind))
    variants = [
        Variant(kind.name, n, RAW, raw, {}),
        Variant(kind.name, n, AA, raw, {}),
        Variant(kind.name, n, COMMITTED, committed, {}),
        *(Variant(kind.name, n, f"hot_step {lv}", hot, cfg, level=lv) for lv in LEVELS),
        Variant(kind.name, n, JIT, jax.jit(_step(kind), donate_argnums=0, **statics), cfg),
        Variant(kind.name, n, PLAIN, jax.jit(_step(kind), **statics), cfg),
    ]
    try:
        import equinox as eqx
    except ImportError:
        variants.append(Variant(kind.name, n, EQX, None, cfg, note="not installed"))
    else:
        variants.append(Variant(kind.name, n, EQX, eqx.filter_jit(_step(kind), donate="all"), cfg))
    for v in variants:
        if v.fn is not None:
            v.state = jc.device_tree(kind.make())
    return variants, hot


run_block = donated_block  # benchmarks._common: one timed block of s = f(s)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--leaves", type=int, nargs="+", help="leaf counts (default 10 100 1000 3000)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, metavar="KIND", help=f"state kinds (default all: {KINDS})")
    p.add_argument("--repeats", type=int, help="timed blocks per variant (default 60)")
    p.add_argument("--block-ms", type=float, help="target length of a raw block (default 5)")
    args = p.parse_args(argv)
    leaves = args.leaves or ([10] if args.quick else [10, 100, 1000, 3000])
    kinds = args.kinds or list(KINDS)
    repeats = args.repeats or (5 if args.quick else 60)
    block_ms = args.block_ms or (0.5 if args.quick else 5.0)
    start = time.perf_counter()
    initial = jc.get_checks()
    res = Result("states", "per-call time of a donated s = f(s) step by state kind, f32[4] leaves")
    res.meta = machine()

    variants: list[Variant] = []
    hot_steps: dict[tuple[str, int], Any] = {}
    missing: dict[str, str] = {}
    for name in kinds:
        for n in leaves:
            kind = build_kind(name, n)
            if isinstance(kind, str):
                missing[name] = kind
                break
            vs, hot = build_variants(kind, n)
            variants.extend(vs)
            hot_steps[(name, n)] = hot
    timed = [v for v in variants if v.fn is not None]
    for v in timed:  # first call (compiles), then warm up; each level's path timed as built
        run_block(v, 2)
        run_block(v, 10 if args.quick else 50)
        if v.level is not None:
            v.fn, v.level = hot_steps[(v.kind, v.leaves)]._call, None
    calls: dict[tuple[str, int], int] = {}
    for key in hot_steps:
        raw = next(v for v in timed if (v.kind, v.leaves) == key and v.name == RAW)
        per_call = statistics.median(run_block(raw, 4) for _ in range(3))
        calls[key] = int(min(2000, max(2, round(block_ms * 1e3 / per_call))))

    rng = random.Random(args.seed)
    order = list(timed)
    for _ in range(repeats):
        gc.collect()
        rng.shuffle(order)
        for v in order:
            v.samples.append(run_block(v, calls[(v.kind, v.leaves)]))
    jc.set_checks(initial)  # type: ignore[arg-type]

    by_key = {(v.kind, v.leaves, v.name): v for v in variants}
    overhead: dict[str, dict[str, list[list[float]]]] = {}  # kind -> variant -> [leaves, ratio, paired]
    for (name, n) in hot_steps:
        raw = by_key[(name, n, RAW)].samples
        jit = by_key[(name, n, JIT)].samples
        for v in variants:
            if (v.kind, v.leaves) != (name, n):
                continue
            note = v.note or ("base" if v.name == RAW else "")
            res.rows.append(row(f"{name}, {n} leaves", v.name, v.samples, "us/call", base=raw, jit=jit, note=note))
            if v.samples and v.name != RAW:
                ratio = statistics.median(v.samples) / statistics.median(raw)
                paired = statistics.median(a / b for a, b in zip(v.samples, raw))
                overhead.setdefault(name, {}).setdefault(v.name, []).append([n, ratio, paired])
    res.meta["overhead"] = overhead
    res.meta["budgets"] = {f"hot_step {lv}": limit for lv, limit in BUDGETS.items()}
    for name, why in missing.items():
        res.notes.append(f"{name}: {why}")
    for level in LEVELS:
        parts = []
        for (name, n) in hot_steps:
            diffs = [a - b for a, b in zip(by_key[(name, n, f"hot_step {level}")].samples, by_key[(name, n, RAW)].samples)]
            parts.append(f"{name} {n}: {statistics.median(diffs):+.1f}")
        res.notes.append(f"hot_step {level} minus raw compiled, us/call (median of paired differences): " + ", ".join(parts))
    parts = []
    for (name, n) in hot_steps:
        c = by_key[(name, n, COMMITTED)].samples
        per_level = "/".join(
            f"{statistics.median(a - b for a, b in zip(by_key[(name, n, f'hot_step {lv}')].samples, c)):+.1f}"
            for lv in LEVELS
        )
        parts.append(f"{name} {n}: {per_level}")
    res.notes.append(
        "hot_step off/fast/full minus raw committed (an executable of the same program compiled from a committed state, as a hot"
        " step compiles: its outputs stay committed, which JAX's C++ call checks per leaf), us/call: " + ", ".join(parts)
    )
    res.notes.append(f"calls per block: {', '.join(f'{k} {n}: {c}' for (k, n), c in calls.items())}; {repeats} repeats")

    sizes = "/".join(str(n) for n in leaves)
    for name in kinds:
        for level, limit in BUDGETS.items():
            line = f"{name}: hot_step {level} <= {limit:.2f}x raw compiled at {sizes} leaves"
            if name in missing:
                res.budget(line, None, limit, why=missing[name])
                continue
            worst = max(leaves, key=lambda n: statistics.median(by_key[(name, n, f"hot_step {level}")].samples)
                        / statistics.median(by_key[(name, n, RAW)].samples))
            v, raw = by_key[(name, worst, f"hot_step {level}")].samples, by_key[(name, worst, RAW)].samples
            b = res.budget(line, statistics.median(v) / statistics.median(raw), limit,
                           paired=[a / c for a, c in zip(v, raw)], seed=args.seed)
            b["line"] += f" (worst: {worst})"

    for (name, n), hot in hot_steps.items():
        res.check_clean(f"{name} at {n} leaves", hot)
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
