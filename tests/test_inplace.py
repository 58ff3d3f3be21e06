"""States updated in place: a flax NNX step that mutates its objects and
returns nothing, as flax's docs write it first (issue 38, item 1).

Before, such a step compiled, ran and trained nothing (0 leaves donated, every
contract passing). Now the objects named in ``state=`` are carried as
``nnx.jit`` carries them: their arrays donated and proven, the new arrays
written back into the caller's objects; an argument updated in place that
nothing carries, and a named state that is never carried, are refused at
compile, naming the parameter.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SYNC_ERRORS

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxcontracts as jc  # noqa: E402


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(3, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.do = nnx.Dropout(0.2, rngs=rngs)
        self.l2 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.do(nnx.relu(self.bn(self.l1(x)))))


def _objects():
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"))
    return model, optimizer, metrics


def train_step(model, optimizer, metrics, batch):  # the NNX tutorial's shape: returns nothing
    def loss_fn(model):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    metrics.update(loss=loss)
    optimizer.update(model, grads)


def _batches(n):
    rng = np.random.default_rng(0)
    for _ in range(n):
        x = rng.normal(size=(32, 3)).astype(np.float32)
        yield {"x": x, "y": x.sum(axis=1, keepdims=True)}


def _read(model, optimizer, metrics):
    return (
        np.array(jc.fetch(model.l1.kernel[...])),
        int(jc.fetch(optimizer.step[...])),
        float(jc.fetch(metrics.compute()["loss"])),
    )


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_an_nnx_step_that_mutates_its_objects_trains_them_as_nnx_jit_does(level):
    expected = _objects()
    reference = nnx.jit(train_step)
    for batch in _batches(5):
        reference(*expected, batch)

    objects = _objects()
    model = objects[0]
    step = jc.hot_step(train_step, state=("model", "optimizer", "metrics"), host="batch")
    with jc.checks_level(level), jc.hot_loop(compiles="warmup") as loop:
        for batch in loop.iterate(_batches(5)):
            step(*objects, batch)
    got, want = _read(*objects), _read(*expected)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)  # the weights changed as nnx.jit's did
    assert got[1:] == want[1:] == (5, got[2]) and got[2] > 0
    assert not model.l1.kernel[...].is_deleted()  # the objects hold the new arrays
    described = step.describe().current  # every leaf of the three objects donated, and proven
    assert len(described.donated) == 26 and set(described.aliased) == set(described.donated)
    assert "(26 leaves donated)" in str(step.report())
    assert "outputs 0 B" not in str(step.report())


def test_an_eval_view_sharing_the_variables_sees_the_new_arrays():
    model, optimizer, metrics = _objects()
    view = nnx.view(model, deterministic=True, use_running_average=True) if hasattr(nnx, "view") else None
    if view is None:
        pytest.skip("this flax has no nnx.view")
    step = jc.hot_step(train_step, state=("model", "optimizer", "metrics"), host="batch")
    evaluate = jc.hot_step(lambda m, x: m(x), stateless=True)
    x = jnp.ones((4, 3))
    before = np.array(evaluate(view, x))
    for batch in _batches(3):
        step(model, optimizer, metrics, batch)
    assert view.l1.kernel[...] is model.l1.kernel[...]  # the same Variable, written back
    after = np.array(evaluate(view, x))
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, np.array(nnx.view(model, deterministic=True, use_running_average=True)(x)), rtol=1e-5)


def test_an_object_updated_in_place_but_not_named_is_refused_at_compile_naming_it():
    model, optimizer, metrics = _objects()
    kernel = model.l1.kernel[...]
    step = jc.hot_step(train_step, state=("model", "optimizer"), host="batch")
    with pytest.raises(jc.DefinitionError) as info:
        step(model, optimizer, metrics, next(_batches(1)))
    err = info.value
    assert "updates `metrics` in place, and nothing carries the new value out of the compiled step" in str(err)
    assert '@jc.hot_step(state=("model", "optimizer", "metrics"))' in err.fix
    assert err.leaves == ("metrics",)
    assert not kernel.is_deleted() and int(jc.fetch(optimizer.step[...])) == 0  # nothing ran


def test_a_stateless_step_that_returns_the_new_state_of_what_it_updates_runs(tmp_path):
    """flax's Gemma trainer shape (issue 51, section 5): the step updates its
    objects in place and returns ``nnx.state(...)`` of them; the caller writes
    it back with ``nnx.update``. The update is carried out (the returned leaves
    are the very new values), so nothing is lost and nothing is refused; the
    same for an eval step that returns its metrics object."""

    def stateless_train(model, optimizer, metrics, batch):
        train_step(model, optimizer, metrics, batch)
        return nnx.state((model, optimizer, metrics))

    def stateless_eval(metrics, batch):
        metrics.update(loss=jnp.mean(batch["y"]))
        return metrics

    model, optimizer, metrics = _objects()
    ref_model, ref_optimizer, ref_metrics = _objects()
    step = jc.hot_step(stateless_train, stateless=True, host="batch")
    for batch in _batches(3):
        nnx.update((model, optimizer, metrics), step(model, optimizer, metrics, batch))
        nnx.jit(train_step)(ref_model, ref_optimizer, ref_metrics, batch)
    got, want = _read(model, optimizer, metrics), _read(ref_model, ref_optimizer, ref_metrics)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    assert got[1:] == pytest.approx(want[1:], rel=1e-5) and got[1] == 3
    evaluate = jc.hot_step(stateless_eval, stateless=True, host="batch")
    metrics.reset()
    metrics = evaluate(metrics, next(_batches(1)))
    assert float(jc.fetch(metrics.compute()["loss"])) == pytest.approx(float(np.mean(next(_batches(1))["y"])))


def test_a_step_that_returns_only_part_of_what_it_updates_is_still_refused():
    def half(model, optimizer, metrics, batch):
        train_step(model, optimizer, metrics, batch)
        return nnx.state(model)  # the optimizer's and the metrics' updates are lost

    model, optimizer, metrics = _objects()
    with pytest.raises(jc.DefinitionError, match=r"updates `optimizer`, `metrics` in place"):
        jc.hot_step(half, stateless=True, host="batch")(model, optimizer, metrics, next(_batches(1)))
    assert int(jc.fetch(optimizer.step[...])) == 0


def _swap(s, x):
    s["a"], s["b"] = s["b"], s["a"]  # no new leaf: the same arrays in other places
    return x * 2


def _drop(s, x):
    del s["b"]
    return x * 2


def _one_returned(s, x):
    s["a"] = s["a"] + 1
    return s["a"]  # the new leaf alone: the caller's dict keeps its old array


@pytest.mark.parametrize("fn", [_swap, _drop, _one_returned])
def test_an_in_place_change_the_output_does_not_hand_back_whole_is_still_refused(fn):
    # a stateless step hands an update back only with the argument's whole new value
    s = {"a": jnp.zeros(2), "b": jnp.ones(2)}
    with pytest.raises(jc.DefinitionError, match=r"updates `s` in place, and nothing carries"):
        jc.hot_step(fn, stateless=True)(s, jnp.ones(2))


def test_a_dict_changed_inside_the_step_is_refused_with_the_return_fix():
    def bump(s, extra):
        s["w"] = s["w"] + 1  # a container passed to a compiled step is a copy inside it
        extra["n"] = extra["n"] + 1
        return s

    s, extra = {"w": jnp.zeros(2)}, {"n": jnp.zeros(())}
    with pytest.raises(jc.DefinitionError, match=r"updates `extra` in place") as info:
        jc.hot_step(bump, state="s")(s, extra)
    assert info.value.fix.startswith("return the new value and rebind it")
    assert not s["w"].is_deleted()


def test_a_rng_count_advanced_in_a_module_merged_from_an_unreturned_state_is_refused():
    # Dropout inside nnx.merge(graphdef, state): the merged module shares the
    # state's Variables, so each call advances the rng count in `state`; not
    # returned, the count would never advance (the same mask on every call).
    model = MLP(nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def forward(state, x):
        return nnx.merge(graphdef, state)(x)

    with pytest.raises(jc.DefinitionError, match=r"updates `state` in place"):
        jc.hot_step(forward, stateless=True)(state, jnp.ones((4, 3)))

    def forward_returning(state, x):
        m = nnx.merge(graphdef, state)
        return m(x), nnx.state(m)

    step = jc.hot_step(forward_returning, state="state")
    _, state = step(state, jnp.ones((4, 3)))
    _, state = step(state, jnp.ones((4, 3)))
    assert int(jc.fetch(state["do"]["rngs"]["count"][...])) == 2


def test_a_kept_array_of_an_object_is_refused_before_dispatch_with_the_objects_intact():
    model, optimizer, metrics = _objects()
    step = jc.hot_step(train_step, state=("model", "optimizer", "metrics"), host="batch")
    batches = _batches(3)
    with jc.checks_level("full"):
        step(model, optimizer, metrics, next(batches))
        kept = model.l1.kernel[...]  # a sample of the weights, kept
        with pytest.raises(jc.DonationError, match=r"model\.l1\.kernel"):
            step(model, optimizer, metrics, next(batches))
        assert not kept.is_deleted() and int(jc.fetch(optimizer.step[...])) == 1
        del kept
        step(model, optimizer, metrics=metrics, batch=next(batches))  # by keyword too
    assert int(jc.fetch(optimizer.step[...])) == 2


def test_under_an_outer_jit_the_step_mutates_the_traced_objects_as_nnx_does():
    model, optimizer, metrics = _objects()
    step = jc.hot_step(train_step, state=("model", "optimizer", "metrics"), host="batch")
    batch = next(_batches(1))

    @nnx.jit
    def twice(model, optimizer, metrics, batch):
        step(model, optimizer, metrics, batch)
        step(model, optimizer, metrics, batch)

    twice(model, optimizer, metrics, jax.tree.map(jnp.asarray, batch))
    assert int(jc.fetch(optimizer.step[...])) == 2 and step.stats.traced_calls == 2


def test_a_second_signature_and_a_checks_level_change_keep_writing_back():
    # a new batch shape compiles a second signature from inside the call path:
    # its slow path must hand back what the executable returns, not the output
    # (it did: "iteration over a 0-d array"); and the step after a level change
    objects = _objects()
    step = jc.hot_step(train_step, state=("model", "optimizer", "metrics"), host="batch", max_compiles=2)
    small = {k: v[:8] for k, v in next(_batches(1)).items()}
    step(*objects, next(_batches(1)))
    step(*objects, small)  # compiles its second signature
    with jc.checks_level("off"):
        step(*objects, small)
    step(*objects, next(_batches(1)))
    assert _read(*objects)[1] == 4 and step.stats.compiles == 2


def test_a_static_attribute_that_differs_inside_a_module_is_named_by_its_attribute():
    model, _, metrics = _objects()

    @jc.hot_step(state="metrics")
    def evaluate(model, metrics, x):
        metrics.update(loss=model(x).mean())

    model.eval()
    evaluate(model, metrics, jnp.ones((4, 3)))
    model.train()  # flips use_running_average and deterministic: a new signature
    with pytest.raises(jc.RecompileError) as info:
        evaluate(model, metrics, jnp.ones((4, 3)))
    text = str(info.value)
    assert "model.bn: compiled with BatchNorm" in text
    assert "it differs at .use_running_average: True vs False" in text
    assert "model.do: compiled with Dropout" in text and ".deterministic: True vs False" in text


class _Pooled(nnx.Module):
    """A model that makes its own partial in __init__, as flax's examples do."""

    def __init__(self, rngs, window=2):
        import functools

        self.lin = nnx.Linear(4, 4, rngs=rngs)
        self.pool = functools.partial(nnx.avg_pool, window_shape=(window,), strides=(window,))

    def __call__(self, x):
        return self.pool(self.lin(x)[..., None])[..., 0]


