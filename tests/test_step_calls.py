"""How a hot step may be defined and called: what Python allows is accepted.

Keywords and omitted defaults at every checks level, methods (bound once per
instance) and partials, postponed annotations naming ``TYPE_CHECKING``-only
types; specs or the class given where arrays belong are named as API misuse,
a refused call does not chain JAX's own error, wrong argument counts name the
parameters, and a step is copied like a function.

Issue 10, sections 3 and 4: calls and definitions that were refused wrongly.
"""

from __future__ import annotations

import functools
import pathlib
import re
import typing
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float32

import jaxcontracts as jc

try:  # imported at collection, as JAX options it registers must be before any step compiles
    import equinox as eqx
except ImportError:  # pragma: no cover - the test extra installs it
    eqx = None

if TYPE_CHECKING:  # never imported at run time: the annotation stays a string
    from collections.abc import Mapping as Metrics

    import helpers as later


@jc.state
class S:
    u: Float32[Array, "n"]


# -- keywords and defaults at every checks level ------------------------------


ZERO = jnp.float32(0)


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_keywords_and_omitted_defaults_work_at_every_level(level):
    def scale_fn(s: S, k: Float32[Array, ""], *, bias: Float32[Array, ""] = ZERO) -> S:
        return S(u=s.u * k + bias)

    jc.set_checks(level)
    step = jc.hot_step(scale_fn)
    k = jnp.float32(2)
    s = step(S.zeros(n=3), k)
    s = step(s, k=k)  # a keyword, the default omitted
    s = step(s=s, k=k, bias=jnp.float32(1))
    s = step(s, k, bias=jnp.float32(1))
    assert step.stats.compiles == 1
    assert jnp.all(s.u == 3)


# -- methods and partials -----------------------------------------------------


class Trainer:
    def __init__(self, rate: float) -> None:
        self.rate = rate

    @jc.hot_step
    def step(self, s: S) -> S:
        return S(u=s.u + self.rate)

    @jc.hot_step(signature=S, donate="none")
    def scaled(self, s: S, k: Float32[Array, ""]) -> S:
        return S(u=s.u * k * self.rate)


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_a_method_step_closes_over_self(level):
    jc.set_checks(level)
    a, b = Trainer(1.0), Trainer(10.0)
    s = a.step(S.zeros(n=3))
    s = a.step(s)
    assert jnp.all(s.u == 2)
    assert a.step is a.step  # bound once, kept on the instance
    assert a.step.stats.compiles == 1
    t = b.step(S.zeros(n=3))  # another instance: its own configuration
    assert jnp.all(t.u == 10)
    t = Trainer.step(b, t)  # through the class, as for any method
    assert jnp.all(t.u == 20)
    u = a.scaled(s, k=jnp.float32(2))
    assert jnp.all(u.u == 4)
    assert a.step.describe().params == ("s",)


def test_an_unbound_method_step_says_to_use_an_instance():
    with pytest.raises(jc.DefinitionError, match=r"is a method.*instance"):
        Trainer.step.compile(S.spec(n=3))
    with pytest.raises(TypeError, match="call it on an instance"):
        Trainer.step()


def test_a_partial_closes_over_its_bound_keywords():
    def scale_fn(s: S, *, scale: float) -> S:
        return S(u=(s.u + 1) * scale)

    step = jc.hot_step(functools.partial(scale_fn, scale=2.0))
    s = step(S.zeros(n=3))
    assert jnp.all(s.u == 2)
    assert step.describe().params == ("s",)
    assert "scale_fn" in step.describe().name
    with pytest.raises(TypeError, match="scale"):
        step(s, scale=3.0)  # configuration, fixed when the step was made


# -- postponed annotations naming TYPE_CHECKING-only types --------------------


def test_a_type_checking_only_type_in_the_return_annotation_is_accepted():
    def with_metrics(s: S) -> tuple[S, Metrics]:
        return S(u=s.u + 1), {"sum": s.u.sum()}

    for step in (jc.hot_step(with_metrics), jc.hot_step(with_metrics, signature=S)):
        s, metrics = step(S.zeros(n=3))
        assert step.state_type is S
        assert jnp.all(s.u == 1) and "sum" in metrics


def test_a_type_checking_only_state_type_is_matched_by_name():
    def only_names(s: later.S, m: Metrics) -> later.S:
        return s

    with pytest.raises(jc.DefinitionError, match="cannot be resolved"):
        jc.hot_step(only_names)
    step = jc.hot_step(only_names, signature=S)  # later.S, by name: S
    assert step.describe().state_params == ("s",)


# -- the class or specs where arrays belong: API misuse, not a transfer -------


def _scale(s: S, k: Float32[Array, ""]) -> S:
    return S(u=s.u * k)


