"""Sharded states on 8 simulated CPU devices: 1-D and 2-D meshes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import alive, all_deleted, single_device_sharding
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float32

import jaxcontracts as jc


@jc.state
class Field:
    u: Float32[Array, "n m"]
    w: Float32[Array, "n m"]
    t: Float32[Array, ""]
    dt: float = jc.static(0.1)


def relax_fn(f: Field) -> Field:
    u = f.u + f.dt * (f.w - f.u)
    return Field(u=u, w=f.w, t=f.t + f.dt, dt=f.dt)


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    n = int(np.prod(shape))
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS)")
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


LAYOUTS = {
    "1-D, rows sharded": ((8,), ("x",), P("x"), P()),
    "1-D, replicated": ((8,), ("x",), P(), P()),
    "2-D, both axes": ((4, 2), ("x", "y"), P("x", "y"), P()),
    "2-D, rows only": ((4, 2), ("x", "y"), P("x"), P()),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sharded_state_compiles_donates_and_keeps_its_sharding(layout):
    shape, names, field_spec, scalar_spec = LAYOUTS[layout]
    mesh = _mesh(shape, names)
    shard = {
        "u": NamedSharding(mesh, field_spec),
        "w": NamedSharding(mesh, field_spec),
        "t": NamedSharding(mesh, scalar_spec),
    }
    step = jc.hot_step(relax_fn, signature=Field)
    step.compile(Field.spec(n=16, m=8, sharding=shard))
    f = Field.zeros(n=16, m=8, sharding=shard)
    assert jc.spec_of(f).u.sharding == shard["u"]
    ptrs = [s.data.unsafe_buffer_pointer() for s in f.u.addressable_shards]
    g = step(f)
    assert all_deleted(f)
    assert [s.data.unsafe_buffer_pointer() for s in g.u.addressable_shards] == ptrs
    assert g.u.sharding.is_equivalent_to(shard["u"], 2)
    with jc.hot_loop():
        for _ in range(5):
            g = step(g)
    report = step.report()
    assert report.ok
    assert all(r.donated and r.aliased for r in report.rows)


@pytest.mark.parametrize(
    ("mismatch", "leaf", "compiled", "called"),
    [
        ("rows vs columns", "u", "P('x') on mesh(x=4,y=2)", "P(None, 'x') on mesh(x=4,y=2)"),
        ("sharded vs replicated", "w", "P('x') on mesh(x=4,y=2)", "replicated on mesh(x=4,y=2)"),
        ("mesh vs one device", "t", "replicated on mesh(x=4,y=2)", "single device cpu:0"),
    ],
)
def test_each_call_time_mismatch_names_the_leaf_and_both_shardings(mismatch, leaf, compiled, called):
    mesh = _mesh((4, 2), ("x", "y"))
    rows, rep = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    good = {"u": rows, "w": rows, "t": rep}
    step = jc.hot_step(relax_fn, signature=Field)
    step.compile(Field.spec(n=16, m=8, sharding=good))
    bad_sharding = dict(good)
    bad_sharding[leaf] = {
        "rows vs columns": NamedSharding(mesh, P(None, "x")),
        "sharded vs replicated": rep,
        "mesh vs one device": single_device_sharding(jax.devices()[0]),
    }[mismatch]
    f = Field.zeros(n=16, m=8, sharding=bad_sharding)
    with pytest.raises(jc.RecompileError) as info:
        step(f)
    msg = str(info.value)
    assert f"f.{leaf}: compiled with " in msg
    assert compiled in msg and called in msg
    assert [line for line in msg.splitlines() if "compiled with" in line][0].strip().startswith(f"f.{leaf}")
    assert alive(f)


def test_uncommitted_input_to_a_sharded_step_is_not_silently_resharded():
    mesh = _mesh((8,), ("x",))
    rows = NamedSharding(mesh, P("x"))
    with pytest.raises(jc.SpecError, match=r"field \.t: the sharding P\('x'\) on mesh\(x=8\) does not fit f32\[\]"):
        Field.spec(n=16, m=8, sharding=rows)  # one sharding for all, but t is a scalar
    step = jc.hot_step(relax_fn, signature=Field)
    step.compile(Field.spec(n=16, m=8, sharding={"u": rows, "w": rows, "t": NamedSharding(mesh, P())}))
    f = Field(u=jnp.zeros((16, 8)), w=jnp.zeros((16, 8)), t=0.0)  # uncommitted, device 0
    with pytest.raises(jc.RecompileError, match="single device"):
        step(f)
    assert alive(f)


@pytest.mark.parametrize("level", ["full", "fast", "off"])
@pytest.mark.parametrize("variant", ["P('x', None) vs P('x')", "renamed mesh axis"])
def test_an_equivalent_sharding_is_accepted_not_a_recursion(level, variant):
    mesh = _mesh((8,), ("x",))
    compiled_with = NamedSharding(mesh, P("x", None))
    if variant == "renamed mesh axis":
        called_with = NamedSharding(Mesh(mesh.devices, ("rows",)), P("rows"))
    else:
        called_with = NamedSharding(mesh, P("x"))
    jc.set_checks(level)
    step = jc.hot_step(relax_fn, signature=Field)
    shard = {"u": compiled_with, "w": compiled_with, "t": NamedSharding(mesh, P())}
    step.compile(Field.spec(n=16, m=8, sharding=shard))
    f = Field.zeros(n=16, m=8, sharding={**shard, "u": called_with, "w": called_with})
    g = step(f)
    g = step(g)
    assert step.stats.compiles == 1
    assert step.stats.refused == 0
    assert g.u.sharding.is_equivalent_to(called_with, 2)


def test_a_call_path_that_refuses_what_the_slow_path_accepts_is_an_error_not_a_recursion(monkeypatch):
    from jaxcontracts._step import callctx as _callctx
    from jaxcontracts._step import callpath as _callpath

    # A stand-in for the array class that no leaf is: the call path refuses all.
    stand_in = type("NotAnArray", (), {"is_deleted": _callpath.ArrayImpl.is_deleted})
    monkeypatch.setattr(_callpath, "ArrayImpl", stand_in)
    monkeypatch.setattr(_callctx, "ArrayImpl", stand_in)  # the C-level type comparison's
    step = jc.hot_step(relax_fn, signature=Field)
    f = Field.zeros(n=4, m=2)
    with pytest.raises(jc.RecompileError, match="internal disagreement") as info:
        step(f)
    assert "u: f32[4,2]" in str(info.value)
    assert alive(f)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_state_built_under_another_default_device_is_refused_before_dispatch(level, mesh2):
    # jax.default_device(d1) at the first call, then a state made on device 0:
    # JAX moved the uncommitted input silently (its copy donated, the input
    # alive, the output on device 1); at full the error blamed a numpy view.
    d1 = jax.devices()[1]

    def adv(d):
        return {"x": d["x"] + 1}

    step = jc.hot_step(adv, state="d")
    with jc.checks_level(level):
        with jax.default_device(d1):
            step({"x": jnp.zeros(3)})
        s0 = {"x": jnp.zeros(3)}  # uncommitted, device 0
        with pytest.raises(jc.RecompileError, match=r"d\['x'\]: compiled with f32\[3\] sharded single device cpu:1, called with f32\[3\] sharded single device cpu:0"):
            step(s0)
    assert not s0["x"].is_deleted()


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_state_on_a_one_device_named_sharding_of_the_compiled_device_is_no_move(level):
    # issue 39: "the call path refused arguments that match its compiled
    # signature (an internal disagreement)": the placement probe compared the
    # sharding objects, the slow path their placement
    step = jc.hot_step(lambda s: {"w": s["w"] + 1}, state="s")
    named = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    with jc.checks_level(level):
        s = step({"w": jax.device_put(jnp.zeros(3), jax.devices()[0])})
        s = step(step({"w": jax.device_put(s["w"] + 0, named)}))
    assert s["w"].tolist() == [3.0] * 3 and step.stats.compiles == 1


def test_an_uncommitted_leaf_on_another_device_is_refused_at_full_and_copied_at_fast():
    # issue 39: at fast the placement is checked in the cache miss only, so
    # JAX copies an uncommitted leaf made on another device (the documented
    # limit of fast: nothing is lost, the leaf is not donated); full refuses
    # the call, naming the leaf and both devices, with the inputs intact.
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs two devices")
    step = jc.hot_step(lambda s: {"a": s["a"] + 1, "b": s["b"] + 1}, state="s")
    s = step({"a": jax.device_put(jnp.zeros(3), devices[0]), "b": jax.device_put(jnp.zeros(3), devices[0])})
    with jax.default_device(devices[1]):
        b = jnp.ones(3)
    assert not b.committed
    with jc.checks_level("full"), pytest.raises(jc.RecompileError, match=r"s\['b'\]: compiled with .* cpu:0, called with .* cpu:1"):
        step({"a": s["a"], "b": b})
    assert not b.is_deleted() and not s["a"].is_deleted()
    with jc.checks_level("fast"):
        out = step({"a": s["a"], "b": b})
    assert not b.is_deleted() and out["b"].devices() == {devices[0]}  # copied, not donated


def test_a_call_under_another_mesh_context_names_the_with_block_in_its_fix():
    # hostile round 64: compiled outside `with jax.set_mesh(mesh):`, called inside: the
    # fix said to set JAX options with jax.config.update, which cannot set a mesh
    if len(jax.devices()) < 2 or not hasattr(jax, "set_mesh"):
        pytest.skip("needs 2 devices and jax.set_mesh")
    mesh = jax.make_mesh((2,), ("x",))
    step = jc.hot_step(lambda s: {"a": s["a"] + 1}, state="s")
    s = step({"a": jnp.zeros(4)})
    with jax.set_mesh(mesh), pytest.raises(jc.RecompileError) as info:
        step(s)
    if "mesh_context_manager" not in str(info.value):
        pytest.skip("this jax does not name its trace context's options")
    assert info.value.fix.startswith(
        "make every call, the first one (or .compile()) included, inside the same "
        "`with jax.set_mesh(mesh):` block, or every one outside it"
    ), info.value.fix
    assert not s["a"].is_deleted()


def test_a_state_sharded_over_make_meshs_default_axes_runs_as_under_jax_jit():
    # jax.make_mesh's axes are Explicit by default (jax >= 0.7): the sharding is
    # part of each array's type, and with_sharding_constraint refuses it. The
    # step constrained its carried leaves with it: JAX's raw ValueError at the
    # first call, where jax.jit runs the step.
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS)")
    mesh = jax.make_mesh((2,), ("x",))
    placed = NamedSharding(mesh, P("x"))

    @jc.hot_step(state="s")
    def step(s):
        return {"w": s["w"] * 2.0, "b": s["b"] + 1.0}

    s = {"w": jax.device_put(jnp.ones((4, 3)), placed), "b": jax.device_put(jnp.zeros(4), placed)}
    for _ in range(3):
        s = step(s)
    assert s["w"].sharding.is_equivalent_to(placed, 2) and s["b"].sharding.is_equivalent_to(placed, 1)
    assert all(leaf.aliased for leaf in step.describe().current.leaves)  # donated, as jax.jit would
    np.testing.assert_array_equal(jc.fetch(s["w"]), np.full((4, 3), 8.0))
    assert step.stats.compiles == 1


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_an_uncommitted_argument_beside_a_sharded_state_is_moved_as_jax_jit_moves_it(level):
    # a key made with jax.random.key (uncommitted, on the default device) and a
    # batch made by jnp.ones, beside a state sharded over a mesh: jax.jit moves
    # them to the mesh; the first call used to fail in JAX's lowering
    # ("Received incompatible devices"), later calls were refused as a new signature
    rows = NamedSharding(_mesh((8,), ("x",)), P("x"))

    def body(s, key, y):
        return {"w": s["w"] + jax.random.normal(key, (16,)) + y}

    key, y = jax.random.key(0), jnp.ones(16)
    assert not key.committed and not y.committed
    expected = jax.jit(body)({"w": jax.device_put(jnp.zeros(16), rows)}, key, y)
    step = jc.hot_step(body, state="s")
    with jc.checks_level(level):
        s = step({"w": jax.device_put(jnp.zeros(16), rows)}, key, y)
        np.testing.assert_array_equal(jc.fetch(s["w"]), jax.device_get(expected["w"]))  # (jc.fetch pins nothing)
        with jc.hot_loop(transfers="allow"):  # each call copies them to the mesh: a transfer
            for _ in range(3):
                s = step(s, key, y)
        with pytest.raises(jc.TransferError, match="device-to-device"), jc.hot_loop():
            step(s, key, y)
    assert step.stats.compiles == 1 and s["w"].sharding == rows and not key.is_deleted()


def test_a_donated_uncommitted_state_beside_a_sharded_argument_is_refused_by_name():
    # jax.jit would copy the state to the mesh and donate the copy (the state
    # not consumed); it was JAX's lowering error ("Received incompatible devices")
    rows = NamedSharding(_mesh((8,), ("x",)), P("x"))
    step = jc.hot_step(lambda s, y: {"w": s["w"] + y}, state="s")
    s = {"w": jnp.zeros(16)}
    with pytest.raises(jc.DonationError, match=r"(?s)1 donated leaf is uncommitted, on other devices than y.*s\['w'\]: f32\[16\] on"):
        step(s, jax.device_put(jnp.ones(16), rows))
    assert not s["w"].is_deleted()


def test_a_refusal_never_blames_an_uncommitted_argument_jax_moves():
    # the key is moved at every call, as jax.jit moves it; only y, committed to
    # another device, is the cause
    devices = jax.devices()
    rows = NamedSharding(_mesh((8,), ("x",)), P("x"))
    step = jc.hot_step(lambda s, key, y: {"w": s["w"] + jax.random.normal(key, (16,)) + y}, state="s")
    key, y = jax.random.key(0), jnp.ones(16)
    s = step({"w": jax.device_put(jnp.zeros(16), rows)}, key, y)
    with pytest.raises(jc.RecompileError) as info:
        step(s, key, jax.device_put(y, devices[3]))
    text = str(info.value)
    assert "parameter `y`" in text and "parameter `key`" not in text, text


def test_arguments_committed_to_two_devices_at_the_first_compile_are_named_as_jax_jit_names_them():
    # JAX's "incompatible devices" error named "argument args[0]['n']" and
    # "argument args[1]" of the library's wrapper, its traceback ending in
    # jax/_src/stages.py; the note said "while tracing" (it is the lowering)
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs two devices")
    step = jc.hot_step(lambda s, k: {"x": s["x"] * k, "n": s["n"] + 1}, state="s")
    s = jax.device_put({"x": jnp.ones(3), "n": jnp.int32(0)}, devices[1])
    with pytest.raises(ValueError, match=r"argument s\['\w'\] of <lambda> .* argument k of <lambda>") as e:
        step(s, jax.device_put(jnp.float32(3.0), devices[0]))
    assert str(e.traceback[-1].path) == __file__, e.traceback[-1]
    assert any("raised while compiling the hot step" in n for n in e.value.__notes__)
