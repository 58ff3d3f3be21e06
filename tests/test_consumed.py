"""A state a hot step donated: every later use names the step and the field.

Issue 10: reading a donated state outside a loop gave JAX's bare
``RuntimeError: Array has been deleted`` at first use. After a donating call
the state object takes a "consumed" subclass of its class (one store per
call), whose donated fields raise a DonationError when read.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import pickle
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, advance_fn, make_particles, record_dropped_at_dispatch
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
    s1 = step(s0)  # the checked path; s1 carries a provenance token
    step(s1)  # the token path consumes s1
    for stale in (s0, s1):
        with pytest.raises(jc.DonationError, match=r"s\.x: f32\[3\] was already donated to step"):
            step(stale)
    s = S(x=jnp.zeros(3), y=jnp.ones(3))
    step_x(s)  # only x was donated: the first leaf read by the token path
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
    assert type(class_step(ClassForm(v=jnp.zeros(2)))) is ClassForm


def test_the_mark_costs_one_class_per_state_class_and_step():
    from jaxcontracts._consumed import consumed_class

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
    from jaxcontracts._fields import is_state

    assert not is_state(Sub) and is_state(S)

    @jc.state
    class Decorated(Inner):
        z: Float32[Array, "n"]

    d = Decorated(a=jnp.zeros(3), z=jnp.ones(3))
    assert [p[0].name for p, _ in jax.tree_util.tree_flatten_with_path(d)[0]] == ["a", "z"]


@jc.hot_step(signature=S)
def with_arg(s: S, k: Float32[Array, "n"]) -> S:
    return S(x=s.x + k, y=s.y, scale=s.scale)


def test_full_refuses_deleted_or_repeated_buffers_before_xla_prints(capfd):
    """XLA logs `ExecutePrepareWithOomRetries failed` before refusing a deleted
    or doubly donated buffer; at `full` every leaf is looked at first."""
    with jc.checks_level("full"):
        donor = S(x=jnp.zeros(3), y=jnp.ones(3))
        step(donor)
        gone = donor.__dict__["x"]  # deleted by the donation
        live = with_arg(S(x=jnp.zeros(3), y=jnp.ones(3)), jnp.ones(3))  # a token state
        capfd.readouterr()
        mixed = S(x=jnp.zeros(3), y=gone)  # one deleted leaf, not the first
        with pytest.raises(jc.DonationError, match=r"s\.y: f32\[3\] was already"):
            step(mixed)
        with pytest.raises(jc.DonationError, match=r"passes a buffer that no longer exists(.|\n)*k: f32\[3\] was already"):
            with_arg(live, gone)  # a deleted argument that is not donated
        a = jnp.zeros(3)
        with pytest.raises(jc.DonationError, match=r"s\.x and s\.y are the same buffer"):
            step(S(x=a, y=a))
        assert "ExecutePrepare" not in capfd.readouterr().err
        assert with_arg(live, jnp.ones(3)).x.tolist() == [2.0] * 3


def test_stale_state_is_explained_without_an_xla_error_line(capfd):
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    q = advance(p)  # p is now stale
    capfd.readouterr()
    with pytest.raises(jc.DonationError, match="already"):
        advance(p)
    assert "ExecutePrepare" not in capfd.readouterr().err
    assert q.pos.shape == (4, 3)


@dataclasses.dataclass(frozen=True)
class _Inc:
    by: float = 1.0


def _bump_dict(s, *, config):
    return {k: v + config.by for k, v in s.items()}


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("shape", ["dict", "dict, keyword + static"])
def test_a_stale_foreign_state_is_explained_without_an_xla_error_line(capfd, level, shape):
    """A dict state (checked once per signature by the guarded C++ call) and a
    static config by keyword (static in that C++ call): a consumed state is
    looked at before the call, so XLA prints nothing."""
    with jc.checks_level(level):
        if shape == "dict":
            f = jc.hot_step(lambda s: {k: v + 1 for k, v in s.items()}, state="s")
            kw = {}
        else:
            f = jc.hot_step(_bump_dict, state="s", static="config")
            kw = {"config": _Inc()}
        s = {"a": jnp.zeros(3), "b": jnp.ones(2)}
        old = f(s, **kw)
        new = f(old, **kw)  # the C++ path: its signature is cached
        capfd.readouterr()
        for stale in (s, old):
            with pytest.raises(jc.DonationError, match="already"):
                f(stale, **kw)
        assert "ExecutePrepare" not in capfd.readouterr().err
        assert f(new, **kw)["a"].tolist() == [3.0] * 3


# -- kept outputs: a donated leaf held elsewhere is refused before dispatch ---


def _sampler():
    class Sample(typing.NamedTuple):  # blackjax's state shape: a NamedTuple of arrays
        position: jax.Array
        logdensity: jax.Array

    def kernel(key, state):
        position = state.position + 0.1 * jax.random.normal(key, state.position.shape)
        return Sample(position, -0.5 * jnp.sum(position**2)), {"accepted": jnp.bool_(True)}

    return Sample, jc.hot_step(kernel, state="state")


def test_a_kept_sample_is_refused_naming_the_leaf_and_the_step_inputs_intact():
    Sample, step = _sampler()
    state = Sample(jnp.zeros(3), jnp.float32(0))
    key = jax.random.key(0)
    state, _ = step(key, state)
    samples = []
    with pytest.raises(jc.DonationError) as info:  # noqa: PT012
        for _ in range(3):
            state, _ = step(key, state)
            samples.append(state.position)  # BlackJAX's quickstart keeps each position
    err = info.value
    assert err.leaves == ("state.position",) and err.step.endswith("kernel")
    assert "still hold elsewhere" in str(err) and "jnp.copy(state.position)" in err.fix
    assert len(samples) == 1 and not samples[0].is_deleted()  # nothing was lost
    assert not state.position.is_deleted()  # the refused call's inputs are intact
    samples = [jnp.copy(s) for s in samples]  # the fix: keep copies
    for _ in range(3):
        state, _ = step(key, state)
        samples.append(jnp.copy(state.position))
    assert len(samples) == 4 and not any(s.is_deleted() for s in samples)


@pytest.mark.parametrize(
    "keep",
    [
        lambda s: s.x,  # a variable
        lambda s: [s.x],  # a list of samples
        lambda s: {"saved": s.x},  # another container
        lambda s: s.replace(y=s.y + 1),  # another state sharing .x
    ],
    ids=["variable", "list", "dict", "shared-leaf"],
)
def test_every_kind_of_kept_reference_is_refused(keep):
    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    held = keep(s)
    with pytest.raises(jc.DonationError, match=r"s\.x: f32\[3\]"):
        step(s)
    del held
    try:
        step(s)  # dropped: it runs
    except jc.DonationError as err:  # say who holds it, so that a failure tells its cause
        held_by = [type(r).__name__ for leaf in (s.x, s.y) for r in gc.get_referrers(leaf)]
        raise AssertionError(f"refused after del: referrers {held_by}") from err


def test_a_leaf_held_only_by_uncollected_garbage_is_not_a_kept_reference():
    # An unreachable cycle the collector has not reached yet (here an object
    # that refers to itself; in a suite, a caught error and its frames) still
    # counts as a reference: it must not refuse the call.
    class Logger:
        pass

    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    gc.disable()
    try:
        logger = Logger()
        logger.me, logger.last = logger, s.y
        del logger  # garbage now, collected only by the cyclic collector
        s = step(s)
    finally:
        gc.enable()
    np.testing.assert_array_equal(jc.fetch(s.y), [4.0, 4.0, 4.0])


def test_a_kept_reference_is_not_looked_at_below_full_nor_when_nothing_is_kept():
    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    with jc.checks_level("fast"):
        kept = s.x
        s = step(s)  # not looked at: the kept array is deleted by the donation
    assert kept.is_deleted()
    t = S(x=jnp.zeros(3), y=jnp.ones(3))
    for _ in range(5):
        t = step(t)  # nothing kept: every call runs
    assert step.stats.calls >= 6


def test_a_saved_traceback_that_saw_the_array_is_not_a_kept_reference():
    # A caught error (or a notebook's sys.last_traceback) keeps the frames
    # that saw an array; losing the array there loses nothing.
    d = jc.device_tree({"x": jnp.zeros(3)})
    dict_step = jc.hot_step(lambda d: {"x": d["x"] + 1}, state="d")
    d = dict_step(d)
    norm = jax.jit(lambda a: jnp.sum(a * a))
    norm(jnp.zeros(3))  # warmed on an uncommitted array: the loop sees a compile
    try:
        with jc.hot_loop():
            norm(d["x"])
    except jc.RecompileError as e:
        saved = e  # noqa: F841 - its traceback's frames hold d["x"]
    d = dict_step(d)  # runs
    assert not d["x"].is_deleted()


def test_a_loop_exit_leaves_no_local_alive():
    # Loop exit reads the caller's locals (which step outputs are still
    # computing); before 3.13 that snapshot kept every local alive until the
    # function returned, and a donated leaf dropped after the loop still
    # counted as held.
    import weakref

    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    x = jnp.ones(5)
    gone = weakref.ref(x)
    with jc.hot_loop():
        s = step(s)
    del x
    assert gone() is None
    old = s
    with jc.hot_loop():  # the exit reads this frame's locals: `old` among them
        pass
    shared = old.replace(y=old.y * 2)  # a new state sharing .x with `old`
    del old, s  # before the fix, the exit's snapshot still held the old state
    step(shared)  # nothing holds .x besides `shared`: runs


def test_pytests_assertion_temporaries_are_not_a_kept_reference():
    # pytest's rewritten assert keeps each subexpression's value for its
    # message: the inline jnp.zeros(2) below is held by `@py_assert` locals.
    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    assert step(S(x=jnp.zeros(3) + s.scale, y=jnp.ones(3))).x.shape == (3,)
    assert type(class_step(ClassForm(v=jnp.zeros(2)))) is ClassForm


class _Wrapping:
    """A Mapping pytree node whose item access runs Python and wraps nested
    dicts (as flax's nnx.State does): reading one leaf by its path is costly."""

    def __init__(self, mapping):
        self._mapping = mapping

    def __getitem__(self, key):
        value = self._mapping[key]
        return _Wrapping(value) if isinstance(value, dict) else value


jax.tree_util.register_pytree_with_keys(
    _Wrapping,
    lambda w: (tuple((jax.tree_util.DictKey(k), w._mapping[k]) for k in sorted(w._mapping)), tuple(sorted(w._mapping))),
    lambda keys, children: _Wrapping(dict(zip(keys, children))),
)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_state_whose_items_run_python_is_flattened_once_and_checked_quietly(capfd, monkeypatch, level):
    # At fast the first donated leaf of such a state is looked at in its flat
    # leaves (one flatten, as full does), not read level by level through
    # the container's own __getitem__; a stale state is still explained
    # before XLA sees it.
    def step(s):
        return jax.tree_util.tree_map(lambda x: x + 1, s)

    with jc.checks_level(level):
        f = jc.hot_step(step, state="s")
        s = _Wrapping({"params": {"w": jnp.zeros(3), "b": jnp.ones(2)}, "count": jnp.int32(0)})
        old = f(s)
        new = f(old)
        wrapped = []
        real = _Wrapping.__getitem__
        monkeypatch.setattr(_Wrapping, "__getitem__", lambda self, k: wrapped.append(k) or real(self, k))
        new = f(new)
        assert wrapped == []  # no item read of the state's per call
        capfd.readouterr()
        for stale in (s, old):
            with pytest.raises(jc.DonationError, match=r"s\['params'\]\['w'\]: f32\[3\] was already"):
                f(stale)
        assert "ExecutePrepare" not in capfd.readouterr().err
        with pytest.raises(jc.TransferError, match=r"\['count'\]"):
            f(_Wrapping({"params": {"w": jnp.zeros(3), "b": jnp.ones(2)}, "count": np.int32(0)}))
        traced = jax.jit(lambda s: f(s))(new)  # under an outer trace: traced, not run
        assert not new._mapping["count"].is_deleted()
        assert int(traced._mapping["count"]) == 4
        new = f(s=new)
    assert int(new._mapping["count"]) == 4
    np.testing.assert_allclose(new._mapping["params"]["w"], 4.0)
    assert f.stats.compiles == 1


def test_at_fast_a_dict_or_attribute_path_is_read_without_a_flatten(monkeypatch):
    # Item access of dicts, lists and tuples and plain attributes cost no
    # Python frame: the first donated leaf is read by its path, and the
    # state is flattened only by the executable's C++ call.
    from jaxcontracts import _callctx, _callpath

    @dataclasses.dataclass
    class Box:
        params: dict

    jax.tree_util.register_dataclass(Box, data_fields=["params"], meta_fields=[])
    with jc.checks_level("fast"):
        f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x * 2, s), state="s")
        s = (Box(params={"w": jnp.ones(3)}), [jnp.ones(2)])
        s = f(f(s))
        calls = []
        for module in (_callpath, _callctx):
            real = module.flatten
            monkeypatch.setattr(module, "flatten", lambda x, real=real: calls.append(1) or real(x))
        s = f(s)
        assert calls == []
    np.testing.assert_allclose(s[0].params["w"], 8.0)