@pytest.mark.parametrize("level", ["full", "off"])
def test_compile_with_the_class_itself_points_to_spec(level):
    jc.set_checks(level)
    step = jc.hot_step(_scale)
    k = jax.ShapeDtypeStruct((), jnp.float32)
    with pytest.raises(jc.DefinitionError, match=r"given the class S itself for `s`") as info:
        step.compile(S, k)
    assert "_scale.compile(S.spec(...))" in info.value.fix
    with pytest.raises(jc.DefinitionError, match="the class S itself"):
        step.lower(S, k)


@pytest.mark.parametrize("level", ["full", "off"])
@pytest.mark.parametrize("compiled_first", [False, True])
def test_a_call_with_specs_or_the_class_says_to_pass_arrays(level, compiled_first):
    jc.set_checks(level)
    step = jc.hot_step(_scale)
    k = jnp.float32(2)
    if compiled_first:
        step(S.zeros(n=3), k)
    with pytest.raises(jc.DefinitionError, match=r"called with specs") as info:
        step(S.spec(n=3), k)
    assert list(info.value.leaves) == ["s.u"]
    assert "S.zeros(...)" in info.value.fix and "compile" in info.value.fix
    with pytest.raises(jc.DefinitionError, match="called with the class S itself") as info:
        step(S, k)
    assert "S.zeros(...)" in info.value.fix


# -- a refused call does not chain JAX's own error ----------------------------


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_a_refused_call_does_not_chain_the_executables_type_error(level):
    import traceback

    jc.set_checks(level)
    step = jc.hot_step(_scale)
    s = step(S.zeros(n=3), jnp.float32(1))
    with pytest.raises(jc.RecompileError) as info:
        step(s, jnp.int32(1))  # the executable refuses it with a TypeError first
    err = info.value
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)
    assert "During handling" not in "".join(traceback.format_exception(err))


# -- wrong argument counts; copying a step ------------------------------------


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_too_many_or_too_few_arguments_name_the_parameters(level):
    jc.set_checks(level)
    step = jc.hot_step(_scale)
    k = jnp.float32(1)
    s = step(S.zeros(n=3), k)
    with pytest.raises(jc.DefinitionError, match=r"too many positional arguments[\s\S]*parameters: _scale\(s, k\)[\s\S]*Fix: call it as _scale\(s, k\)"):
        step(s, k, k)
    with pytest.raises(jc.DefinitionError, match=r"missing a required argument: 'k'[\s\S]*parameters: _scale\(s, k\)"):
        step(s)
    step(s, k)  # the state was not consumed by the refused calls


