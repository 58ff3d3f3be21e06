"""Equinox Modules as state: non-array leaves static, as eqx.filter_jit has them.

A Module holding functions (``jax.nn.relu``, ``jnp.ravel``) and Python
numbers (``MaxPool2d``'s ``init``) is carried and donated by its arrays; the
rest is part of the signature.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest

import jaxcontracts as jc

eqx = pytest.importorskip("equinox")


class Net(eqx.Module):
    layers: list

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Conv2d(1, 2, kernel_size=3, key=k1),
            eqx.nn.MaxPool2d(kernel_size=2),  # holds a Python float and a function
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(2 * 5 * 5, 3, key=k2),
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)


def _train(model, x):
    loss, grads = eqx.filter_value_and_grad(_loss)(model, x)
    return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads)), loss


def _data():
    return jax.random.normal(jax.random.key(1), (4, 1, 8, 8))


def test_a_module_holding_functions_is_carried_and_donated_like_filter_jit():
    x = _data()
    reference = jax.tree.leaves(eqx.filter_jit(_train)(Net(jax.random.key(0)), x))
    step = jc.hot_step(_train, state="model")
    model = Net(jax.random.key(0))
    first = model
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(3)):
            model, loss = step(model, x)
    assert step.stats.compiles == 1 and step.stats.refused == 0
    assert model.layers[2] is jax.nn.relu and model.layers[3] is jnp.ravel  # the same functions back
    assert isinstance(model.layers[1].init, float)  # a Python number stays one (static)
    assert first.layers[0].weight.is_deleted()  # the arrays were donated
    report = str(step.report())
    assert "model.layers[0].weight" in report and "model.layers[4].bias" in report
    assert "[pass] donation verified in the executable (4 leaves donated)" in report
    again = jc.hot_step(_train, state="model")
    out = again(Net(jax.random.key(0)), x)
    arrays = [x for x in jax.tree.leaves(out) if isinstance(x, jax.Array)]
    expected = [x for x in reference if isinstance(x, jax.Array)]
    assert len(arrays) == len(expected) == 5  # 4 parameters and the loss
    for a, b in zip(arrays, expected):
        assert jnp.allclose(a, b)  # the numbers of eqx.filter_jit


def test_a_new_function_in_a_module_is_a_new_signature_named_by_its_path():
    step = jc.hot_step(_train, state="model")
    model, _ = step(Net(jax.random.key(0)), _data())
    swapped = eqx.tree_at(lambda m: m.layers[2], model, jax.nn.tanh)
    with pytest.raises(jc.RecompileError) as e:
        step(swapped, _data())
    assert "model.layers[2]: compiled with relu, called with tanh" in str(e.value)
    assert model.layers[0].weight.is_deleted() is False  # refused before dispatch: intact


def test_a_kept_reference_to_a_module_leaf_is_refused_at_full():
    step = jc.hot_step(_train, state="model")
    model, _ = step(Net(jax.random.key(0)), _data())
    kept = model.layers[0].weight
    with pytest.raises(jc.DonationError, match=r"model.layers\[0\].weight: f32\[2,1,3,3\]"):
        step(model, _data())
    assert not kept.is_deleted()
    del kept
    model, _ = step(model, _data())  # nothing else holds it now


def test_device_tree_accepts_a_module_and_leaves_its_static_leaves_alone():
    model = jc.device_tree(Net(jax.random.key(0)))
    assert model.layers[2] is jax.nn.relu and isinstance(model.layers[1].init, float)
    assert isinstance(model.layers[0].weight, jax.Array)


def test_device_tree_converts_a_number_beside_a_module_not_the_modules_own():
    # only a Module's non-array leaves are static; a learning rate beside it is the tree's
    out = jc.device_tree({"model": Net(jax.random.key(0)), "lr": 0.1})
    assert isinstance(out["model"].layers[1].init, float) and out["model"].layers[2] is jax.nn.relu
    assert isinstance(out["lr"], jax.Array) and out["lr"].dtype == jnp.float32 and not out["lr"].weak_type


def test_numpy_arrays_in_a_module_are_still_host_data():
    import numpy as np

    class Holder(eqx.Module):
        w: object
        act: object

    step = jc.hot_step(lambda m: Holder(m.w * 2, m.act), state="m")
    with pytest.raises(jc.TransferError, match=r"m.w: f32\[2\] \(numpy array\)"):
        step(Holder(np.ones(2, np.float32), jax.nn.relu))


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_consumed_module_goes_at_the_rebinding_and_a_held_one_is_worded_on_read(level):
    # The call takes a Module as a per-call node of its arrays and records
    # none of them: the consumed Module goes when the caller rebinds it. A
    # Module the user still holds (old = model) is read as a donated array,
    # with the steps that donate, also after a call that failed.
    import re
    import weakref

    from jaxcontracts import _steps

    step = jc.hot_step(_train, state="model")
    x, wrong = _data(), jnp.zeros((4, 1, 9, 9))
    with jc.checks_level(level):
        model, _ = step(*step(Net(jax.random.key(0)), x)[:1], x)  # warm
        consumed = weakref.ref(model.layers[0].weight)
        model, _ = step(model, x)
        model, _ = step(model, x)  # (at full, the step's record of what a call consumed goes at its next call)
        assert consumed() is None
        old, (model, _) = model, step(model, x)
        with pytest.raises(jc.RecompileError):
            step(model, wrong)
        live = _steps.donating()  # every live donating step (other tests' too), sorted, three at most
        assert "_train" in live
        listed = ", ".join(live[:3]) + (", ..." if len(live) > 3 else "")
        worded = "donated to _train" if level == "full" else f"most likely donated to an earlier call (hot steps that donate: {listed};"
        with pytest.raises(jc.DonationError, match=re.escape(worded)):
            old.layers[0].weight + 1  # noqa: B018 - the read is the test
        model, _ = step(model, x)
    assert not model.layers[0].weight.is_deleted()


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_module_steps_record_from_another_signature_is_read_safely(level):
    # As test_consumed_state's case, through the per-call nodes of a Module.
    def inc(t):
        return jax.tree_util.tree_map(lambda x: x + 1, t)

    def step_fn(model, carry):
        return eqx.apply_updates(model, jax.tree_util.tree_map(jnp.ones_like, eqx.filter(model, eqx.is_array))), inc(carry)

    f = jc.hot_step(step_fn, state=("model", "carry"), max_compiles=2)
    with jc.checks_level(level):
        model, carry = f(Net(jax.random.key(0)), None)
        model, carry = f(model, {"h": jnp.zeros(2)})
        model, carry = f(model, carry)
        model, none = f(model, None)
    assert carry["h"].tolist() == [2.0] * 2 and none is None and model.layers[2] is jax.nn.relu


class _Named(eqx.Module):
    """A layer with non-array fields a call accepts (eqx.nn.BatchNorm's axis_name,
    diffrax's vector field): compile takes them too (issue 38 item 5)."""

    lin: eqx.nn.Linear
    axis_name: str
    act: object

    def __init__(self, key):
        self.lin = eqx.nn.Linear(3, 3, key=key)
        self.axis_name = "batch"
        self.act = jax.nn.relu


def test_compile_takes_the_module_leaves_a_call_takes_and_the_call_reuses_it():
    @jc.hot_step(state="m")
    def step(m, x):
        return eqx.tree_at(lambda t: t.lin.bias, m, m.lin.bias + x.sum())

    m = _Named(jax.random.key(0))
    compiled = step.compile(m, jax.ShapeDtypeStruct((3,), jnp.float32))
    assert compiled is step.compiled
    m = step(m, jnp.ones(3))
    assert step.stats.compiles == 1 and m.axis_name == "batch" and m.act is jax.nn.relu


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_what_a_permitted_compile_runs_eagerly_while_it_traces_is_part_of_the_compile(level):
    # equinox's enums and diffrax's checks run eager ops under
    # jax.ensure_compile_time_eval while the step traces (a first call in warm-up).
    # At off a loop engages only JAX's own guard, and compiles are not checked:
    # such a compile was refused there (the diffrax port failed at off).
    def step(s):
        with jax.ensure_compile_time_eval():
            c = jnp.asarray(2.0) * 3
        return {"x": s["x"] * c}

    f = jc.hot_step(step, state="s")
    s = {"x": jnp.ones(3)}
    with jc.checks_level(level):
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(3)):
                s = f(s)
        assert jc.fetch(s["x"]).tolist() == [216.0] * 3 and f.stats.compiles == 1
        with pytest.raises(jc.TransferError), jc.hot_loop(compiles="allow"):  # outside a compile, refused
            jnp.asarray(2.0) * 3