class _Reversed(list):
    """A list node whose flatten lists its items last to first, keyed by flat
    position: a key that does not index the node's own items."""


jax.tree_util.register_pytree_with_keys(
    _Reversed,
    lambda r: (tuple((jax.tree_util.SequenceKey(i), x) for i, x in enumerate(reversed(r))), None),
    lambda _, children: _Reversed(reversed(list(children))),
)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_leaf_reader_is_proven_on_positions_not_on_shared_specs(capfd, level):
    # Leaves of one shape share one spec object: a reader that reached the
    # other leaf would have passed a check by identity on the specs.
    from jaxcontracts import _callctx

    with jc.checks_level(level):
        f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
        old = f(_Reversed([jnp.zeros(3), jnp.ones(3)]))
        s = f(old)
        cs = f._current
        assert cs.leaves[0].spec is cs.leaves[1].spec  # one spec object for both
        t = _Reversed([jnp.zeros(3), old[1]])  # old[1] is flat leaf 0, the first donated: consumed
        assert _callctx.leaf_reader(cs, 0)((t,)) is jax.tree_util.tree_leaves(t)[0]
        assert _callctx.stale_reader(cs)((t,)) is True
        capfd.readouterr()
        with pytest.raises(jc.DonationError, match=r"s\[0\]: f32\[3\] was already"):
            f(t)
        assert "ExecutePrepare" not in capfd.readouterr().err
        s = f(s)
    np.testing.assert_allclose(s[0], 3.0)