def _pooled_eval():
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"))

    @jc.hot_step(state="metrics")
    def evaluate(model, metrics, x):
        metrics.update(loss=model(x).mean())

    return evaluate, metrics


def test_a_second_instance_holding_its_own_partial_takes_the_same_executable():
    # Each instance's partial is a new object (partials compare by identity):
    # before, the second instance was a new signature, refused at max_compiles=1.
    evaluate, metrics = _pooled_eval()
    first, second = _Pooled(nnx.Rngs(0)), _Pooled(nnx.Rngs(1))
    x = jnp.ones((2, 4))
    evaluate(first, metrics, x)  # compiles, before the loop
    with jc.hot_loop():
        for model in (second, first, second):
            evaluate(model, metrics, x)
    assert evaluate.stats.compiles == 1 and len(evaluate.signatures) == 1
    assert evaluate.stats.shared == 1  # the second instance's structure, matched once
    assert "shared executable: 1 new argument structure(s) took a compiled signature" in str(evaluate.report())
    losses = {id(m): float(jnp.mean(m(x))) for m in (first, second)}
    assert losses[id(first)] != losses[id(second)]  # each instance's own weights were used
    expected = np.mean([losses[id(m)] for m in (first, second, first, second)])
    np.testing.assert_allclose(float(metrics.compute()["loss"]), expected, rtol=1e-6)


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_partials_equal_by_value_share_the_executable_at_every_level(level):
    evaluate, metrics = _pooled_eval()
    x = jnp.ones((2, 4))
    with jc.checks_level(level):
        for seed in range(12):  # more instances than aliases kept: the oldest ones go
            evaluate(_Pooled(nnx.Rngs(seed)), metrics, x)
    assert evaluate.stats.compiles == 1


