"""How a consumed array is named: a consumed state goes at the caller's
rebinding at any size; a jc.state names its consumer; anything else is worded
through one helper; nothing of the user's (locals, frames) is changed to do it."""

from __future__ import annotations

import contextlib
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_consumed_state import S, step  # the consumed-state tests' state and step

import jaxcontracts as jc

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
        # at the rebinding, gone, or (at full) deleted arrays in the step's
        # record of what its last call consumed, which holds no device memory
        assert all(r() is None or (level == "full" and r().is_deleted()) for r in consumed)
        given = weakref.ref(batch)
        del batch  # the step consumed nothing of it: nothing holds it after the call
        assert given() is None
        s = f(s, last)
        assert [r() for r in consumed] == [None] * len(consumed)  # the next call lets go of the record
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(s))


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("kind", ["dict", "NamedTuple", "TrainState"])
def test_a_held_foreign_state_is_worded_through_one_helper_naming_its_consumer(level, kind):
    f = jc.hot_step(lambda s: jax.tree_util.tree_map(lambda x: x + jnp.ones((), x.dtype), s), state="s")
    with jc.checks_level(level):
        s = f(f(_state_of(kind, 3)))
        old, s = s, f(s)
        w = (old["w"] if kind == "dict" else old.w if kind == "NamedTuple" else old.params["w"])
        if level == "full":  # the step's record of what its call consumed names it
            worded = "donated to <lambda>"
            repassed = r"f32\[3\] was already donated to <lambda>\n"
        else:  # no record below full: the steps that donate
            worded = r"deleted: most likely donated to an earlier call \(hot steps that donate: [^)]*<lambda>"
            repassed = r"(?s)\(" + worded + r".*f32\[3\] was already deleted\n"
        with pytest.raises(jc.DonationError, match=repassed):
            f(old)  # re-passed
        with pytest.raises(jc.DonationError, match=r"\(f32\[3\]\) was " + worded):
            np.asarray(w)  # read
        with pytest.raises(jc.DonationError, match=worded):
            jc.fetch(old)
        with pytest.raises(jc.DonationError, match=worded), jc.hot_loop():
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
    with pytest.raises(jc.TransferError), jc.hot_loop():
        s.x.tolist()
    assert hparams == before and hparams["lr"] == lr


# -- issue 39, "Names": each message names only what is proven ----------------
#
# No call records what it consumed: a "donated" message names the consumer
# only where a jc.state's consumed class proves it, else lists the live steps
# that donate and says "or a jax.jit" (_runtime.donated). Each case below
# once named a wrong step, or none where one was proven.


def _listed() -> str:
    """The steps a message lists: every live donating step (other tests' too), sorted, three at most."""
    from jaxcontracts import _steps

    live = _steps.donating()
    return (
        "hot steps that donate: " + ", ".join(live[:3]) + (", ..." if len(live) > 3 else "") + ";"
    )


def _summary(err: BaseException) -> str:
    return str(err).split("\nFix:")[0]


def _as_a_script(source: str, **names):
    """Run ``source`` as module-level code (a training script): its variables
    are the module's namespace, which messages read on every Python, where a
    function's locals are read from 3.13 only (``_compat.frames.locals_of``)."""
    namespace = {"__name__": "training_script", "jc": jc, "jax": jax, "jnp": jnp, "np": np, **names}
    exec(compile(source, "<training script>", "exec"), namespace)
    return namespace