def test_a_step_is_copied_like_a_function_and_a_bound_one_follows_its_instance():
    import copy
    import pickle

    step = jc.hot_step(_scale)
    step(S.zeros(n=3), jnp.float32(1))
    assert copy.deepcopy(step) is step
    assert copy.copy(step) is step
    assert copy.deepcopy({"step": step})["step"] is step
    assert pickle.loads(pickle.dumps(Trainer.step)) is Trainer.step  # by reference
    a = Trainer(1.0)
    a.step(S.zeros(n=3))
    b = copy.deepcopy(a)
    b.rate = 5.0
    assert b.step is not a.step
    assert jnp.all(b.step(S.zeros(n=3)).u == 5)  # bound to the copy, not to `a`
    assert jnp.all(a.step(S.zeros(n=3)).u == 1)


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_keyword_calls_take_the_call_path_not_the_slow_path(level, monkeypatch):
    # PPO's update(runner_state, config=config): keywords bound without inspect.
    from jaxcontracts._step import hot_step as _hot_step

    class Config(typing.NamedTuple):
        lr: float

    def update(state, batch, *, config):
        return {"w": state["w"] - config.lr * batch}, batch.sum()

    def plain(state, batch):
        return {"w": state["w"] - batch}, batch.sum()

    static = jc.hot_step(update, state="state", static="config")
    bare = jc.hot_step(plain, state="state")
    config, batch = Config(0.1), jnp.ones(3)
    with jc.checks_level(level):
        s, _ = static({"w": jnp.zeros(3)}, batch, config=config)
        t, _ = bare({"w": jnp.zeros(3)}, batch=batch)
        slow = []
        real = _hot_step._decide
        monkeypatch.setattr(_hot_step, "_decide", lambda *a: slow.append(1) or real(*a))
        for _ in range(5):
            s, _ = static(s, batch, config=config)
            s, _ = static(state=s, batch=batch, config=config)  # any keyword shape that names all
            t, _ = bare(t, batch=batch)
            t, _ = bare(batch=batch, state=t)
        assert slow == []
    assert jnp.allclose(s["w"], -1.1) and jnp.allclose(t["w"], -11.0)
    with pytest.raises(TypeError, match="does not match the step's parameters"):
        bare(t, batsh=batch)  # a wrong name: the slow path binds and explains


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_omitted_defaults_take_the_call_path_not_the_slow_path(level, monkeypatch):
    # optax's update(updates, state, params=None) called as update(g, state):
    # the call path's one keyword binder puts the defaults in by position,
    # with neither the slow path nor inspect's bind (which cost 50 us a
    # call), static ones included, and no wrapper in front of the closure.
    import inspect

    from jaxcontracts._step import hot_step as _hot_step

    class Config(typing.NamedTuple):
        lr: float = 0.5

    def update(grads, state, params=None, *, scale=ZERO + 1):
        return {"w": state["w"] - grads * scale}

    def configured(state, config=Config()):  # noqa: B008 - a default config, as users write it
        return {"w": state["w"] - config.lr}

    plain = jc.hot_step(update, state="state")
    given = jc.hot_step(update, state="state")
    static = jc.hot_step(configured, state="state", static="config")
    g = jnp.ones(3)
    with jc.checks_level(level):
        s = plain(g, {"w": jnp.zeros(3)}, None, scale=ZERO + 1)
        u = given(g, given(g, {"w": jnp.zeros(3)}, None, scale=ZERO + 1), None, scale=ZERO + 1)
        s = plain(g, s)
        s = plain(g, s, scale=ZERO + 2)
        t = static(static({"w": jnp.zeros(3)}, Config()))
        with monkeypatch.context() as m:
            slow, binds = [], []
            real, bind = _hot_step._decide, inspect.Signature.bind
            m.setattr(_hot_step, "_decide", lambda *a: slow.append(1) or real(*a))
            m.setattr(inspect.Signature, "bind", lambda *a, **k: binds.append(1) or bind(*a, **k))
            for _ in range(5):
                s = plain(g, s)  # params and scale left out
                s = plain(g, s, scale=ZERO + 2)  # params left out, a keyword given
                s = plain(g, state=s)
                t = static(t)
                u = given(g, u, None, scale=ZERO + 1)
            assert (slow, binds) == ([], [])
        assert plain._call.__name__ == given._call.__name__  # the level's one closure
        assert plain.stats.compiles == static.stats.compiles == given.stats.compiles == 1
    assert jnp.allclose(s["w"], -24.0) and jnp.allclose(t["w"], -3.5) and jnp.allclose(u["w"], -7.0)
    this = test_omitted_defaults_take_the_call_path_not_the_slow_path.__name__
    with pytest.raises(jc.DefinitionError, match=r"missing a required argument: 'state'") as e:
        plain(g)  # a wrong call is still the slow path's to explain, at the user's line
    assert e.traceback[-1].name == this
    with pytest.raises(jc.DefinitionError, match=r"unexpected keyword argument 'parms'") as e:
        plain(g, s, parms=None)
    assert e.traceback[-1].name == this


def test_under_disable_jit_a_step_runs_its_python_function_as_jax_jit_does():
    # It raised "Disable jit is not supported in the AOT path" on every call.
    seen = []

    def advance(s):
        seen.append(type(s["x"]).__name__)  # a concrete array: op by op, no trace
        return {"x": s["x"] + 1}

    step = jc.hot_step(advance, state="s")
    s = step({"x": jnp.zeros(3)})
    with jax.disable_jit():
        s = step(s)
        fresh = jc.hot_step(advance, state="s")
        t = fresh({"x": jnp.ones(3)})
    assert fresh.stats.compiles == 0 and step.stats.compiles == 1
    assert seen[-2:] == ["ArrayImpl", "ArrayImpl"]
    assert jc.fetch(s["x"]).tolist() == [2.0] * 3 and jc.fetch(t["x"]).tolist() == [2.0] * 3
    s = step(s)  # and compiled again after it
    assert jc.fetch(s["x"]).tolist() == [3.0] * 3


# -- without the guarded C++ call (capability guarded-call missing) -----------


class _PyBox:
    """A pytree node flattened by Python callbacks: compiled over flat leaves."""

    def __init__(self, x, y):
        self.x, self.y = x, y


jax.tree_util.register_pytree_node(_PyBox, lambda b: ((b.x, b.y), None), lambda _, kids: _PyBox(*kids))


def test_at_off_without_the_guarded_call_a_state_compiled_over_flat_leaves_is_checked_for_its_tree(monkeypatch):
    # Without the guarded C++ call, `off` flattens such a state itself, and a
    # call whose tree differs (the same number of leaves in another structure)
    # goes to the slow path instead of running the executable on those leaves.
    from jaxcontracts._step import callpath as _callpath

    monkeypatch.setattr(_callpath, "guarded_call", lambda *a, **k: None)  # missing
    with jc.checks_level("off"):
        step = jc.hot_step(lambda b: _PyBox(b.x + 1, b.y * 2), state="b", max_compiles=1)
        b = step(_PyBox(jnp.zeros(2), jnp.ones(2)))
        b = step(b)
        b = step(b=b)  # a keyword: bound, then the same closure
        assert step.compiled is not None and step._current.flat_style
        assert step.stats.compiles == 1  # (off counts no calls)
        assert b.x.tolist() == [3.0, 3.0] and b.y.tolist() == [8.0, 8.0]
        with pytest.raises(jc.RecompileError):
            step((jnp.zeros(2), jnp.ones(2)))  # two leaves, another tree


