"""A state a hot step donated: every later use names the step and the field.

Issue 10: reading a donated state outside a loop gave JAX's bare
``RuntimeError: Array has been deleted`` at first use. After a donating call
the state object takes a "consumed" subclass of its class (one store per
call), whose donated fields raise a DonationError when read.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float32, Int32, PyTree

import jaxcontracts as jc


@jc.state
class S:
    x: Float32[Array, "n"]
    y: Float32[Array, "n"]
    scale: float = jc.static(default=2.0)


@jc.hot_step(signature=S)
def step(s: S) -> S:
    return S(x=s.x + 1, y=s.y * s.scale, scale=s.scale)


@jc.hot_step(signature=S, donate=("x",))
def step_x(s: S) -> S:
    return S(x=s.x + 1, y=s.y, scale=s.scale)


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_field_read_names_the_step_and_the_field_at_every_level(level):
    with jc.checks_level(level):
        s = S(x=jnp.zeros(3), y=jnp.ones(3))
        new = step(s)
        if level == "off":  # no per-call work at all: JAX's own error stays
            assert type(s) is S
            return
        with pytest.raises(jc.DonationError) as info:
            s.x + 1  # noqa: B018 - the read is the test
        err = info.value
        assert str(err).startswith("S.x: f32[3] was donated to step and no longer exists")
        assert "s = step(s); s.x" in err.fix
        assert (err.contract, err.step, err.leaves) == ("no-donated-use", "step", (".x",))
        assert s.scale == 2.0  # static fields are no buffers: they read as before
        assert new.x.tolist() == [1.0] * 3


def test_only_donated_fields_raise_and_the_rest_read_as_before():
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step_x(s)
    with pytest.raises(jc.DonationError, match=r"S\.x: f32\[3\] was donated to step_x"):
        s.x  # noqa: B018
    assert s.y.tolist() == [1.0] * 3


def test_the_consumed_state_is_still_an_instance_and_prints_without_a_read():
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step(s)
    assert isinstance(s, S) and type(s).__name__ == "S"
    assert repr(s) == "S(x=f32[3] (deleted: donated to step), y=f32[3] (deleted: donated to step), scale=2.0)"
    # jax sees the same leaves (deleted), and a tree_map builds a plain S
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(s))
    fresh = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), s)
    assert type(fresh) is S and fresh.x.tolist() == [0.0] * 3


def test_rebuilding_reads_the_fields_it_keeps():
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step(s)
    with pytest.raises(jc.DonationError, match=r"S\.y: f32\[3\] was donated to step"):
        s.replace(x=jnp.ones(3))  # keeps y, which is gone
    whole = s.replace(x=jnp.ones(3), y=jnp.ones(3))
    assert type(whole) is S and type(s)(x=jnp.ones(3), y=jnp.ones(3)).__class__ is S
    with pytest.raises(jc.DonationError, match="was donated to step"):
        dataclasses.asdict(s)


def test_pickling_or_copying_a_consumed_state_is_refused_by_name():
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step(s)
    for attempt in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(jc.DonationError, match="donated to step: its arrays no longer exist"):
            attempt(s)


def test_passing_it_again_is_the_donation_hazard_on_every_path():
    s0 = S(x=jnp.zeros(3), y=jnp.ones(3))
    s1 = step(s0)
    step(s1)
    for stale in (s0, s1):
        with pytest.raises(jc.DonationError, match=r"s\.x: f32\[3\] was already donated to step"):
            step(stale)
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step_x(s)  # only x was donated
    with pytest.raises(jc.DonationError, match=r"s\.x: f32\[3\] was already donated to step_x"):
        step_x(s)


def test_in_a_loop_the_read_is_the_loops_violation_at_the_users_line():
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step.compile(S.spec(n=3))
    with pytest.raises(jc.DonationError) as info:
        with jc.hot_loop():
            new = step(s)
            stale = s.x  # noqa: F841 - the planted line
    text = str(info.value)
    assert "use of a donated array inside jc.hot_loop: S.x: f32[3] was donated to step" in text
    assert "stale = s.x  # noqa: F841 - the planted line" in text
    del new


def test_record_mode_records_the_stale_read_once():
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step.compile(S.spec(n=3))
    with jc.hot_loop(on_violation="record") as loop:
        new = step(s)
        try:
            float(s.x[0])  # the read, then a use of the deleted value, one line
        except RuntimeError:  # JAX's own error for the deleted array ("Array has been deleted")
            pass
    (v,) = loop.violations
    assert v.kind == "donation" and "S.x: f32[3] was donated to step" in v.what
    assert new.x.tolist() == [1.0] * 3


@jc.state
class Inner:
    a: Float32[Array, "n"]


@jc.state
class Outer:
    inner: Inner
    params: PyTree[Float32[Array, "..."]]
    count: Int32[Array, ""]


@jc.hot_step(signature=Outer)
def outer_step(o: Outer) -> Outer:
    return Outer(
        inner=Inner(a=o.inner.a * 2),
        params=jax.tree_util.tree_map(lambda p: p - 1, o.params),
        count=o.count + 1,
    )


def test_nested_and_pytree_fields_are_refused_as_a_whole():
    o = Outer(inner=Inner(a=jnp.ones(2)), params={"w": jnp.ones((2, 2))}, count=np.int32(0))
    new = outer_step(o)
    with pytest.raises(jc.DonationError, match=r"Outer\.inner: its arrays was donated to outer_step"):
        o.inner  # noqa: B018
    with pytest.raises(jc.DonationError, match=r"Outer\.params: its arrays was donated to outer_step"):
        o.params  # noqa: B018
    with pytest.raises(jc.DonationError, match=r"Outer\.count: i32\[\] was donated"):
        o.count  # noqa: B018
    assert new.count.tolist() == 1


class ClassForm(jc.State):
    v: Float32[Array, "n"]


@jc.hot_step(signature=ClassForm)
def class_step(c: ClassForm) -> ClassForm:
    return ClassForm(v=c.v + 1)


def test_the_base_class_form_is_marked_the_same_way():
    c = ClassForm(v=jnp.zeros(2))
    class_step(c)
    with pytest.raises(jc.DonationError, match=r"ClassForm\.v: f32\[2\] was donated to class_step"):
        c.v  # noqa: B018
    out = class_step(ClassForm(v=jnp.zeros(2)))  # not inside the assert: see test_pytests_assertion_...
    assert type(out) is ClassForm


def test_the_mark_costs_one_class_per_state_class_and_step():
    from jaxcontracts._donation.consumed import consumed_class

    a, b = S(x=jnp.zeros(3), y=jnp.ones(3)), S(x=jnp.zeros(3), y=jnp.ones(3))
    step(a)
    step(b)
    assert type(a) is type(b) is consumed_class(S, "step")
    assert consumed_class(S, "step_x") is not type(a)


# -- definitions that used to be accepted and fail later ------------------


def test_an_unhashable_static_default_is_refused_where_it_is_written():
    with pytest.raises(jc.DefinitionError, match=r"jc\.static\(\[1, 2\]\): a static field's default must be hashable") as info:
        jc.static([1, 2])
    assert "Fix: use a tuple, jc.static((1, 2))." in str(info.value)
    with pytest.raises(jc.DefinitionError, match=r"\{'a': 1\}.*must be hashable"):
        jc.static(default={"a": 1})
    assert jc.static((1, 2)).default == (1, 2)


def test_an_undecorated_subclass_of_a_state_is_refused_at_construction():
    class Sub(S):  # forgot @jc.state
        extra: float = 1.0

    with pytest.raises(jc.DefinitionError, match=r"Sub subclasses the state class S but is not a jc.state itself") as info:
        Sub(x=jnp.zeros(3), y=jnp.ones(3))
    assert "@jc.state class Sub(S)" in str(info.value)
    from jaxcontracts._state.fields import is_state

    assert not is_state(Sub) and is_state(S)

    @jc.state
    class Decorated(Inner):
        z: Float32[Array, "n"]

    d = Decorated(a=jnp.zeros(3), z=jnp.ones(3))
    assert [p[0].name for p, _ in jax.tree_util.tree_flatten_with_path(d)[0]] == ["a", "z"]