class _Held:
    """A state node built by Python (its unflatten runs while JAX makes a
    call's outputs) that a weak reference can watch."""

    made_while_alive: typing.ClassVar[list[bool]] = []
    watched: typing.ClassVar[typing.Any] = None

    def __init__(self, params):
        self.params = params


class _Slotted:
    """As :class:`_Held`, with no weak reference to itself (``__slots__``) and
    its leaves behind a property, so that reading one by its path runs Python
    (as an equinox Module's per-call node): the step's record holds it
    strongly (a dict or a NamedTuple is recorded by id instead: ``_steps.Gone``)."""

    __slots__ = ("_params",)  # (the tests watch one of its leaves instead)

    def __init__(self, params):
        self._params = params

    @property
    def params(self):
        return self._params


def _held_unflatten(cls):
    def unflatten(_, children):
        ref = _Held.watched
        if ref is not None:
            _Held.made_while_alive.append(ref() is not None)
        return cls(children[0])

    return unflatten


for _cls in (_Held, _Slotted):
    jax.tree_util.register_pytree_with_keys(
        _cls, lambda h: (((jax.tree_util.GetAttrKey("params"), h.params),), None), _held_unflatten(_cls)
    )


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("shape", ["positional", "keyword + static"])
@pytest.mark.parametrize("cls", [_Held, _Slotted], ids=["weakly recorded", "recorded"])
def test_the_consumed_state_is_freed_before_the_next_call_makes_its_outputs(level, shape, cls):
    # The step's record of its last call (to name it in a later message)
    # holds the state it consumed, weakly where its container takes a weak
    # reference; a strong record is dropped once a call's checks have
    # passed, before the executable makes the outputs, so that they reuse
    # the consumed state's memory as in a plain jax.jit loop.
    import weakref

    with jc.checks_level(level):
        if shape == "positional":
            f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
            kw = {}
        else:
            f = jc.hot_step(
                lambda s, *, config: jax.tree_util.tree_map(lambda x: x + config.by, s), state="s", static="config"
            )
            kw = {"config": _Inc()}
        s = f(cls({"w": jnp.zeros(3), "b": jnp.ones(2)}), **kw)
        s = f(s, **kw)  # warm: the call path is built
        old, s = s, f(s, **kw)
        with pytest.raises(jc.DonationError, match=r"s\.params\['w'\]: f32\[3\] was already donated to <lambda>"):
            f(old, **kw)  # the record still names this step for the state it consumed
        _Held.watched, _Held.made_while_alive[:] = weakref.ref(old.params["w"]), []
        del old
        try:
            s = f(s, **kw)
        finally:
            _Held.watched = None
        assert _Held.made_while_alive == [False]
        # A deleted leaf that is not the first donated one: full looks at
        # every leaf before the record is dropped; fast leaves it to XLA,
        # after the record's turn, which kept it (the user holds `old`):
        # both name the step.
        old, s = s, f(s, **kw)
        mixed = cls({"b": s.params["b"], "w": old.params["w"]})  # "b" is the first leaf
        with pytest.raises(jc.DonationError, match=r"s\.params\['w'\]: f32\[3\] was already donated to <lambda>"):
            f(mixed, **kw)
        assert not s.params["b"].is_deleted()
        if level == "fast":  # (full refuses to donate a leaf held elsewhere)
            # A leaf taken out of a state nobody holds any more: the record
            # went with that state, so after a failed call the message says
            # only which steps donate (the documented limit, _callpath._guarded).
            w, s = s.params["w"], f(s, **kw)
            with pytest.raises(jc.RecompileError):
                f(cls({"w": jnp.zeros(4), "b": jnp.ones(2)}), **kw)
            with pytest.raises(jc.DonationError, match=r"`w` \(f32\[3\]\) no longer exists: it was deleted, most likely donated"):
                np.asarray(w)
            s = f(s, **kw)
    np.testing.assert_allclose(s.params["w"], 7.0 if level == "fast" else 5.0)