@pytest.mark.parametrize("level", ["fast", "full"])
def test_without_the_guarded_call_one_closure_checks_every_call_in_python(level, monkeypatch):
    # On a jax whose pjit C++ call cannot be built around an AOT executable,
    # the full closure runs the per-signature checks on every call and calls
    # the executable itself, at both levels: same contracts, same messages.
    from jaxcontracts._step import callpath as _callpath

    asked: list[int] = []
    monkeypatch.setattr(_callpath, "guarded_call", lambda *a, **k: asked.append(1))  # None: missing
    jc.set_checks(level)
    dstep = jc.hot_step(lambda d: {"w": d["w"] + 1, "n": d["n"] + 1}, state="d", max_compiles=1)
    d = dstep({"w": jnp.zeros(3), "n": jnp.int32(0)})
    for _ in range(3):
        d = dstep(d)
    assert jc.fetch(d["n"]) == 4 and dstep.stats.compiles == 1
    with pytest.raises(jc.RecompileError, match=r"d\['w'\]"):
        dstep({"w": jnp.zeros(3, jnp.int32), "n": d["n"]})  # another dtype
    old, d = d, dstep(d)
    with pytest.raises(jc.DonationError, match="was already (deleted|donated to <lambda>)"):
        dstep(old)
    if level == "full":
        kept = [d["w"]]
        with pytest.raises(jc.DonationError, match="you still hold elsewhere"):
            dstep(d)
        assert not kept[0].is_deleted() and not d["w"].is_deleted()
        del kept
    step = jc.hot_step(_scale)
    s = step(S.zeros(n=3), jnp.float32(2))
    s = step(s, k=jnp.float32(2))  # a keyword: bound by the one binder
    assert jax.jit(lambda s: step(s, jnp.float32(1)).u)(s).shape == (3,)  # traced: the slow path
    d = dstep(d)
    assert not d["w"].is_deleted() and asked  # the call paths were built without it


class _Trainer:  # module level: its instances pickle
    def __init__(self, lr=0.5):
        self.lr = lr

    @jc.hot_step(state="t")
    def step(self, t):
        return t - self.lr * t


class _Overriding(_Trainer):
    def step(self, t):
        return super().step(t) + 100.0


def test_a_method_step_never_shadows_the_class_and_follows_copies():
    # the bound step was cached under the method's name in obj.__dict__, where
    # it shadowed the class: a subclass's override ran once, then the base step
    # (silently wrong results); copy.copy(obj) ran the original's program
    import copy
    import pickle

    child = _Overriding()
    assert [float(child.step(jnp.ones(()))) for _ in range(3)] == [100.5] * 3
    a = _Trainer()
    assert a.step(jnp.ones(2)).tolist() == [0.5, 0.5] and a.step is a.step
    assert "step" not in vars(a)
    b = copy.copy(a)
    b.lr = 0.0
    assert b.step(jnp.ones(2)).tolist() == [1.0, 1.0] and b.step is not a.step
    c = pickle.loads(pickle.dumps(a))
    assert c.step(jnp.ones(2)).tolist() == [0.5, 0.5] and c.step._bound_to[1] is c
    assert [float(_Trainer.step(child, jnp.ones(()))), float(child.step(jnp.ones(())))] == [0.5, 100.5]


def test_a_method_step_of_an_instance_hashed_by_value_follows_its_changes():
    # a schedule written into a value-hashed trainer (`unsafe_hash=True`): the
    # step ran the program compiled for the first lr, silently, where jax.jit
    # (0.11 on) re-hashes a static self (hostile round 3); an instance hashed
    # by identity reads its attributes at its compile, as documented
    import dataclasses

    @dataclasses.dataclass(unsafe_hash=True)
    class ByValue:
        lr: float

        @jc.hot_step(state="s", max_compiles=2)  # each value of `self` is a compile
        def step(self, s):
            return {"x": s["x"] * 0 + self.lr}

    class ByIdentity:
        def __init__(self, lr):
            self.lr = lr

        step = ByValue.__dict__["step"]

    for cls, want in ((ByValue, [0.1, 0.2, 0.1]), (ByIdentity, [0.1, 0.1, 0.1])):
        trainer, s, seen = cls(0.1), {"x": jnp.ones(2)}, []
        for lr in (0.1, 0.2, 0.1):
            trainer.lr = lr
            s = trainer.step(s)
            seen.append(round(float(s["x"][0]), 3))
        assert seen == want, (cls.__name__, seen)
    # the review: one bound step per hash, kept (a value seen before compiles
    # nothing: no compile per change, and none inside a loop once both are warm)
    trainer, s = ByValue(0.1), {"x": jnp.ones(2)}
    for lr in (0.1, 0.2):
        trainer.lr = lr
        s = trainer.step(s)
    with jc.hot_loop():
        for lr in (0.1, 0.2) * 3:
            trainer.lr = lr
            s = trainer.step(s)
    trainer.lr = 0.1
    assert trainer.step.stats.compiles == 1 and trainer.step.stats.calls == 4


