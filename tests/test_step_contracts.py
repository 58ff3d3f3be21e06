"""A hot step's contracts: derived donation and its proof, the compile-time
contracts, the call-time checks at each checks level, and what a call keeps.

How steps of other shapes are defined is in test_step_shapes; how a step may
be called (keywords, methods, partials) in test_step_calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    NUMPY_VIEW,
    SYNC_ERRORS,
    Counter,
    Particles,
    advance_fn,
    alive,
    all_deleted,
    make_particles,
    single_device_sharding,
)
from jaxtyping import Array, Float32, PyTree

import jaxcontracts as jc


def make_advance(**kw):
    return jc.hot_step(advance_fn, signature=Particles, **kw)


# -- donation -------------------------------------------------------------


def test_donates_every_state_leaf_and_reuses_the_buffers():
    advance = make_advance()
    p = make_particles()
    ptrs = [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(p)]
    q = advance(p)
    assert all_deleted(p)
    assert [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(q)] == ptrs
    assert advance.stats.calls == 1 and advance.stats.compiles == 1


def test_parameter_inserted_before_the_state_still_donates_the_state():
    # The classic desync: donate_argnums=0 would now donate `force`.
    @jc.hot_step(signature=Particles)
    def push(force: Float32[Array, "3"], p: Particles) -> Particles:
        return Particles(pos=p.pos + force * p.dt, vel=p.vel, t=p.t + p.dt, dt=p.dt)

    force = jnp.ones(3, jnp.float32)
    p = make_particles()
    ptrs = [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(p)]
    q = push(force, p)
    assert all_deleted(p)
    assert alive(force)
    assert [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(q)] == ptrs
    q = push(force, q)  # the non-state argument is reusable
    assert alive(force)


def test_keyword_call_and_keyword_only_state():
    @jc.hot_step(signature=Particles)
    def push(scale: Float32[Array, ""], *, p: Particles) -> Particles:
        return Particles(pos=p.pos * scale, vel=p.vel, t=p.t, dt=p.dt)

    p = make_particles()
    s = jnp.float32(1.0)
    q = push(s, p=p)
    assert all_deleted(p) and alive(s)
    q = push(scale=s, p=q)
    assert push.stats.calls == 2


def test_donate_a_subset_of_fields():
    advance = make_advance(donate=("pos",))
    p = make_particles()
    q = advance(p)
    assert p.__dict__["pos"].is_deleted()
    # the fields that were not donated still read, and their arrays are alive
    assert not p.vel.is_deleted() and not p.t.is_deleted()
    with pytest.raises(jc.DonationError, match=r"Particles\.pos: f32\[4,3\] was donated to advance"):
        p.pos  # noqa: B018
    advance(q)


def test_donate_none_is_an_explicit_opt_out():
    advance = make_advance(donate="none")
    p = make_particles()
    advance(p)
    assert alive(p)


def test_a_state_parameter_not_returned_is_read_only_and_never_donated():
    # The step returns one state for two state parameters: the second is a
    # read-only input (not donated, not copied), still part of the signature.
    @jc.hot_step(signature=Particles)
    def relax(p: Particles, target: Particles) -> Particles:
        pos = p.pos + (target.pos.mean(0) - p.pos) * p.dt
        return Particles(pos=pos, vel=p.vel, t=p.t + target.t, dt=p.dt)

    relax.compile(Particles.spec(n=8), Particles.spec(n=2))
    leaves = {leaf.path: leaf for leaf in relax.describe().current.leaves}
    assert leaves["p.pos"].donated and leaves["p.pos"].aliased
    assert not leaves["target.pos"].donated and leaves["target.pos"].aliased is None
    p, target = make_particles(8), make_particles(2)
    q = relax(p, target)
    assert all_deleted(p) and alive(target)
    relax(q, target)


def test_donated_argument_that_cannot_alias_is_a_donation_error_at_compile():
    # A donated non-state argument with no output of its shape and dtype.
    @jc.hot_step(signature=Particles, donate_argnames=("target",))
    def relax(p: Particles, target: Float32[Array, "m 3"]) -> Particles:
        pos = p.pos + (target.mean(0) - p.pos) * p.dt
        return Particles(pos=pos, vel=p.vel, t=p.t, dt=p.dt)

    with pytest.raises(jc.DonationError) as info:
        relax.compile(Particles.spec(n=8), jax.ShapeDtypeStruct((2, 3), jnp.float32))
    msg = str(info.value)
    assert "target: f32[2,3]: no output is f32[2,3]" in msg
    assert "p.pos" not in msg
    assert "donate_argnames" in msg
    assert relax.compiled is None and relax.stats.compiles == 0


def test_passthrough_and_constant_leaves_alias():
    @jc.hot_step(signature=dict)
    def step(s: dict) -> tuple[dict, Float32[Array, "4"]]:
        return {"a": s["a"], "b": jnp.zeros(4), "c": s["c"] + 1}, s["a"] * 2

    s = {"a": jnp.zeros(4), "b": jnp.zeros(4), "c": jnp.zeros(2)}
    out, _ = step(s)
    assert all_deleted(s) and alive(out)
    leaves = step.describe().current.leaves
    assert [(leaf.path, leaf.aliased) for leaf in leaves] == [
        ("s['a']", True), ("s['b']", True), ("s['c']", True)
    ]


@pytest.mark.cpu_only(NUMPY_VIEW)
def test_a_numpy_view_of_a_donated_leaf_is_refused_before_dispatch():
    advance = make_advance()
    p = make_particles()
    advance.compile(p)
    view = np.asarray(p.pos)  # holds p.pos: the donation would delete what it shows
    with pytest.raises(jc.DonationError) as info:
        advance(p)
    err = info.value
    assert err.result is None and err.leaves == ("p.pos",) and err.contract == "donation-hazard"
    assert "would delete 1 array(s) you still hold elsewhere" in str(err) and "intact" in str(err)
    assert alive(p) and advance.stats.refused == 1
    del view
    assert alive(advance(p))  # dropped: the call runs


def test_numpy_view_makes_xla_copy_and_raises_after_dispatch_with_result(without_kept_check):
    advance = make_advance()
    p = make_particles()
    advance.compile(p)
    view = np.asarray(p.pos)  # zero-copy view: XLA:CPU must copy instead of donating
    with pytest.raises(jc.DonationError) as info:
        advance(p)
    err = info.value
    assert isinstance(err.result, Particles)
    assert err.result.pos.shape == (4, 3)  # nothing lost: the outputs are here
    assert "p.pos" in str(err) and "numpy view" in str(err)
    assert err.contract == "consumed" and err.leaves == ("p.pos",)
    del view


def test_not_consumed_names_a_pinning_jaxlib(monkeypatch, without_kept_check):
    from jaxcontracts._step import diagnose as _diagnose

    monkeypatch.setattr(_diagnose, "pins_host_views", lambda: True)
    advance = make_advance()
    p = make_particles()
    advance.compile(p)
    view = np.asarray(p.pos)
    with pytest.raises(jc.DonationError, match="Or: this jaxlib keeps a host view") as info:
        advance(p)
    assert "pickle.dumps(x)" in str(info.value)  # pickling a state reads it too (3.12, 0.11.2)
    del view


# -- compile-time contracts -----------------------------------------------


def test_int32_counter_dict_state_is_a_recompile_error_at_compile():
    @jc.hot_step
    def step(s: dict) -> dict:
        return {"x": s["x"] * 0.5, "t": s["t"] + 1.0}

    s = {"x": jnp.zeros(3), "t": jnp.int32(0)}
    with pytest.raises(jc.RecompileError) as info:
        step.compile(s)
    msg = str(info.value)
    assert "['t']: takes i32[], returns" in msg
    assert "['x']" not in msg
    assert alive(s) and step.stats.calls == 0


def test_int32_counter_in_a_state_class_is_caught_at_construction():
    with pytest.raises(jc.SpecError, match=r"\.t: expected f32\[\], got i32\[\]"):
        Particles(pos=jnp.zeros((2, 3)), vel=jnp.zeros((2, 3)), t=jnp.int32(0))


def test_compile_from_spec_then_call_with_data():
    advance = make_advance()
    compiled = advance.compile(Particles.spec(n=16))
    assert compiled is advance.compiled
    assert advance.signature[0].pos.shape == (16, 3)
    p = advance(make_particles(16))
    assert advance.stats.compiles == 1 and advance.stats.calls == 1
    assert isinstance(advance.lowered.as_text(), str)
    del p


def test_max_compiles():
    advance = make_advance(max_compiles=2)
    a = advance(make_particles(4))
    b = advance(make_particles(8))
    assert advance.stats.compiles == 2
    a = advance(a)
    b = advance(b)  # switching between compiled signatures is allowed
    with pytest.raises(jc.RecompileError, match="max_compiles=2"):
        advance(make_particles(16))
    assert len(advance.signatures) == 2


def test_step_returning_state_and_metrics():
    @jc.hot_step(signature=Counter)
    def step(c: Counter) -> tuple[Counter, Float32[Array, ""]]:
        return Counter(x=c.x + 1, count=c.count + 1), c.x.sum()

    c = Counter.zeros(n=3)
    c, loss = step(c)
    c, loss = step(c)
    assert int(c.count) == 2 and float(loss) == 3.0


def test_not_blocking(monkeypatch):
    advance = make_advance()
    p = advance(make_particles())

    def forbidden(*a, **k):
        raise AssertionError("hot_step blocked on the device")

    monkeypatch.setattr(jax, "block_until_ready", forbidden)
    monkeypatch.setattr(type(p.pos), "block_until_ready", forbidden)
    for _ in range(3):
        p = advance(p)
    monkeypatch.undo()
    p.pos.block_until_ready()


def test_plain_tracing_under_outer_transformations():
    advance = make_advance()

    @jax.jit
    def two(p):
        return advance(advance(p))

    p = two(make_particles())
    assert advance.stats.compiles == 0 and advance.stats.traced_calls == 2
    grads = jax.grad(lambda pos: advance(Particles(pos=pos, vel=p.vel, t=p.t)).pos.sum())(p.pos)
    assert grads.shape == (4, 3)
    batched = jax.vmap(lambda pos: advance(Particles(pos=pos, vel=pos, t=p.t)).pos)(
        jnp.zeros((2, 4, 3))
    )
    assert batched.shape == (2, 4, 3)


@jc.state
class S1:
    x: Float32[Array, "n"]


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_closed_over_state_under_an_outer_transformation_is_traced_not_run(level):
    # No argument is a tracer, but a trace is active: the step must be traced
    # into the outer computation, donating nothing.
    @jc.hot_step(signature=S1)
    def st(s: S1) -> S1:
        return S1(x=s.x + 1)

    with jc.checks_level(level):
        s = st(S1(x=jnp.zeros(3)))  # compiled
        outer = jax.jit(lambda: st(s).x * 2)
        assert outer().tolist() == [4.0] * 3
        assert outer().tolist() == [4.0] * 3
        assert alive(s)
        pick = jax.jit(lambda c: jax.lax.cond(c, lambda: st(s).x, lambda: s.x))
        assert pick(True).tolist() == [2.0] * 3 and pick(False).tolist() == [1.0] * 3
        assert alive(s)
        fresh = S1(x=jnp.zeros(3))  # a state no step returned
        assert jax.jit(lambda: st(fresh).x)().tolist() == [1.0] * 3 and alive(fresh)
        assert st.stats.traced_calls == 3 and st.stats.compiles == 1
        # Outside any trace it still donates. A fresh state: one that a jax.jit
        # closed over was read by JAX itself, which pins it on jaxlib 0.11.2.
        before = st(S1(x=jnp.ones(3)))
        after = st(before)
        assert not alive(before) and after.x.tolist() == [3.0] * 3


@pytest.mark.cpu_only(SYNC_ERRORS)
@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_an_error_raised_while_the_executable_runs_is_reraised_truthfully(level):
    calls = []

    def cb(x):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("boom from the callback")
        return x

    @jc.hot_step(signature=S1)
    def st(s: S1) -> S1:
        return S1(x=jax.pure_callback(cb, jax.ShapeDtypeStruct(s.x.shape, s.x.dtype), s.x) + 1)

    with jc.checks_level(level):
        s = st(S1(x=jnp.zeros(3)))
        with pytest.raises(jax.errors.JaxRuntimeError, match="boom from the callback") as info:
            st(s)  # JAX's own error, not a DonationError about the deleted input
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "failed while its executable ran. The call did run" in note
    assert "s.x: f32[3] deleted" in note and "did not run" not in note
    assert s.x.is_deleted()  # the note is true: XLA took the buffer


@pytest.mark.cpu_only(SYNC_ERRORS)
def test_a_callback_that_fails_inside_a_loop_is_reported_with_what_it_cost():
    # A host callback that raises fails the executable after XLA took the
    # donated state. JAX's error carries the callback's; the note says the
    # state is gone (it said "already deleted ... the call did not run"). A
    # callback's own jnp ops are no longer refused (tests/test_callbacks.py):
    # here the callback fails for its own reason.
    def show(x):
        jnp.sum(x * 3.25)  # a cold eager op: runs (the loop's guards are lifted)
        raise ValueError("the callback's own failure")

    @jc.hot_step(signature=S1)
    def st(s: S1) -> S1:
        jax.debug.callback(show, s.x)
        return S1(x=s.x + 1)

    st.compile(S1.spec(n=3))
    s = S1(x=jnp.zeros(3))
    with pytest.raises(jax.errors.JaxRuntimeError, match="the callback's own failure") as info:
        with jc.hot_loop():
            st(s)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "The call did run" in note and "s.x: f32[3] deleted" in note
    assert s.x.is_deleted()


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_donated_state_names_the_step_that_consumed_it_outside_loops(level):
    @jc.hot_step(signature=S1)
    def st(s: S1) -> S1:
        return S1(x=s.x + 1)

    with jc.checks_level(level):
        s0 = S1(x=jnp.zeros(3))
        s = st(s0)  # the checked path
        s2 = st(s)  # a warm call
        assert repr(s0) == repr(s) == "S1(x=f32[3] (deleted: donated to st))"
        assert repr(s2) == "S1(x=f32[3])"
        for stale in (s0, s):
            with pytest.raises(jc.DonationError, match=r"s\.x: f32\[3\] was already donated to st"):
                st(stale)
        with pytest.raises(jc.DonationError, match=r"jc\.fetch\(\): \.x: f32\[3\] was donated to st"):
            jc.fetch(s)
        # reading a field names the step and the field, not JAX's bare RuntimeError
        with pytest.raises(jc.DonationError, match=r"S1\.x: f32\[3\] was donated to st") as info:
            s0.x  # noqa: B018
        assert info.value.contract == "no-donated-use" and info.value.leaves == (".x",)
        # the mark is not part of the state: a rebuilt state is a plain S1
        assert type(s.replace(x=jnp.ones(3))) is S1  # a new, plain state
        fresh = jax.tree_util.tree_map(lambda x: jnp.ones(x.shape, x.dtype), s)
        assert type(fresh) is S1 and repr(fresh) == "S1(x=f32[3])"
        assert isinstance(s, S1)
        assert st(s2).x.tolist() == [3.0] * 3


# -- call-time checks: every wrong call raises before dispatch ------------


def _compiled_advance():
    advance = make_advance()
    advance(make_particles())
    return advance


@pytest.mark.parametrize(
    ("name", "make_bad", "error", "fragment"),
    [
        ("dtype", lambda p: {"pos": p.pos.astype(jnp.float16)}, jc.RecompileError, "p.pos: compiled with f32[4,3], called with f16[4,3]"),
        ("shape", lambda p: {"pos": jnp.zeros((5, 3))}, jc.RecompileError, "p.pos: compiled with f32[4,3], called with f32[5,3]"),
        ("weak python float", lambda p: {"t": 1.0}, jc.TransferError, "p.t: ~f32[] (Python float)"),
        ("weak array", lambda p: {"t": jnp.asarray(1.0)}, jc.RecompileError, "p.t: compiled with f32[], called with ~f32[]"),
        ("numpy array", lambda p: {"vel": np.zeros((4, 3), np.float32)}, jc.TransferError, "p.vel: f32[4,3] (numpy array)"),
        ("static field", lambda p: {"dt": 0.5}, jc.RecompileError, "p.dt: compiled with static 0.01, called with static 0.5"),
    ],
)
def test_wrong_call_raises_before_dispatch_and_inputs_stay_alive(name, make_bad, error, fragment):
    advance = _compiled_advance()
    p = make_particles()
    fields = {"pos": p.pos, "vel": p.vel, "t": p.t, "dt": p.dt} | make_bad(p)
    bad = Particles.__new__(Particles)
    bad.__dict__.update(fields)  # bypass validation: what a careless caller might build
    with pytest.raises(error) as info:
        advance(bad)
    assert fragment in str(info.value), str(info.value)
    assert "intact" in str(info.value)
    assert alive(p) and alive(bad)
    assert advance.stats.calls == 1  # only the first, good call ran


def test_wrong_structure():
    advance = _compiled_advance()
    p = make_particles()
    with pytest.raises(jc.RecompileError, match="p: compiled with Particles, called with dict with keys"):
        advance({"pos": p.pos, "vel": p.vel, "t": p.t})
    assert alive(p)


def test_already_donated_leaf():
    advance = _compiled_advance()
    p = make_particles()
    advance(p)
    with pytest.raises(jc.DonationError, match=r"p.pos: f32\[4,3\] was already"):
        advance(p)


def test_one_buffer_passed_twice():
    @jc.hot_step(signature=Counter)
    def step(c: Counter, other: Float32[Array, "n"]) -> Counter:
        return Counter(x=c.x + other, count=c.count)

    c = Counter.zeros(n=3)
    step(c, jnp.ones(3))
    c = Counter.zeros(n=3)
    with pytest.raises(jc.DonationError, match="c.x and other are the same buffer"):
        step(c, c.x)
    assert alive(c)


def test_wrong_sharding_on_a_two_device_mesh(mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rows = NamedSharding(mesh2, P("x"))
    rep = NamedSharding(mesh2, P())
    shard = {"pos": rows, "vel": rows, "t": rep}
    advance = make_advance()
    advance.compile(Particles.spec(n=8, sharding=shard))
    p = Particles.zeros(n=8, sharding=shard)
    ptrs = [s.data.unsafe_buffer_pointer() for s in p.pos.addressable_shards]
    q = advance(p)
    assert all_deleted(p)
    assert [s.data.unsafe_buffer_pointer() for s in q.pos.addressable_shards] == ptrs
    assert q.pos.sharding == rows

    wrong = Particles.zeros(n=8, sharding=rep)  # replicated where rows were compiled
    with pytest.raises(jc.RecompileError) as info:
        advance(wrong)
    msg = str(info.value)
    assert "p.pos: compiled with f32[8,3] sharded P('x')" in msg
    assert "called with f32[8,3] sharded replicated" in msg
    assert alive(wrong)
    uncommitted = Particles.zeros(n=8)  # single device, would be resharded silently
    with pytest.raises(jc.RecompileError, match="sharded single device"):
        advance(uncommitted)
    assert alive(uncommitted)


# -- definition errors ----------------------------------------------------


def test_definition_errors():
    with pytest.raises(jc.DefinitionError, match="no parameter is annotated with the state type Particles"):
        jc.hot_step(lambda x: x, signature=Particles)
    with pytest.raises(jc.DefinitionError, match="unknown field\\(s\\) 'position'") as info:
        make_advance(donate=("position",))
    assert "array fields: pos, vel, t" in str(info.value)
    assert "static fields (not donatable, not arrays): dt" in str(info.value)
    with pytest.raises(jc.DefinitionError, match='donate="all"'):
        make_advance(donate="everything")
    with pytest.raises(jc.DefinitionError, match="max_compiles"):
        make_advance(max_compiles=0)



def test_without_a_return_annotation_what_is_returned_is_read_from_the_output():
    # Was a DefinitionError ("the return annotation is missing"): the output
    # tells whether the state comes back.
    def carries(p: Particles):
        return advance_fn(p)

    def reads(p: Particles):
        return p.pos.sum()

    carry, read = jc.hot_step(carries), jc.hot_step(reads)
    p = make_particles()
    q = carry(p)
    assert vars(p)["pos"].is_deleted() and not q.pos.is_deleted()  # carried: donated
    total = read(q)
    assert not q.pos.is_deleted() and total.shape == ()  # read-only: never donated
    assert carry.describe().current.donated and not read.describe().current.donated


def test_unknown_donated_field_of_a_dict_state_is_reported_at_compile():
    @jc.hot_step(signature=dict, donate=("y",))
    def step(s: dict) -> dict:
        return {"x": s["x"] + 1}

    with pytest.raises(jc.DefinitionError, match="(?s)unknown field\\(s\\) 'y' of dict.*array fields: x"):
        step.compile({"x": jnp.zeros(2)})


def test_donated_fields_of_a_state_named_by_parameter_only_say_how_to_name_its_type():
    # it said "donate names unknown field(s) 'x' of None. array fields: (none)"
    step = jc.hot_step(lambda s: {"x": s["x"] + 1}, state="s", donate=("x",))
    with pytest.raises(jc.DefinitionError, match="(?s)names no state type.*signature=dict") as info:
        step({"x": jnp.zeros(2)})
    assert "of None" not in str(info.value)


# -- checks levels ---------------------------------------------------------


@pytest.mark.cpu_only(NUMPY_VIEW)
def test_checks_levels():
    advance = make_advance()
    p = advance(make_particles())
    with jc.checks_level("off"):
        p = advance(p)  # a bare compiled call
        view = np.asarray(p.pos)
        p2 = advance(p)  # XLA copies; "off" does not look
        del view
        with pytest.raises(jc.RecompileError):  # failures are still explained
            advance(make_particles(5))
    with jc.checks_level("fast"):
        view = np.asarray(p2.pos)
        p3 = advance(p2)  # fast: no after-dispatch check
        del view
    view = np.asarray(p3.pos)
    with pytest.raises(jc.DonationError):
        advance(p3)
    del view
    with pytest.raises(jc.DefinitionError, match="valid levels are 'full', 'fast', 'off'"):
        jc.set_checks("paranoid")


def test_a_checks_level_set_back_takes_its_call_path_again():
    # A level change rebuilds the call path; setting a level back takes the
    # one built before (and its C++ call's cache), per compiled signature.
    step = jc.hot_step(state="s", max_compiles=2)(lambda s: {"x": s["x"] + 1.0})
    small, big = {"x": jnp.zeros(3)}, {"x": jnp.zeros(5)}
    small = step(small)
    full_small = step._call
    with jc.checks_level("off"):
        small = step(small)
        off_small = step._call
        assert off_small is not full_small
    assert step._call is full_small
    big = step(big)  # a second signature: its own call paths
    full_big = step._call
    assert full_big is not full_small
    with jc.checks_level("off"):
        small = step(small)  # the slow path switches signatures
        big = step(big)
    small, big = step(small), step(big)
    np.testing.assert_allclose(small["x"], 4.0)
    np.testing.assert_allclose(big["x"], 3.0)
    assert step.stats.compiles == 2


def test_a_call_path_is_built_at_its_first_call_not_at_compile(monkeypatch):
    # As jax.stages.Compiled builds its C++ call at its first call: a compile
    # (and a checks level change) builds no call path that no call uses.
    from jaxcontracts._step import hot_step as _hot_step

    built = []
    real = _hot_step.make_dispatch
    monkeypatch.setattr(_hot_step, "make_dispatch", lambda cs, level, step: built.append(level) or real(cs, level, step))
    step = make_advance()
    step.compile(Particles.spec(n=4))
    assert built == []
    with jc.checks_level("off"), jc.checks_level("fast"):
        pass
    assert built == []
    p = step(make_particles(4))
    p = step(p)
    assert built == ["full"]
    with jc.checks_level("off"):
        p = step(p)
        p = step(p)
    p = step(p)  # the full path kept: not built again
    assert built == ["full", "off"]
    want = make_particles(4)
    for _ in range(5):
        want = advance_fn(want)
    np.testing.assert_allclose(p.pos, want.pos, rtol=1e-6)
    # a refusal at the first call after a compile still ends at the user's
    # line, with the inputs intact
    fresh = make_advance()
    fresh.compile(Particles.spec(n=4))
    q = make_particles(4)
    kept = q.pos  # a leaf held elsewhere: refused on every backend
    with pytest.raises(jc.DonationError) as info:
        fresh(q)
    del kept
    import traceback

    frames = traceback.extract_tb(info.value.__traceback__)
    assert [f.filename for f in frames] == [__file__], frames  # no frame of the library's
    assert not q.pos.is_deleted()


def test_checks_env_variable_is_validated():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import jaxcontracts"],
        env={"JAXCONTRACTS_CHECKS": "sometimes", "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "JAXCONTRACTS_CHECKS got 'sometimes'" in out.stderr
    ok = subprocess.run(
        [sys.executable, "-c", "import jaxcontracts as jc; print(jc.get_checks())"],
        env={"JAXCONTRACTS_CHECKS": "FAST", "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert ok.stdout.strip() == "fast"


# -- states returned by a hot_step ------------------------------------------


def test_a_returned_state_carries_no_mark_in_or_out_of_loops():
    # Nothing is written on a state a step returns (no provenance token, no
    # producer mark): a loop records the step's output, and messages read it
    # there (advance -> .t).
    from jaxcontracts._marks import PREFIX
    from jaxcontracts._runtime import produced_by

    advance = make_advance()
    q = advance(make_particles())
    assert not any(k.startswith(PREFIX) for k in vars(q))
    with jc.hot_loop():
        r = advance(q)
        assert not any(k.startswith(PREFIX) for k in vars(r))
        assert produced_by(r.t) == "advance_fn -> .t"
    assert produced_by(r.t) is None  # the loop's exit forgets the record


def test_the_state_path_keeps_no_argument_or_output_alive_inside_a_loop():
    # The `s = step(s)` path records nothing per call (a record of the last
    # arguments and output slowed loops of small steps by ~3%): once the
    # caller drops them, the consumed state and a returned state are freed.
    import gc
    import weakref

    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with jc.hot_loop():
        consumed = weakref.ref(p)
        q = advance(p)
        del p
        returned = weakref.ref(q)
        r = advance(q)
        del q
        gc.collect()
        assert consumed() is None and returned() is None
        assert float(jc.fetch(r.t)) == pytest.approx(0.03)  # the loop still sees its state


@pytest.mark.cpu_only(NUMPY_VIEW)
def test_the_state_path_catches_every_hazard():

    advance = make_advance()
    other = make_advance()
    q = advance(make_particles())
    r = other(q)  # a second step with the same spec accepts it
    assert all_deleted(q)
    with pytest.raises(jc.DonationError, match="already"):
        advance(q)  # stamped, but its buffers were donated to `other`
    assert alive(r)
    with pytest.raises(jc.RecompileError, match="static 0.5"):
        advance(r.replace(dt=0.5))
    view = np.asarray(r.pos)
    with pytest.raises(jc.DonationError, match="still hold elsewhere"):
        advance(r)  # held by a view: refused before dispatch on a warm call too
    assert alive(r)
    del view


@jc.state
class WithParams:
    x: Float32[Array, "n"]
    p: PyTree[Float32[Array, "..."]]


def _params_step():
    @jc.hot_step(signature=WithParams)
    def step(s: WithParams) -> WithParams:
        return WithParams(x=s.x + 1, p=jax.tree_util.tree_map(lambda a: a * 2, s.p))

    return step


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_state_with_an_editable_container_is_checked_on_every_call(level):
    # A PyTree field holds a dict the user can edit in place: every call is
    # checked, whatever step returned the state.
    with jc.checks_level(level):
        step = _params_step()
        s = step(WithParams(x=jnp.zeros(2), p={"w": jnp.ones(2), "lr": jnp.float32(0.1)}))
        s = step(s)
        s.p["w"] = np.ones(2, np.float32)  # edited in place: a host leaf
        with pytest.raises(jc.TransferError, match=r"s\.p\['w'\]: f32\[2\] \(numpy array\)"):
            step(s)  # refused before dispatch, inputs intact
        assert alive(s)
        s.p["w"] = jnp.ones(2)
        s.p["lr"] = 0.2  # a Python float in a 0-d leaf's slot
        with pytest.raises(jc.TransferError, match=r"s\.p\['lr'\]"):
            step(s)
        assert alive(s)
        s.p["lr"] = jnp.float32(0.2)
        s = step(s)
        assert float(s.x[0]) == 3.0 and step.stats.calls == 3


def test_a_state_is_sealed_only_when_no_field_can_be_edited_in_place():
    from jaxcontracts._state.fields import is_sealed_state

    @jc.state
    class Outer:
        inner: Counter
        y: Float32[Array, "n"]

    @jc.state
    class Loose:
        inner: WithParams

    assert is_sealed_state(Particles) and is_sealed_state(Outer)
    assert not is_sealed_state(WithParams) and not is_sealed_state(Loose)


def test_a_warm_call_with_a_returned_state_checks_the_other_arguments():
    @jc.hot_step(signature=Particles)
    def push(force: Float32[Array, "3"], p: Particles) -> Particles:
        return Particles(pos=p.pos + force * p.dt, vel=p.vel, t=p.t + p.dt, dt=p.dt)

    force = jnp.ones(3, jnp.float32)
    p = push(force, make_particles())
    with pytest.raises(jc.TransferError, match="force: f32\\[3\\] \\(numpy array\\)"):
        push(np.ones(3, np.float32), p)
    with pytest.raises(jc.RecompileError, match="force: compiled with f32\\[3\\], called with f32\\[4\\]"):
        push(jnp.ones(4), p)
    assert alive(p)
    p = push(force, p)
    assert push.stats.calls == 2


@jc.state
class _One:
    x: Float32[Array, "n"]


@jc.hot_step(signature=_One, donate="all")
def _bump(s: _One) -> _One:
    return _One(x=s.x + 1)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_returned_state_deleted_by_plain_jax_is_explained_without_an_xla_error_line(capfd, level):
    """A state a hot step returned keeps its class when a plain
    ``jax.jit(donate_argnums=0)`` consumes it; the warm call still looks at
    its donated buffers before calling, so XLA prints nothing."""
    with jc.checks_level(level):
        s = _bump(_bump(_One(x=jnp.zeros(3))))  # a warm call's output
        t = jax.jit(lambda s: s, donate_argnums=0)(s)  # its buffer passes to t
        assert type(s) is _One  # not marked: no hot step consumed it
        capfd.readouterr()
        with pytest.raises(jc.DonationError, match="already deleted"):
            _bump(s)
        assert "ExecutePrepare" not in capfd.readouterr().err
        assert _bump(t).x.tolist() == [3.0] * 3


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_returned_state_by_keyword_or_with_wrong_arguments_is_bound_or_refused(level):
    with jc.checks_level(level):
        s = _bump(_bump(_One(x=jnp.zeros(3))))
        s = _bump(s=s)  # by keyword: bound to its position, same result
        # jc.fetch, not .tolist(): jaxlib 0.11.2 pins a CPU buffer after a plain read
        assert jc.fetch(s.x).tolist() == [3.0] * 3
        with pytest.raises(TypeError, match="missing a required argument: 's'"):
            _bump()
        with pytest.raises(TypeError, match="too many positional arguments"):
            _bump(s, s)
        assert _bump(s).x.tolist() == [4.0] * 3  # refused calls consumed nothing


def test_compile_time_contracts_run_at_every_checks_level():
    @jc.hot_step
    def step(s: dict) -> dict:
        return {"t": s["t"] + 1.0}

    with jc.checks_level("off"), pytest.raises(jc.RecompileError, match=r"\['t'\]: takes i32"):
        step.compile({"t": jnp.int32(0)})


def test_a_returned_state_keeps_its_input_shardings_even_if_the_step_reshards(mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rows = NamedSharding(mesh2, P("x"))
    rep = NamedSharding(mesh2, P())

    @jc.hot_step(signature=Particles)
    def gather(p: Particles) -> Particles:
        pos = jax.lax.with_sharding_constraint(p.pos + 1, rep)  # would come back replicated
        return Particles(pos=pos, vel=p.vel, t=p.t, dt=p.dt)

    shard = {"pos": rows, "vel": rows, "t": rep}
    gather.compile(Particles.spec(n=8, sharding=shard))  # derived: no carry error
    out = gather(Particles.zeros(n=8, sharding=shard))
    assert out.pos.sharding.is_equivalent_to(rows, 2)
    gather(out)


def _memory(kind: str) -> jax.sharding.Sharding:
    device = jax.devices()[0]
    if kind not in [m.kind for m in device.addressable_memories()]:
        pytest.skip(f"this backend has no {kind} memory")
    return single_device_sharding(device, memory_kind=kind)


@pytest.mark.cpu_only("XLA:TPU refuses to compile the move this test plants (an unimplemented DMA)")
def test_a_step_that_moves_its_carried_state_to_another_memory_is_refused_at_compile():
    """ARCHITECTURE.md's recipe for a compile-time contract, walked through: a
    carried leaf offloaded to host memory by the step would not match the
    compiled signature on the next call. The carry check (_step/compile.py)
    names the leaf and both memories (_leafdiff.py: the diff kind
    ``memory_kind``); nothing runs."""
    device, host = _memory("device"), _memory("pinned_host")
    placed = jax.jit(lambda x: jax.device_put(x * 2, host))(jax.device_put(jnp.ones(3), device))
    if placed.sharding.memory_kind != "pinned_host":  # jax 0.10.0 on CPU keeps it in device memory
        pytest.skip("this jax does not place a jitted device_put in host memory on this backend")

    @jc.hot_step(signature=S1)
    def offload(s: S1) -> S1:
        return S1(x=jax.device_put(s.x * 2, host))  # moved to host memory

    s = S1(x=jax.device_put(jnp.ones(3), device))
    with pytest.raises(jc.RecompileError) as info:
        offload(s)
    err = info.value
    assert ".offload returns its state in another memory than it takes it in" in str(err)
    assert "(moved from device memory to pinned_host memory)" in str(err)
    assert err.contract == "carry" and list(err.leaves) == ["s.x"] and "jax.device_put(new_leaf" in err.fix
    assert alive(s)

    @jc.hot_step(signature=S1)
    def round_trip(s: S1) -> S1:  # the fix: moved back before returning
        return S1(x=jax.device_put(jax.device_put(s.x * 2, host), device))

    assert round_trip(s).x.tolist() == [2.0] * 3


def test_output_resharded_by_propagation_says_to_constrain_it_in_the_step(mesh2, monkeypatch):
    # Derived out shardings make this unreachable for placed specs; with the
    # derivation switched off, the carry check still names the leaf, and its
    # fix is a sharding constraint in the step (not a cast or a device_put:
    # the step makes that leaf).
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxcontracts._step import compile as _compile

    monkeypatch.setattr(_compile, "derive_out_shardings", lambda sig, fn, paths, specs: fn)
    rows = NamedSharding(mesh2, P("x"))
    rep = NamedSharding(mesh2, P())

    @jc.hot_step(signature=Particles)
    def gather(p: Particles) -> Particles:
        pos = jax.lax.with_sharding_constraint(p.pos + 1, rep)  # comes back replicated
        return Particles(pos=pos, vel=p.vel, t=p.t, dt=p.dt)

    with pytest.raises(jc.RecompileError) as info:
        gather.compile(Particles.spec(n=8, sharding={"pos": rows, "vel": rows, "t": rep}))
    msg = str(info.value)
    assert ".pos: takes f32[8,3] sharded P('x') on mesh(x=2), returns f32[8,3] sharded replicated" in msg
    assert "XLA's sharding propagation placed the step's output differently" in msg
    assert "jax.lax.with_sharding_constraint(new_leaf, <input sharding>)" in msg
    assert "astype" not in msg and "device_put" not in msg
    assert ".vel" not in msg and gather.stats.compiles == 0


def test_arrays_on_other_devices_fed_to_a_step_in_a_hot_loop_are_transfers(mesh2):
    import jax

    advance = make_advance()
    advance(make_particles())  # compiled for device 0
    elsewhere = jax.device_put(make_particles(), jax.devices()[1])
    with pytest.raises(jc.RecompileError, match="sharding changed"):
        advance(elsewhere)  # outside a loop: a signature mismatch
    with pytest.raises(jc.TransferError, match="implicit device-to-device transfer") as info:
        with jc.hot_loop():
            advance(elsewhere)
    assert "p.pos: compiled with f32[4,3] sharded single device cpu:0" in str(info.value)
    assert alive(elsewhere)


@jc.state
class S:
    x: Float32[Array, "n"]


@jc.hot_step(signature=S)
def scaled(s: S, k: Float32[Array, ""]) -> S:
    return S(x=s.x * k)


def test_a_python_float_to_a_step_in_a_loop_is_named_without_touching_the_device():
    """The message used to call jnp.asarray, and the user got `RecompileError:
    jax compiles 'stage'`, which was about the library."""
    s = scaled(S(x=jnp.ones(3)), jnp.float32(2))
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            scaled(s, 2.5)
    text = str(info.value)
    assert "k: ~f32[] (Python float)" in text or "k: f32[] (Python float)" in text
    assert "compile" not in text.split("Fix:")[0]
    assert info.value.contract == "device-arguments"


@pytest.mark.parametrize("sizes", [(4, 5, 6, 7), (4, 4, 4, 4)], ids=["shapes differ", "one shape"])
def test_threads_making_the_first_call_at_once_compile_once(sizes):
    import threading

    step = jc.hot_step(advance_fn, signature=Particles)  # fresh: max_compiles=1
    states = [make_particles(n) for n in sizes]
    barrier = threading.Barrier(len(sizes))
    outcomes: list[str] = []

    def first_call(p):
        barrier.wait()
        try:
            step(p)
            outcomes.append("ran")
        except jc.RecompileError:
            outcomes.append("refused")

    threads = [threading.Thread(target=first_call, args=(p,)) for p in states]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert step.stats.compiles == 1 and len(step.signatures) == 1
    expected = ["ran"] if len(set(sizes)) > 1 else ["ran"] * len(sizes)
    assert sorted(outcomes) == sorted(expected + ["refused"] * (len(sizes) - len(expected)))


def test_the_first_call_refuses_a_kept_leaf_as_any_later_call_does():
    # gymnax PPO: globals `obsv`, `train_state`... share leaves with `runner_state`;
    # the compiling call used to delete them silently.
    def step(s):
        a, b = s
        return (a + 1, b * 2)

    step = jc.hot_step(step, state="s")
    a, b = jnp.zeros(3), jnp.ones(3)
    s = (a, b)
    with pytest.raises(jc.DonationError, match=r"would delete 2 array\(s\) you still hold elsewhere") as e:
        step(s)
    assert "s[0]: f32[3]" in str(e.value) and not a.is_deleted() and not b.is_deleted()
    assert step.stats.compiles == 1  # compiled; the call refused before dispatch
    del a, b
    s = step(s)  # nothing else holds them: donated
    assert jc.fetch(s[0]).tolist() == [1.0, 1.0, 1.0]


def test_a_compiled_signature_keeps_no_trace_of_jax_s_caches():
    """Issue 22: JAX caches a jitted function's trace (a ClosedJaxpr) and
    lowering by the function it traced; a step's own function lives as long as
    the step, so each signature held ~6x its executable's memory. The step
    traces a function made for each compile: nothing of the trace outlives it
    (a kept jax.jit holds its jaxprs: the control)."""
    import gc

    from jax.extend.core import ClosedJaxpr

    def alive() -> int:
        gc.collect()
        return sum(type(o) is ClosedJaxpr for o in gc.get_objects())

    def make(i):
        def f(p: Particles) -> Particles:
            return p.replace(t=p.t + i)

        return f

    spec = Particles.spec(n=4)
    # JAX's own AOT compile with the step's options, its function dropped: the
    # base (jax 0.12 keeps a jaxpr per keep_unused=True compile on its own)
    before = alive()
    raw = [jax.jit(make(20 + i), donate_argnums=0, keep_unused=True).lower(spec).compile() for i in range(5)]
    base = alive() - before
    steps = [jc.hot_step(make(0))]
    steps[0].compile(spec)
    before = alive()
    for i in range(1, 6):
        steps.append(jc.hot_step(make(i)))
        steps[-1].compile(spec)
    assert alive() - before <= base + 1, (alive() - before, base)
    jitted = [jax.jit(make(10 + i)) for i in range(5)]
    for j in jitted:
        j(make_particles(4))
    assert alive() - before >= base + 5  # the control: the method can see what it counts
    assert isinstance(steps[-1].lowered.as_text(), str) and raw  # lowered again on demand


def test_a_redefined_cell_leaves_nothing_of_the_old_one_alive():
    import gc
    import textwrap
    import weakref

    # A notebook cell run again: module-level code run in the notebook's
    # namespace, defining a new class, step and loop each time. Once the
    # cell's names are rebound, nothing the library keeps (loop clock, step
    # registry, recorded outputs, compiled signatures) holds the old step,
    # its state or its executable's outputs.
    cell = textwrap.dedent(
        """
        from __future__ import annotations

        @jc.state
        class Walker:
            x: Float32[Array, "n"]

        @jc.hot_step(signature=Walker)
        def step(w: Walker) -> Walker:
            return Walker(x=w.x + 1.0)

        w = step(Walker(x=jnp.zeros(1000)))
        with jc.hot_loop():
            for _ in range(3):
                w = step(w)
        refs.append((weakref.ref(step), weakref.ref(w), weakref.ref(w.x)))
        """
    )
    notebook = {"jc": jc, "jnp": jnp, "Float32": Float32, "Array": Array, "weakref": weakref, "refs": []}
    code = compile(cell, "<cell>", "exec")
    for _ in range(5):
        exec(code, notebook)
    for name in ("step", "w", "Walker"):
        del notebook[name]
    gc.collect()
    assert [tuple(r() is not None for r in triple) for triple in notebook["refs"]] == [(False, False, False)] * 5


def test_checks_level_blocks_overlapping_on_two_threads_leave_the_level_they_found():
    # issue 39: T1 enters off, T2 enters fast, T1 exits, T2 exits: the process
    # was left at off (each block restored the level it had saved)
    import threading

    assert jc.get_checks() == "full"
    t1_in, t2_in, t1_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with jc.checks_level("off"):
            t1_in.set()
            t2_in.wait(30)
        t1_out.set()

    def second():
        t1_in.wait(30)
        with jc.checks_level("fast"):
            t2_in.set()
            t1_out.wait(30)
            seen.append(jc.get_checks())  # the latest block's, whichever ended first

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == ["fast"] and jc.get_checks() == "full"
    with jc.checks_level("off"):
        jc.set_checks("fast")  # inside a block: until the block ends
        assert jc.get_checks() == "fast"
    assert jc.get_checks() == "full"


def test_a_state_named_step_returning_its_state_with_another_structure_shows_the_difference():
    # state= finds the new state by its exact structure: a step that adds a
    # key (or fills an optional leaf) returns none, and the refusal shows what
    # it returns of the state's kind and how it differs (the annotated form
    # gets carry invariance's RecompileError with the same lines)
    @jc.hot_step(state="state")
    def add_key(state):
        out = {k: v + 1 for k, v in state.items()}
        out["count"] = jnp.int32(0)
        return out

    with pytest.raises(jc.DefinitionError) as info:
        add_key(jc.device_tree({"w": jnp.zeros(2)}))
    text = str(info.value)
    assert "`state` and the return value, a dict too, differ:" in text
    assert "['count']: takes absent, returns present" in text
    assert info.value.fix.startswith("if what it returns there is the state's new value, keep")

    @jc.hot_step(state="params")
    def loss(params, x):  # a read-only state, returning no dict: the refusal as before
        return jnp.sum(params["w"] * x)

    with pytest.raises(jc.DefinitionError) as info:
        loss(jc.device_tree({"w": jnp.zeros(2)}), jnp.ones(2))
    assert "too, differ:" not in str(info.value) and info.value.fix.startswith("return its new value")
