"""ports: a real program's loop, ported with the least change, against the original.

What is measured
----------------
flax NNX's functional training loop as its docs write it (``nnx.split``, a
donated ``jax.jit`` on ``nnx.State``, numpy batches from a loader), and the
same program ported: ``@jc.hot_step(state="state", host="batch")`` in place
of ``jax.jit(donate_argnums=0)`` and the loop in
``jc.hot_loop(compiles="warmup")``. Each sample is one loop over the same
numpy batches (made before timing), ending in one ``block_until_ready``;
the variants (original, port at ``full``, port at ``off``) are interleaved
in shuffled order. The batches are numpy: the original's ``jax.jit`` and the
port's executable both transfer them in JAX's C++ path.

Budget: the port at ``full`` <= 1.05x the original (ratio of medians).

Run: ``python -m benchmarks.ports`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import functools
import gc
import random
import statistics
import time
from typing import Any

import jax
import numpy as np

import jaxcontracts as jc
from benchmarks._common import Result, machine, parser, row

LIMIT = 1.05


def _program() -> tuple[Any, Any, Any]:
    """(train_step function, initial state maker, graphdef), as NNX's docs write it."""
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, din: int, dhidden: int, dout: int, *, rngs: Any) -> None:
            self.l1 = nnx.Linear(din, dhidden, rngs=rngs)
            self.l2 = nnx.Linear(dhidden, dout, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.l2(jax.nn.relu(self.l1(x)))

    def make() -> Any:
        model = MLP(8, 32, 1, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        return nnx.split((model, optimizer))

    graphdef, _ = make()

    def train_step(state: Any, batch: Any) -> Any:
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model: Any) -> Any:
            logits = model(batch["x"])
            return optax.sigmoid_binary_cross_entropy(logits, batch["y"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    return train_step, (lambda: make()[1]), graphdef


def _batches(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        x = rng.normal(size=(32, 8)).astype(np.float32)
        out.append({"x": x, "y": (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, help="loop iterations (default 200)")
    p.add_argument("--repeats", type=int, help="loops per variant (default 31)")
    args = p.parse_args(argv)
    steps = args.steps or (20 if args.quick else 200)
    repeats = args.repeats or (3 if args.quick else 31)
    start = time.perf_counter()
    res = Result("ports", f"flax NNX's functional loop, {steps} steps of numpy batches: port vs original")
    res.meta = machine()
    train_step, initial, _ = _program()
    original = functools.partial(jax.jit, donate_argnums=0)(train_step)
    port = jc.hot_step(train_step, state="state", host="batch")
    batches = _batches(steps)
    states = {"original": initial(), "full": initial(), "off": initial()}

    def run(variant: str) -> float:
        state = states[variant]
        gc.disable()
        try:
            t0 = time.perf_counter()
            if variant == "original":
                for batch in batches:
                    loss, state = original(state, batch)
            else:
                with jc.checks_level(variant), jc.hot_loop(compiles="warmup") as loop:
                    for batch in loop.iterate(batches):
                        loss, state = port(state, batch)
            jax.block_until_ready((loss, state))
            return time.perf_counter() - t0
        finally:
            gc.enable()
            states[variant] = state

    samples: dict[str, list[float]] = {v: [] for v in states}
    for _ in range(2):  # warm-up: compiles, caches
        for variant in states:
            run(variant)
    rng = random.Random(args.seed)
    for _ in range(repeats):
        gc.collect()
        order = list(states)
        rng.shuffle(order)
        for variant in order:
            samples[variant].append(run(variant) * 1e3)
    base = samples["original"]
    case = f"{steps} steps, numpy batches"
    res.rows.append(row(case, "jax.jit (original)", base, "ms/loop", base=base, note="base"))
    res.rows.append(row(case, "port full", samples["full"], "ms/loop", base=base))
    res.rows.append(row(case, "port off", samples["off"], "ms/loop", base=base))
    ratio = statistics.median(samples["full"]) / statistics.median(base)
    res.budget(f"NNX port at full <= {LIMIT:.2f}x the original jax.jit loop", ratio, LIMIT,
               paired=[a / b for a, b in zip(samples["full"], base)], seed=args.seed)
    off = statistics.median(samples["off"]) / statistics.median(base)
    per_step = statistics.median(base) / steps * 1e3
    res.notes.append(f"original: {per_step:.1f} us per step; port at off: {off:.3f}x; {repeats} loops each")
    res.notes.append(f"port: {port.stats.host_calls} calls transferred {port.stats.host_bytes:,} bytes of batches")
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
