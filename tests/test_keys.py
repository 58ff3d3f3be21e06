"""Typed PRNG keys (jax.random.key) are leaves like any other, everywhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float32, Int32, Key, PyTree

import jaxcontracts as jc


@jc.state
class Walker:
    key: Key[Array, ""]
    keys: Key[Array, "n"]
    x: Float32[Array, "n"]
    t: Int32[Array, ""]


def walk_fn(w: Walker) -> Walker:
    key, sub = jax.random.split(w.key)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(w.keys)
    noise = jax.random.normal(sub, w.x.shape)
    return Walker(key=key, keys=keys, x=w.x + noise, t=w.t + 1)


def make_walker(n: int = 4, seed: int = 0) -> Walker:
    key = jax.random.key(seed)
    return Walker(key=key, keys=jax.random.split(key, n), x=jnp.zeros(n, jnp.float32), t=0)


# --------------------------------------------------------------------------
# jc.state fields


def test_key_field_spec_is_the_default_key_dtype():
    spec = Walker.spec(n=3)
    assert spec.key.dtype == jax.random.key(0).dtype
    assert spec.keys.shape == (3,)
    assert "key<fry>[3]" in repr(spec)


def test_zeros_of_a_key_field_is_zero_key_data_which_is_seed_zero_for_threefry():
    z = Walker.zeros(n=3)
    assert jax.dtypes.issubdtype(z.key.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(z.keys), np.zeros((3, 2), np.uint32))
    np.testing.assert_array_equal(jax.random.key_data(z.key), jax.random.key_data(jax.random.key(0)))


def test_repr_of_a_state_with_keys_shows_their_spec():
    assert repr(make_walker(3)) == "Walker(key=key<fry>[], keys=key<fry>[3], x=f32[3], t=i32[])"


def test_a_raw_uint32_key_in_a_key_field_is_refused_with_the_wrap_fix():
    with pytest.raises(jc.SpecError) as e:
        Walker(key=jax.random.PRNGKey(0), keys=jax.random.split(jax.random.key(0), 2),
               x=jnp.zeros(2, jnp.float32), t=0)
    assert ".key: expected key<fry>[], got u32[2]" in str(e.value)
    assert "jax.random.wrap_key_data" in str(e.value)


def test_a_key_of_another_implementation_is_refused():
    rbg = jax.random.key(0, impl="rbg")
    with pytest.raises(jc.SpecError) as e:
        Walker(key=rbg, keys=jax.random.split(jax.random.key(0), 2), x=jnp.zeros(2, jnp.float32), t=0)
    assert "key<rbg>[]" in str(e.value) and "implementation" in str(e.value)


def test_a_python_number_in_a_key_field_is_refused():
    with pytest.raises(jc.SpecError, match=r"jax\.random\.key\(seed\)"):
        Walker(key=0, keys=jax.random.split(jax.random.key(0), 2), x=jnp.zeros(2, jnp.float32), t=0)


# --------------------------------------------------------------------------
# hot steps: compile, donation, the fast paths, reports


def test_state_with_keys_compiles_donates_and_runs_in_a_raising_loop():
    walk = jc.hot_step(walk_fn)
    w = make_walker()
    old = w  # the container, not its leaves: holding it keeps nothing alive
    w = walk(w)
    assert old.__dict__["key"].is_deleted() and old.__dict__["keys"].is_deleted()
    with jc.hot_loop():
        for _ in range(5):
            w = walk(w)  # a returned state
    assert walk.stats.compiles == 1
    assert int(jc.fetch(w.t)) == 6
    cs = walk.describe().current
    key_leaves = [leaf for leaf in cs.leaves if "key" in leaf.path]
    assert key_leaves and all(leaf.donated and leaf.aliased for leaf in key_leaves)
    assert "key<fry>[4]" in str(walk.report())


def test_keys_in_a_dict_state_and_as_an_argument():
    @jc.hot_step(signature=dict)
    def sample(d: dict, key: jax.Array) -> dict:
        return {"k": jax.random.fold_in(d["k"], 1), "x": d["x"] + jax.random.uniform(key, d["x"].shape)}

    d = {"k": jax.random.key(0), "x": jnp.zeros(3, jnp.float32)}
    key = jax.random.key(7)
    d = sample(d, key)
    with jc.hot_loop():
        for _ in range(3):
            d = sample(d, key)
    assert sample.stats.compiles == 1
    assert not key.is_deleted()  # not a state parameter: never donated
    assert "key<fry>[]" in str(sample.report())


def test_keys_in_a_pytree_field():
    @jc.state
    class Agent:
        params: PyTree
        t: Int32[Array, ""]

    @jc.hot_step
    def act(a: Agent) -> Agent:
        return Agent(params={"key": jax.random.split(a.params["key"])[0], "w": a.params["w"] * 2}, t=a.t + 1)

    a = Agent(params={"key": jax.random.key(1), "w": jnp.ones(2, jnp.float32)}, t=0)
    assert "<dict: 2 leaves, 16 bytes>" in repr(a)
    a = act(a)
    with jc.hot_loop():
        a = act(a)
    assert act.stats.compiles == 1


def test_a_raw_key_where_a_typed_key_was_compiled_names_the_cause():
    @jc.hot_step(signature=dict)
    def f(d: dict) -> dict:
        return d

    f({"k": jax.random.key(0)})
    with pytest.raises(jc.RecompileError) as e:
        f({"k": jax.random.PRNGKey(0)})
    assert "typed PRNG key" in str(e.value)


def test_sharded_keys(mesh2):
    sharding = NamedSharding(mesh2, P("x"))

    @jc.hot_step(signature=dict)
    def f(d: dict) -> dict:
        return {"keys": jax.vmap(lambda k: jax.random.fold_in(k, 3))(d["keys"])}

    d = {"keys": jax.device_put(jax.random.split(jax.random.key(0), 4), sharding)}
    d = f(d)
    with jc.hot_loop():
        d = f(d)
    assert d["keys"].sharding.is_equivalent_to(sharding, 1)
    assert jc.fetch(d["keys"]).shape == (4, 2)


def test_spec_of_and_device_tree_keep_keys():
    k = jax.random.key(3)
    assert jc.spec_of({"k": k})["k"].dtype == k.dtype
    out = jc.device_tree({"k": k})
    assert out["k"].dtype == k.dtype and out["k"].committed


# --------------------------------------------------------------------------
# jc.fetch


def test_fetch_of_a_key_is_its_key_data_on_the_host_in_and_out_of_a_loop():
    k = jax.random.key(42)
    want = np.asarray(jax.random.key_data(k))
    out = jc.fetch(k)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint32
    np.testing.assert_array_equal(out, want)
    jax.random.split(k, 3)  # compiled before the loop, whatever ran before this test
    with jc.hot_loop():
        inside = jc.fetch({"k": k, "ks": jax.random.split(k, 3)})
    np.testing.assert_array_equal(inside["k"], want)
    assert inside["ks"].shape == (3, 2)
    # Round trip: the data makes the same key again.
    again = jax.random.wrap_key_data(out)
    np.testing.assert_array_equal(jax.random.key_data(again), want)


def test_jax_device_get_of_a_key_puts_it_back_on_the_device():
    # Why jc.fetch returns key data: JAX's own device_get rebuilds a device
    # key, a host-to-device transfer that a hot loop refuses.
    k = jax.random.key(1)
    assert isinstance(jax.device_get(k), jax.Array)
    with pytest.raises(jc.TransferError) as e, jc.hot_loop():
        jax.device_get(k)
    assert "jax.device_get of a typed PRNG key" in str(e.value)
    assert "jc.fetch(key)" in e.value.fix


def test_printing_a_key_in_a_loop_is_a_read_and_key_data_is_not():
    k = jax.random.key(0)
    jax.random.key_data(k)
    with jc.hot_loop():
        jax.random.key_data(k)  # a device-side view: clean
    with pytest.raises(jc.TransferError) as e, jc.hot_loop():
        print(k)
    assert "device-to-host read" in str(e.value)
    assert "of a typed PRNG key key<fry>[] (its key data, u32[2])" in str(e.value)


def test_zeros_and_check_with_sharded_key_fields(mesh2):
    rows, rep = NamedSharding(mesh2, P("x")), NamedSharding(mesh2, P())
    z = Walker.zeros(n=4, sharding={"key": rep, "keys": rows, "x": rows, "t": rep})
    assert z.keys.sharding.is_equivalent_to(NamedSharding(mesh2, P("x")), 1)
    walk = jc.hot_step(walk_fn)
    report = jc.check(walk, z)
    assert report.ok
    leaf = next(leaf for leaf in walk.describe().current.leaves if leaf.path.endswith(".keys"))
    assert leaf.donated and leaf.aliased and leaf.nbytes == 4 * 8
    assert "key&lt;fry&gt;[4]" in report._repr_html_()