def test_a_changed_eqx_state_leaf_is_named_by_its_state_index():
    # eqx.nn.State registers no keys: JAX names its leaves [<flat index 1>];
    # the message names them by the index's marker (the layer's path)
    class Net(eqx.Module):
        lin: eqx.nn.Linear
        norm: eqx.nn.BatchNorm

        def __init__(self, key):
            self.lin = eqx.nn.Linear(3, 4, key=key)
            self.norm = eqx.nn.BatchNorm(4, axis_name="batch", mode="batch")

        def __call__(self, x, state):
            return self.norm(self.lin(x), state)

    model, state = eqx.nn.make_with_state(Net)(jax.random.key(0))

    @jc.hot_step(state="state")
    def step(model, state, xs):
        batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        ys, state = batched(xs, state)
        return state, ys.sum()

    xs = jnp.ones((5, 3))
    state, _ = step(model, state, xs)
    half = jax.tree.map(lambda x: x.astype(jnp.float16) if x.dtype == jnp.float32 else x, state)
    with pytest.raises(jc.RecompileError) as info:
        step(model, half, xs)
    text = str(info.value)
    assert "state['Net.norm.batch_state_index'][0]: compiled with f32[4], called with f16[4]" in text
    assert "flat index" not in text
    assert "state['Net.norm.batch_state_index'][1]" in str(step.report())


