"""floor: what the checks that define ``fast`` and ``full`` cost, written inline.

What is measured
----------------
The budgets of ``benchmarks.states`` (``fast <= 1.05x``, ``full <= 1.10x`` a
raw donated AOT call) and of ``benchmarks.ports`` (a port at ``full`` <=
1.05x the original ``jax.jit`` loop) are only reachable if the checks each
level is defined to make cost less than that on their own. Here each level's
checks are written inline around JAX's own C++ call, with nothing of
jaxcontracts in the timed path but that call, so the floor they set can be
read next to the hot step's own figure:

* ``floor fast``: what ``fast`` checks on a call of a signature seen before:
  the first donated leaf read by its path and asked ``is_deleted()`` (a
  stale state, before XLA refuses it with an error line on stderr), then the
  executable's C++ call on the state (``_compat.tracing.cpp_call``, without
  ``Compiled.__call__``'s Python frame, as a hot step calls it; it checks structure, shapes,
  dtypes, weak types and placement in its cache lookup anyway);
* ``floor full``: what ``full`` checks on every call: one flatten, the tree
  structure compared with the compiled one, every leaf asked
  ``is_deleted()``, every leaf's reference count read (a donated leaf held
  elsewhere is refused before the call), and the count of each container
  inside the state that holds donated leaves (a ``TrainState``'s
  ``params``: a kept ``state.params`` is refused too), the executable's C++ call on the
  flat leaves (``_compat.guarded``, as ``full`` calls it), every donated
  leaf asked ``is_deleted()`` after it (the donation really happened), and
  the record of what the call consumed, whose last entry's first leaf is
  counted (a later read of a state kept whole names the step);
* ``flat call``: the flatten and the flat call alone, no check: what calling
  with flat leaves costs or saves against the call on the state.

Each check is one C loop (``map``) over the leaves; none can be dropped
without dropping what the level promises. ``hot_step fast|full`` is the
library's own call at that level, so ``hot_step - floor`` is what the
library adds beyond its checks (the record that names a consumed state, the
counters, the frames).

Cases: a sealed ``jc.state``, a dict, a NamedTuple and a flax ``TrainState`` (skipped without flax
and optax) of 10 and 100 ``f32[4]`` leaves, ``s -> s + 1`` donated, as in
``benchmarks.states``; and the NNX program of ``benchmarks.ports`` (an
``nnx.State`` of 16 leaves, numpy batches declared ``host=``) against its
original ``jax.jit`` loop, outside a ``hot_loop`` (the ports benchmark times
it inside one: about 1.5 us a call more, the loop's record).

How: every variant warmed up, then each repeat times one block of every
variant in a freshly shuffled order (``benchmarks.states``' method); no
budget lines, only rows and the notes that set each floor against its
budget.

Run: ``python -m benchmarks.floor`` (``--quick``: 10 leaves, few repeats).
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

import jaxcontracts as jc
from benchmarks._common import Result, donated_block, machine, parser, row
from jaxcontracts._compat import refcount
from jaxcontracts._compat.arrays import ArrayImpl
from jaxcontracts._compat.guarded import flat_in_tree, guarded_call
from jaxcontracts._compat.threadguard import allow_host_to_device
from jaxcontracts._compat.tracing import cpp_call, flatten

RAW, FLAT, FLOOR_FAST, FLOOR_FULL = "raw compiled", "flat call", "floor fast", "floor full"
BUDGETS = {"fast": 1.05, "full": 1.10}
PORT_LIMIT = 1.05


@dataclass
class Variant:
    """One thing to time (``benchmarks._common.donated_block`` reads ``fn``, ``state``, ``level``)."""

    case: str
    name: str
    fn: Callable[..., Any]
    state: Any
    level: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)
    block: Callable[[Any, int], float] = donated_block
    calls: int = 2


def _refused() -> None:
    raise AssertionError("a floor check fired on a clean call: the floor measures nothing real")


def floor_fast(compiled: Any, first: Callable[[Any], Any]) -> Callable[..., Any]:
    """``fast``'s checks inline: the first donated leaf by its path, then JAX's
    C++ call (without ``Compiled.__call__``'s Python frame, as a hot step calls it)."""
    run = cpp_call(compiled)

    def call(s: Any) -> Any:
        if first(s).is_deleted():
            _refused()
        return run(s)

    return call


def floor_full(
    compiled: Any, spec: tuple[Any, ...], host: int = 0, nodes: Callable[[Any], list[Any]] | None = None
) -> Callable[..., Any]:
    """``full``'s checks inline around the flat C++ call; ``host``: the last
    ``host`` leaves are declared host data (numpy; not checked, transferred
    with the host-to-device guard lifted, as a hot step's ``host=``);
    ``nodes``: the containers inside the state that hold donated leaves (a
    ``TrainState``'s ``params``), read by hand, whose reference counts
    ``full`` reads too (a kept ``state.params`` is refused)."""
    leaves0, want = flatten(spec)
    n, device = len(leaves0), len(leaves0) - host
    call = guarded_call(compiled, lambda args: True, flat_in_tree(n))
    assert call is not None, "the guarded-call capability is missing here"
    if host:
        call = allow_host_to_device(call)
    is_deleted, count = ArrayImpl.is_deleted, refcount.count
    # Held by its state and read through the sequence map() runs over (the
    # flat list; with host leaves, a slice of it, which the list holds too).
    limit = refcount.BASELINE + (1 if host else 0)
    record: list[Any] = [None]  # what the last call consumed (the state is the one argument)

    def checked(*args: Any) -> Any:
        leaves, treedef = flatten(args)
        if treedef != want:
            _refused()
        dev = leaves if not host else leaves[:device]
        if any(map(is_deleted, dev)) or max(map(count, dev)) > limit:
            _refused()
        if nodes is not None and max(map(count, nodes(args[0]))) > refcount.BASELINE:
            _refused()
        out = call(*leaves)
        if not all(map(is_deleted, dev)):
            _refused()
        previous, record[0] = record[0], dev
        if previous is not None and count(previous[0]) > 3:  # the last call's state, kept whole
            _refused()
        return out

    return checked


def flat_only(compiled: Any, spec: tuple[Any, ...], host: int = 0) -> Callable[..., Any]:
    """The flatten and the flat call alone (no check)."""
    n = len(flatten(spec)[0])
    call = guarded_call(compiled, lambda args: True, flat_in_tree(n))
    assert call is not None
    if host:
        call = allow_host_to_device(call)

    def flat(*args: Any) -> Any:
        return call(*flatten(args)[0])

    return flat


# --------------------------------------------------------------------------
# The state kinds


def _leaves(n: int) -> dict[str, Any]:
    return {f"p{i:04d}": np.zeros(4, np.float32) for i in range(n)}


def _kind(name: str, n: int) -> tuple[Callable[[], Any], Callable[[Any], Any], Callable[[Any], Any]] | str:
    """(make a state, read its first donated leaf, the hot step) or why not."""
    if name == "sealed":
        from benchmarks.states import _sealed_class

        S = _sealed_class(n)
        return (
            (lambda: S(**{f"x{i}": np.zeros(4, np.float32) for i in range(n)})),
            (lambda s: s.x0),
            (lambda f: jc.hot_step(f, signature=S, state="s")),
        )
    if name == "dict":
        first_key = next(iter(_leaves(1)))
        return (lambda: jc.device_tree(_leaves(n))), (lambda s: s[first_key]), (lambda f: jc.hot_step(f, state="s"))
    if name == "NamedTuple":
        NT = typing.NamedTuple(f"Floor{n}", [(f"x{i}", Any) for i in range(n)])  # type: ignore[misc]
        return (lambda: jc.device_tree(NT(*_leaves(n).values()))), (lambda s: s[0]), (lambda f: jc.hot_step(f, state="s"))
    if name == "TrainState":
        try:
            import optax
            from flax.training.train_state import TrainState
        except ImportError:
            return "not installed (flax, optax)"
        tx = optax.sgd(0.1)
        return (
            (lambda: jc.device_tree(TrainState.create(apply_fn=None, params=_leaves(n - 1), tx=tx))),
            (lambda s: s.step),
            (lambda f: jc.hot_step(f, state="s")),
        )
    raise ValueError(name)


def _step(s: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: x + 1, s)


# The containers inside each kind that hold donated leaves: a TrainState's
# params dict (its sgd opt_state holds none).
_nodes: dict[str, Callable[[Any], list[Any]]] = {"TrainState": lambda s: [s.params]}


def state_variants(name: str, n: int) -> list[Variant] | str:
    kind = _kind(name, n)
    if isinstance(kind, str):
        return kind
    make, first, hot = kind
    case = f"{name}, {n} leaves"
    compiled = jax.jit(_step, donate_argnums=0).lower(make()).compile()
    step = hot(_step)
    return [
        Variant(case, RAW, compiled, make()),
        Variant(case, FLAT, flat_only(compiled, (make(),)), make()),
        Variant(case, FLOOR_FAST, floor_fast(compiled, first), make()),
        Variant(case, FLOOR_FULL, floor_full(compiled, (make(),), nodes=_nodes.get(name)), make()),
        Variant(case, "hot_step fast", step, make(), level="fast"),
        Variant(case, "hot_step full", step, make(), level="full"),
    ]


# --------------------------------------------------------------------------
# The NNX program


def nnx_variants(steps: int) -> list[Variant] | str:
    try:
        from benchmarks.ports import _batches, _program
    except ImportError as err:  # pragma: no cover - the ports' libraries
        return f"not installed ({err.name})"
    try:
        train_step, initial, _ = _program()
    except ImportError:
        return "not installed (flax, optax)"
    batches = _batches(steps)
    case = f"NNX: {steps} steps, numpy batches"
    compiled = jax.jit(train_step, donate_argnums=0).lower(initial(), batches[0]).compile()
    original = jax.jit(train_step, donate_argnums=0)
    port = jc.hot_step(train_step, state="state", host="batch")
    n_host = len(jax.tree_util.tree_leaves(batches[0]))

    def block(v: Variant, calls: int) -> float:  # us per iteration over the batches
        if v.level is not None:
            jc.set_checks(v.level)
        f, s = v.fn, v.state
        v.state = None
        gc.disable()
        try:
            t0 = time.perf_counter()
            for batch in batches:
                loss, s = f(s, batch)
            jax.block_until_ready(s)
            t1 = time.perf_counter()
        finally:
            gc.enable()
        v.state = s
        return (t1 - t0) / len(batches) * 1e6

    spec = (initial(), batches[0])
    return [
        Variant(case, "jax.jit (original)", original, initial(), block=block),
        Variant(case, FLAT, flat_only(compiled, spec, n_host), initial(), block=block),
        Variant(case, FLOOR_FULL, floor_full(compiled, spec, n_host), initial(), block=block),
        Variant(case, "port full", port, initial(), level="full", block=block),
    ]


# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--leaves", type=int, nargs="+", help="leaf counts of the state kinds (default 10 100)")
    p.add_argument("--repeats", type=int, help="timed blocks per variant (default 40)")
    args = p.parse_args(argv)
    leaves = args.leaves or ([10] if args.quick else [10, 100])
    repeats = args.repeats or (4 if args.quick else 40)
    block_ms = 0.5 if args.quick else 4.0
    start = time.perf_counter()
    initial = jc.get_checks()
    res = Result("floor", "the cost of each level's own checks, written inline, against the hot step's")
    res.meta = machine()

    variants: list[Variant] = []
    for name in ("sealed", "dict", "NamedTuple", "TrainState"):
        for n in leaves:
            vs = state_variants(name, n)
            if isinstance(vs, str):
                res.notes.append(f"{name}: {vs}")
                break
            variants.extend(vs)
    nnx = nnx_variants(10 if args.quick else 100)
    if isinstance(nnx, str):
        res.notes.append(f"NNX: {nnx}")
    else:
        variants.extend(nnx)

    for v in variants:  # first calls (compiles), then warm up
        v.block(v, 2)
        v.block(v, 10 if args.quick else 30)
    bases = {v.case: v for v in variants if v.name in (RAW, "jax.jit (original)")}
    calls = {  # per case, from its base: a raw block lasts about block_ms; one pass over the NNX batches
        case: int(min(2000, max(2, round(block_ms * 1e3 / statistics.median(donated_block(base, 4) for _ in range(3))))))
        if base.block is donated_block
        else 1
        for case, base in bases.items()
    }
    for v in variants:
        v.calls = calls[v.case]
    rng = random.Random(args.seed)
    order = list(variants)
    for _ in range(repeats):
        gc.collect()
        rng.shuffle(order)
        for v in order:
            v.samples.append(v.block(v, v.calls))
    jc.set_checks(initial)  # type: ignore[arg-type]

    for v in variants:
        base = bases[v.case]
        unit = "us/call" if v.block is donated_block else "us/iter"
        res.rows.append(row(v.case, v.name, v.samples, unit, base=base.samples, note="base" if v is base else ""))

    def paired(a: Variant, b: Variant) -> tuple[float, float]:
        ratio = statistics.median(x / y for x, y in zip(a.samples, b.samples))
        diff = statistics.median(x - y for x, y in zip(a.samples, b.samples))
        return ratio, diff

    by = {(v.case, v.name): v for v in variants}
    for case, base in bases.items():
        parts = []
        levels = ("fast", "full") if base.name == RAW else ("full",)
        for level in levels:
            floor = by[(case, f"floor {level}")]
            hot = by.get((case, f"hot_step {level}")) or by[(case, f"port {level}")]
            limit = BUDGETS[level] if base.name == RAW else PORT_LIMIT
            f_ratio, f_diff = paired(floor, base)
            h_ratio, h_diff = paired(hot, floor)
            verdict = "under" if f_ratio <= limit else "OVER"
            parts.append(
                f"{level}: floor {f_ratio:.3f}x ({f_diff:+.1f} us), {verdict} the {limit:.2f}x budget; "
                f"the hot step {h_ratio:.3f}x the floor ({h_diff:+.1f} us)"
            )
        flat_ratio, flat_diff = paired(by[(case, FLAT)], base)
        parts.append(f"flat call alone {flat_ratio:.3f}x ({flat_diff:+.1f} us)")
        res.notes.append(f"{case} (paired medians against {base.name}): " + "; ".join(parts))
    res.notes.append(f"{repeats} repeats; blocks of {block_ms:g} ms of the raw call, the NNX rows one pass of the batches")
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