def test_a_partial_with_other_arguments_is_a_new_signature_and_says_what_differs():
    evaluate, metrics = _pooled_eval()
    evaluate(_Pooled(nnx.Rngs(0)), metrics, jnp.ones((2, 4)))
    with pytest.raises(jc.RecompileError) as info:
        evaluate(_Pooled(nnx.Rngs(1), window=4), metrics, jnp.ones((2, 4)))
    text = str(info.value)
    assert "it differs at .pool.keywords['window_shape'][0]: 2 vs 4" in text
    assert "compare by identity" not in text


def test_two_models_trained_in_place_by_one_step_each_keep_their_own_updates():
    # An ensemble (or a model and its copy) trained alternately: each instance
    # holds its own partial; the one executable updates whichever it is given.
    @jc.hot_step(state=("model", "optimizer"))
    def train(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: (m(x) ** 2).mean())(model)
        optimizer.update(model, grads)
        return loss

    models = [_Pooled(nnx.Rngs(i)) for i in range(2)]
    tx = optax.sgd(0.1)  # one optimizer definition: its functions are shared
    optimizers = [nnx.Optimizer(m, tx, wrt=nnx.Param) for m in models]
    before = [np.array(m.lin.kernel[...]) for m in models]  # copies (np.asarray would be a view)
    x = jnp.ones((2, 4))
    with jc.checks_level("full"), jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(3)):
            for model, optimizer in zip(models, optimizers):
                train(model, optimizer, x)
    assert train.stats.compiles == 1 and train.stats.not_consumed == 0
    assert [int(o.step[...]) for o in optimizers] == [3, 3]
    for model, w in zip(models, before):  # each one's own weights moved
        assert not np.allclose(np.asarray(model.lin.kernel[...]), w)