def test_a_python_number_returned_where_the_state_held_an_array_is_carried_as_that_array():
    # diffrax's solver.step returns (False, f) where solver.init gave
    # (jnp.array(True), f): eqx.filter_jit hands back the bool (a second
    # compile); a hot step returns the array, as jax.jit does, and compiles once
    class Scale(eqx.Module):
        fn: object  # a function: the Module is filtered
        k: jax.Array

    @jc.hot_step(state="state")
    def advance(module, state):
        first, y = state
        return (False, module.fn(y) * module.k), jnp.sum(y), 7

    module, state = Scale(jnp.negative, jnp.array(2.0)), (jnp.array(True), jnp.ones(3))
    for _ in range(3):
        state, total, seven = advance(module, state)
    assert isinstance(state[0], jax.Array) and state[0].dtype == jnp.bool_ and not bool(state[0])
    assert jc.fetch(state[1]).tolist() == [-8.0] * 3 and advance.stats.compiles == 1
    assert type(seven) is int and seven == 7  # a number elsewhere: as eqx.filter_jit returns it


# -- issue 39, "Names": a consumed Module's leaf, a learning rate per step ----


_CONSUMED_MODULE = """
class Model(eqx.Module):
    lin: eqx.nn.Linear

    def __init__(self, key):
        self.lin = eqx.nn.Linear(3, 2, key=key)

    def __call__(self, x):
        return self.lin(x)


@jc.hot_step(state="model")
def fit(model, x):
    grads = eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(x) ** 2))(model)
    return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads))


x = jnp.ones((4, 3))
model = fit(Model(jax.random.key(0)), x)
old = model
model = fit(model, x)
errors = []
for use in (lambda: old.lin.weight + 1, lambda: old(x[0])):  # a read; a call of the Module
    try:
        use()
    except jc.DonationError as err:
        errors.append(err)
"""


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("where", ["a script", "a function"])
def test_a_consumed_modules_weight_is_named_by_its_path_read_or_called(level, where):
    # A Module is callable, and callables were skipped when the user's frame
    # was searched for the array: it said "an array (f32[2,3])". A read inside
    # the Module's own __call__ is named by the caller's name for it.
    from _program import run_program

    with jc.checks_level(level):
        namespace = run_program(_CONSUMED_MODULE, "x = jnp.ones", where, {"jc": jc, "jax": jax, "jnp": jnp, "eqx": eqx}, "errors")
    read, called = namespace["errors"]
    for err in (read, called):
        if level == "full":  # the step's record of what its call consumed names it
            assert str(err).startswith("`old.lin.weight` (f32[2,3]) was donated to fit."), str(err)
            continue
        assert str(err).startswith(
            "`old.lin.weight` (f32[2,3]) was deleted: most likely donated to an earlier call ("
        ), str(err)
        assert "donated to fit" not in str(err)  # a Module is no jc.state: nothing records it below full


def _lr_model():
    class Model(eqx.Module):
        lin: eqx.nn.Linear

        def __call__(self, x):
            return self.lin(x)

    return Model(eqx.nn.Linear(3, 2, key=jax.random.key(0)))