@pytest.mark.parametrize(
    ("level", "failure"),
    [
        *((level, failure) for level in ("fast", "full") for failure in ("another shape", "a weak-typed leaf")),
        # fast's C++ call refuses it after the record's turn, where its first
        # donated leaf (read for staleness) is a device array; full tells it
        # before (a guard that the record's turn stays after full's checks)
        *((level, "a numpy leaf past the first") for level in ("fast", "full")),
    ],
)
@pytest.mark.parametrize("kind", ["dict", "NamedTuple", "dict, recorded by id"])
def test_a_failed_call_keeps_the_record_of_a_consumed_state_still_held(level, failure, kind):
    # The record is dropped before the executable only where it alone holds
    # the consumed state: one the user still holds keeps it, so a call that
    # then fails (refused by the C++ call's checks, or raising) does not take
    # the step's name from a later re-pass or read of that state. Past
    # EARLY_FREE_LEAVES leaves a dict is recorded by id (_steps.Gone): the
    # state the user holds is found again by its identity, after a failed
    # call too.
    from jaxcontracts._steps import EARLY_FREE_LEAVES

    def large(**items):  # "b" and "w" stay the first two leaves
        return {**items, **{f"z{i:03}": jnp.zeros(1) for i in range(EARLY_FREE_LEAVES)}}

    make = {"dict": dict, "NamedTuple": _Pair, "dict, recorded by id": large}[kind]
    by_id, kind = kind == "dict, recorded by id", kind.split(",")[0]
    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
    later = np.zeros(3, np.float32) if kind == "dict" else np.ones((), np.float32)  # dicts flatten "b" first
    bad = {
        "another shape": make(w=jnp.zeros(4), b=jnp.ones(())),
        "a weak-typed leaf": make(w=jnp.zeros(3), b=jnp.asarray(1.0)),
        "a numpy leaf past the first": make(w=later, b=jnp.ones(())) if kind == "dict" else make(w=jnp.zeros(3), b=later),
    }[failure]
    if failure == "a numpy leaf past the first":
        assert jax.tree_util.tree_leaves(bad)[1] is later
    else:
        assert (bad["b"] if kind == "dict" else bad.b).weak_type is (failure == "a weak-typed leaf")
    with jc.checks_level(level):
        s = f(f(make(w=jnp.zeros(3), b=jnp.ones(()))))  # warm: the call path is built
        old, s = s, f(s)
        from jaxcontracts._steps import Gone

        assert (type(f.last_call[0][0][0]) is Gone) is by_id
        with pytest.raises((jc.RecompileError, jc.TransferError)):
            f(bad)
        path = "s['w']" if kind == "dict" else "s.w"
        with pytest.raises(jc.DonationError, match=re.escape(f"{path}: f32[3] was already donated to <lambda>")):
            f(old)  # re-passed
        with pytest.raises(jc.DonationError, match="was donated to <lambda> and no longer exists"):
            np.asarray(old["w"] if kind == "dict" else old.w)  # read
        s = f(s)
    np.testing.assert_allclose(s["w"] if kind == "dict" else s.w, 4.0)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_the_early_free_is_bounded_by_the_donated_leaves_not_by_every_leaf(level):
    # A small donated state read with large read-only parameters: what the
    # early free costs is the consumed state's leaves, so it is freed early.
    import weakref

    from jaxcontracts._steps import EARLY_FREE_LEAVES

    params = {f"p{i:03}": jnp.ones(2) for i in range(2 * EARLY_FREE_LEAVES)}
    with jc.checks_level(level):
        f = jc.hot_step(
            lambda s, params: jax.tree_util.tree_map(lambda x: x + params["p000"][0], s), state="s"
        )
        s = f(f(_Slotted({"w": jnp.zeros(2), "b": jnp.zeros(3)}), params), params)
        old, s = s, f(s, params)
        assert f.last_call[0][0][0] is old
        _Held.watched, _Held.made_while_alive[:] = weakref.ref(old.params["w"]), []
        del old
        try:
            s = f(s, params)
        finally:
            _Held.watched = None
        assert _Held.made_while_alive == [False]
    np.testing.assert_allclose(s.params["w"], 4.0)
    assert not params["p000"].is_deleted()