def test_a_method_step_follows_a_frozen_instance_s_mutable_field_and_an_instance_hashable_again():
    # the second review: a frozen dataclass was taken for one that cannot
    # change (its field's object can), and one failed hash bound the whole
    # class by identity for good: both ran the program of the old values
    import dataclasses

    @dataclasses.dataclass(unsafe_hash=True)
    class Inner:
        lr: float
        tags: typing.Any = ()

        @jc.hot_step(state="s", max_compiles=2)
        def step(self, s):
            return {"x": s["x"] * 0 + self.lr}

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner

        @jc.hot_step(state="s", max_compiles=2)
        def step(self, s):
            return {"x": s["x"] * 0 + self.inner.lr}

    s = {"x": jnp.ones(2)}
    outer = Outer(Inner(0.5))
    seen = []
    for lr in (0.5, 0.25):
        outer.inner.lr = lr
        s = outer.step(s)
        seen.append(float(s["x"][0]))
    unhashable = Inner(0.5, tags=[1])  # a list field: its hash fails
    unhashable.tags, unhashable.lr = (), 0.125  # hashable again: follows its changes
    s = unhashable.step(s)
    seen.append(float(s["x"][0]))
    assert seen == [0.5, 0.25, 0.125], seen


def test_a_method_step_of_a_dataclass_that_cannot_hash_is_refused_at_its_call_as_jax_jit_refuses():
    # the sixth hostile round: a plain @dataclass (eq=True: no hash) was bound
    # by identity, and ran the program of its first values after a change;
    # jax.jit refuses it as an unhashable static argument. Refused at the
    # call (attribute access reads as ever), with the fix; a frozen one whose
    # hash fails (an array field) cannot be rebound: bound once, as before.
    import dataclasses
    import inspect

    @dataclasses.dataclass
    class Plain:
        k: float

        @jc.hot_step(state="s")
        def step(self, s):
            return {"x": s["x"] * 0 + self.k}

    plain, s = Plain(1.0), {"x": jnp.ones(2)}
    assert hasattr(plain, "step") and plain.step.stats.compiles == 0 and inspect.getmembers(plain)
    with pytest.raises(jc.DefinitionError, match=r"dataclass\(eq=False\)") as info:
        s = plain.step(s)
    assert info.traceback[-1].path == pathlib.Path(__file__)
    assert jc.fetch(s["x"]).tolist() == [1.0, 1.0]  # not consumed

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        w: jax.Array

        @jc.hot_step(state="s")
        def step(self, s):
            return {"x": s["x"] * self.w}

    frozen = Frozen(jnp.full(2, 2.0))
    for _ in range(3):
        s = frozen.step(s)
    assert jc.fetch(s["x"]).tolist() == [8.0, 8.0] and frozen.step.stats.compiles == 1


def test_a_method_step_of_an_instance_that_changed_past_max_compiles_is_refused_naming_it():
    # the sixth hostile round: each new value of a value-hashed `self` compiled
    # silently past max_compiles=1; a static argument changed so is refused
    import dataclasses

    @dataclasses.dataclass(unsafe_hash=True)
    class Trainer:
        lr: float

        @jc.hot_step(state="s")
        def step(self, s):
            return {"x": s["x"] * self.lr}

    trainer, s = Trainer(0.5), {"x": jnp.ones(2)}
    s = trainer.step(s)
    trainer.lr = 0.25
    assert trainer.step.stats.compiles == 0  # an access reads as ever: the call refuses
    with pytest.raises(jc.RecompileError) as info:
        s = trainer.step(s)
    text = str(info.value)
    assert "Trainer" in text and "max_compiles=1" in text and "max_compiles=2" in info.value.fix, text
    # the same object, hashed anew: its old value is gone, its hash then and now tell the change
    assert re.search(r"since: \S.* \(hashed -?\d+ then\) -> hashed -?\d+ now\. Each", text), text
    assert info.traceback[-1].path == pathlib.Path(__file__)
    trainer.lr = 0.5  # the value compiled for: its program
    s = trainer.step(s)
    assert jc.fetch(s["x"]).tolist() == [0.25, 0.25]
    # the review: values past the 8 kept bound steps, and a __slots__ instance, still count
    for limit, slots in ((10, False), (2, True)):
        cls = _counted_trainer(limit, slots)
        t, s = cls(0), {"x": jnp.ones(2)}
        with pytest.raises(jc.RecompileError, match=f"max_compiles={limit}"):
            for k in range(limit + 3):
                t.lr = float(k)
                s = t.step(s)
        assert k == limit