def _lr_loss(model, x):
    return jnp.sum(jax.vmap(model)(x) ** 2)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_learning_rate_changed_per_step_is_named_in_the_recompile_diff(level):
    # equinox's examples pass the optimizer to the step; one rebuilt per step
    # with a new learning rate is a new static value. The diff named two
    # functions `chain.<locals>.update_fn` alike: it names the number they
    # close over now, and says how to change it without a compile.
    optax = pytest.importorskip("optax")

    @jc.hot_step(state=("model", "opt_state"), static="optim")
    def make_step(model, opt_state, optim, x):
        grads = eqx.filter_grad(_lr_loss)(model, x)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state

    class Trainer(eqx.Module):  # the optimizer inside a Module: its functions static leaves
        model: eqx.Module
        opt_state: object
        optim: object

    @jc.hot_step(state="t")
    def trainer_step(t, x):
        grads = eqx.filter_grad(_lr_loss)(t.model, x)
        updates, opt_state = t.optim.update(grads, t.opt_state, eqx.filter(t.model, eqx.is_array))
        return Trainer(eqx.apply_updates(t.model, updates), opt_state, t.optim)

    x = jnp.ones((4, 3))
    with jc.checks_level(level):
        model = _lr_model()
        opt_state = optax.adam(0.1).init(eqx.filter(model, eqx.is_array))
        model, opt_state = make_step(model, opt_state, optax.adam(0.1), x)
        with pytest.raises(jc.RecompileError) as static:
            make_step(model, opt_state, optax.adam(0.05), x)
        with pytest.raises(jc.RecompileError) as same:  # a new optimizer, the same numbers
            make_step(model, opt_state, optax.adam(0.1), x)
        t = trainer_step(Trainer(model, opt_state, optax.adam(0.1)), x)
        with pytest.raises(jc.RecompileError) as field:
            trainer_step(Trainer(t.model, t.opt_state, optax.adam(0.05)), x)
    for err in (static.value, field.value):
        text = str(err)
        assert (
            "-> step_size: -0.1 vs -0.05 (f -> name: a value f closes over, "
            "such as an optimizer's learning rate" in text
        ), text
        assert "optax.inject_hyperparams(optax.adam)(learning_rate=lr)" in text
    assert ".update -> update_fns[1] -> tx.update -> step_size: -0.1 vs -0.05" in str(static.value)
    assert "t.optim.update: compiled with chain.<locals>.update_fn" in str(field.value)
    assert "update_fn -> update_fns[1] -> tx.update -> step_size" in str(field.value)
    # what the two functions hold is equal: the objects alone differ, and nothing else is named
    assert "step_size" not in str(same.value) and "learning rate" not in str(same.value)
    assert ".update: chain.<locals>.update_fn (object id" in str(same.value)


# -- issue 51 section 5: a Python-float learning rate beside a Module ---------


class _Carry(NamedTuple):
    model: object
    lr: object


def _carry_step(c, x):
    grads = eqx.filter_grad(_lr_loss)(c.model, x)
    return _Carry(eqx.apply_updates(c.model, jax.tree.map(lambda g: -c.lr * g, grads)), c.lr)


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("holds", ["an equinox Module", "a dict"])
def test_a_python_float_where_a_device_learning_rate_was_compiled_is_named_as_a_transfer(level, holds):
    # Compiled with the learning rate a device scalar, called with a Python
    # float. Beside a dict of arrays, that was a TransferError naming `c.lr`;
    # beside an equinox Module the float made the state filtered (as
    # eqx.filter_jit would have it), and the refusal compared the two nodes:
    # "c: compiled with Carry of 2, called with Filtered", no leaf, no fix.
    step = jc.hot_step(_carry_step, state="c")
    x = jnp.ones((4, 3))
    with jc.checks_level(level):
        model = _lr_model()
        if holds == "a dict":
            model = {"lin": {"weight": model.lin.weight, "bias": model.lin.bias}}
            step = jc.hot_step(lambda c, x: _Carry(jax.tree.map(lambda w: w - c.lr * w, c.model), c.lr), state="c")
        c = _Carry(model, jnp.float32(0.1))
        del model  # held by the state alone (a kept leaf is refused at full)
        c = step(c, x)
        with pytest.raises(jc.TransferError) as info:
            step(c._replace(lr=0.05), x)
    text, fix = str(info.value), info.value.fix
    del info  # its traceback's frames hold the state's leaves (a kept leaf is refused at full)
    assert "1 argument leaf is on the host" in text and "  c.lr: ~f32[] (Python float)" in text, text
    assert "Filtered" not in text and "Carry of 2" not in text
    assert "c = jc.device_tree(c)" in fix
    assert not jax.tree.leaves(c.model)[0].is_deleted()  # refused before dispatch
    assert step.stats.compiles == 1
    with jc.checks_level(level):  # the fix it names works: the float beside the Module goes to the device
        c = jc.device_tree(c._replace(lr=0.05))
        c = step(c, x)
    assert step.stats.compiles == 1 and float(jc.fetch(c.lr)) == pytest.approx(0.05)
