"""Steps in the shapes real programs have: read-only and stateless steps,
donated non-state arguments, static arguments, derived output shardings,
steps you did not write (state=) and host data (host=).

A hot step's own contracts are in test_step_contracts; how a step may be
called in test_step_calls."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, alive, all_deleted, make_particles
from jaxtyping import Array, Float32

import jaxcontracts as jc

# -- read-only state parameters -------------------------------------------


class Metrics(NamedTuple):
    energy: jax.Array
    speed: jax.Array


@jc.hot_step(signature=Particles)
def measure(p: Particles) -> Metrics:
    """An eval step: reads the state, returns metrics only."""
    return Metrics(energy=(p.vel**2).sum(), speed=jnp.sqrt((p.vel**2).sum(-1)).max())


def test_a_state_the_step_does_not_return_is_read_only():
    p = make_particles(4)
    pointer = p.pos.unsafe_buffer_pointer()
    measure.compile(p)
    with jc.hot_loop():
        for _ in range(3):
            m = measure(p)
    assert isinstance(m, Metrics) and m.energy.dtype == jnp.float32
    assert alive(p) and p.pos.unsafe_buffer_pointer() == pointer  # not donated, not copied
    assert measure.stats.compiles == 1 and measure.stats.calls == 3
    leaves = measure.describe().current.leaves
    assert [leaf.path for leaf in leaves] == ["p.pos", "p.vel", "p.t"]
    assert not any(leaf.donated for leaf in leaves)
    assert measure.report().ok
    assert "donated" in str(measure.report())


def test_a_read_only_step_is_still_recompile_guarded():
    @jc.hot_step(signature=Particles)
    def energy(p: Particles) -> jax.Array:
        return (p.vel**2).sum()

    energy(make_particles(4))
    with pytest.raises(jc.RecompileError) as info:
        energy(make_particles(5))
    assert "p.pos: compiled with f32[4,3], called with f32[5,3]" in str(info.value)


def test_apply_model_returning_grads_and_metrics_leaves_the_state_alone():
    @jc.state
    class Model:
        w: Float32[Array, "d k"]
        b: Float32[Array, "k"]

    @jc.hot_step(signature=Model)
    def apply_model(m: Model, x: Float32[Array, "n d"]) -> tuple[Model, jax.Array]:
        def loss(m: Model) -> jax.Array:
            return ((x @ m.w + m.b) ** 2).mean()

        value, grads = jax.value_and_grad(loss)(m)
        return grads, value

    m = Model(w=jnp.ones((3, 2), jnp.float32), b=jnp.zeros(2, jnp.float32))
    x = jnp.ones((5, 3), jnp.float32)
    # The returned Model is the *gradient*, but it stands where a state would:
    # the return annotation says Model, so the carry contract holds for it.
    grads, value = apply_model(m, x)
    assert all_deleted(m)  # `Model` was returned: it is a carried state
    assert grads.w.shape == (3, 2)

    @jc.hot_step(signature=Model)
    def grads_only(m: Model, x: Float32[Array, "n d"]) -> tuple[dict, jax.Array]:
        value, grads = jax.value_and_grad(lambda m: ((x @ m.w + m.b) ** 2).mean())(m)
        return {"w": grads.w, "b": grads.b}, value

    m = Model(w=jnp.ones((3, 2), jnp.float32), b=jnp.zeros(2, jnp.float32))
    g, value = grads_only(m, x)
    assert alive(m) and g["w"].shape == (3, 2)


def test_without_a_return_annotation_a_gradient_shaped_like_the_state_needs_donate_none():
    # The output's structure decides what is carried: gradients with the
    # state's own structure read as its new value, so a gradient step that is
    # not annotated says donate="none" (and keeps its state).
    @jc.state
    class Model:
        w: Float32[Array, "d k"]
        b: Float32[Array, "k"]

    def grads_of(m: Model, x: Float32[Array, "n 3"]):
        return jax.grad(lambda m: ((x @ m.w + m.b) ** 2).mean())(m)

    x = jnp.ones((4, 3), jnp.float32)
    m = Model(w=jnp.ones((3, 2), jnp.float32), b=jnp.zeros(2, jnp.float32))
    reads = jc.hot_step(grads_of, donate="none")
    g = reads(m, x)
    assert alive(m) and type(g) is Model
    taken = jc.hot_step(grads_of)  # read as carrying its state: m is donated
    taken(m, x)
    assert not alive(m)


# -- stateless steps ------------------------------------------------------


def compute_gae(rewards: Float32[Array, "t"], values: Float32[Array, "t"]) -> Float32[Array, "t"]:
    def back(carry, rv):
        r, v = rv
        carry = r - v + 0.99 * carry
        return carry, carry

    _, adv = jax.lax.scan(back, jnp.float32(0), (rewards, values), reverse=True)
    return adv


def test_a_stateless_step_takes_its_signature_from_the_first_call():
    gae = jc.hot_step(compute_gae, stateless=True)
    r, v = jnp.ones(8, jnp.float32), jnp.zeros(8, jnp.float32)
    with pytest.raises(jc.RecompileError):  # the first call compiles: not in a loop
        with jc.hot_loop():
            gae(r, v)
    gae(r, v)
    with jc.hot_loop():
        adv = gae(r, v)
        adv = gae(r, values=v)
    assert adv.shape == (8,) and alive((r, v))
    assert gae.stats.compiles == 1 and gae.state_type is None
    with pytest.raises(jc.RecompileError) as info:
        gae(jnp.ones(9, jnp.float32), jnp.zeros(9, jnp.float32))
    msg = str(info.value)
    assert "rewards: compiled with f32[8], called with f32[9]" in msg
    assert "values: compiled with f32[8], called with f32[9]" in msg


def test_a_stateless_step_compiles_from_specs():
    gae = jc.hot_step(compute_gae, stateless=True)
    spec = jax.ShapeDtypeStruct((16,), jnp.float32)
    gae.compile(spec, spec)
    assert gae.stats.compiles == 1
    r, v = jnp.ones(16, jnp.float32), jnp.zeros(16, jnp.float32)
    with jc.hot_loop():
        gae(r, v)
    with pytest.raises(jc.TransferError):
        gae(np.ones(16, np.float32), jnp.ones(16, jnp.float32))  # numpy: a transfer


def test_a_stateless_helper_on_a_pytree_of_arrays():
    @jc.hot_step(stateless=True)
    def normalise(batch: dict) -> dict:
        x = batch["x"]
        return {"x": (x - x.mean()) / (x.std() + 1e-6), "y": batch["y"]}

    batch = {"x": jnp.arange(6, dtype=jnp.float32), "y": jnp.zeros(6, jnp.int32)}
    out = normalise(batch)
    assert alive(batch) and out["y"].dtype == jnp.int32


def test_donating_fields_of_a_read_only_state_is_a_definition_error():
    def energy(p: Particles) -> jax.Array:
        return (p.vel**2).sum()

    with pytest.raises(jc.DefinitionError, match="does not return a Particles: its state is read-only"):
        jc.hot_step(energy, donate=("vel",))


@pytest.mark.parametrize("level", ["fast", "full"])
def test_one_array_in_two_undonated_positions_is_no_hazard(level):
    # Only a *donated* buffer passed twice is a hazard (find_hazards); the
    # call path must agree, or the slow path reports an internal disagreement.
    jc.set_checks(level)
    gae = jc.hot_step(compute_gae, stateless=True)
    r = jnp.ones(8, jnp.float32)
    gae(r, r)
    with jc.hot_loop():
        adv = gae(r, r)
    assert alive(r) and adv.shape == (8,)


def test_stateless_definition_errors():
    with pytest.raises(jc.DefinitionError, match="stateless=True"):
        jc.hot_step(lambda r, v: r + v)
    with pytest.raises(jc.DefinitionError, match="names state fields, but the step is stateless"):
        jc.hot_step(compute_gae, stateless=True, donate=("rewards",))
    with pytest.raises(jc.DefinitionError, match="contradict"):
        jc.hot_step(compute_gae, stateless=True, signature=Particles)


# -- donated non-state arguments ------------------------------------------


@jc.hot_step(signature=Particles, donate_argnames=("forces",))
def kick(p: Particles, forces: Float32[Array, "n 3"]) -> tuple[Particles, Float32[Array, "n 3"]]:
    vel = p.vel + forces * p.dt
    return Particles(pos=p.pos + vel * p.dt, vel=vel, t=p.t + p.dt, dt=p.dt), forces * 0.5


def test_a_named_argument_is_donated_and_its_aliasing_proven():
    p, f = make_particles(4), jnp.ones((4, 3), jnp.float32)
    q, f2 = kick(p, f)
    assert all_deleted(p) and f.is_deleted()
    leaves = {leaf.path: leaf for leaf in kick.describe().current.leaves}
    assert leaves["forces"].donated and leaves["forces"].aliased
    with jc.hot_loop():
        for _ in range(3):
            q, f2 = kick(q, f2)
    with pytest.raises(jc.DonationError) as info:
        kick(q, f)  # the donated forces, used again
    assert "forces: f32[4,3] was already donated to kick" in str(info.value)
    assert "An argument in donate_argnames (forces) is consumed by every call" in str(info.value)
    assert alive(q)


def test_donate_argnames_definition_errors():
    with pytest.raises(jc.DefinitionError, match="unknown parameter\\(s\\) 'batch'") as info:
        jc.hot_step(kick.__wrapped__, signature=Particles, donate_argnames=("batch",))
    assert "parameters: p, forces" in str(info.value)
    with pytest.raises(jc.DefinitionError, match="names state parameter\\(s\\) 'p'"):
        jc.hot_step(kick.__wrapped__, signature=Particles, donate_argnames=("p",))
    with pytest.raises(jc.DefinitionError, match="both static and donated"):
        jc.hot_step(kick.__wrapped__, signature=Particles, donate_argnames="forces", static="forces")
    with pytest.raises(jc.DefinitionError, match="not valid"):
        jc.hot_step(kick.__wrapped__, signature=Particles, donate_argnames=(1,))


def test_a_stateless_step_donates_named_arguments():
    @jc.hot_step(stateless=True, donate_argnames="x")
    def scale(x: Float32[Array, "n"], k: Float32[Array, ""]) -> Float32[Array, "n"]:
        return x * k

    x, k = jnp.ones(4, jnp.float32), jnp.float32(2)
    y = scale(x, k)
    assert x.is_deleted() and alive(k)
    scale(y, k)


# -- static arguments -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    lr: float = 0.1
    clip: float = 1.0


def sgd(p: Particles, config: Config) -> Particles:
    vel = jnp.clip(p.vel - config.lr * p.pos, -config.clip, config.clip)
    return Particles(pos=p.pos + vel * p.dt, vel=vel, t=p.t + p.dt, dt=p.dt)


def test_static_arguments_are_part_of_the_signature():
    step = jc.hot_step(sgd, signature=Particles, static=("config",))
    p = step(make_particles(), Config())
    with jc.hot_loop():
        for _ in range(3):
            p = step(p, Config())  # an equal value: the same executable
            p = step(p, config=Config())
    assert step.stats.compiles == 1 and step.stats.calls == 7
    with pytest.raises(jc.RecompileError) as info:
        step(p, Config(lr=0.2))
    msg = str(info.value)
    assert (
        "config: compiled with static Config(lr=0.1, clip=1.0), called with static Config(lr=0.2, clip=1.0)"
    ) in msg
    assert "a static argument is part of the compiled signature" in msg
    assert "max_compiles=2" in msg
    assert alive(p)


def test_a_new_static_value_counts_against_max_compiles():
    step = jc.hot_step(sgd, signature=Particles, static="config", max_compiles=2)
    p = step(make_particles(), Config())
    p = step(p, Config(lr=0.2))
    p = step(p, Config())
    assert step.stats.compiles == 2
    with pytest.raises(jc.RecompileError):
        step(p, Config(lr=0.3))
    with pytest.raises(jc.RecompileError):  # a new static value in a loop is a compile
        with jc.hot_loop():
            jc.hot_step(sgd, signature=Particles, static="config")(p, Config())


def test_an_unhashable_static_value_is_refused():
    @dataclasses.dataclass  # not frozen: unhashable
    class Mutable:
        lr: float = 0.1

    step = jc.hot_step(sgd, signature=Particles, static=("config",))
    p = make_particles()
    with pytest.raises(jc.DefinitionError) as info:
        step(p, Mutable())
    msg = str(info.value)
    assert "static argument `config` is Mutable, which is not hashable" in msg
    assert "frozen dataclass" in msg
    assert alive(p) and step.stats.compiles == 0


def test_functions_and_partials_as_static_arguments():
    def env_step(x: jax.Array) -> jax.Array:
        return x * 0.5

    @jc.hot_step(stateless=True, static=("fn", "n"))
    def rollout(x: Float32[Array, "k"], fn, n: int) -> Float32[Array, "k"]:
        for _ in range(n):
            x = fn(x)
        return x

    x = jnp.ones(3, jnp.float32)
    rollout(x, env_step, 2)
    with jc.hot_loop():
        y = rollout(x, env_step, 2)
    with pytest.raises(jc.RecompileError, match="called with static 3"):
        rollout(x, env_step, 3)
    with pytest.raises(jc.RecompileError, match="function"):
        rollout(x, functools.partial(env_step), 2)  # a new object, not equal
    assert jc.fetch(y).tolist() == [0.25, 0.25, 0.25]


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_static_partials_compare_by_function_arguments_and_keywords(level):
    # functools.partial has no __eq__: each new partial was a new signature.
    def leaky(x, slope):
        return jnp.where(x > 0, x, slope * x)

    @jc.hot_step(state="s", static="act")
    def step(act, s):
        return {"w": act(s["w"]) - 1.0}

    s = {"w": jnp.ones(3)}
    with jc.checks_level(level):
        s = step(functools.partial(leaky, slope=0.1), s)
        with jc.hot_loop():
            for _ in range(3):
                s = step(functools.partial(leaky, slope=0.1), s)  # a new object each call
                s = step(act=functools.partial(leaky, slope=0.1), s=s)
        with pytest.raises(jc.RecompileError, match=r"it differs at .keywords\['slope'\]: 0.1 vs 0.2"):
            step(functools.partial(leaky, slope=0.2), s)
    assert step.stats.compiles == 1 and step.stats.shared == 6  # a new partial at each call: matched each time
    w = 1.0
    for _ in range(7):
        w = (w if w > 0 else 0.1 * w) - 1.0
    np.testing.assert_allclose(jc.fetch(s["w"]), [w] * 3, rtol=1e-5)


class _Scale(typing.NamedTuple):
    c: typing.Any


@pytest.mark.parametrize(
    ("first", "second", "differs"),
    [
        (np.array(2, np.int32), np.array(2, np.float32), "i32[] at .keywords['c'], called with a value holding f32[]"),
        (_Scale(2), _Scale(2.0), ".c: 2 vs 2.0"),
        (0.0, -0.0, "0.0 vs -0.0"),
        (jnp.float32(2.0), jnp.float32(2.0), "another array object"),
    ],
    ids=["0-d numpy dtypes", "NamedTuple int vs float", "signed zero", "two jax arrays"],
)
def test_partials_whose_arguments_trace_otherwise_are_a_new_signature(first, second, differs):
    # Values that == calls equal but that trace to another program (another
    # dtype, another sign) never share an executable; arrays are never
    # compared by value (a jax.Array's == is a device op).
    def scale(x, c):
        c = c.c if isinstance(c, _Scale) else c
        return x * c

    @jc.hot_step(state="s", static="act")
    def step(act, s):
        return {"w": act(s["w"]).astype(s["w"].dtype)}

    s = step(functools.partial(scale, c=first), {"w": jnp.arange(3, dtype=jnp.int32)})
    s = step(functools.partial(scale, c=first), s)  # the same values again: one executable
    with pytest.raises(jc.RecompileError) as info:
        step(functools.partial(scale, c=second), s)
    assert differs in str(info.value) and step.stats.compiles == 1


def test_a_static_step_under_an_outer_jit_is_traced():
    step = jc.hot_step(sgd, signature=Particles, static=("config",))
    p = make_particles()
    out = jax.jit(lambda p: step(p, Config()))(p)
    assert step.stats.traced_calls == 1 and alive(p)
    assert out.pos.shape == (4, 3)


def _add_n(s, *, n):
    return {k: v + n for k, v in s.items()}


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_static_keywords_are_static_in_the_cpp_call_and_still_type_strict(level):
    """At off and fast a dict state's step with a static keyword is called by
    one C++ call that takes the keyword as static (as jax.jit's
    static_argnames does); at full the closure compares it by identity and
    flattens the rest once. Every other call shape falls back to the wrapper,
    and a value equal by == but of another type is still a new signature."""
    with jc.checks_level(level):
        step = jc.hot_step(_add_n, state="s", static="n")
        s = step({"a": jnp.zeros(3), "b": jnp.ones(2)}, n=1)
        assert getattr(step._call, "takes_static", False)
        with jc.hot_loop():
            for _ in range(3):
                s = step(s, n=1)
        s = step(s=s, n=1)  # the state by keyword: the wrapper binds it
        assert step.stats.compiles == 1 and step.stats.calls == (0 if level == "off" else 5)  # off counts none
        with pytest.raises(jc.RecompileError, match="called with static True"):
            step(s, n=True)  # 1 == True, hash(1) == hash(True): not the same static value
        with pytest.raises(jc.RecompileError, match="called with static 2"):
            step(s, n=2)
        assert not s["a"].is_deleted()  # refused before dispatch: the inputs are intact
        assert jax.jit(lambda s: step(s, n=1))(s)["a"].tolist() == [6.0] * 3  # traced
        assert step.stats.traced_calls == 1
        assert step(s, n=1)["b"].tolist() == [7.0] * 2


@dataclasses.dataclass(frozen=True)
class _Inc:
    by: float = 1.0


def _add_inc(s, *, cfg):
    return {k: v + cfg.by for k, v in s.items()}


def test_a_static_keyword_at_full_is_checked_as_the_state_is():
    # The full closure that takes the static value as it comes (no StaticArg
    # node per call) still refuses what full refuses, and takes an equal new
    # object as the same signature.
    with jc.checks_level("full"):
        step = jc.hot_step(_add_inc, state="s", static="cfg")
        s = step({"a": jnp.zeros(3), "b": jnp.ones(2)}, cfg=_Inc())
        assert getattr(step._call, "takes_static", False)
        with jc.hot_loop():
            for _ in range(3):
                s = step(s, cfg=_Inc())  # a new, equal object each call
        assert step.stats.compiles == 1 and step.stats.calls == 4
        kept = s["a"]
        with pytest.raises(jc.DonationError, match=r"s\['a'\]"):
            step(s, cfg=_Inc())
        assert not kept.is_deleted() and not s["b"].is_deleted()  # refused before dispatch
        del kept
        old, s = s, step(s, cfg=_Inc())
        with pytest.raises(jc.DonationError, match="donated"):
            step(old, cfg=_Inc())  # a stale state, named before XLA logs a refusal
        with pytest.raises(jc.RecompileError, match="called with static _Inc"):
            step(s, cfg=_Inc(by=2.0))
        assert step(s, cfg=_Inc())["b"].tolist() == [7.0] * 2
        assert step.stats.compiles == 1


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_static_stateless_and_read_only_steps_at_every_checks_level(level):
    jc.set_checks(level)
    step = jc.hot_step(sgd, signature=Particles, static=("config",))
    gae = jc.hot_step(compute_gae, stateless=True)
    p = step(make_particles(), Config())
    r, v = jnp.ones(8, jnp.float32), jnp.zeros(8, jnp.float32)
    gae(r, v)
    measure.compile(p)
    with jc.hot_loop():
        for _ in range(3):
            p = step(p, Config())
            p = step(p, config=Config())
            adv = gae(r, v)
            m = measure(p)
    assert step.stats.compiles == 1 and gae.stats.compiles == 1
    assert alive(p) and alive(r) and adv.shape == (8,) and m.energy.shape == ()
    with pytest.raises(jc.RecompileError, match="called with static Config"):
        step(p, Config(lr=0.5))
    with pytest.raises(jc.DefinitionError, match="not hashable"):
        step(p, {"lr": 0.1})
    assert alive(p)


# -- structure diffs that name the node -----------------------------------


def test_a_redefined_class_is_named_as_such():
    def define():
        @jc.state
        class Walker:
            x: Float32[Array, "n"]

        return Walker

    old, new = define(), define()
    step = jc.hot_step(signature=old, donate="none")(_identity_for(old))
    step(old(x=jnp.zeros(3, jnp.float32)))
    with pytest.raises(jc.RecompileError) as info:
        step(new(x=jnp.zeros(3, jnp.float32)))
    msg = str(info.value)
    assert "a different class object with the same name" in msg
    assert f"class object id {id(old):#x}" in msg and f"class object id {id(new):#x}" in msg
    assert "re-run notebook cell" in msg


def _identity_for(cls):
    def ident(w):
        return w

    ident.__annotations__ = {"w": cls, "return": cls}  # this module's annotations are strings
    return ident


def test_new_optimizer_closures_in_a_static_field_are_named():
    flax_ts = pytest.importorskip("flax.training.train_state")
    optax = pytest.importorskip("optax")
    TrainState = flax_ts.TrainState

    def apply(params, x):
        return x @ params["w"]

    def make():
        s = TrainState.create(apply_fn=apply, params={"w": jnp.ones((3, 2))}, tx=optax.sgd(0.1))
        return s.replace(step=jnp.int32(0))

    @jc.hot_step(signature=TrainState)
    def train(s: TrainState, x: Float32[Array, "b 3"]) -> TrainState:
        grads = jax.grad(lambda p: s.apply_fn(p, x).sum())(s.params)
        return s.apply_gradients(grads=grads)

    x = jnp.ones((4, 3), jnp.float32)
    s = train(make(), x)
    with pytest.raises(jc.RecompileError) as info:
        train(make(), x)
    msg = str(info.value)
    assert "s.tx: compiled with static GradientTransformation" in msg
    assert "object id" in msg
    assert "a second optax.adam(...)" in msg
    assert "likely cause: the tree structure differs" not in msg
    train(s, x)


def test_an_unequal_aux_field_of_a_plain_registered_dataclass_is_named():
    @functools.partial(
        jax.tree_util.register_dataclass, data_fields=["x"], meta_fields=["mode"]
    )
    @dataclasses.dataclass
    class Box:
        x: jax.Array
        mode: str

    @jc.hot_step(signature=Box)
    def step(b: Box) -> Box:
        return Box(x=b.x + 1, mode=b.mode)

    b = step(Box(x=jnp.zeros(2, jnp.float32), mode="a"))
    with pytest.raises(jc.RecompileError) as info:
        step(Box(x=jnp.zeros(2, jnp.float32), mode="b"))
    assert "b.mode: compiled with 'a', called with another str, not equal: 'b'" in str(info.value)
    step(b)


def test_an_aux_difference_of_a_custom_node_is_named():
    class Tagged:
        def __init__(self, x, tag):
            self.x, self.tag = x, tag

    jax.tree_util.register_pytree_node(
        Tagged, lambda t: ((t.x,), t.tag), lambda tag, xs: Tagged(xs[0], tag)
    )

    @jc.hot_step(stateless=True)
    def double(t: Tagged) -> jax.Array:
        return t.x * 2

    double(Tagged(jnp.zeros(2, jnp.float32), "a"))
    with pytest.raises(jc.RecompileError) as info:
        double(Tagged(jnp.zeros(2, jnp.float32), "b"))
    msg = str(info.value)
    assert "t: compiled with Tagged with static data 'a', called with Tagged with static data 'b'" in msg
    assert "pytree aux data" in msg


# -- output shardings derived from the signature --------------------------


def _mesh8():
    from jax.sharding import Mesh

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS)")
    return Mesh(np.array(jax.devices()[:8]), ("data",))


@jc.state
class LM:
    w: Float32[Array, "b d"]  # data-sharded activations / parameters
    scale: Float32[Array, "b d"]  # a replicated LayerNorm scale
    step: Float32[Array, ""]


def lm_step(s: LM) -> LM:
    h = s.w * s.scale
    # `scale` is updated from a data-sharded value: left to XLA's sharding
    # propagation, it comes back sharded P('data').
    return LM(w=h, scale=s.scale + 0.01 * h, step=s.step + 1)


@pytest.mark.parametrize("donate", ["all", ("w",)], ids=["whole state", "one field"])
def test_a_replicated_leaf_next_to_a_sharded_one_keeps_its_sharding(donate):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh8()
    rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    shard = {"w": data, "scale": rep, "step": rep}
    s = LM.zeros(b=8, d=4, sharding=shard)
    # What propagation alone does (this test fails if it stops resharding):
    raw = jax.jit(lm_step)(s)
    assert raw.scale.sharding.spec == P("data")

    step = jc.hot_step(lm_step, signature=LM, donate=donate)
    s = step(LM.zeros(b=8, d=4, sharding=shard))
    with jc.hot_loop():
        for _ in range(3):
            s = step(s)
    assert s.scale.sharding.is_equivalent_to(rep, 2)
    assert s.w.sharding.is_equivalent_to(data, 2)
    assert step.stats.compiles == 1
    out_shardings = jax.tree_util.tree_leaves(step.compiled.output_shardings)
    assert out_shardings[1].is_equivalent_to(rep, 2)


def test_derived_shardings_leave_other_outputs_to_propagation():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh8()
    rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    @jc.hot_step(signature=LM)
    def with_metrics(s: LM) -> tuple[LM, jax.Array]:
        new = lm_step(s)
        return new, jax.lax.with_sharding_constraint(new.w * 2, data)

    s = LM.zeros(b=8, d=4, sharding={"w": data, "scale": rep, "step": rep})
    s, m = with_metrics(s)
    assert s.scale.sharding.is_equivalent_to(rep, 2)
    assert m.sharding.is_equivalent_to(data, 2)


def test_a_method_step_with_a_static_argument_and_keyword_only_parameters():
    class Sim:
        def __init__(self, k: float) -> None:
            self.k = k

        @jc.hot_step(signature=Particles, static=("config",))
        def run(self, p: Particles, *, config: Config) -> Particles:
            vel = p.vel - self.k * config.lr * p.pos
            return Particles(pos=p.pos + vel * p.dt, vel=vel, t=p.t + p.dt, dt=p.dt)

    sim = Sim(2.0)
    p = sim.run(make_particles(), config=Config())
    with jc.hot_loop():
        p = sim.run(p, config=Config())
    with pytest.raises(jc.RecompileError, match="called with static Config\\(lr=0.3"):
        sim.run(p, config=Config(lr=0.3))
    assert sim.run.stats.compiles == 1 and alive(p)


# -- steps you did not write: state= names the state ------------------------


class SamplerState(typing.NamedTuple):  # the shape of blackjax's HMCState
    position: jax.Array
    logdensity: jax.Array
    logdensity_grad: jax.Array


class SamplerInfo(typing.NamedTuple):
    acceptance_rate: jax.Array
    is_divergent: jax.Array


def _kernel(rng_key, state, logdensity_fn, step_size):  # unannotated, as libraries write it
    noise = jax.random.normal(rng_key, state.position.shape)
    position = state.position + step_size * (state.logdensity_grad + noise)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    accept = jnp.minimum(1.0, jnp.exp(logdensity - state.logdensity))
    return SamplerState(position, logdensity, grad), SamplerInfo(accept, jnp.isnan(logdensity))


def _sampler_init(position, logdensity_fn):
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    return SamplerState(position, logdensity, grad)


def test_a_library_kernel_partial_is_a_hot_step_by_naming_its_state():
    logdensity = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    kernel = functools.partial(_kernel, logdensity_fn=logdensity, step_size=0.1)
    step = jc.hot_step(kernel, state="state")
    state = _sampler_init(jnp.ones(3), logdensity)
    key = jax.random.key(0)
    kept_positions = []
    state, info = step(key, state)  # the first call compiles, outside the loop
    assert step.describe().state_params == ("state",)
    old = state
    key, sub = jax.random.split(key)
    with jc.hot_loop():
        for _ in range(3):
            key, sub = jax.random.split(key)
            state, info = step(sub, state)
            kept_positions.append(jc.fetch(state.position))
    assert all(x.is_deleted() for x in old)  # the state was carried, so donated
    assert not any(x.is_deleted() for x in info) and len(kept_positions) == 3
    cs = step.describe().current
    assert [leaf.path for leaf in cs.leaves if leaf.donated] == [
        "state.position",
        "state.logdensity",
        "state.logdensity_grad",
    ]
    assert all(leaf.aliased for leaf in cs.leaves if leaf.donated)


def test_an_optax_update_is_a_hot_step_by_naming_its_state():
    optax = pytest.importorskip("optax")
    tx = optax.adam(1e-2)
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    opt_state = tx.init(params)
    update = jc.hot_step(tx.update, state="state")  # optax names it `state`
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    updates, new_state = update(grads, opt_state, params)
    # The new optimizer state is carried (donated); params and grads are read-only.
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(opt_state) if x.size)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves((params, grads)))
    assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(opt_state)
    plain_updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], plain_updates["w"])


def test_an_evosax_style_tell_carries_its_state_and_reads_the_rest():
    class Strategy(typing.NamedTuple):  # evosax's state: mean, sigma, generation
        mean: jax.Array
        sigma: jax.Array
        generation: jax.Array

    def tell(key, population, fitness, state, params):
        elite = population[jnp.argsort(fitness)[: params.elite]]
        return state._replace(mean=elite.mean(0), generation=state.generation + 1)

    class Params(typing.NamedTuple):  # hashable configuration: static
        elite: int

    params = Params(elite=2)
    step = jc.hot_step(tell, state="state", static=("params",))
    state = Strategy(jnp.zeros(4), jnp.ones(()), jnp.int32(0))
    population = jnp.arange(20.0).reshape(5, 4)
    fitness = jnp.array([5.0, 1.0, 3.0, 0.0, 9.0])
    new = step(jax.random.key(0), population, fitness, state, params)
    assert all(x.is_deleted() for x in state) and int(new.generation) == 1
    assert not population.is_deleted() and not fitness.is_deleted()
    np.testing.assert_allclose(new.mean, (population[3] + population[1]) / 2)


def test_a_static_config_first_is_never_taken_for_the_state():
    @jc.state
    class Config:
        gamma: float = jc.static(0.9)

    def update(config: Config, s: Particles) -> Particles:
        return s.replace(t=s.t + config.gamma)

    step = jc.hot_step(update, static=("config",))  # the state type comes from `s`
    assert step.state_type is Particles
    p = step(Config(), make_particles())
    assert float(p.t) == pytest.approx(0.9)
    # the state parameter named in static= (issue 21: said "no parameter is annotated")
    with pytest.raises(jc.DefinitionError, match="'s' is the state parameter .* named in static=") as info:
        jc.hot_step(update, signature=Particles, static=("s",))
    assert "signature=" not in info.value.fix  # it was given: never offered back


def test_state_names_are_checked_when_the_decorator_runs():
    def f(key, state, config):
        return state

    with pytest.raises(jc.DefinitionError, match="unknown parameter\\(s\\) 'stat'"):
        jc.hot_step(f, state="stat")
    with pytest.raises(jc.DefinitionError, match="both state= and static="):
        jc.hot_step(f, state="state", static=("state",))
    with pytest.raises(jc.DefinitionError, match="contradict"):
        jc.hot_step(f, state="state", stateless=True)


def test_a_named_state_the_step_neither_returns_nor_updates_is_refused_at_compile():
    def evaluate(params, batch):
        return {"loss": jnp.mean((batch @ params["w"]) ** 2)}

    params = {"w": jnp.ones((3, 1))}
    step = jc.hot_step(evaluate, state="params")
    with pytest.raises(jc.DefinitionError) as info:
        step(params, jnp.ones((4, 3)))
    assert "state parameter `params` is neither returned by the step nor updated in place" in str(info.value)
    assert "@jc.hot_step(stateless=True)" in info.value.fix and info.value.leaves == ("params",)
    assert not params["w"].is_deleted()
    reader = jc.hot_step(evaluate, stateless=True)  # the fix: a step that only reads
    assert float(reader(params, jnp.ones((4, 3)))["loss"]) == 9.0 and not params["w"].is_deleted()
    assert not reader.describe().current.donated


def test_a_var_keyword_parameter_is_not_part_of_the_step():
    def update(updates, state, params=None, **extra_args):
        return updates, state

    step = jc.hot_step(update, state="state")
    assert step.describe().params == ("updates", "state", "params")
    with pytest.raises(TypeError, match="unexpected keyword"):
        step(jnp.zeros(2), jnp.zeros(2), extra=1)

    def many(*states):
        return states

    with pytest.raises(jc.DefinitionError, match=r"\*states takes any number of arguments"):
        jc.hot_step(many, state="states")


# -- host data: host= parameters -------------------------------------------


def _sgd_step(params, batch):
    x, y = batch["x"], batch["y"]
    loss, g = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] - y) ** 2))(params)
    return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, params, g), loss


def _numpy_batches(n, rows=8, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {"x": rng.normal(size=(rows, 3)).astype(np.float32), "y": rng.normal(size=(rows, 1)).astype(np.float32)}
        for _ in range(n)
    ]


def test_declared_host_data_is_transferred_by_the_call_inside_a_raising_loop():
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    plain = jax.jit(_sgd_step)
    batches = _numpy_batches(6)
    params, ref = {"w": jnp.zeros((3, 1))}, {"w": jnp.zeros((3, 1))}
    params, _ = step(params, batches[0])
    ref, _ = plain(ref, batches[0])
    with jc.hot_loop() as loop:
        for b in batches[1:]:
            params, loss = step(params, b)
    for b in batches[1:]:
        ref, ref_loss = plain(ref, b)
    np.testing.assert_allclose(params["w"], ref["w"], rtol=1e-6)
    assert not loop.violations
    assert step.stats.host_calls == 6 and step.stats.host_bytes == 6 * (8 * 3 + 8) * 4
    assert "host transfers" in str(step.report())


def test_undeclared_host_data_is_still_refused_and_a_new_batch_shape_is_a_recompile():
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    params, _ = step({"w": jnp.zeros((3, 1))}, _numpy_batches(1)[0])
    with pytest.raises(jc.TransferError, match="params"):
        step({"w": np.zeros((3, 1), np.float32)}, _numpy_batches(1)[0])  # numpy state
    short = _numpy_batches(1, rows=5)[0]  # the smaller last batch
    with jc.hot_loop(), pytest.raises(jc.RecompileError, match=r"batch\['x'\]"):
        step(params, short)
    assert not params["w"].is_deleted()  # refused before dispatch: intact


def test_host_data_costs_the_loop_no_guard_change_outside_the_call():
    # Inside a raising loop the declared transfer is allowed for the call
    # only: an implicit transfer on the next line is still refused.
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    params, loss = step({"w": jnp.zeros((3, 1))}, _numpy_batches(1)[0])
    loss + np.float32(1.0)  # warm the eager add (outside a loop it may transfer)
    with pytest.raises(jc.TransferError, match="host-to-device"), jc.hot_loop():
        params, loss = step(params, _numpy_batches(1)[0])
        loss + np.float32(1.0)  # undeclared: refused (as the loop exits, JAX's error translated)
    assert step.stats.host_calls == 2


@pytest.mark.parametrize("level", ["fast", "full"])
def test_host_data_on_the_cached_call_never_lets_numpy_in_elsewhere(level):
    # The C++ call caches the numpy batch's signature; numpy at a leaf that is
    # not declared host data is still a new signature its checks refuse, in a
    # loop (where the call runs with the guard at allow) and out of one.
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    batches = _numpy_batches(8)
    with jc.checks_level(level):
        params, _ = step({"w": jnp.zeros((3, 1))}, batches[0])
        params, _ = step(params, batches[1])
        device_batch = jc.device_tree(batches[4])
        with jc.hot_loop() as loop:
            params, _ = step(params, batches[2])
            with pytest.raises(jc.TransferError, match=r"params\['w'\]"):
                step({"w": np.zeros((3, 1), np.float32)}, batches[3])
            assert not params["w"].is_deleted()
            params, _ = step(params, device_batch)  # a device batch: accepted, not a transfer
            params, _ = step(params, batches[5])
        assert not loop.violations
        with pytest.raises(jc.ContractError, match=r"batch\['x'\]"):  # int32: another signature
            step(params, {"x": batches[6]["x"].astype(np.int32), "y": batches[6]["y"]})
        assert not params["w"].is_deleted()
        params, _ = step(params, batches[7])
    assert step.stats.host_calls == 5 and step.stats.compiles == 1


def test_host_data_at_off_is_allowed_inside_a_loop_and_costs_no_guard_change_outside():
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    batches = _numpy_batches(3)
    with jc.checks_level("off"):
        params, _ = step({"w": jnp.zeros((3, 1))}, batches[0])
        with jc.hot_loop() as loop:
            params, _ = step(params, batches[1])
        params, _ = step(params, batches[2])
    assert not loop.violations and step.stats.compiles == 1


def test_declared_host_data_passes_a_transfer_guard_of_the_users_own():
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    batches = _numpy_batches(2)
    params, _ = step({"w": jnp.zeros((3, 1))}, batches[0])
    with jax.transfer_guard_host_to_device("disallow"):
        params, _ = step(params, batches[1])  # declared: allowed
        with pytest.raises(jc.TransferError, match=r"params\['w'\]"):
            step({"w": np.zeros((3, 1), np.float32)}, batches[1])  # undeclared: refused
    assert step.stats.host_calls == 2


def test_at_off_host_data_lets_no_numpy_in_elsewhere():
    # The call runs with the guard at allow, so JAX's own guard (all that
    # checks at off) would not see numpy in the state: the call refuses it.
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    batches = _numpy_batches(3)
    with jc.checks_level("off"):
        params, _ = step({"w": jnp.zeros((3, 1))}, batches[0])
        with jc.hot_loop():
            params, _ = step(params, batches[1])
            with pytest.raises(jc.TransferError, match=r"params\['w'\]"):
                step({"w": np.zeros((3, 1), np.float32)}, batches[2])
        params, _ = step(params, batches[2])
    assert not params["w"].is_deleted()


def test_declared_host_data_passes_a_global_transfer_guard():
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    batches = _numpy_batches(4)
    params, _ = step({"w": jnp.zeros((3, 1))}, batches[0])
    jax.config.update("jax_transfer_guard_host_to_device", "disallow")
    try:
        for level, b in zip(("off", "fast", "full"), batches[1:]):
            with jc.checks_level(level):
                params, _ = step(params, b)
    finally:
        jax.config.update("jax_transfer_guard_host_to_device", "allow")
    assert step.stats.host_calls == 3  # off counts nothing; the first call and fast, full


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_memmapped_batch_is_host_data(level, tmp_path):
    # A loader reading a dataset from disk gives np.memmap views (an ndarray subclass).
    step = jc.hot_step(_sgd_step, state="params", host="batch")
    x = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=(8, 3))
    y = np.memmap(tmp_path / "y.bin", dtype=np.float32, mode="w+", shape=(8, 1))
    x[:], y[:] = 1.0, 2.0
    with jc.checks_level(level):
        params, _ = step({"w": jnp.zeros((3, 1))}, _numpy_batches(1)[0])
        with jc.hot_loop():
            params, loss = step(params, {"x": x, "y": y})
    ref, _ = jax.jit(_sgd_step)({"w": jnp.zeros((3, 1))}, _numpy_batches(1)[0])
    ref, _ = jax.jit(_sgd_step)(ref, {"x": np.asarray(x), "y": np.asarray(y)})
    np.testing.assert_allclose(params["w"], ref["w"], rtol=1e-6)


def test_host_names_are_checked_against_the_other_options():
    with pytest.raises(jc.DefinitionError, match="both host= and state="):
        jc.hot_step(_sgd_step, state="params", host=("params",))
    with pytest.raises(jc.DefinitionError, match="unknown parameter"):
        jc.hot_step(_sgd_step, state="params", host="batches")


def test_a_changed_static_object_is_shown_attribute_by_attribute():
    class Graph:  # an opaque, hashable static object, as nnx.GraphDef is
        def __init__(self, layers, deterministic):
            self.layers, self.deterministic = layers, deterministic

        def __eq__(self, other):
            return type(other) is Graph and vars(self) == vars(other)

        def __hash__(self):
            return hash((self.layers, self.deterministic))

        def __repr__(self):
            return f"Graph({'x' * 100})"  # too long to tell two apart

    def forward(graph, params, x):
        return x @ params["w"] * (1.0 if graph.deterministic else 0.5)

    step = jc.hot_step(forward, stateless=True, static=("graph",))
    params, x = {"w": jnp.ones((3, 2))}, jnp.ones((4, 3))
    step(Graph(("linear", "dropout"), False), params, x)
    with pytest.raises(jc.RecompileError) as info:
        step(Graph(("linear", "dropout"), True), params, x)
    assert "holding False at .deterministic, called with a value holding True there" in str(info.value)


def test_an_nnx_graphdef_after_eval_says_what_changed():
    nnx = pytest.importorskip("flax.nnx")

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(3, 2, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(self.linear(x))

    model = Model(nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def forward(graphdef, state, x):
        model = nnx.merge(graphdef, state)
        return model(x), nnx.state(model)  # the dropout's rng count advances: returned

    step = jc.hot_step(forward, state="state", static=("graphdef",), donate="none")
    x = jnp.ones((4, 3))
    step(graphdef, state, x)
    model.eval()
    graphdef2, state2 = nnx.split(model)
    with pytest.raises(jc.RecompileError, match=r"holding False at \S+, called with a value holding True there"):
        step(graphdef2, state2, x)


def test_a_step_returning_the_state_where_its_annotation_says_a_tuple_is_told_so():
    @jc.state
    class One:
        x: Float32[Array, "3"]

    @jc.hot_step
    def step(s: One) -> tuple[One, Float32[Array, ""]]:
        return One(x=s.x + 1)

    with pytest.raises(jc.RecompileError) as info:
        step.compile(One.spec())
    text = str(info.value)
    assert "does not return what its signature says" in text
    assert "the step returns One, with no state at return value [0]" in text
    assert "-> One for the state alone" in text and "dtype" not in text


@pytest.mark.parametrize("static", [False, True], ids=["dict", "dict with a static keyword"])
def test_a_foreign_state_not_consumed_at_full_names_the_leaf_and_returns_the_result(static, without_kept_check):
    # The full closure of a foreign state checks consumption over its own flat
    # leaves (every leaf donated: inline; a static keyword: never flattened
    # with the state), so the error names the leaf XLA copied, not a neighbour.
    with jc.checks_level("full"):
        if static:  # the static parameter first: the state's leaves are not the call's first
            step = jc.hot_step(_inc_first, state="s", static="cfg")
            call = functools.partial(step, _Inc())
        else:
            step = call = jc.hot_step(_add_n_one, state="s")
        s = call({"a": jnp.zeros(3), "b": jnp.ones(2)})
        view = np.asarray(s["b"])  # a numpy view: XLA:CPU copies instead of donating
        with pytest.raises(jc.DonationError) as info:
            call(s)
        del view
        err = info.value
        assert err.contract == "consumed" and err.leaves == ("s['b']",)
        assert err.result["b"].tolist() == [3.0, 3.0]  # nothing lost: the outputs are here
        assert step.stats.not_consumed == 1


def _add_n_one(s):
    return {k: v + 1 for k, v in s.items()}


def _inc_first(cfg, s):
    return {k: v + cfg.by for k, v in s.items()}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Registered:  # a node JAX flattens through Python callbacks (as a flax struct)
    w: jax.Array
    b: jax.Array


def _registered_step(s: _Registered, scale: jax.Array) -> _Registered:
    return _Registered(w=s.w * scale, b=s.b + scale)


def test_at_off_a_python_flattened_state_is_flattened_once_by_the_cpp_call(monkeypatch):
    # Compiled over flat leaves (its nodes flatten through Python callbacks),
    # the step at off takes the arguments as they come: JAX's C++ call
    # flattens them once, as jax.jit does, where the call path flattened them
    # in Python and the executable flattened the tuple of leaves again.
    from jaxcontracts._step import callpath as _callpath

    step = jc.hot_step(_registered_step, state="s")
    s = _Registered(w=jnp.ones(3), b=jnp.zeros(3))
    two = jnp.float32(2.0)
    with jc.checks_level("off"):
        s = step(s, two)
        s = step(s, scale=two)  # a keyword: bound, same signature
        assert step._current.flat_style
        calls = []
        real = _callpath.flatten
        monkeypatch.setattr(_callpath, "flatten", lambda x: calls.append(1) or real(x))
        for _ in range(3):
            s = step(s, two)
        assert calls == []  # no Python flatten per call
        monkeypatch.setattr(_callpath, "flatten", real)
        np.testing.assert_allclose(s.w, 32.0)
        np.testing.assert_allclose(s.b, 10.0)
        # under an outer transformation: traced, nothing donated or run
        traced = jax.jit(lambda s: step(s, two))(s)
        assert not s.w.is_deleted()
        np.testing.assert_allclose(traced.w, 64.0)
        # another structure: the slow path explains it, inputs intact
        other = {"w": s.w, "b": s.b}
        with pytest.raises(jc.ContractError, match="structure|_Registered|dict"):
            step(other, two)
        assert not s.w.is_deleted()
        # a consumed state: the library's error, not XLA's
        stale = s
        s = step(s, two)
        with pytest.raises(jc.DonationError):
            step(stale, two)
        # numpy in the state inside a loop: JAX's guard refuses it, named by the library
        with jc.hot_loop():
            s = step(s, two)
            with pytest.raises(jc.TransferError, match=r"s\.w"):
                step(_Registered(w=np.ones(3, np.float32), b=np.zeros(3, np.float32)), two)
    assert step.stats.compiles == 1


@pytest.mark.parametrize("level", ["fast", "full"])
def test_numpy_scalars_and_python_numbers_at_a_host_parameter_are_host_data(level):
    # issue 39: a loader batch holding an np.float32 (what numpy reductions
    # return) and a Python float at host= were "an internal disagreement"
    @jc.hot_step(state="s", host=("batch", "lr"))
    def step(s, batch, lr):
        return {"w": s["w"] + batch["x"].sum() * batch["scale"] * lr}

    s = {"w": jnp.zeros(3)}
    with jc.checks_level(level):
        for _ in range(3):
            x = np.ones(4, np.float32)
            s = step(s, {"x": x, "scale": np.float32(x.mean())}, 0.5)
    assert s["w"].tolist() == [6.0] * 3 and step.stats.compiles == 1
    assert step.stats.host_calls == 3


@dataclasses.dataclass
class _MutableScale:
    c: float

    def __getitem__(self, i):
        return self.c


# values a static partial holds that change in place: (make, change to 3.0)
_CHANGED_IN_PLACE = pytest.mark.parametrize(
    ("make", "change"),
    [
        (lambda: [2.0], lambda v: v.__setitem__(0, 3.0)),
        (lambda: {0: 2.0}, lambda v: v.__setitem__(0, 3.0)),
        (lambda: np.array([2.0], np.float32), lambda v: v.__setitem__(0, 3.0)),
        (lambda: _MutableScale(2.0), lambda v: setattr(v, "c", 3.0)),
    ],
    ids=["list", "dict", "numpy array", "mutable dataclass"],
)


@_CHANGED_IN_PLACE
def test_a_new_partial_of_a_value_changed_in_place_never_runs_the_stale_program(make, change):
    # issue 50: the partials compared equal by value (the same list inside),
    # and the executable traced with 2.0 ran again for 3.0; jax.jit runs 3.0.
    def g(x, scale):
        return x * scale[0]

    @jc.hot_step(state="s", static="fn", max_compiles=2)
    def step(s, fn):
        return {"w": fn(s["w"])}

    value = make()
    s = step({"w": jnp.ones(3)}, functools.partial(g, scale=value))
    change(value)
    s = step(s, functools.partial(g, scale=value))  # a new signature: traced with 3.0
    assert jc.fetch(s["w"]).tolist() == [6.0] * 3 and step.stats.compiles == 2
    s = step(s, functools.partial(g, scale=value))  # the same value held: that program
    assert jc.fetch(s["w"]).tolist() == [18.0] * 3 and step.stats.compiles == 2
    setattr(value, "c", 4.0) if isinstance(value, _MutableScale) else value.__setitem__(0, 4.0)
    with pytest.raises(jc.RecompileError, match=r"keywords\['scale'\]"):
        step(s, functools.partial(g, scale=value))  # max_compiles=2: the part that changed named


@pytest.mark.parametrize("level", ["off", "fast", "full"])
@_CHANGED_IN_PLACE
def test_the_same_partial_whose_value_changed_in_place_never_runs_the_stale_program(level, make, change):
    # the sixth hostile round: the same partial object, its list changed in
    # place, hashes and compares as itself: the program traced with 2.0 ran
    # for 3.0 at every checks level. Its value is compared at every call.
    def g(x, scale):
        return x * scale[0]

    with jc.checks_level(level):

        @jc.hot_step(state="s", static="fn", max_compiles=2)
        def step(s, fn):
            return {"w": fn(s["w"])}

        value = make()
        fn = functools.partial(g, scale=value)
        s = step({"w": jnp.ones(3)}, fn)
        s = step(s, fn)
        change(value)
        s = step(s, fn)  # a new signature: traced with 3.0
        assert jc.fetch(s["w"]).tolist() == [12.0] * 3 and step.stats.compiles == 2
        s = step(s, functools.partial(g, scale=value))  # a new partial of the same value: its program
        assert jc.fetch(s["w"]).tolist() == [36.0] * 3 and step.stats.compiles == 2
        change(value)  # (the same value again: 3.0)
        s = step(s, fn)
        assert jc.fetch(s["w"]).tolist() == [108.0] * 3 and step.stats.compiles == 2


@dataclasses.dataclass
class _Scaler:
    c: float
    log: list = dataclasses.field(default_factory=list, compare=False)

    def apply(self, x):
        return x * self.c


@dataclasses.dataclass
class _Tagged:
    note: str = dataclasses.field(default="", compare=False)
    b: float = 1.0
    c: float = 2.0


def test_a_changed_dataclass_field_is_named_past_a_field_it_does_not_compare():
    # a compare=False field is not in the value's key: the names were taken from
    # every field, so a change of .c was named .b
    from jaxcontracts._state.spec import value_key
    from jaxcontracts._step.diffs import key_difference

    path, was, now = key_difference(value_key(_Tagged(c=2.0)), value_key(_Tagged(c=3.0)))
    assert (path, was, now) == (".c", "2.0", "3.0")


def test_value_keys_see_what_the_review_found_they_missed_and_end_on_cycles():
    # the review of the sixth round's fix: an argparse.Namespace and a bound
    # method of an unhashable dataclass were compared by identity (stale); two
    # structured dtypes had one key; a cyclic or shared structure never ended
    import argparse
    import time

    from jaxcontracts._state.spec import value_key

    ns = argparse.Namespace(lr=0.5)
    before = value_key(functools.partial(np.multiply, ns))
    ns.lr = 0.25
    assert value_key(functools.partial(np.multiply, ns)) != before
    scaler = _Scaler(2.0)
    before = value_key(functools.partial(scaler.apply))
    scaler.log.append("not compared")  # compare=False: not part of its value
    assert value_key(functools.partial(scaler.apply)) == before
    scaler.c = 3.0
    assert value_key(functools.partial(scaler.apply)) != before
    a = np.zeros(1, dtype=[("lr", "f4"), ("n", "i4")])
    b = np.zeros(1, dtype=[("lr", "i4"), ("n", "f4")])
    assert a.tobytes() == b.tobytes() and value_key(a) != value_key(b)
    ring: dict = {"v": 1.0}
    ring["self"] = ring
    shared = [[0.5] * 4]
    for _ in range(40):
        shared = [shared, shared]  # 2**40 paths, 41 objects
    start = time.perf_counter()
    assert value_key(ring) == value_key(ring) and value_key(shared) == value_key(shared)
    assert time.perf_counter() - start < 5.0