class _Pair(typing.NamedTuple):
    w: jax.Array
    b: jax.Array


def _record_at_dispatch(monkeypatch, module):
    """Make the executables that ``module`` builds calls of note, as each
    call starts, whether the step's last-call record is dropped."""
    seen = []
    real = module.cpp_call

    def noting(compiled):
        call = real(compiled)

        def noted(*args):
            seen.append(noting.step.last_call[0] is None)
            return call(*args)

        return noted

    monkeypatch.setattr(module, "cpp_call", noting)
    return seen, noting


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("path", ["checked", "provenance"])
def test_every_call_path_drops_the_record_before_the_executable(monkeypatch, level, path):
    # The paths the guarded-call tests above do not take: the checked closure
    # (a jaxlib without a guarded C++ call) and the provenance path of a
    # sealed state with another argument. A consumed state recorded strongly
    # that nobody else holds is dropped before the executable runs; one the
    # user holds is not; a sealed state is recorded weakly, so there is
    # nothing to drop.
    from jaxcontracts import _callpath

    seen, noting = _record_at_dispatch(monkeypatch, _callpath)
    if path == "checked":
        monkeypatch.setattr(_callpath, "guarded_call", lambda *a, **k: None)
        f = jc.hot_step(lambda s, dt: jax.tree_util.tree_map(lambda x: x + dt, s), state="s")
        s0 = _Slotted({"w": jnp.zeros(3), "b": jnp.ones(2)})
    else:
        f = jc.hot_step(lambda s, dt: Particles(pos=s.pos + dt, vel=s.vel, t=s.t), state="s")
        s0 = make_particles()
    noting.step = f
    dt = jnp.float32(1)
    with jc.checks_level(level):
        s = f(f(s0, dt), dt)
        assert f._call.__qualname__.split(".")[-1] == path
        seen.clear()
        s = f(s, dt)
        s = f(s, dt)
        old, s = s, f(s, dt)
        s = f(s, dt)  # the user holds `old`: its record stays while this call runs
    if path == "checked":  # recorded strongly, the record dropped where it alone holds the state
        assert seen == [True, True, True, False]
    else:  # a jc.state takes a weak reference: the record holds none of it, and stays
        import weakref

        assert seen == [False] * 4 and type(f.last_call[0][0][0]) is weakref.ref
    assert old is not s


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("cls", [_Held, _Slotted], ids=["weakly recorded", "recorded"])
def test_a_large_consumed_state_is_freed_after_the_dispatch_unless_weakly_recorded(level, cls):
    # Freeing costs about 0.5 us a leaf: above EARLY_FREE_LEAVES it would
    # delay the dispatch, so a strong record is replaced after the call, as
    # before. A weak one holds none of the state: it goes at the caller's
    # rebinding, at any size, as in a plain loop.
    import weakref

    from jaxcontracts._steps import EARLY_FREE_LEAVES

    n = EARLY_FREE_LEAVES + 1
    with jc.checks_level(level):
        f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
        s = f(f(cls({f"x{i:03}": jnp.zeros(2) for i in range(n)})))
        old, s = s, f(s)
        held = f.last_call[0][0][0]
        assert (held() if cls is _Held else held) is old  # the record holds the consumed state, weakly or not
        _Held.watched, _Held.made_while_alive[:] = weakref.ref(old.params["x000"]), []
        del old, held
        try:
            s = f(s)
        finally:
            _Held.watched = None
        assert _Held.made_while_alive == [cls is _Slotted]  # strongly recorded: alive while the outputs were made
    np.testing.assert_allclose(s.params["x000"], 4.0)


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("where", ["in a hot_loop", "outside loops"])
def test_the_early_free_reads_the_state_where_static_keywords_leave_the_record_short(level, where):
    # `step(dt, s, config=c)`: the C++ call takes the static keyword itself,
    # so the record holds the positional arguments `(dt, s)` (in loops), or
    # the wholly donated one (outside): the count must be taken on `s`, not
    # on `dt` (one the user holds would keep a state nobody holds, one only
    # the record holds would drop the record of a state the user holds),
    # whatever the record's length.
    import contextlib
    import weakref

    f = jc.hot_step(
        lambda dt, s, config: jax.tree_util.tree_map(lambda x: x + dt * config.by, s), state="s", static="config"
    )
    dt, kw = jnp.float32(1), {"config": _Inc()}
    section = jc.hot_loop if where == "in a hot_loop" else contextlib.nullcontext
    with jc.checks_level(level):
        s = f(dt, f(dt, _Slotted({"w": jnp.zeros(3), "b": jnp.zeros(2)}), **kw), **kw)  # warm
        bad = _Slotted({"w": jnp.zeros(4), "b": jnp.zeros(2)})
        steps = [jnp.float32(1) for _ in range(2)]  # each popped: the record alone holds it
        with section():
            old, s = s, f(dt, s, **kw)
            assert old in f.last_call[0][0]
            _Held.watched, _Held.made_while_alive[:] = weakref.ref(old.params["w"]), []
            del old
            try:
                s = f(dt, s, **kw)  # nobody else holds the consumed state: freed first
            finally:
                _Held.watched = None
            assert _Held.made_while_alive == [False]
            old, s = s, f(steps.pop(), s, **kw)
            with pytest.raises(jc.RecompileError):
                f(dt, bad, **kw)
            with pytest.raises(jc.DonationError, match=re.escape("s.params['w']: f32[3] was already donated to <lambda>")):
                f(dt, old, **kw)  # the user holds `old`: its record, and the step's name, stayed
            s = f(dt, s, **kw)
    np.testing.assert_allclose(s.params["w"], 6.0)


