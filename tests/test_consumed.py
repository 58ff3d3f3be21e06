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
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, advance_fn, make_particles
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


def test_a_saved_traceback_that_saw_the_array_is_a_kept_reference_like_any_other():
    # The one rule: the check cannot prove that losing an array held by a
    # caught error's frames loses nothing (a notebook's sys.last_traceback, a
    # debugger's post-mortem read them), so it refuses with the inputs intact
    # and says how to let go of it.
    d = jc.device_tree({"x": jnp.zeros(3)})
    dict_step = jc.hot_step(lambda d: {"x": d["x"] + 1}, state="d")
    d = dict_step(d)

    def check_finite(x):
        raise FloatingPointError("not finite")  # a helper of the user's that fails holding x

    try:
        check_finite(d["x"])
    except FloatingPointError as e:
        saved = e  # its traceback's frame holds d["x"]
    with pytest.raises(jc.DonationError, match="a caught exception you kept") as refused:
        dict_step(d)
    assert "del err for a kept exception" in refused.value.fix
    assert not d["x"].is_deleted()  # the inputs are intact
    del saved, refused
    d = dict_step(d)  # let go of: runs
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


def test_pytests_assertion_temporaries_are_a_kept_reference_like_any_other():
    # pytest's rewritten assert keeps each subexpression's value for its
    # message: the inline jnp.zeros(3) + s.scale below is held by an
    # `@py_assert` local of this frame as well as by the state. The rule
    # refuses it, with the inputs intact; building the state on a line of
    # its own is the fix the message gives.
    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    with pytest.raises(jc.DonationError, match="pytest's record of an `assert`") as refused:
        assert step(S(x=jnp.zeros(3) + s.scale, y=jnp.ones(3))).x.shape == (3,)
    assert "not inside an assert" in refused.value.fix
    fresh = S(x=jnp.zeros(3) + s.scale, y=jnp.ones(3))
    assert step(fresh).x.shape == (3,)


def _fails_holding(value):
    raise FloatingPointError("not finite")  # a user's check that fails, its frame holding value


class _Trainer:
    def __init__(self):
        self.samples = []

    def log(self, x):
        self.samples.append(x)
        _fails_holding(self)  # the saved frame's `value` is this live trainer


def _holding(kind, s):
    """A live holder of s.x that a saved exception's frame also sees; the
    list, the trainer or the generator stays alive after the exception."""
    saved = None
    if kind == "list":
        holder = [s.x]
        try:
            _fails_holding(holder)
        except FloatingPointError as e:
            saved = e
        return holder, saved, lambda: holder[0]
    if kind == "trainer":
        holder = _Trainer()
        try:
            holder.log(s.x)
        except FloatingPointError as e:
            saved = e
        return holder, saved, lambda: holder.samples[0]

    def gen(x):
        yield x  # suspended: its frame holds x, and only the generator holds the frame
        yield None

    holder = gen(s.x)
    first = next(holder)
    return holder, saved, lambda: first


@pytest.mark.parametrize("kind", ["list", "trainer", "generator"])
def test_a_live_holder_that_a_saved_or_suspended_frame_also_sees_is_refused(kind):
    # Every reference the collector can see from a finished frame was once
    # taken as harmless: a list the test still holds, a trainer's samples,
    # a suspended generator's local. Now any reference besides the state is
    # refused, and the kept array is intact after the refusal.
    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    holder, saved, kept = _holding(kind, s)
    with pytest.raises(jc.DonationError, match="you still hold elsewhere"):
        step(s)
    assert not kept().is_deleted() and not s.x.is_deleted()
    np.testing.assert_array_equal(jc.fetch(kept()), jc.fetch(s.x))
    del holder, saved, kept
    s = step(s)  # every holder dropped: runs
    assert not s.x.is_deleted()


def test_a_call_the_slow_path_dispatches_again_is_counted_like_any_other():
    # A call the closure hands to the slow path (a keyword, a default left
    # out) is dispatched again by it: the closure holds none of its flat
    # leaves then, so a kept sample is refused there too (it was let through,
    # and deleted).
    one = jnp.float32(1.0)

    @jc.hot_step(signature=S)
    def scaled(s: S, k: jax.Array = one) -> S:
        return s.replace(x=s.x * k)

    s = scaled(scaled(S(x=jnp.zeros(3), y=jnp.ones(3)), jnp.float32(1.0)), jnp.float32(1.0))
    kept = [s.x]
    for call in (lambda s: scaled(s, k=jnp.float32(2.0)), lambda s: scaled(s=s), lambda s: scaled(s)):
        with pytest.raises(jc.DonationError, match="you still hold elsewhere"):
            call(s)
        assert not kept[0].is_deleted() and not s.x.is_deleted()
    kept.clear()
    s = scaled(s=s)
    assert not s.x.is_deleted()


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
    from jaxcontracts._step import callctx as _callctx
    from jaxcontracts._step import callpath as _callpath

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
    from jaxcontracts._step import callctx as _callctx

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


# -- a consumed state goes at the rebinding; how a consumed array is named ----
#
# No call records its arguments: a consumed state goes when the caller rebinds
# it, as in a plain `s = f(s)` loop, at any size, in loops or out. A
# consumed array is named by the consumed class of a jc.state; anything else
# is worded by one helper (_runtime.donated) that lists the steps that donate.


class _Pair(typing.NamedTuple):
    w: jax.Array
    b: jax.Array


class _Slotted:
    """A pytree node with no weak reference to itself and its leaves behind a
    property (as an equinox Module's per-call node)."""

    __slots__ = ("_params",)

    def __init__(self, params):
        self._params = params

    @property
    def params(self):
        return self._params


