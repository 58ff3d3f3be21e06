"""Pinned wording of the main messages: they are part of the product."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float32

import jaxcontracts as jc


@jc.state
class Body:
    pos: Float32[Array, "n 3"]
    t: Float32[Array, ""]
    dt: float = jc.static(0.1)


def move(b: Body) -> Body:
    return Body(pos=b.pos + b.dt, t=b.t + b.dt, dt=b.dt)


def counter(s: dict) -> dict:
    return {"x": s["x"] * 2, "t": s["t"] + 1.0}


def _message(fn, *args):
    with pytest.raises(jc.ContractError) as info:
        fn(*args)
    return str(info.value)


def test_spec_error_at_construction():
    msg = _message(lambda: Body(pos=jnp.zeros((2, 3)), t=jnp.int32(0)))
    assert msg == (
        "test_messages.Body(...) got 1 invalid field:\n"
        "  .t: expected f32[], got i32[] (jax array)\n"
        "      fix: a jax array of the wrong dtype is never cast silently (a step "
        "would return another dtype and recompile). Create it as float32, e.g. "
        "jnp.zeros(shape, jnp.float32), or cast it yourself with "
        ".astype(jnp.float32) if you mean it.\n"
        "  dims bound: n=2  (n from .pos)\n"
        "See: docs/errors.md#specerror"
    )


def test_spec_error_for_an_overflowing_scalar():
    msg = _message(lambda: Body(pos=jnp.zeros((2, 3)), t=1e39))
    assert msg == (
        "test_messages.Body(...) got 1 invalid field:\n"
        "  .t: expected f32[], got Python float 1e+39\n"
        "      fix: it overflows float32 (largest finite value 3.40282e+38) and would "
        "be stored as inf; pass a smaller value, or annotate the field Float64 (with "
        "jax_enable_x64 on).\n"
        "  dims bound: n=2  (n from .pos)\n"
        "See: docs/errors.md#specerror"
    )


def test_spec_error_for_dims_and_shardings():
    assert _message(lambda: Body.spec(n="3")) == (
        "Body.spec() got 1 invalid dimension size:\n"
        "  n='3' (str): expected a non-negative int\n"
        "Fix: pass each dimension as a non-negative Python int, e.g. Body.spec(n=4).\n"
        "See: docs/errors.md#specerror"
    )
    assert _message(lambda: Body.zeros(n=2, sharding={"post": None})) == (
        "Body.zeros(sharding=...) names 'post', which is not a data field of Body.\n"
        "  valid field names: pos, t\n"
        "Fix: fix the spelling, or drop the entry; a field left out of the mapping "
        "gets no sharding (a nested state takes a mapping of its own fields).\n"
        "See: docs/errors.md#specerror"
    )


def test_recompile_error_at_compile_carry():
    step = jc.hot_step(counter)
    msg = _message(step.compile, {"x": jnp.zeros(2), "t": jnp.int32(0)})
    assert msg.startswith(
        "test_messages.counter does not return its state with the spec it takes"
    )
    assert "  parameter `s` -> the return value:\n    ['t']: takes i32[], returns ~f32[]\n" in msg
    assert msg.endswith("Nothing has run yet.\nSee: docs/errors.md#recompileerror")


def test_recompile_error_at_call():
    step = jc.hot_step(move)
    step(Body.zeros(n=2))
    msg = _message(step, Body.zeros(n=3))
    assert msg == (
        "test_messages.move was called with a signature it was not compiled for "
        "(max_compiles=1, 1 used).\n"
        "  parameter `b`:\n"
        "    b.pos: compiled with f32[2,3], called with f32[3,3]\n"
        "      likely cause: shape changed: a smaller last batch? pad it, or drop it\n"
        "Fix: pass arguments with the compiled spec (see the likely cause above), "
        "or allow more signatures with @jc.hot_step(max_compiles=2).\n"
        "The call did not run; your inputs are intact.\n"
        "See: docs/errors.md#recompileerror"
    )


def test_transfer_error_at_call():
    step = jc.hot_step(move)
    good = Body.zeros(n=2)
    step(good)
    bad = Body.__new__(Body)
    bad.__dict__.update(pos=np.zeros((2, 3), np.float32), t=jnp.float32(0), dt=0.1)
    msg = _message(step, bad)
    assert msg.startswith(
        "test_messages.move: 1 argument leaf/leaves are on the host, so every call "
        "would copy them to the device"
    )
    assert "\n  b.pos: f32[2,3] (numpy array)\n" in msg
    assert "b = jc.device_tree(b)" in msg  # the parameter the leaves are in


def test_host_leaves_in_a_read_only_parameter_name_that_parameter_in_the_fix():
    # evosax's ask(key, state, params): Python floats in `params`, not in the state.
    import typing

    class Params(typing.NamedTuple):
        std_min: float
        c_mean: float

    def ask(key, state, params):
        return state * params.c_mean, state + params.std_min

    step = jc.hot_step(ask, state="state")
    with pytest.raises(jc.TransferError) as e:
        step(jax.random.key(0), jnp.zeros(3), Params(1e-6, 1.0))
    assert "params.std_min: ~f32[] (Python float)" in str(e.value)
    assert "params = jc.device_tree(params)" in e.value.fix
    assert "state = jc.device_tree(state)" not in e.value.fix


def test_a_weakly_typed_state_from_library_init_offers_device_tree_in_the_fix():
    # evosax's init makes weak scalars that its tell returns strongly typed.
    def tell(state):
        return {"best": state["best"].astype(jnp.float32) + 1}

    step = jc.hot_step(tell, state="state")
    with pytest.raises(jc.RecompileError) as e:
        step({"best": jnp.asarray(0.0)})  # ~f32[]: weak
    assert "state = jc.device_tree(state) before the first call" in e.value.fix
    out = step(jc.device_tree({"best": jnp.asarray(0.0)}))  # the fix, followed
    assert float(out["best"]) == 1.0


def test_an_array_first_parameter_is_not_taken_for_the_state_beside_an_annotated_one():
    import typing

    class State(typing.NamedTuple):
        mean: jax.Array

    def ask(key: jax.Array, state: State):
        return state.mean + 1, State(state.mean + 1)

    with pytest.raises(jc.DefinitionError, match="which one is the state is ambiguous") as e:
        jc.hot_step(ask)
    assert e.value.fix == 'name the state parameter(s): @jc.hot_step(state="state").'


def test_donation_error_already_donated():
    step = jc.hot_step(move)
    b = Body.zeros(n=2)
    step(b)
    msg = _message(step, b)
    assert msg.startswith("test_messages.move: the call would donate a buffer that cannot be donated:\n")
    assert "  b.pos: f32[2,3] was already donated to move\n" in msg  # the state is marked
    assert "use the state the previous call returned (s = step(s))" in msg
    c = Body.zeros(n=2)
    jax.tree_util.tree_map(lambda x: x.delete(), c)  # deleted, but by no step
    msg = _message(step, c)
    assert "  b.pos: f32[2,3] was already deleted (donated to an earlier call?)\n" in msg


def test_definition_error_lists_valid_options():
    msg = _message(lambda: jc.hot_step(move, donate="yes"))
    assert msg == (
        "@jc.hot_step on test_messages.move: donate='yes' is not valid.\n"
        "Valid values:\n"
        '  donate="all"            every leaf of every state parameter (default)\n'
        '  donate=("pos", "vel")   those state fields only\n'
        '  donate="none"           no donation (an explicit opt-out)\n'
        "See: docs/errors.md#definitionerror"
    )


def test_errors_read_as_jaxcontracts_in_tracebacks():
    for cls in (jc.ContractError, jc.SpecError, jc.RecompileError, jc.DonationError,
                jc.TransferError, jc.DefinitionError):
        assert cls.__module__ == "jaxcontracts"
        assert issubclass(cls, jc.ContractError)


def test_a_spec_error_carries_its_fields_and_fixes_as_structured_fields():
    with pytest.raises(jc.SpecError) as info:
        Body(pos=jnp.zeros((2, 3)), t=jnp.int32(0))
    err = info.value
    assert err.contract == "state-fields" and err.leaves == (".t",)
    assert err.fix.startswith("a jax array of the wrong dtype is never cast silently")
    assert "Fix:" not in str(err)  # the fix is written under its field, once
    with pytest.raises(jc.SpecError) as info:
        Body(pos=np.zeros((2, 3), np.int32), t=1e39)
    err = info.value
    assert err.leaves == (".pos", ".t")
    assert err.fix.splitlines()[0].startswith(".pos: a numpy array of the wrong dtype")
    assert err.fix.splitlines()[1].startswith(".t: it overflows float32")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Body.spec(m=3),  # an unknown dimension
        lambda: jc.static([1, 2]),  # an unhashable static default
    ],
    ids=["unknown-dim", "unhashable-static"],
)
def test_definition_and_spec_errors_put_the_fix_in_its_field(make):
    with pytest.raises(jc.ContractError) as info:
        make()
    err = info.value
    assert err.fix and str(err).count("Fix: ") == 1
    assert f"Fix: {err.fix}" in str(err)


def test_a_field_kind_jaxcontracts_cannot_hold_names_the_field_and_the_fix():
    with pytest.raises(jc.DefinitionError) as info:

        @jc.state
        class Bad:
            x: jax.Array

    err = info.value
    assert err.leaves == (".x",)
    assert err.fix.startswith("if x is configuration, write `x: ") and "jc.static(...)" in err.fix
    assert "  3. a pytree:        params: PyTree[Float32[Array, '...']]" in str(err)