def _counted_trainer(limit, slots):
    class Trainer:
        if slots:
            __slots__ = ("lr", "__weakref__")

        def __init__(self, lr):
            self.lr = lr

        def __eq__(self, other):
            return type(other) is Trainer and other.lr == self.lr

        def __hash__(self):
            return hash(self.lr)

        @jc.hot_step(state="s", max_compiles=limit)
        def step(self, s):
            return {"x": s["x"] + self.lr}

    return Trainer


def test_a_method_step_of_an_instance_whose_hash_fails_is_refused_as_jax_jit_refuses():
    # issue 50: bound by identity while its hash failed, the step ran the
    # program of the first lr after `lr` changed (a stale program, silently);
    # jax.jit refuses a static argument that cannot hash: so does the step,
    # naming the class and the cause, at the user's line, the state intact
    # (a dataclass is compared field by field instead: the test above)
    class Trainer:
        def __init__(self, lr, tags):
            self.lr, self.tags = lr, tags

        def __eq__(self, other):
            return type(other) is Trainer and (self.lr, self.tags) == (other.lr, other.tags)

        def __hash__(self):
            return hash((self.lr, self.tags))

        @jc.hot_step(state="s", max_compiles=3)
        def step(self, s):
            return {"x": s["x"] * 0 + self.lr}

    trainer, s = Trainer(0.5, tags=["run-1"]), {"x": jnp.ones(2)}
    for _ in range(2):  # the second time too (no bind kept from the first)
        with pytest.raises(jc.DefinitionError) as info:
            s = trainer.step(s)
        message = str(info.value)
        assert "Trainer" in message and "unhashable type: 'list'" in message, message
        assert "stale" in message and "tuple" in message, message
        assert info.traceback[-1].path == pathlib.Path(__file__), info.traceback[-1]
    assert jc.fetch(s["x"]).tolist() == [1.0, 1.0]  # not consumed
    with pytest.raises(jc.DefinitionError, match="unhashable"):
        Trainer.step(trainer, s)  # the class-level call too
    trainer.tags, trainer.lr = ("run-1",), 0.25  # hashable: it follows its changes
    s = trainer.step(s)
    trainer.lr = 0.125
    s = trainer.step(s)
    assert jc.fetch(s["x"]).tolist() == [0.125, 0.125]


def test_a_method_step_of_an_equinox_module_pays_no_hash_per_call(monkeypatch):
    # an equinox Module cannot change and its array fields fail its hash: a
    # hash tried at every call cost 2.6 us (the review)
    if eqx is None:
        pytest.skip("equinox is not installed")
    from jaxcontracts._step import hot_step as module

    class Model(eqx.Module):
        w: jax.Array
        lr: float = 0.5

        @jc.hot_step(state="s")
        def step(self, s):
            return {"x": s["x"] * self.lr}

    model = Model(jnp.ones(2))
    s = model.step({"x": jnp.ones(2)})
    hashed = []
    monkeypatch.setattr(module, "hash", lambda o: hashed.append(o) or 0, raising=False)
    for _ in range(3):
        s = model.step(s)
    assert hashed == [] and s["x"].tolist() == [0.0625] * 2


def test_a_method_step_of_a_temporary_instance_holds_it_as_a_bound_method_does():
    import gc
    import weakref

    assert _Trainer(0.25).step(jnp.ones(2)).tolist() == [0.75, 0.75]  # nothing else holds the instance
    step = _Trainer(0.75).step
    gc.collect()
    assert step(jnp.ones(2)).tolist() == [0.25, 0.25]

    class Scale(int):  # a __dict__, no weak references
        @jc.hot_step(state="x")
        def step(self, x):
            return x * int(self)

    assert Scale(4).step(jnp.ones(2)).tolist() == [4.0, 4.0]
    t = _Trainer()
    ref = weakref.ref(t)
    t.step(jnp.ones(1))
    del t
    gc.collect()
    assert ref() is None  # the instance and its bound step, a cycle, collected


