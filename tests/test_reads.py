"""Device-to-host reads in a hot loop: every path intercepted, named, and no false alarm.

Every way Python code reads a jax.Array on the host (float(), an ``if``,
repr, print, np.asarray, a ufunc, pickle, iterating a sharded array, the
buffer protocol, DLPack) raises a TransferError naming the array, the state
path that produced it and the user's line, and works again after the loop. A
read of a donated array is a DonationError naming the step. Correct programs
that read nothing (device slicing and unpacking, key splits, host glue on
device values, a step's own jax.debug.print) run clean.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BUFFER_PROTOCOL, Particles, _warm_then_loop, advance_fn, make_particles
from jaxtyping import Array, Float32

import jaxcontracts as jc

# -- the access-path matrix ---------------------------------------------------


# Each path reads one array prepared before the loop: a 0-d float, a 0-d int
# or a vector. Nothing else in the lambda touches jax (no eager op).
READS = {
    "float": ("f", lambda x: float(x)),
    "int": ("f", lambda x: int(x)),
    "bool (if)": ("f", lambda x: 1 if x else 0),
    "complex": ("f", lambda x: complex(x)),
    "index (list)": ("i", lambda x: [10, 20, 30][x]),
    "index (range)": ("i", lambda x: range(x)),
    ".item()": ("f", lambda x: x.item()),
    ".tolist()": ("v", lambda x: x.tolist()),
    "repr": ("v", lambda x: repr(x)),
    "str": ("v", lambda x: str(x)),
    "f-string": ("f", lambda x: f"{x:.3f}"),
    "print": ("v", lambda x: print(x, file=io.StringIO())),
    "iteration": ("v", lambda x: [None for _ in x]),
    "np.asarray": ("v", lambda x: np.asarray(x)),
    "np.array(dtype)": ("v", lambda x: np.array(x, dtype=np.float64)),
    "np.add (ufunc)": ("v", lambda x: np.add(x, 1)),
    "pickle": ("v", lambda x: pickle.dumps(x)),
}


def _arrays(layout: str, mesh2) -> dict[str, jax.Array]:
    f, i, v = jnp.float32(2.5) + 0, jnp.int32(1) + 0, jnp.arange(4.0, dtype=jnp.float32)
    if layout == "one device":
        return {"f": f, "i": i, "v": v}
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rep = NamedSharding(mesh2, P())
    return {
        "f": jax.device_put(f, rep),
        "i": jax.device_put(i, rep),
        "v": jax.device_put(v, NamedSharding(mesh2, P("x"))),
    }


@pytest.mark.parametrize("layout", ["one device", "2-device mesh"])
@pytest.mark.parametrize("path", list(READS))
def test_every_read_raises_inside_and_works_outside(path, layout, mesh2):
    kind, read = READS[path]
    x = _arrays(layout, mesh2)[kind]
    read(x)  # outside: works (and warms any lazy path)
    if path == "iteration" and layout == "one device":
        with jc.hot_loop():  # slices on the device: no read (see the RNG test)
            read(x)
        return
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            read(x)
    msg = str(info.value)
    assert "device-to-host read" in msg
    assert "test_reads.py:" in msg and "Fix: " in msg and "jc.fetch" in msg
    read(x)  # and works again after the loop


@pytest.mark.parametrize("key", ["uint32 key", "typed key"])
def test_rng_split_and_unpacking_a_device_array_are_clean(key, mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    k = jax.random.PRNGKey(0) if key == "uint32 key" else jax.random.key(0)
    rows = jnp.arange(8.0).reshape(4, 2)
    replicated = jax.device_put(rows, NamedSharding(mesh2, P()))

    def body(k):
        k, sub = jax.random.split(k)
        a, b, c, d = rows
        r = [row for row in replicated]
        return k, sub, a, r

    body(k)  # warm: a cold slice compiles once (and would raise in the loop)
    with jc.hot_loop():
        for _ in range(3):
            k, sub, a, r = body(k)
    assert a.shape == (2,) and len(r) == 4 and k.shape == sub.shape
    scalar = jnp.float32(1.0)
    with jc.hot_loop(), pytest.raises(TypeError, match="0-d"):
        iter(scalar)  # numpy's error, not a read
    # A sharded, not replicated array is still read on the host to iterate.
    sharded = jax.device_put(rows, NamedSharding(mesh2, P("x")))
    list(sharded)
    with pytest.raises(jc.TransferError, match="device-to-host read"):
        with jc.hot_loop():
            list(sharded)


# -- buffer-protocol and DLPack reads -----------------------------------------


@pytest.mark.parametrize(
    ("read", "words"),
    [
        (memoryview, "the buffer protocol"),
        (functools.partial(np.frombuffer, dtype=np.float32), "the buffer protocol"),
        (hashlib.sha256, "the buffer protocol"),
        (np.from_dlpack, "a DLPack export"),
    ],
    ids=["memoryview", "np.frombuffer", "hashlib.sha256", "np.from_dlpack"],
)
@pytest.mark.cpu_only(BUFFER_PROTOCOL)
def test_buffer_and_dlpack_reads_in_a_loop_are_transfer_errors(read, words):
    x = jnp.arange(3.0)
    with pytest.raises(jc.TransferError, match=rf"device-to-host read: {words}.* of f32\[3\]") as info:
        with jc.hot_loop():
            read(x)
    assert info.value.__context__ is None or info.value.__suppress_context__
    with jc.hot_loop(on_violation="record") as loop:
        read(x)
    assert [v.kind for v in loop.violations] == ["transfer"]
    read(x)  # outside a loop: allowed


def test_a_refused_buffer_read_caught_inside_the_loop_is_still_reported():
    """On 3.11 the refusal reaches user code as a SystemError (the slot cannot
    raise ours), on 3.12 as the TransferError itself; caught there, either
    way, it fails the loop as it ends (a violation is not lost because the
    code caught it)."""
    x = jnp.arange(3.0)
    # What memoryview raises there: the TransferError on 3.12, a SystemError on 3.11.
    raised = jc.TransferError if sys.version_info >= (3, 12) else SystemError

    def careless():
        with jc.hot_loop():
            try:
                memoryview(x)
            except raised:  # what a careless caller does
                pass

    with pytest.raises(jc.TransferError, match=r"the buffer protocol.* of f32\[3\]") as info:
        careless()
    assert "caught" in "".join(getattr(info.value, "__notes__", []))


# -- what the message names: the state path, the line, the step a donated array went to ---


def test_message_names_the_state_path_and_the_line():
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            p = advance(p)
            float(p.t)  # the planted read
    msg = str(info.value)
    assert "float() of f32[] (advance_fn -> .t)" in msg
    assert "float(p.t)  # the planted read" in msg


def test_a_read_names_the_step_that_returned_a_state_kept_in_a_list_or_dict():
    advance = jc.hot_step(advance_fn, signature=Particles)
    holders = [
        (lambda q: [q], lambda h: h[-1]),
        (lambda q: {"last": q}, lambda h: h["last"]),
        (lambda q: (0, q), lambda h: h[1]),
    ]
    for keep, last in holders:
        p = advance(make_particles())
        with pytest.raises(jc.TransferError) as info:
            with jc.hot_loop():
                history = keep(advance(p))  # only the container holds the state
                t = last(history).t
                float(t)  # the planted read
        assert "float() of f32[] (advance_fn -> .t)" in str(info.value)


def test_reading_a_donated_array_names_the_step():
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with pytest.raises(jc.DonationError) as info:
        with jc.hot_loop():
            old = p
            p = advance(p)
            jc.fetch(p)
            print(float(old.t))
    assert "donated to" in str(info.value) and "advance_fn" in str(info.value)


# -- no false positives -------------------------------------------------------


@jc.state
class Body:
    x: Float32[Array, "n"]
    v: Float32[Array, "n"]
    dt: float = jc.static(0.1)


@jc.hot_step(signature=Body)
def drift(b: Body) -> Body:
    return Body(x=b.x + b.v * b.dt, v=b.v, dt=b.dt)


@jc.hot_step(signature=Body)
def kick(b: Body, force: Float32[Array, "n"]) -> tuple[Body, Float32[Array, ""]]:
    jax.debug.print("kick {}", b.x[0])  # must not trip the loop (jax issue 39289)
    v = b.v + force * b.dt
    return Body(x=b.x, v=v, dt=b.dt), jnp.sum(v * v)


def test_correct_loops_raise_nothing(mesh2, capsys):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    for sharding in (None, NamedSharding(mesh2, P("x"))):
        b = Body.zeros(n=8, sharding=sharding)
        force = jax.device_put(np.ones(8, np.float32), sharding or jax.devices()[0])
        b = drift(b) if sharding is None else b
        kick_step = kick if sharding is None else jc.hot_step(kick.__wrapped__, signature=Body)
        drift_step = drift if sharding is None else jc.hot_step(drift.__wrapped__, signature=Body)
        b, energy = kick_step(drift_step(b), force)  # compile before the loop
        seen = []
        with jc.hot_loop():
            for i in range(20):
                b = drift_step(b)
                b, energy = kick_step(b, force)
                if i % 10 == 0:
                    seen.append(jc.fetch(energy))
        assert b.dt == 0.1 and len(seen) == 2
        print(b, b.x, energy)  # everything prints after the loop
        assert np.isfinite(float(energy))
    assert "kick" in capsys.readouterr().out


# -- host glue between steps: clean when no transfer happens ------------------


# The glue real training/RL/simulation loops write between steps: unpacking a
# key split, iterating a device array of permutations, metric math on device
# scalars, a gather, a bit test on an overflow flag.


def test_unpacking_a_key_split_is_clean():
    split = jax.jit(jax.random.split)
    key = jax.random.key(0)

    def glue():
        k, sub = split(key)
        return sub

    assert jax.dtypes.issubdtype(_warm_then_loop(glue).dtype, jax.dtypes.prng_key)


def test_iterating_a_device_array_of_permutations_is_clean():
    perms = jnp.stack([jax.random.permutation(jax.random.key(i), 8) for i in range(3)])

    def glue():
        return [perm for perm in perms]

    assert len(_warm_then_loop(glue)) == 3


def test_metric_math_on_device_scalars_is_clean():
    loss, count = jnp.float32(3.0), jnp.float32(2.0)

    def glue():
        return (loss + loss) / count

    assert isinstance(_warm_then_loop(glue), jax.Array)


def test_gather_and_bit_test_with_device_constants_or_a_jit_helper_are_clean():
    x = jnp.arange(10.0)
    idx = jnp.array([1, 2, 3])
    flag = jnp.int32(5)
    one = jnp.int32(1)  # the constant made once, before the loop
    gather = jax.jit(lambda a, i: a[i])

    def glue():
        return gather(x, idx), flag & one

    _warm_then_loop(glue)