_CHECKPOINTS = """
@jc.hot_step(state="s")
def train_ckpt(s, batch):
    return {k: v + batch.sum() for k, v in s.items()}

@jc.hot_step(stateless=True)
def evaluate(s, batch):
    return s["w"].sum() + batch.sum()

batch = jnp.ones(4)
s = train_ckpt({"w": jnp.zeros(3), "b": jnp.ones(2)}, batch)
evaluate(s, batch)  # reads the state, donates nothing: never its consumer
ckpts = HOLD(s)
s = train_ckpt(s, batch)
errors = []
for use in (lambda: np.asarray(TAKE(ckpts)["w"]), lambda: train_ckpt(TAKE(ckpts), batch)):
    try:
        use()
    except jc.DonationError as err:
        errors.append(err)
"""


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("holder", ["OrderedDict", "NamedTuple"])
def test_a_consumed_dict_kept_in_a_checkpoint_names_its_consumer_and_its_path(
    level, holder
):
    # It named no step. A dict is no jc.state: at full the step's record of
    # what its call consumed names it; below full the message lists the steps
    # that donate. The leaf is named by its path in the checkpoint.
    import collections

    class Checkpoint(typing.NamedTuple):
        step: int
        state: dict

    if holder == "OrderedDict":
        hold, take, path = (
            (lambda s: collections.OrderedDict(epoch0=s)),
            (lambda c: c["epoch0"]),
            "ckpts['epoch0']['w']",
        )
    else:
        hold, take, path = (lambda s: Checkpoint(1, s)), (lambda c: c.state), "ckpts.state['w']"
    with jc.checks_level(level):
        ns = _as_a_script(_CHECKPOINTS, HOLD=hold, TAKE=take)
    read, passed = ns["errors"]
    assert isinstance(read, RuntimeError)  # as JAX's "Array has been deleted" is
    for err in (read, passed):
        assert "evaluate" not in _summary(err)  # it read the state, donated nothing: never named
    if level == "full":  # the record of what train_ckpt's call consumed names it
        assert _summary(read).startswith(f"`{path}` (f32[3]) was donated to train_ckpt."), read
        assert "s['w']: f32[3] was already donated to train_ckpt" in str(passed)
        assert (read.step, passed.step) == ("train_ckpt", "training_script.train_ckpt")
        return
    # below full nothing records it: the message lists the steps that donate
    assert _summary(read).startswith(
        f"`{path}` (f32[3]) was deleted: most likely donated to an earlier call ("
    ), read
    # train_ckpt among the steps listed (the first three, sorted, of every test's)
    assert _listed() in str(read) and _listed() in str(passed)
    assert "s['w']: f32[3] was already deleted" in str(passed)
    for err in (read, passed):
        assert "donated to train_ckpt" not in str(err)
    # the read names no step (none is proven); the re-pass names the step it calls
    assert (read.step, passed.step) == (None, "training_script.train_ckpt")


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_new_tuple_at_a_consumed_tuples_address_is_said_deleted_not_donated_to_the_step(level):
    # A record of consumed arguments by id() once said "donated to <lambda>"
    # of a new tuple the user built at the consumed tuple's address, whose
    # array the user deleted. Nothing is recorded by address now.
    f = jc.hot_step(lambda s: (s[0] + 1, s[1] * 2), state="s")
    with jc.checks_level(level):
        s = f((jnp.zeros(3), jnp.ones(3)))
        old = s
        s = f(s)
        address = id(old)
        a, b = jnp.arange(3.0), jnp.arange(3.0)
        # CPython keeps at most 2,000 freed 2-tuples for reuse; after a long
        # run that list may be full, and `old` would then go back to the
        # allocator. Empty it first, so `old` is the one freed 2-tuple and the
        # next 2-tuple built takes its address.
        emptied = [(i, -i) for i in range(5_000)]
        del old
        t = (a, b)
        assert id(t) == address  # CPython's tuple free list: the consumed tuple's address
        del emptied
        a.delete()
        with pytest.raises(jc.DonationError) as passed:
            f(t)
        with pytest.raises(jc.DonationError) as read:
            np.asarray(t[1] + t[0])
        s = f(s)
    assert "s[0]: f32[3] was already deleted\n" in str(passed.value)
    assert "s[1]" not in _summary(passed.value)  # the live one is not said deleted
    assert "f32[3]) was deleted: most likely donated to an earlier call" in str(read.value)
    for err in (passed.value, read.value):
        assert "donated to <lambda>" not in str(err) and "or x.delete()" in str(err)
    assert not any(x.is_deleted() for x in s)


@pytest.mark.parametrize("level", ["fast", "full"])
@pytest.mark.parametrize("where", ["outside loops", "in a hot_loop"])
def test_a_batch_a_plain_jit_donated_is_never_said_donated_to_the_step_it_is_passed_to(
    level, where
):
    # It said "donated to train". The step does not donate its batch: the fix
    # does not send the user to the state the step returned either.
    @jc.hot_step(state="params")
    def train_batch(params, batch):
        return {"w": params["w"] - 0.1 * batch.mean()}

    normalize = jax.jit(lambda b: b / 2, donate_argnums=0)
    with jc.checks_level(level):
        params = train_batch({"w": jnp.zeros(3)}, jnp.ones(4))
        batch = jnp.ones(4)
        normalize(batch)
        with pytest.raises(jc.DonationError) as info:
            with jc.hot_loop() if where == "in a hot_loop" else contextlib.nullcontext():
                train_batch(params, batch)
        params = train_batch(params, jnp.ones(4))
    err = info.value
    text = str(err)
    assert "the call passes a buffer that no longer exists" in text
    assert (
        "  batch: f32[4] was already deleted\n" in text
        and "or a jax.jit with donate_argnums" in text
    )
    assert "donated to train_batch" not in text
    assert err.fix.startswith(
        "pass an array that still exists: batch was deleted before this call ("
    ), err.fix
    assert "train_batch returned" not in err.fix and "jnp.copy(batch)" in err.fix
    assert err.step.endswith(".train_batch") and list(err.leaves) == ["batch"]
    assert not params["w"].is_deleted()


def test_a_deleted_state_leaf_still_says_pass_the_state_the_step_returned():
    # The fix above is for arguments the step does not donate; a re-passed
    # state keeps the fix that names the step's own returned state.
    f = jc.hot_step(lambda s: {"w": s["w"] + 1}, state="s")
    s = f({"w": jnp.zeros(3)})
    old, s = s, f(s)
    with pytest.raises(jc.DonationError) as info:
        f(old)
    assert info.value.fix.startswith("pass the state")
    assert "not the one you passed to it" in info.value.fix
