"""A sharded training step on 8 simulated CPU devices (the nanodo shape).

The weight matrix is sharded by rows over a ``data`` mesh axis (FSDP style),
the batch by examples, and the LayerNorm scale is replicated. The step folds
each weight row's norm into the scale (weight normalisation); left to XLA's
sharding propagation, the scale then comes back sharded like those rows
(``P('data')``), so the next call would reshard or recompile. A hot step compiles a returned state with its input shardings as
output shardings (derived from the signature, like donation): the carry
keeps its placement, with no ``with_sharding_constraint`` in the step.

Run: python examples/sharded_training.py
"""

from __future__ import annotations

import os

# Eight CPU devices; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from jaxtyping import Array, Float32, Int32  # noqa: E402

import jaxcontracts as jc  # noqa: E402

D, BATCH, STEPS = 64, 32, 20


@jc.state
class Model:
    w: Float32[Array, "d d"]  # rows sharded over `data`
    scale: Float32[Array, " d"]  # LayerNorm scale: replicated
    step: Int32[Array, ""]


def loss_fn(params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    w, scale = params
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    h = (x - mu) / jnp.sqrt(var + 1e-5) * scale
    return ((h @ w - y) ** 2).mean()


def train_fn(m: Model, x: Float32[Array, "b d"], y: Float32[Array, "b d"]) -> tuple[Model, jax.Array]:
    loss, (gw, gs) = jax.value_and_grad(loss_fn)((m.w, m.scale), x, y)
    w, scale = m.w - 0.05 * gw, m.scale - 0.05 * gs
    # Weight normalisation: fold each input row's norm of `w` into the scale
    # (h @ w is unchanged). The norms are computed on `w`'s sharded rows.
    norms = jnp.linalg.norm(w, axis=1)
    return Model(w=w / norms[:, None], scale=scale * norms, step=m.step + 1), loss


train_step = jc.hot_step(train_fn, signature=Model)


def main() -> float:
    devices = jax.devices()
    assert len(devices) >= 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    mesh = Mesh(np.array(devices[:8]), ("data",))
    rows, replicated = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P())

    rng = np.random.default_rng(0)
    target = rng.normal(size=(D, D)).astype(np.float32) / np.sqrt(D)
    batches = []
    for _ in range(4):
        x = rng.normal(size=(BATCH, D)).astype(np.float32)
        batches.append((jax.device_put(x, rows), jax.device_put(x @ target, rows)))

    model = Model(
        w=jax.device_put(rng.normal(size=(D, D)).astype(np.float32) / np.sqrt(D), rows),
        scale=jax.device_put(np.ones(D, np.float32), replicated),
        step=jax.device_put(np.int32(0), replicated),
    )

    # What propagation alone does to the carry:
    raw_out, _ = jax.jit(train_fn)(model, *batches[0])
    print(f"jax.jit: scale comes back {raw_out.scale.sharding.spec}")

    train_step.compile(model, *batches[0])
    losses = []
    with jc.hot_loop():
        for i in range(STEPS):
            model, loss = train_step(model, *batches[i % len(batches)])
            losses.append(loss)
    first, last = (float(v) for v in jc.fetch((losses[0], losses[-1])))
    print(f"hot_step: scale stays {model.scale.sharding.spec}, w stays {model.w.sharding.spec}")
    print(f"loss {first:.3f} -> {last:.3f} in {STEPS} steps, {train_step.stats.compiles} compile")
    assert model.scale.sharding.is_equivalent_to(replicated, 1)
    assert model.w.sharding.is_equivalent_to(rows, 2)
    assert last < first
    return last


if __name__ == "__main__":
    main()