def test_a_method_step_on_a_slotted_instance_is_bound_once_and_keeps_nothing_alive():
    # issue 39: on a __slots__ instance each access made a new step, and every
    # call compiled again (silently outside loops)
    import gc

    class Agent:
        __slots__ = ("k", "__weakref__")

        def __init__(self, k):
            self.k = k

        @jc.hot_step(state="s")
        def act(self, s):
            return {"x": s["x"] * self.k}

    agent, s = Agent(2.0), {"x": jnp.ones(3)}
    for _ in range(3):
        s = agent.act(s)
    assert agent.act is agent.act and agent.act.stats.compiles == 1 and s["x"].tolist() == [8.0] * 3
    # a temporary instance is gone before its call (the bound step holds it weakly): named
    # (its trace read `self` as None: AttributeError: 'NoneType' object has no attribute 'k')
    with pytest.raises(jc.DefinitionError, match="the instance this method step was bound to is gone"):
        Agent(3.0).act({"x": jnp.ones(3)})
    method = Agent.__dict__["act"]
    del agent
    gc.collect()
    assert method._bound_steps == {}  # the instance went, and its bound step with it

    class Bare:
        __slots__ = ("k",)

        def __init__(self, k):
            self.k = k

        @jc.hot_step(state="s")
        def act(self, s):
            return {"x": s["x"] * self.k}

    with pytest.raises(jc.DefinitionError, match=r'add "__weakref__" to Bare.__slots__'):
        Bare(2.0).act  # noqa: B018


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_keyword_only_parameter_given_by_position_is_refused_at_every_call(level):
    # As Python refuses f(s, k, lr) for `def f(s, k, *, lr)`: at the first call,
    # and at every call after the compile (the one binder never fills a
    # keyword-only parameter from a positional argument).
    zero = jnp.float32(0)

    def f(s, k, *, lr, mom=zero):
        return {"w": s["w"] * k + lr + mom}

    with jc.checks_level(level):
        step = jc.hot_step(f, state="s")
        with pytest.raises(jc.DefinitionError, match="too many positional arguments"):
            step({"w": jnp.ones(3)}, jnp.float32(2), jnp.float32(1))
        s = step({"w": jnp.ones(3)}, jnp.float32(2), lr=jnp.float32(1))  # compiles
        with pytest.raises(jc.DefinitionError, match="too many positional arguments"):
            step(s, jnp.float32(2), jnp.float32(1))
        assert not s["w"].is_deleted()  # the inputs are intact
        s = step(s, jnp.float32(2), lr=jnp.float32(1))
    assert s["w"].tolist() == [7.0, 7.0, 7.0] and step.stats.compiles == 1


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_step_with_keyword_only_parameters_traces_under_an_outer_jit(level):
    # The call path binds every parameter by position; traced, the function
    # takes each by its kind (a keyword-only one by keyword).
    one, zero = jnp.float32(1), jnp.float32(0)

    def f(s, k=one, *, b=zero):
        return {"w": s["w"] * k + b}

    with jc.checks_level(level):
        step = jc.hot_step(f, state="s")
        s = step({"w": jnp.ones(3)})
        out = jax.jit(lambda s: step(s, b=jnp.float32(2))["w"])(s)
    assert out.tolist() == [3.0, 3.0, 3.0] and not s["w"].is_deleted()


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_static_keyword_with_a_default_left_out_runs_with_each_new_equal_value(level):
    # update(s, cfg=Config(...)) with a new, equal config each call and a
    # defaulted parameter left out: the C++ call that takes the static keyword
    # itself once ran the executable without the default (XLA's raw "Execution
    # supplied 1 arguments but compiled program expected 2").
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        scale: float

    zero = jnp.float32(0)
    with jc.checks_level(level):
        step = jc.hot_step(lambda s, cfg, x=zero: {"w": s["w"] * cfg.scale + x}, state="s", static=("cfg",))
        s = {"w": jnp.ones(2)}
        for _ in range(4):
            s = step(s, cfg=Cfg(2.0))
    assert s["w"].tolist() == [16.0, 16.0] and step.stats.compiles == 1


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_python_default_left_out_is_part_of_the_program_as_for_jax_jit(level):
    # step(s) with `lr=0.1, training=True` left out was refused as two host
    # leaves copied at each call; jax.jit never sees them as arguments
    def update(s, lr=0.1, training=True, *, name="w"):
        return {"w": s["w"] - lr * s["w"] * 2 if training else s["w"]}

    with jc.checks_level(level):
        step = jc.hot_step(update, state="s")
        s = step({"w": jnp.ones(3)})
        s = step(s)
        assert s["w"].tolist() == pytest.approx([0.64] * 3) and step.stats.compiles == 1
        with pytest.raises(jc.RecompileError, match="lr: compiled with static 0.1, called with an array"):
            step(s, jnp.float32(0.2))  # an argument now: a new signature, named
        # a parameter declared host= keeps its default as a host value, passed or not
        lr_step = jc.hot_step(lambda x, lr=0.1: x * (1 - lr), state="x", host="lr")
        x = lr_step(jnp.ones(2))
        x = lr_step(x, 0.2)
        x = lr_step(x)
        assert x.tolist() == pytest.approx([0.648] * 2) and lr_step.stats.compiles == 1


class _Config:  # hashable by value, as jax asks of a static value, and mutable
    def __init__(self, k):
        self.k = k

    def __hash__(self):
        return hash(self.k)

    def __eq__(self, other):
        return type(other) is _Config and other.k == self.k