def test_where_references_cannot_be_counted_the_record_is_dropped_before_every_call(monkeypatch):
    # Without sys.getrefcount (not CPython) whether the user still holds the
    # consumed state cannot be told: the early free is kept, the name after
    # a failed call is what is given up.
    from jaxcontracts._compat import refcount

    monkeypatch.setattr(refcount, "available", lambda: False)
    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
    seen = record_dropped_at_dispatch(monkeypatch, lambda: f)
    with jc.checks_level("fast"):
        s = f(f(_Slotted({"w": jnp.zeros(3)})))
        old, s = s, f(s)
        seen.clear()
        s = f(s)  # the user holds `old`: dropped all the same
    assert seen == [True]
    assert old.params["w"].is_deleted() and s.params["w"].tolist() == [4.0] * 3


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_record_another_signature_wrote_is_read_safely_by_the_early_free(level):
    # max_compiles=2: the step's record is shared by its signatures, and one
    # written where `carry` was None (no leaves, not wholly donated) is laid
    # out otherwise than the other signature's early free reads it.
    def inc(t):
        return jax.tree_util.tree_map(lambda x: x + 1, t)

    f = jc.hot_step(lambda s, carry: (inc(s), inc(carry)), state=("s", "carry"), max_compiles=2)
    with jc.checks_level(level):
        s, carry = f({"w": jnp.zeros(3)}, None)
        s, carry = f(s, {"h": jnp.zeros(2)})  # the other signature, after a record of the first
        s, carry = f(s, carry)
        s, none = f(s, None)
        s, carry = f(s, carry)
    assert s["w"].tolist() == [5.0] * 3 and carry["h"].tolist() == [3.0] * 2 and none is None


@pytest.mark.parametrize("level", ["fast", "full"])
def test_in_a_loop_the_early_free_is_bounded_by_every_recorded_leaf(monkeypatch, level):
    # In a loop the record holds every argument: a large batch only the
    # record holds would be freed before the dispatch too, so past
    # EARLY_FREE_LEAVES leaves in all the record is left to the tail. Outside
    # loops it holds the small consumed state alone, which is freed first.
    from jaxcontracts._steps import EARLY_FREE_LEAVES

    f = jc.hot_step(lambda s, batch: jax.tree_util.tree_map(lambda x: x + batch["b000"][0], s), state="s")
    seen = record_dropped_at_dispatch(monkeypatch, lambda: f)
    batches = [{f"b{i:03}": jnp.ones(2) for i in range(2 * EARLY_FREE_LEAVES)} for _ in range(4)]
    with jc.checks_level(level):
        s = f(f(_Slotted({"w": jnp.zeros(2)}), batches[0]), batches[0])
        seen.clear()
        s = f(s, batches.pop())
        s = f(s, batches.pop())  # outside loops: the consumed state alone, freed before
        assert seen == [True, True]
        with jc.hot_loop():
            seen.clear()
            s = f(s, batches.pop())
            s = f(s, batches.pop())  # the record holds the last batch too: left to the tail
        assert seen == [True, False]  # (the first call's record was written outside the loop)
    assert s.params["w"].tolist() == [6.0] * 2


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("where", ["outside loops", "in a hot_loop"])
@pytest.mark.parametrize("kind", ["TrainState", "dict", "NamedTuple"])
def test_a_weakly_recorded_state_goes_at_the_rebinding_and_is_still_named_while_held(level, where, kind):
    # A flax TrainState takes a weak reference: the step's record holds it
    # weakly; a dict or NamedTuple takes none, and past EARLY_FREE_LEAVES
    # leaves its record keeps its id and a weak reference to its first leaf
    # (_steps.Gone). Either way the consumed state goes when the caller
    # rebinds `state`, as in a plain loop, and a consumed state the caller
    # still holds names the step after a failed call (a dict found again by
    # its id, in the caller's frame or among the call's arguments).
    import contextlib
    import weakref

    optax = pytest.importorskip("optax")
    train_state = pytest.importorskip("flax.training.train_state")

    from jaxcontracts._steps import EARLY_FREE_LEAVES

    def train(state, batch):
        if kind == "dict":
            return {"w": state["w"] - batch.mean(), "n": state["n"] + 1, "pad": state["pad"]}
        if kind == "NamedTuple":
            return _Pair(w=state.w - batch.mean(), b=jax.tree_util.tree_map(lambda x: x + 1, state.b))
        grads = jax.grad(lambda p: jnp.sum(p["w"] * batch.mean()))(state.params)
        return state.apply_gradients(grads=grads)

    pad = tuple(jnp.zeros(1) for _ in range(EARLY_FREE_LEAVES))
    if kind == "dict":
        state = {"w": jnp.ones(3), "n": jnp.int32(0), "pad": pad}
    elif kind == "NamedTuple":
        state = _Pair(w=jnp.ones(3), b=pad)
    else:
        state = jc.device_tree(train_state.TrainState.create(apply_fn=None, params={"w": jnp.ones(3)}, tx=optax.sgd(0.1)))
    w_of = {"dict": lambda s: s["w"], "NamedTuple": lambda s: s.w}.get(kind, lambda s: s.params["w"])
    step = jc.hot_step(train, state="state")
    batch, bad = jnp.ones(4), jnp.ones(5)
    section = jc.hot_loop if where == "in a hot_loop" else contextlib.nullcontext
    with jc.checks_level(level):
        state = step(step(state, batch), batch)
        with section():
            leaf = weakref.ref(w_of(state))
            state = step(state, batch)
            assert leaf() is None  # not held by the record: gone at the rebinding
            if where == "outside loops":
                from jaxcontracts import _steps

                [(args,)] = [args for _, args, _, _ in _steps.last_calls([step])]
                if kind == "TrainState":
                    assert args is None  # read as gone
                else:
                    assert type(args) is _steps.Gone and args.first() is None
            old, state = state, step(state, batch)
            with pytest.raises(jc.RecompileError):
                step(state, bad)
            with pytest.raises(jc.DonationError, match="was already donated to train"):
                step(old, batch)  # held: still named, after the failed call
        if where == "outside loops":  # (a loop's exit forgets its steps' records: test_a_loop_exit_leaves_no_local_alive)
            with pytest.raises(jc.DonationError, match="was donated to train and no longer exists"):
                np.asarray(w_of(old))
        state = step(state, batch)
    assert not w_of(state).is_deleted()