def test_compiling_for_a_second_instance_with_its_own_partial_compiles_nothing():
    evaluate, metrics = _pooled_eval()
    x = jnp.ones((2, 4))
    first = evaluate.compile(_Pooled(nnx.Rngs(0)), metrics, x)
    assert evaluate.compile(_Pooled(nnx.Rngs(1)), metrics, x) is first  # was: RecompileError (max_compiles=1)
    assert evaluate.stats.compiles == 1


# -- issue 39, "Names": a model updated with a consumed state, then used ------

_UPDATED_WITH_CONSUMED = """
class Net(nnx.Module):
    def __init__(self, rngs):
        # shapes no other test uses: where JAX's C++ dispatch has run dot_general on these
        # shapes before, the use is XLA's own "Buffer has been deleted or donated" ValueError
        self.l1 = nnx.Linear(7, 11, rngs=rngs)

    def __call__(self, x):
        return self.l1(x)


model = Net(nnx.Rngs(0))
graphdef, state = nnx.split(model)


@jc.hot_step(state="state")
def fit(state, x):
    m = nnx.merge(graphdef, state)
    grads = nnx.grad(lambda m: (m(x) ** 2).mean())(m)
    return jax.tree.map(lambda p, g: p - 0.1 * g, state, nnx.state(grads))


x = jnp.ones((13, 7))
new_state = fit(state, x)
nnx.update(model, state)  # the state fit consumed, not new_state
errors = []
for use in (lambda: model(x), lambda: np.asarray(model.l1.kernel.get_value())):
    try:
        use()
    except jc.DonationError as err:
        errors.append(err)
nnx.update(model, new_state)
y = model(x)
"""


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("where", ["a script", "a function"])
def test_a_model_updated_with_a_consumed_state_then_used_is_named_by_its_path(level, where):
    # It said "an array (f32[7,11]) was deleted": an NNX Module is callable,
    # and callables were not searched; the read inside the model's own
    # __call__ is named by the caller's name for it.
    from _program import run_program

    names = {"jc": jc, "jax": jax, "jnp": jnp, "np": np, "nnx": nnx}
    with jc.checks_level(level):
        namespace = run_program(_UPDATED_WITH_CONSUMED, "model = Net", where, names, "errors, y")
    called, read = namespace["errors"]
    for err in (called, read):
        if level == "full":  # the step's record of what its call consumed names it
            assert str(err).startswith("`model.l1.kernel.value` (f32[7,11]) was donated to fit."), str(err)
            continue
        assert str(err).startswith(
            "`model.l1.kernel.value` (f32[7,11]) was deleted: most likely donated to an earlier call ("
        ), str(err)
        assert "donated to fit" not in str(err)  # an nnx.State is no jc.state: nothing records it below full
    assert namespace["y"].shape == (13, 11)  # updated with what fit returned, the model runs