@pytest.mark.parametrize("level", ["off", "fast", "full"])
@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_a_static_object_changed_in_place_runs_the_program_for_its_new_value(level, how):
    # the executable compiled for the old value ran (the object is equal to
    # itself); jax.jit (0.11 on) hashes a static anew and compiles for the new value
    f = lambda x, cfg: x * cfg.k  # noqa: E731
    call = (lambda st, x, c: st(x, c)) if how == "positional" else (lambda st, x, c: st(x, cfg=c))
    with jc.checks_level(level):
        step = jc.hot_step(f, state="x", static="cfg", max_compiles=3)
        cfg = _Config(2.0)
        assert call(step, jnp.ones(2), cfg).tolist() == [2.0, 2.0]
        assert call(step, jnp.ones(2), cfg).tolist() == [2.0, 2.0]  # the same value: no compile
        cfg.k = 3.0
        assert call(step, jnp.ones(2), cfg).tolist() == [3.0, 3.0]
        assert call(step, jnp.ones(2), _Config(3.0)).tolist() == [3.0, 3.0]
    assert step.stats.compiles == 2
    strict = jc.hot_step(f, state="x", static="cfg")
    strict(jnp.ones(2), cfg)
    cfg.k = 4.0
    with pytest.raises(jc.RecompileError, match="the same object, changed in place since"):
        strict(jnp.ones(2), cfg)


# -- issue 51, section 4: a step with a parameter before its state ----------


def _lr_step():
    @jc.hot_step(signature=S)
    def scaled(lr, s: S) -> S:
        return S(u=s.u * lr)

    return scaled


def test_the_compile_advice_for_a_step_with_a_leading_parameter_compiles_it():
    step, s = _lr_step(), S(u=jnp.ones(3))
    lr = jax.device_put(jnp.float32(0.5))
    with pytest.raises(jc.RecompileError) as info:
        with jc.hot_loop():
            step(lr, s)
    text = str(info.value)
    assert "scaled.compile(lr, S.spec(...))" in text and 'compiles="warmup"' in text
    step.compile(lr, S.spec(n=3))  # the advice, as written (S.spec(...) given its dims)
    with jc.hot_loop():
        s = step(lr, s)


def test_compile_refuses_a_python_float_that_every_call_would_refuse():
    step = _lr_step()
    with pytest.raises(jc.TransferError, match=r"jax.device_put\(lr\)") as info:
        step.compile(0.5, S.spec(n=3))
    assert "lr: ~f32[] (Python float)" in str(info.value)
    assert info.traceback[-1].path.name == "test_step_calls.py"  # ends at the user's line
    step.compile(jax.device_put(jnp.float32(0.5)), S.spec(n=3))  # what the calls will pass


@pytest.fixture
def x64_restored():
    before = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_jax_option_changed_after_the_compile_is_a_new_signature_never_the_old_program(level, x64_restored):
    """jax.jit compiles again when an option in its cache key changes
    (jax_enable_x64 here); a hot step did run the program compiled before,
    in float32. Now the change is a new signature: refused by name at
    max_compiles=1, compiled (the float64 program, as jax.jit's) where allowed."""

    def body(s):
        return {"x": s["x"] + 1}, jnp.asarray(1e-10, dtype=float) + 1.0

    plain = jax.jit(body)
    with jc.checks_level(level):
        once = jc.hot_step(body, state="s")
        twice = jc.hot_step(body, state="s", max_compiles=2)
        for step in (once, twice):
            s, eps = step({"x": jnp.zeros(3)})
            s, eps = step(s)
            assert eps.dtype == jnp.float32
        jax.config.update("jax_enable_x64", True)
        s = {"x": jnp.zeros(3, jnp.float32)}
        with pytest.raises(jc.RecompileError) as info:
            once(s)
        assert "compiled with False, called with True" in str(info.value)  # (named on jax 0.10.2 on)
        assert "jax_enable_x64: " in str(info.value) or jax.__version__ == "0.10.0"
        assert not s["x"].is_deleted()
        _, eps = twice(s)
        _, want = plain({"x": jnp.zeros(3, jnp.float32)})
        assert eps.dtype == want.dtype == jnp.float64
        assert float(eps) - 1.0 == pytest.approx(1e-10)


def test_a_new_signature_refused_in_a_loop_says_what_makes_it_new(x64_restored):
    @jc.hot_step(state="s", max_compiles=3)
    def step(s, b):
        return {"w": s["w"] + b.sum()}

    s = step({"w": jnp.zeros(3)}, jnp.ones(4))
    b5 = jnp.ones(5)
    with pytest.raises(jc.RecompileError, match=r"new signature \(b: f32\[4\] -> f32\[5\]\)"):
        with jc.hot_loop():
            s = step(s, b5)
    b4 = jnp.ones(4)
    jax.config.update("jax_enable_x64", True)
    with pytest.raises(jc.RecompileError, match=r"new signature \((jax_enable_x64|option \d+ of JAX's trace context) False -> True\)"):
        with jc.hot_loop():
            s = step(s, b4)