def test_an_argument_that_takes_no_weak_reference_is_recorded_as_it_is():
    # Two registered dataclasses with the same fields have equal tree
    # structures: one with __slots__ takes the other's signature, whose
    # record is weak; its own record is then strong, never an error after
    # the executable has consumed the state.
    @dataclasses.dataclass
    class Plain:
        w: jax.Array

    @dataclasses.dataclass(slots=True)
    class Slotted:
        w: jax.Array

    for cls in (Plain, Slotted):
        jax.tree_util.register_dataclass(cls, data_fields=["w"], meta_fields=[])
    f = jc.hot_step(lambda s: dataclasses.replace(s, w=s.w + 1), state="s")
    for level in ("fast", "full"):
        with jc.checks_level(level):
            f(f(Plain(jnp.zeros(2))))  # the signature, recorded weakly
            for section in (contextlib.nullcontext, jc.hot_loop):
                s = Slotted(jnp.zeros(2))
                with section():
                    s = f(s)
                    old, s = s, f(s)
                    with pytest.raises(jc.DonationError, match=r"s\.w: f32\[2\] was already donated to <lambda>"):
                        f(old)
    assert f.stats.compiles == 1


@pytest.mark.parametrize("level", ["fast", "full"])
def test_in_a_loop_a_weak_record_holds_no_batch_while_the_next_call_runs(monkeypatch, level):
    # A weakly recorded state has nothing to free early, so nothing drops
    # the loop's record before the next dispatch: it holds the batch as None
    # (this step consumed nothing of it), so a training loop's previous batch
    # goes as in a plain loop.
    import weakref

    from jaxcontracts import _steps

    optax = pytest.importorskip("optax")
    train_state = pytest.importorskip("flax.training.train_state")
    watched = [None]  # the previous batch's leaf, once there is one
    alive = record_dropped_at_dispatch(
        monkeypatch, None, probe=lambda: None if watched[0] is None else watched[0]() is not None
    )

    def train(state, batch):
        grads = jax.grad(lambda p: jnp.sum(p["w"] * batch["x"].mean()))(state.params)
        return state.apply_gradients(grads=grads)

    step = jc.hot_step(train, state="state")
    state = jc.device_tree(train_state.TrainState.create(apply_fn=None, params={"w": jnp.ones(3)}, tx=optax.sgd(0.1)))
    batches = [{"x": jnp.ones(4) * i} for i in range(6)]
    with jc.checks_level(level):
        state = step(step(state, batches.pop()), batches.pop())
        with jc.hot_loop():
            for _ in range(3):
                batch = batches.pop()
                state = step(state, batch)
                watched[0] = weakref.ref(batch["x"])  # at the next dispatch: the previous batch
                del batch
    watched[0] = None
    assert alive == [False, False]
    assert list(_steps.last_calls([step])) == []  # forgotten at the loop's exit


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_consumed_dict_is_recorded_by_id_and_a_reused_id_names_no_step(level):
    # A dict takes no weak reference: the record keeps its id and a weak
    # reference to its first donated leaf (_steps.Gone), so it holds none of
    # the state. CPython reuses a freed dict's memory for the next dict: a
    # new dict at the consumed one's address, whose own array was deleted by
    # other means, must not be said to have been donated to the step (its
    # leaves are not the recorded one); a consumed dict still held is named,
    # read, re-passed, fetched, or held in a list.
    from jaxcontracts import _steps

    def fresh():  # past EARLY_FREE_LEAVES leaves: recorded by id
        return {"w": jnp.zeros(3), "b": jnp.ones(2), **{f"z{i:03}": jnp.zeros(1) for i in range(_steps.EARLY_FREE_LEAVES)}}

    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
    with jc.checks_level(level):
        s = f(f(fresh()))
        s = f(s)  # the consumed dict went at this rebinding
        [(mark,)] = [args for _, args, _, _ in _steps.last_calls([f])]
        assert type(mark) is _steps.Gone and mark.first() is None
        alive = []
        while len(alive) < 100 and (not alive or id(alive[-1]) != mark.cid):
            alive.append(fresh())
        d = alive[-1]
        assert id(d) == mark.cid  # the address was reused
        d["w"].delete()
        with pytest.raises(jc.DonationError, match="most likely donated") as err:
            np.asarray(d["w"])
        assert "was donated to" not in str(err.value)
        with pytest.raises(jc.DonationError, match=r"deleted \(donated to an earlier call\?\)"):
            f(d)  # passed: not named either
        old, s = s, f(s)
        with pytest.raises(jc.DonationError, match=r"`old\['w'\]` \(f32\[3\]\) was donated to <lambda>"):
            np.asarray(old["w"])
        with pytest.raises(jc.DonationError, match=r"s\['b'\]: f32\[2\] was already donated to <lambda>"):
            f(old)
        with pytest.raises(jc.DonationError, match="was donated to <lambda> and no longer exists"):
            jc.fetch(old)
        if level == "fast":  # (full refuses to donate a state a list also holds)
            history = [s]
            s = f(s)
            with pytest.raises(jc.DonationError, match="was donated to <lambda>"):
                np.asarray(history[-1]["w"])
        s = f(s)
    assert s["w"].tolist() == ([6.0] * 3 if level == "fast" else [5.0] * 3)


