"""Shared state classes and helpers for the tests."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc


@jc.state
class Particles:
    pos: Float32[Array, "n 3"]
    vel: Float32[Array, "n 3"]
    t: Float32[Array, ""]
    dt: float = jc.static(0.01)


def make_particles(n: int = 4, dt: float = 0.01) -> Particles:
    key = jax.random.PRNGKey(0)
    pos = jax.random.normal(key, (n, 3), jnp.float32)
    return Particles(pos=pos, vel=jnp.zeros((n, 3), jnp.float32), t=jnp.float32(0), dt=dt)


def advance_fn(p: Particles) -> Particles:
    vel = p.vel - p.pos * p.dt
    return Particles(pos=p.pos + vel * p.dt, vel=vel, t=p.t + p.dt, dt=p.dt)


@jc.state
class Counter:
    x: Float32[Array, "n"]
    count: Int32[Array, ""]


def alive(tree) -> bool:
    """Whether every jax array in the tree still has its buffer."""
    return not any(
        x.is_deleted() for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)
    )


def all_deleted(tree) -> bool:
    return all(
        x.is_deleted() for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)
    )


def _warm_then_loop(fn, **loop):
    """Run ``fn`` once, then once more inside ``jc.hot_loop(**loop)``; return that result."""
    fn()  # the first iteration compiles the eager ops, as a loop's warm-up would
    with jc.hot_loop(**loop):
        return fn()


#: The ``filterwarnings`` lines of the ini files tests write for the pytest runs
#: they start: strict, as this repository's own settings, minus JAX's own
#: start-up warning on a TPU host (pyproject.toml says why).
STRICT_WARNINGS = "filterwarnings =\n    error\n    ignore:Transparent hugepages are not enabled:UserWarning\n"


def single_device_sharding(device, memory_kind=None) -> jax.sharding.Sharding:
    """A sharding on one device: jax 0.12.1 deprecates the class's constructor
    for ``make_single_device_sharding``, which older versions lack."""
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    if make is not None:
        return make(device, memory_kind=memory_kind)
    return jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)


#: The reasons the suite's CPU-only tests give (``@pytest.mark.cpu_only(...)``, conftest.py).
BUFFER_PROTOCOL = "JAX exports only CPU buffers through the buffer protocol (np.asarray falls back to __array__)"
NUMPY_VIEW = "only a CPU array has a zero-copy numpy view, which makes XLA copy instead of donating"
SYNC_ERRORS = "a run-time error surfaces at the call on CPU; an accelerator raises it at the next read"
CPU_SIZES = "the sizes XLA:CPU allocates; an accelerator pads and tiles its buffers"


def own_lines(stderr: str, *, only_jax: bool = False) -> list[str]:
    """The lines a child process of ours wrote, without the warnings Python
    printed for other modules' code (JAX's start-up warning on a TPU host is
    348 characters long): each a ``file.py:N: ...Warning: ...`` line and its
    indented source line. ``only_jax``: drop only the warnings of JAX's own
    files, keep those of the standard library (a ResourceWarning of
    ``subprocess.py`` is a finding)."""
    jax_dir = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
    out, skip = [], False
    for line in stderr.splitlines():
        where = line.split(":")[0]
        if re.match(r"\S+\.py:\d+: \w*Warning: ", line) and "jaxcontracts" not in where and (
            not only_jax or os.path.abspath(where).startswith(jax_dir)
        ):
            skip = True
            continue
        if skip and line.startswith("  "):
            skip = False
            continue
        skip = False
        out.append(line)
    return out
