"""The validation cache: a signature seen before is not re-proven, and never lies.

Each test builds a state twice, once with the class's cache warm and once
cold (cleared), and checks both give the same outcome: the same values, or
the same error message. The attacks are the ways a cached signature could
stand for a value it does not describe.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import single_device_sharding
from jaxtyping import Array, Float32, Float64, PyTree

import jaxcontracts as jc
from jaxcontracts._state.validate import clear_validation_cache, validation_cache_size


class Pair(jc.State):
    x: Float32[Array, "n"]
    y: Float32[Array, "n"]


class WithStatic(jc.State):
    x: Float32[Array, "n"]
    k: int = jc.static(default=1)


class Shape(jc.State):
    x: Float32[Array, "n"]
    dims: tuple[int, ...] = jc.static(default=(1,))


class Outer(jc.State):
    inner: Pair
    t: Float32[Array, ""]


class Params(jc.State):
    params: PyTree[Float32[Array, "n"]]
    x: Float32[Array, "n"]


def outcome(cls, **fields):
    """('ok', state) or ('error', message) of ``cls(**fields)``."""
    try:
        return "ok", cls(**fields)
    except jc.SpecError as e:
        return "error", str(e)


def warm_and_cold(cls, **fields):
    """The outcome with the cache as it is, then with it cleared."""
    warm = outcome(cls, **fields)
    clear_validation_cache(cls)
    cold = outcome(cls, **fields)
    return warm, cold


def same(warm, cold):
    assert warm[0] == cold[0], (warm, cold)
    if warm[0] == "error":
        assert warm[1] == cold[1]


f32 = jnp.float32


def test_a_signature_seen_before_is_remembered_and_the_arrays_kept():
    clear_validation_cache(Pair)
    a, b = jnp.zeros(3, f32), jnp.ones(3, f32)
    p = Pair(x=a, y=b)
    assert validation_cache_size(Pair) == 1
    q = Pair(x=b, y=a)  # a hit: the same arrays, unconverted
    assert q.x is b and q.y is a and p.x is a
    assert validation_cache_size(Pair) == 1
    assert p.replace(y=a).y is a
    assert validation_cache_size(Pair) == 1


def test_dims_bound_differently_across_fields_are_not_a_hit():
    clear_validation_cache(Pair)
    Pair(x=jnp.zeros(3, f32), y=jnp.zeros(3, f32))  # n=3 cached
    warm, cold = warm_and_cold(Pair, x=jnp.zeros(3, f32), y=jnp.zeros(4, f32))
    same(warm, cold)
    assert warm[0] == "error" and "n=3 (from .x)" in warm[1]
    Pair(x=jnp.zeros(3, f32), y=jnp.zeros(3, f32))
    Pair(x=jnp.zeros(4, f32), y=jnp.zeros(4, f32))  # another n is another signature
    assert validation_cache_size(Pair) == 2


def test_a_failure_is_never_cached_and_keeps_its_message():
    clear_validation_cache(Pair)
    bad = {"x": jnp.zeros(3, jnp.int32), "y": jnp.zeros(3, f32)}
    first = outcome(Pair, **bad)
    assert first[0] == "error" and validation_cache_size(Pair) == 0
    Pair(x=jnp.zeros(3, f32), y=jnp.zeros(3, f32))
    same(outcome(Pair, **bad), first)


def test_weakly_typed_arrays_are_converted_on_every_construction():
    clear_validation_cache(Pair)
    Pair(x=jnp.zeros(3, f32), y=jnp.zeros(3, f32))  # the strong signature, cached
    weak = jnp.broadcast_to(jnp.asarray(1.0), (3,))
    assert weak.aval.weak_type and weak.dtype == f32
    for _ in range(2):
        p = Pair(x=weak, y=jnp.zeros(3, f32))
        assert not p.x.aval.weak_type and p.x is not weak
    assert validation_cache_size(Pair) == 1  # a converted signature is not remembered


def test_numpy_arrays_and_scalars_are_placed_on_the_device_every_time():
    clear_validation_cache(Pair)
    Pair(x=jnp.zeros(3, f32), y=jnp.zeros(3, f32))  # the device signature, cached
    host = np.zeros(3, np.float32)
    for _ in range(2):
        p = Pair(x=host, y=jnp.zeros(3, f32))
        assert isinstance(p.x, jax.Array) and p.x is not host
    warm, cold = warm_and_cold(Pair, x=np.zeros(3, np.float64), y=jnp.zeros(3, f32))
    same(warm, cold)
    assert warm[0] == "error"


def test_an_object_posing_as_an_array_is_refused_even_with_a_warm_cache():
    real = jnp.zeros(3, f32)

    class Impostor:  # carries a real array's aval, shape and dtype
        aval = real.aval
        shape = real.shape
        dtype = real.dtype

    clear_validation_cache(Pair)
    Pair(x=real, y=real)
    warm, cold = warm_and_cold(Pair, x=Impostor(), y=real)
    same(warm, cold)
    assert warm[0] == "error" and "pass a jax array" in warm[1]


def test_the_concrete_array_class_cannot_be_subclassed():
    # The cache keys only arrays whose type is exactly this class; were it
    # subclassable, a subclass would take the full path anyway.
    with pytest.raises(TypeError):
        type("Sub", (type(jnp.zeros(1)),), {})


def test_a_deleted_array_gets_the_same_answer_warm_and_cold():
    clear_validation_cache(Pair)
    Pair(x=jnp.zeros(3, f32), y=jnp.zeros(3, f32))
    gone = jnp.zeros(3, f32)
    gone.delete()
    warm, cold = warm_and_cold(Pair, x=gone, y=jnp.zeros(3, f32))
    same(warm, cold)


def test_tracers_skip_validation_and_never_fill_the_cache():
    clear_validation_cache(Pair)

    @jax.jit
    def build(a):
        return Pair(x=a, y=a).x + 1

    build(jnp.zeros(3, f32))
    assert validation_cache_size(Pair) == 0


def test_sharding_is_not_part_of_validation_and_is_kept():
    clear_validation_cache(Pair)
    device = jax.devices()[0]
    mesh = jax.sharding.Mesh(np.array([device]), ("d",))
    named = jax.device_put(jnp.zeros(3, f32), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    single = jax.device_put(jnp.zeros(3, f32), single_device_sharding(device))
    a = Pair(x=single, y=single)
    b = Pair(x=named, y=single)  # equal avals, another sharding object
    assert a.x.sharding == single.sharding and b.x is named and b.x.sharding is named.sharding
    assert validation_cache_size(Pair) >= 1


def test_static_values_equal_by_eq_but_of_another_type_are_not_a_hit():
    clear_validation_cache(WithStatic)
    WithStatic(x=jnp.zeros(3, f32), k=1)
    warm, cold = warm_and_cold(WithStatic, x=jnp.zeros(3, f32), k=1.0)  # 1 == 1.0
    same(warm, cold)
    assert warm[0] == "error"


def test_container_statics_take_the_full_path():
    clear_validation_cache(Shape)
    Shape(x=jnp.zeros(3, f32), dims=(1, 2))
    assert validation_cache_size(Shape) == 0  # a tuple may hold 1 or 1.0: not keyed
    # one element: beartype checks one random element of a tuple per call
    # (its O(1) strategy), so (1.0, 2) passes or fails by chance on either path
    warm, cold = warm_and_cold(Shape, x=jnp.zeros(3, f32), dims=(1.0,))
    same(warm, cold)
    assert warm[0] == "error"


def test_a_nested_state_field_is_keyed_by_its_class():
    clear_validation_cache(Outer)
    inner = Pair(x=jnp.zeros(3, f32), y=jnp.zeros(3, f32))
    Outer(inner=inner, t=jnp.zeros((), f32))
    assert validation_cache_size(Outer) == 1
    other = WithStatic(x=jnp.zeros(3, f32))
    warm, cold = warm_and_cold(Outer, inner=other, t=jnp.zeros((), f32))
    same(warm, cold)
    assert warm[0] == "error"


def test_a_pytree_field_hit_still_copies_the_container():
    clear_validation_cache(Params)
    params = {"w": jnp.zeros(3, f32), "b": jnp.zeros(3, f32)}
    Params(params=params, x=jnp.zeros(3, f32))
    assert validation_cache_size(Params) == 1
    s = Params(params=params, x=jnp.zeros(3, f32))  # a hit
    assert s.params == params and s.params is not params
    params["w"] = jnp.ones(7, f32)  # editing the caller's dict leaves the state alone
    assert s.params["w"].shape == (3,)
    warm, cold = warm_and_cold(Params, params=params, x=jnp.zeros(3, f32))  # n=7 vs n=3
    same(warm, cold)
    assert warm[0] == "error"
    warm, cold = warm_and_cold(Params, params={"w": jnp.zeros(3, f32)}, x=jnp.zeros(3, f32))
    same(warm, cold)


def test_user_post_init_runs_on_every_construction():
    calls = []

    class Checked(jc.State):
        x: Float32[Array, "n"]

        def __post_init__(self):
            calls.append(self.x.shape)
            if self.x.shape[0] > 3:
                raise ValueError("too long")

    Checked(x=jnp.zeros(2, f32))
    Checked(x=jnp.zeros(2, f32))
    assert calls == [(2,), (2,)]
    with pytest.raises(ValueError, match="too long"):
        Checked(x=jnp.zeros(4, f32))
    with pytest.raises(ValueError, match="too long"):  # its signature passed validation once
        Checked(x=jnp.zeros(4, f32))


@pytest.mark.skipif(not hasattr(jax, "enable_x64"), reason="jax.enable_x64 context not in this jax")
def test_a_64_bit_array_cached_with_x64_on_gets_the_same_answer_with_it_off():
    class Wide(jc.State):
        x: Float64[Array, "n"]

    with jax.enable_x64(True):
        wide = jnp.zeros(3, jnp.float64)
        Wide(x=wide)
        assert validation_cache_size(Wide) == 1
    with jax.enable_x64(False):
        warm, cold = warm_and_cold(Wide, x=wide)
    same(warm, cold)
    with jax.enable_x64(False):
        assert outcome(Wide, x=np.zeros(3, np.float64))[0] == "error"


def test_the_cache_is_bounded():
    class One(jc.State):
        x: Float32[Array, "n"]

    for n in range(300):  # device_put of host zeros: a transfer, no compile per shape
        One(x=jax.device_put(np.zeros(n, np.float32)))
    assert 0 < validation_cache_size(One) <= 256


def test_jit_closing_over_a_cached_state_is_unaffected():
    s = Pair(x=jnp.zeros(3, f32), y=jnp.ones(3, f32))
    out = jax.jit(lambda: s.replace(x=s.y).x + 1)()
    assert out.shape == (3,)