def test_a_record_by_id_matches_only_the_object_that_holds_its_leaf():
    import weakref

    from jaxcontracts._steps import Gone

    leaf, other = jnp.zeros(2), jnp.ones(2)
    state = {"w": leaf}
    flat = jax.tree_util.tree_flatten
    tree = jax.tree_util.tree_structure(state)
    mark = Gone(id(state), weakref.ref(leaf), tree)
    assert mark.holder([{"w": other}, state], flat) is state
    assert mark.holder([{"w": leaf}], flat) is None  # its leaf, another object
    assert Gone(id(state), weakref.ref(other), tree).holder([state], flat) is None  # its id, not its leaf
    other_tree = jax.tree_util.tree_structure({"w": 0, "x": 0})
    assert Gone(id(state), weakref.ref(leaf), other_tree).holder([state], flat) is None  # another structure
    dead = jnp.zeros(2)
    gone = Gone(id(state), weakref.ref(dead), tree)
    del dead
    assert gone.holder([state], flat) is None  # the leaf is gone: so is the object

    class Unflattenable:
        pass

    odd = Unflattenable()
    assert Gone(id(odd), weakref.ref(leaf), tree).holder([odd], lambda c: 1 / 0) is None


def _large(**items):
    """A dict past EARLY_FREE_LEAVES leaves (recorded by id); ``items`` first."""
    from jaxcontracts._steps import EARLY_FREE_LEAVES

    return {**items, **{f"z{i:03}": jnp.zeros(1) for i in range(EARLY_FREE_LEAVES)}}


class _Trainer:
    def __init__(self, step, state):
        self.step, self.state, self.history = step, state, []

    def advance(self):
        self.history.append(self.state)
        self.state = self.step(self.state)

    def last_w(self):
        return np.asarray(self.history[-1]["w"])


class _Proxy:
    """A config object whose ``__getattr__`` raises a KeyError for ``__dict__``."""

    __slots__ = ("_d",)

    def __init__(self, d):
        self._d = d

    def __getattr__(self, key):
        return self._d[key]


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_consumed_large_dict_is_named_where_users_read_it(level):
    # Past EARLY_FREE_LEAVES leaves the record keeps the dict's id: the
    # message finds it in the reading frame and its callers, in attributes
    # and their containers, among a re-passed call's arguments and by
    # jc.fetch, always for a leaf that is not the first (which names itself).
    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")

    def norm(a):  # a helper that gets only the leaf
        return np.asarray(a)

    cfg = _Proxy({"lr": 0.1})  # a local whose __getattr__ raises: never the message's error
    assert cfg.lr == 0.1
    named = "was donated to <lambda>"
    with jc.checks_level(level):
        s = f(f(_large(a=jnp.zeros(3), w=jnp.ones(3))))
        old, s = s, f(s)
        with pytest.raises(jc.DonationError, match=named):
            norm(old["w"])
        with pytest.raises(jc.DonationError, match=named):
            jax.tree_util.tree_map(lambda a: np.asarray(a), old)
        with pytest.raises(jc.DonationError, match=named):
            jc.fetch(old["w"])
        with pytest.raises(jc.DonationError, match=r"s\['w'\]: f32\[3\] was already donated to <lambda>"):
            f(old)
        if level == "fast":  # (full refuses to donate a state the history also holds)
            trainer = _Trainer(f, s)
            trainer.advance()
            with pytest.raises(jc.DonationError, match=named):
                trainer.last_w()
            s = trainer.state
        s = f(s)
    assert not s["w"].is_deleted()


def test_a_reused_id_with_the_first_leaf_kept_names_no_step():
    # The user keeps the consumed state's first leaf and builds a new dict,
    # which CPython puts at the freed state's address, around it and an array
    # deleted by other means: another tree structure, so not the state.
    from jaxcontracts import _steps

    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
    with jc.checks_level("fast"):
        s = f(f(_large(a=jnp.zeros(3))))
        keep = s["a"]
        s = f(s)  # the consumed dict went here; its first leaf lives on in `keep`
        [(mark,)] = [args for _, args, _, _ in _steps.last_calls([f])]
        assert mark.first() is keep
        other = jnp.ones(4)
        other.delete()
        alive = []
        while len(alive) < 100 and (not alive or id(alive[-1]) != mark.cid):
            alive.append({"a": keep, "x": other})
        d = alive[-1]
        assert id(d) == mark.cid  # the address was reused
        with pytest.raises(jc.DonationError) as err:
            np.asarray(d["x"])
        assert "was donated to" not in str(err.value)
        with pytest.raises(jc.DonationError, match=r"`keep` \(f32\[3\]\) was donated to <lambda>"):
            np.asarray(keep)  # the recorded leaf itself: named
        s = f(s)


def test_a_re_passed_large_state_is_explained_reading_the_records_once(monkeypatch):
    # The DonationError for a re-passed state lists every deleted leaf with
    # the step that consumed it: the records are read once for all of them
    # (read once a leaf, a 3,000-leaf state took 1.5-2.8 s to explain).
    from jaxcontracts import _steps

    n = _steps.EARLY_FREE_LEAVES + 72  # recorded by id
    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
    reads, real = [], _steps.last_calls

    def counted(*args, **kwargs):
        reads.append(1)
        return real(*args, **kwargs)

    with jc.checks_level("fast"):
        s = f(f({f"z{i:03}": jnp.zeros(1) for i in range(n)}))
        old, s = s, f(s)
        monkeypatch.setattr(_steps, "last_calls", counted)
        with pytest.raises(jc.DonationError) as err:
            f(old)
    assert len(reads) == 1
    assert str(err.value).count("was already donated to <lambda>") == 20  # the first lines; the rest in .details
    assert sum("was already donated to <lambda>" in line for line in err.value.details) == n
