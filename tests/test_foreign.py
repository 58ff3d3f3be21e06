"""Foreign state brought into contract: jc.device_tree, and the real libraries.

Each container a JAX user brings (flax ``TrainState`` and ``flax.struct``
classes, equinox Modules, NamedTuples, optax states, dicts) is used as a hot
step's signature and run in a raising ``jc.hot_loop``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Int32, PyTree

import jaxcontracts as jc

# --------------------------------------------------------------------------
# jc.device_tree, leaf by leaf


def test_python_scalars_become_jax_default_dtypes_strongly_typed():
    out, changes = jc.device_tree({"step": 0, "lr": 0.1, "done": False, "z": 1j}, changes=True)
    assert {k: (str(v.dtype), v.aval.weak_type) for k, v in out.items()} == {
        "step": ("int32", False),
        "lr": ("float32", False),
        "done": ("bool", False),
        "z": ("complex64", False),
    }
    assert all(v.committed for v in out.values())
    assert changes.paths == ("['done']", "['lr']", "['step']", "['z']")
    assert "['step']: Python int 0 -> i32[] (a Python scalar" in str(changes)


def test_weakly_typed_arrays_become_strong_in_the_same_dtype():
    weak = jnp.asarray(0.5)
    assert weak.aval.weak_type
    out, changes = jc.device_tree([weak], changes=True)
    assert out[0].dtype == jnp.float32 and not out[0].aval.weak_type
    assert "weakly typed" in changes[0].why and changes[0].before == "~f32[] jax array"


def test_numpy_is_copied_once_in_the_dtype_jax_gives_it():
    host = np.arange(4.0)  # float64
    out, changes = jc.device_tree({"w": host}, changes=True)
    assert out["w"].dtype == jnp.float32  # x64 is off in the suite
    assert "float64 needs jax_enable_x64" in changes[0].why
    f32 = np.ones(1024, np.float32)
    dev = jc.device_tree(f32)
    assert dev.unsafe_buffer_pointer() != f32.ctypes.data  # owns its buffer: donatable


def test_a_strong_committed_array_is_returned_as_is():
    x = jax.device_put(jnp.ones(3), jax.devices()[0])
    out, changes = jc.device_tree({"x": x}, changes=True)
    assert out["x"] is x and len(changes) == 0
    assert "nothing to change" in str(changes)


def test_uncommitted_arrays_are_committed():
    x = jnp.ones(3)
    assert not x.committed
    out = jc.device_tree(x)
    assert out.committed and out.devices() == x.devices()


def test_a_sharding_places_every_leaf(mesh2):
    sharding = NamedSharding(mesh2, P())
    out = jc.device_tree({"a": 1.0, "b": np.ones(2, np.float32)}, sharding=sharding)
    assert all(v.sharding.is_equivalent_to(sharding, v.ndim) for v in out.values())


def test_what_cannot_be_a_device_array_is_refused_with_every_path():
    with pytest.raises(jc.SpecError) as e:
        jc.device_tree({"name": "mnist", "act": jax.nn.relu, "big": 2**40, "ok": 1.0})
    text = str(e.value)
    assert "3 leaves cannot become device arrays" in text
    assert "['name']: str 'mnist'" in text
    assert "['big']: Python int 1099511627776: 1099511627776 does not fit in int32" in text
    assert "['act']" in text
    assert "eqx.partition" in e.value.fix and "pytree_node=False" in e.value.fix
    assert set(e.value.leaves) == {"['name']", "['act']", "['big']"}


def test_numpy_values_past_jax_s_32_bit_types_are_refused_not_wrapped():
    # with jax_enable_x64 off an int64 became int32 (2**40 -> 0, 2**33 + 5 -> 5)
    # and a float64 past float32's range became inf, recorded as a plain copy
    if jax.config.jax_enable_x64:
        pytest.skip("jax_enable_x64 is on: nothing narrows")
    with pytest.raises(jc.SpecError) as e:
        jc.device_tree({"a": np.int64(2**40), "b": np.array([2**33 + 5]), "c": np.array([1e39]), "d": np.array([7])})
    text = str(e.value)
    assert "values up to 1099511627776 do not fit in int32" in text and "values up to 8589934597" in text
    assert "['c']: f64[1] numpy array: finite values past float32's range would become inf" in text
    assert set(e.value.leaves) == {"['a']", "['b']", "['c']"} and "jax_enable_x64" in e.value.fix
    out = jc.device_tree({"d": np.array([7]), "e": np.array([np.inf, 1.5])})  # fits (inf stays inf)
    assert out["d"].dtype == jnp.int32 and out["e"].tolist() == [np.inf, 1.5]


def test_numpy_arrays_of_strings_or_objects_are_refused():
    with pytest.raises(jc.SpecError) as e:
        jc.device_tree({"names": np.array(["a", "b"]), "objs": np.array([None, 1], dtype=object)})
    assert "['names']" in str(e.value) and "['objs']" in str(e.value)


def test_under_a_trace_leaves_pass_through():
    @jax.jit
    def f(x):
        return jc.device_tree({"x": x})["x"] + 1

    assert f(jnp.float32(1)) == 2


def test_x64_is_honoured():
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        out = jc.device_tree({"i": 1, "f": 1.0, "w": np.ones(2)})
        assert (out["i"].dtype, out["f"].dtype, out["w"].dtype) == (jnp.int64, jnp.float64, jnp.float64)
    finally:
        jax.config.update("jax_enable_x64", before)


def test_pytree_fields_of_a_state_accept_python_scalars():
    @jc.state
    class Env:
        params: PyTree
        t: Int32[Array, ""]

    env = Env(params={"mass": 1.0, "n": 3, "w": jnp.ones(2)}, t=0)
    assert env.params["mass"].dtype == jnp.float32 and not env.params["mass"].aval.weak_type
    assert env.params["n"].dtype == jnp.int32
    with pytest.raises(jc.SpecError, match=r"\.params\['name'\]"):
        Env(params={"name": "cartpole"}, t=0)


# --------------------------------------------------------------------------
# The containers users bring, as hot-step signatures in a raising loop


def _run(step, state, n=3):
    state = step(state)
    with jc.hot_loop():
        for _ in range(n):
            state = step(state)
    assert step.stats.compiles == 1
    return state


def test_flax_train_state_with_optax():
    flax_training = pytest.importorskip("flax.training.train_state")
    optax = pytest.importorskip("optax")
    TrainState = flax_training.TrainState

    def apply_fn(params, x):
        return x @ params["w"] + params["b"]

    params = {"w": jnp.ones((3, 2), jnp.float32), "b": jnp.zeros(2, jnp.float32)}
    raw = TrainState.create(apply_fn=apply_fn, params=params, tx=optax.adam(1e-3))
    x = jnp.ones((4, 3), jnp.float32)

    @jc.hot_step
    def train_step(state: TrainState, x: jax.Array) -> TrainState:
        def loss(p):
            return jnp.mean(state.apply_fn(p, x) ** 2)

        return state.apply_gradients(grads=jax.grad(loss)(state.params))

    # Before: TrainState.create(step=0) carries a Python int.
    with pytest.raises(jc.ContractError) as e:
        train_step(raw, x)
    assert ".step" in str(e.value)
    # After: one call brings it into contract.
    state, changes = jc.device_tree(raw, changes=True)
    assert ".step" in changes.paths
    state = train_step(state, x)
    with jc.hot_loop():
        for _ in range(3):
            state = train_step(state, x)
    assert train_step.stats.compiles == 1
    assert int(jc.fetch(state.step)) == 4


def test_flax_struct_dataclass_with_static_fields():
    struct = pytest.importorskip("flax.struct")

    @struct.dataclass
    class EnvState:
        pos: jax.Array
        t: int
        mass: float
        dt: float = struct.field(pytree_node=False, default=0.1)

    @jc.hot_step
    def advance(s: EnvState) -> EnvState:
        return s.replace(pos=s.pos + s.dt / s.mass, t=s.t + 1)

    s = jc.device_tree(EnvState(pos=np.zeros(3, np.float32), t=0, mass=2.0))
    s = _run(advance, s)
    assert int(jc.fetch(s.t)) == 4


def test_equinox_module():
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.Linear(3, 2, key=jax.random.key(0))

    @jc.hot_step
    def decay(m: eqx.nn.Linear) -> eqx.nn.Linear:
        return jax.tree_util.tree_map(lambda p: p * 0.9, m)

    model = _run(decay, jc.device_tree(model))
    assert model.weight.shape == (2, 3)


def test_equinox_module_with_a_function_leaf_keeps_it_static_in_device_tree():
    # As eqx.filter_jit has it (tests/test_equinox.py has the step side).
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    out = jc.device_tree(mlp)
    assert out.activation is mlp.activation
    assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(eqx.filter(out, eqx.is_array)))


def test_named_tuple_carry():
    class Carry(NamedTuple):
        x: jax.Array
        n: int

    @jc.hot_step
    def step(c: Carry) -> Carry:
        return Carry(c.x * 2, c.n + 1)

    c = _run(step, jc.device_tree(Carry(np.ones(2, np.float32), 0)))
    assert int(jc.fetch(c.n)) == 4


def test_optax_state():
    optax = pytest.importorskip("optax")
    tx = optax.adam(1e-2)
    params = {"w": jnp.ones(3, jnp.float32)}
    opt_state = tx.init(params)

    @jc.hot_step(signature=tuple)
    def update(opt: tuple, p: dict) -> tuple:
        _, opt = tx.update(p, opt, p)
        return opt

    opt_state = jc.device_tree(opt_state)
    opt_state = update(opt_state, params)
    with jc.hot_loop():
        opt_state = update(opt_state, params)
    assert update.stats.compiles == 1


def test_dict_state_with_scalars():
    @jc.hot_step(signature=dict)
    def step(d: dict) -> dict:
        return {"t": d["t"] + 1, "lr": d["lr"] * 0.5, "x": d["x"] + d["lr"]}

    d = _run(step, jc.device_tree({"t": 0, "lr": 1.0, "x": np.zeros(2)}))
    assert int(jc.fetch(d["t"])) == 4


# --------------------------------------------------------------------------
# a node whose key is a property (flax's nnx.Variable.value)


class _Boxed:
    """A pytree node keyed by a property, as ``nnx.Variable.value`` is (a
    deprecated property in flax: each read warns)."""

    reads = 0

    def __init__(self, raw):
        self._raw = raw

    @property
    def value(self):
        type(self).reads += 1
        return self._raw


jax.tree_util.register_pytree_with_keys(
    _Boxed,
    lambda b: (((jax.tree_util.GetAttrKey("value"), b._raw),), None),
    lambda _, children: _Boxed(*children),
)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_leaf_behind_a_property_is_read_without_the_property(level):
    # fast reads the first donated leaf by its path before each call: a
    # property on that path is not called (the node is flattened instead).
    @jc.hot_step(state="s")
    def step(s):
        return {"w": _Boxed(s["w"]._raw + 1.0)}

    s = {"w": _Boxed(jnp.zeros(3))}
    with jc.checks_level(level):
        s = step(s)
        _Boxed.reads = 0
        with jc.hot_loop():
            for _ in range(5):
                s = step(s)
        assert _Boxed.reads == 0
        stale = s
        s = step(s)
        with pytest.raises(jc.DonationError, match=r"s\['w'\]"):
            step(stale)
    np.testing.assert_allclose(s["w"]._raw, 7.0)


def test_an_nnx_state_at_fast_warns_nothing_per_call():
    nnx = pytest.importorskip("flax.nnx")
    import warnings

    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    @jc.hot_step(state="state")
    def step(state):
        m = nnx.merge(graphdef, state)
        m.bias[...] = m.bias[...] + 1.0
        return nnx.state(m)

    # recorded, not raised (the suite's filter): a raised warning would make
    # the reader fall back to a flatten per call, and hide the per-call read
    with warnings.catch_warnings(record=True) as seen, jc.checks_level("fast"):
        warnings.simplefilter("always")  # flax's '.value' deprecation, on each read
        for _ in range(4):
            state = step(state)
    assert [str(w.message) for w in seen] == []
    np.testing.assert_allclose(np.asarray(jc.fetch(state["bias"][...])), 4.0)


class _Tagged:
    """A node whose child key is a user's unhashable class (a dataclass with eq)."""

    def __init__(self, raw):
        self.raw = raw


@__import__("dataclasses").dataclass
class _TagKey:
    tag: str

    def __str__(self):
        return f".<{self.tag}>"


jax.tree_util.register_pytree_with_keys(
    _Tagged, lambda t: (((_TagKey("raw"), t.raw),), None), lambda _, children: _Tagged(*children)
)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_node_with_unhashable_keys_is_read_and_named(level):
    @jc.hot_step(state="s")
    def step(s):
        return {"a": _Tagged(s["a"].raw + 1.0), "b": s["b"] * 2.0}

    s = {"a": _Tagged(jnp.zeros(2)), "b": jnp.ones(2)}
    with jc.checks_level(level):
        s = step(s)
        stale = s
        s = step(s)
        with pytest.raises(jc.DonationError, match=r"s\['a'\]"):
            step(stale)
    np.testing.assert_allclose(s["a"].raw, 2.0)