@pytest.mark.cpu_only(SYNC_ERRORS)
def test_a_step_whose_host_callback_raises_at_run_time_is_named_when_the_model_is_read():
    # It said "most likely donated to an earlier call (hot steps that donate:
    # train)": another step, not the one whose call consumed the model.
    model, optimizer, metrics = _objects()

    @jc.hot_step(state=("model", "optimizer", "metrics"))
    def train(model, optimizer, metrics, batch):
        train_step(model, optimizer, metrics, batch)

    def fail(loss):
        raise RuntimeError("a host callback failed")

    @jc.hot_step(state=("model", "optimizer", "metrics"))
    def checked_train(model, optimizer, metrics, batch):
        train_step(model, optimizer, metrics, batch)
        jax.debug.callback(fail, metrics.compute()["loss"])

    batch = jax.device_put(next(_batches(1)))
    train(model, optimizer, metrics, batch)
    with pytest.raises(Exception, match="a host callback failed"):  # noqa: PT011 - JAX's own runtime error
        checked_train(model, optimizer, metrics, batch)
        jax.block_until_ready(model.l1.kernel[...])
    with pytest.raises(jc.DonationError) as info:
        np.asarray(model.l1.kernel[...])
    assert "donated to checked_train" in str(info.value), str(info.value)