jax.tree_util.register_pytree_with_keys(
    _Slotted, lambda h: (((jax.tree_util.GetAttrKey("params"), h.params),), None), lambda _, c: _Slotted(c[0])
)


def _made(kind, n):
    """A state of ``kind`` whose leaves are ``w`` (f32[3]), ``b`` and ``n - 2`` more."""
    extra = {f"z{i:04}": jnp.zeros(1) for i in range(n - 2)}
    if kind == "dict":
        return {"b": jnp.ones(2), "w": jnp.zeros(3), **extra}
    if kind == "NamedTuple":
        return _Pair(w=jnp.zeros(3), b=[jnp.ones(2), extra])
    if kind == "TrainState":
        import optax
        from flax.training.train_state import TrainState

        return TrainState.create(apply_fn=None, params={"w": jnp.zeros(3), "b": jnp.ones(2), **extra}, tx=optax.identity())
    return _Slotted({"b": jnp.ones(2), "w": jnp.zeros(3), **extra})


def _state_of(kind, n):
    return jc.device_tree(_made(kind, n))


_KINDS = ["dict", "NamedTuple", "TrainState", "node"]


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("where", ["outside loops", "in a hot_loop"])
@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("n", [3, 300])
def test_a_consumed_state_goes_at_the_callers_rebinding_at_any_size(level, where, kind, n):
    import weakref

    f = jc.hot_step(lambda s, batch: jax.tree_util.tree_map(lambda x: x + batch[0].astype(x.dtype), s), state="s")
    batch, last = jnp.ones(4), jnp.ones(4)
    with jc.checks_level(level):
        s = f(f(_state_of(kind, n), batch), batch)
    with jc.checks_level(level), jc.hot_loop() if where == "in a hot_loop" else contextlib.nullcontext():
        consumed = [weakref.ref(x) for x in jax.tree_util.tree_leaves(s)]
        s = f(s, batch)
        assert [r() for r in consumed] == [None] * len(consumed)  # gone at the rebinding
        given = weakref.ref(batch)
        del batch  # the step consumed nothing of it: nothing holds it after the call
        assert given() is None
        s = f(s, last)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(s))


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("kind", ["dict", "NamedTuple", "TrainState"])
def test_a_held_foreign_state_is_worded_through_one_helper_naming_the_steps_that_donate(level, kind):
    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + jnp.ones((), x.dtype), s), state="s")
    with jc.checks_level(level):
        s = f(f(_state_of(kind, 3)))
        old, s = s, f(s)
        w = (old["w"] if kind == "dict" else old.w if kind == "NamedTuple" else old.params["w"])
        worded = r"deleted: most likely donated to an earlier call \(hot steps that donate: [^)]*<lambda>"
        with pytest.raises(jc.DonationError, match=r"(?s)\(" + worded + r".*f32\[3\] was already deleted\n"):
            f(old)  # re-passed
        with pytest.raises(jc.DonationError, match=r"\(f32\[3\]\) was " + worded):
            np.asarray(w)  # read
        with pytest.raises(jc.DonationError, match=worded):
            jc.fetch(old)
        with jc.hot_loop(), pytest.raises(jc.DonationError, match=worded):
            w.tolist()
        s = f(s)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(s))


def test_a_re_passed_large_state_lists_every_deleted_leaf_at_once():
    n = 3000
    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), state="s")
    with jc.checks_level("fast"):
        s = f(f({f"z{i:04}": jnp.zeros(1) for i in range(n)}))
        old, s = s, f(s)
        with pytest.raises(jc.DonationError) as err:
            f(old)
    assert sum(line.endswith("f32[1] was already deleted") for line in err.value.details) == n
    assert str(err.value).count("most likely donated") == 1  # said once, above the leaves
    assert str(err.value).count("was already deleted") == 19  # the first lines; the rest in .details


class _LazyProxy:
    """A lazy object whose every attribute, ``__class__`` included, raises
    (werkzeug's LocalProxy outside a request, Django's unconfigured settings)."""

    def __getattribute__(self, name):
        raise RuntimeError("working outside of request context")


def test_a_lazy_proxy_in_the_reading_frame_never_replaces_the_message_nor_breaks_the_exit():
    # Module-level code (its frame's locals are its namespace, read on every
    # Python): a read in a loop is the loop's TransferError; the exit restores
    # everything.
    from jaxcontracts._compat import arrays

    original = arrays.ArrayImpl.__float__
    namespace = {"jc": jc, "jnp": jnp, "step": step, "S": S, "request": _LazyProxy()}
    code = compile(
        "s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))\n"
        "with jc.hot_loop():\n"
        "    s = step(s)\n"
        "    s.x.tolist()\n",
        "<training script>",
        "exec",
    )
    with pytest.raises(jc.TransferError, match="tolist"):
        exec(code, namespace)
    assert arrays.ArrayImpl.__float__ is original
    assert namespace["s"].x.tolist() == [2.0] * 3  # and the guard is off again


def test_a_callers_locals_dict_is_left_as_it_was_by_loops_and_messages():
    # Before Python 3.13, reading a function frame's f_locals syncs the dict
    # that locals() returned: hparams below would gain, lose or be emptied of
    # variables. Nothing of the library reads a function frame's locals there.
    lr, hparams = 0.1, None
    hparams = locals()
    before = dict(hparams)
    s = step(S(x=jnp.zeros(3), y=jnp.ones(3)))
    with jc.hot_loop():
        s = step(s)
    old, s = s, step(s)
    with pytest.raises(jc.DonationError):
        step(old)
    with pytest.raises(jc.DonationError):
        np.asarray(old.x)
    with jc.hot_loop(), pytest.raises(jc.TransferError):
        s.x.tolist()
    assert hparams == before and hparams["lr"] == lr
