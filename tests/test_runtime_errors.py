"""JAX's runtime errors leaving a hot loop, turned into the contract errors they are.

JAX refuses an implicit host-to-device copy (its own transfer guard, engaged
for the loop) and a donated buffer given to a warm jit with bare runtime
errors. Leaving the loop they become a TransferError or a DonationError that
names the user's line, the array and the fix (for a Python constant in an
eager op, the idiomatic one). A user's own exception that merely quotes such
a text is left alone.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import traceback
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, advance_fn, make_particles

import jaxcontracts as jc

# A message names the variable path (`old.x`) where the user's frame's locals
# can be read without writing to them: a function frame's only from Python
# 3.13 (its f_locals proxy); before, reading one syncs the dict locals()
# returned, so the message names the user's line and the array's spec only.
NAMES = sys.version_info >= (3, 13)
DELETED = "was deleted: most likely donated to an earlier call (hot steps that donate: "


def _listed() -> str:
    """The steps a message lists: every live donating step (other tests' too), sorted, three at most."""
    from jaxcontracts import _steps

    live = _steps.donating()
    return DELETED + ", ".join(live[:3]) + (", ..." if len(live) > 3 else "") + ";"

# -- host-to-device: JAX's guard refusal --------------------------------------


def test_implicit_host_to_device_transfers_raise():
    x = jnp.arange(3.0)
    for planted in (
        lambda: x + np.ones(3, np.float32),  # numpy into an eager op
        lambda: x * 2,  # a Python scalar into an eager op
    ):
        planted()  # warm: only the transfer is left to catch
        with pytest.raises(jc.TransferError, match="host-to-device") as info:
            with jc.hot_loop():
                planted()
        assert "test_runtime_errors.py:" in str(info.value)
    advance = jc.hot_step(advance_fn, signature=Particles)
    advance(make_particles())
    bad = Particles.__new__(Particles)
    bad.__dict__.update(pos=np.zeros((4, 3), np.float32), vel=jnp.zeros((4, 3)), t=jnp.float32(0), dt=0.01)
    with pytest.raises(jc.TransferError, match="on the host"):
        with jc.hot_loop():
            advance(bad)


@pytest.mark.parametrize(
    "glue",
    [
        pytest.param(lambda x, idx, flag: flag & 1, id="bit-test"),
        pytest.param(lambda x, idx, flag: x * 0.5, id="metric-math"),
        # x[idx]: JAX's own index constants, named as such (test_messages.py)
    ],
)
def test_python_constants_in_eager_ops_name_the_idiomatic_fix(glue):
    args = (jnp.arange(10.0), jnp.array([1, 2, 3]), jnp.int32(5))
    glue(*args)
    # compiles allowed: in a long session JAX can compile the eager op again (its
    # cache is JAX's); what is checked here is the transfer's message
    with pytest.raises(jc.TransferError) as e, jc.hot_loop(compiles="allow"):
        glue(*args)
    text = str(e.value)
    assert "host-to-device, a Python constant in an eager op" in text
    assert "test_runtime_errors.py" in text  # the user's line
    assert "jax.jit" in e.value.fix and "one = jnp.int32(1)" in e.value.fix
    assert 'transfers="allow_host_to_device"' in e.value.fix


# -- a donated array given to a warm jit --------------------------------------


def test_a_donated_array_in_a_warm_jit_is_a_donation_error_naming_it_and_the_step():
    @jc.hot_step(signature=dict)
    def step(d: dict) -> dict:
        return {"x": d["x"] + 1}

    double = jax.jit(lambda a: a * 2)
    d = step({"x": jnp.zeros(3)})
    double(d["x"])
    with pytest.raises(jc.DonationError, match="still hold elsewhere"), jc.hot_loop():
        x = d["x"]
        d = step(d)  # at full, refused: x holds a leaf the donation would delete
    del x
    with pytest.raises(jc.DonationError) as e, jc.checks_level("fast"), jc.hot_loop():
        x = d["x"]
        d = step(d)  # fast: not looked at, so x is deleted by the donation
        double(x)  # x was pulled out of the state before it was donated
    text = str(e.value)
    # JAX refuses it in C++ (translated at the loop's exit: "an array that ...") or, on some
    # versions, in Python's deletion check (our hook: "an array (f32[3]) ...").
    heads = ("`x` (f32[3]) ",) if NAMES else ("an array that ", "an array (f32[3]) ")
    assert any(h + DELETED in text for h in heads), text
    assert e.value.contract == "no-donated-use"
    assert "test_runtime_errors.py" in text


# -- only JAX's own errors are translated -------------------------------------


@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_a_user_error_that_quotes_a_guard_message_is_left_alone(error):
    """Only JAX's own runtime errors become contract errors at loop exit."""
    text = "Disallowed host-to-device transfer: aval=ShapedArray(float32[3]) (quoted by user code)"
    with pytest.raises(error) as info:
        with jc.hot_loop():
            raise error(text)
    assert type(info.value) is error and str(info.value) == text


def test_a_donated_leaf_of_a_foreign_state_is_named_by_its_path_and_step():
    # A NamedTuple state (blackjax's shape) read after donation inside a loop:
    # the message names the path inside the state the frame holds (3.13), and
    # the step that consumed it.
    import typing

    class State(typing.NamedTuple):
        position: jax.Array
        logdensity: jax.Array

    def kernel(key, state):
        return State(state.position + 1, state.logdensity), {"accepted": jnp.bool_(True)}

    step = jc.hot_step(kernel, state="state")
    key, state = jax.random.key(0), State(jnp.zeros(2), jnp.zeros(()))
    state, _ = step(key, state)
    double = jax.jit(lambda a: a * 2)
    double(state.position)
    with pytest.raises(jc.DonationError) as e, jc.hot_loop():
        old = state
        state, _ = step(key, state)
        double(old.position)
    text = str(e.value)
    heads = ("`old.position` (f32[2]) ",) if NAMES else ("an array that ", "an array (f32[2]) ")  # as above
    # the step's record of what its call consumed names it (a foreign state too), where the
    # array is found (XLA's error for a warm jit names none: before 3.13, a function's
    # variables are not read, and the steps that donate are listed)
    said = "was donated to kernel" if "donated to kernel" in text else DELETED
    assert any(text.startswith("use of a donated array inside jc.hot_loop: " + h + said) for h in heads), text


JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:2])


class _Pair(typing.NamedTuple):
    x: jax.Array
    n: jax.Array


def _pair_step():
    def advance(s):
        return _Pair(s.x + 1, s.n + 1)

    # A shape no other test uses: an eager op JAX has run on this spec before
    # dispatches in C++, where the deleted buffer is XLA's ValueError (below).
    step = jc.hot_step(advance, state="s")
    return step, step(_Pair(jnp.zeros((5, 7)), jnp.zeros((), jnp.int32)))


@pytest.mark.parametrize(
    "use",
    [
        lambda old: print(old.x),
        lambda old: float(old.n),
        lambda old: np.asarray(old.x),
        lambda old: jnp.sin(old.x),
        lambda old: old.x + 1,
        lambda old: jax.device_get(old),
        lambda old: jax.jit(lambda a: a * 2)(old.x),
        lambda old: old.x.block_until_ready(),  # jaxlib's C++ method: its error explained
        lambda old: jax.block_until_ready(old.x),
        lambda old: jax.block_until_ready(old),  # several leaves: one C++ wait, no method
    ],
    ids=["print", "float", "np.asarray", "eager op", "operator", "device_get", "jit", "wait", "jax.wait", "tree"],
)
def test_a_donated_leaf_of_a_foreign_state_read_outside_a_loop_is_named_with_its_step(use):
    # Outside any loop JAX said only "Array has been deleted with shape=float32[3]".
    step, s = _pair_step()
    old = s
    s = step(s)
    with pytest.raises((jc.DonationError, jax.errors.JaxRuntimeError)) as e:
        use(old)
    if not isinstance(e.value, jc.DonationError):
        # jax 0.12's device_get checks deletion in C++ (copy_to_host_async), past
        # the Python check jaxcontracts names arrays in: JAX's own error there.
        assert "Array has been deleted" in str(e.value)
        assert JAX_VERSION >= (0, 12), e.value
        return
    assert isinstance(e.value, RuntimeError)  # still what JAX raised: `except RuntimeError` holds
    text = str(e.value)
    assert "was donated to advance." in text and e.value.step == "advance", text  # the step's record
    if NAMES:
        assert "`old.x` (f32[5,7])" in text or "`old.n` (i32[])" in text, text
    else:
        assert "an array (f32[5,7])" in text or "an array (i32[])" in text, text
    assert e.value.contract == "no-donated-use"
    assert jnp.array_equal(s.x, jnp.full((5, 7), 2.0))  # the state the step returned is fine


def test_block_until_ready_of_an_array_deleted_otherwise_is_jax_s_own_error():
    # the step's words only for what a step consumed: an array a plain jax.jit
    # donated, or one deleted by hand, keeps JAX's JaxRuntimeError
    _pair_step()  # a donating step compiled: the hook is in
    plain = jax.jit(lambda a: a * 2, donate_argnums=0)
    z = jnp.ones(5)
    plain(z)
    y = jnp.ones(2)
    y.delete()
    for use in (z.block_until_ready, lambda: jax.block_until_ready(y), lambda: jax.block_until_ready([z, y])):
        with pytest.raises(jax.errors.JaxRuntimeError):
            use()


def test_block_until_ready_still_names_the_step_after_a_first_compile_inside_a_timing_loop(tmp_path):
    # The loop's timing wraps block_until_ready while it runs; the first donating
    # compile inside it wrapped the timing wrapper, which the loop's exit then
    # replaced by jaxlib's method: the step's words were lost for good. (A fresh
    # process: the hook goes in once, at the first donating compile.)
    script = tmp_path / "first_compile_in_loop.py"
    script.write_text(
        "import jax, jax.numpy as jnp, jaxcontracts as jc\n"
        "step = jc.hot_step(lambda s: s + 1, state='s')\n"
        "s = jnp.zeros(3)\n"
        "with jc.hot_loop(compiles='warmup') as loop:\n"
        "    for _ in loop.iterate(range(3)):\n"
        "        s = step(s)\n"
        "old = s\n"
        "s = step(s)\n"
        "for use in (old.block_until_ready, lambda: jax.block_until_ready(old), lambda: jax.block_until_ready([s, old])):\n"
        "    try:\n"
        "        use()\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__, str(e).splitlines()[0])\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["DonatedArrayError `old` (f32[3]) was donated to <lambda>."] * 3, done


def test_kept_samples_deleted_by_earlier_calls_name_the_list_and_the_donating_step():
    # At "fast" nothing refuses the kept sample; the later read still says what happened.
    gc.collect()  # other tests' steps held only by cycles: gone before the message lists the live ones
    step, s = _pair_step()
    samples = []
    with jc.checks_level("fast"):
        for _ in range(3):
            samples.append(s.x)
            s = step(s)
    with pytest.raises(jc.DonationError) as e:
        jnp.stack(samples)
    text = str(e.value)
    assert text.startswith(("`samples[0]`" if NAMES else "an array") + " (f32[5,7]) " + DELETED), text
    from jaxcontracts import _steps

    live = _steps.donating()  # every live donating step (other tests' too), sorted
    assert "advance" in live
    assert f"hot steps that donate: {', '.join(live[:3])}{', ...' if len(live) > 3 else ''};" in text


def test_a_deleted_array_nothing_names_is_jaxs_own_error_only_while_no_step_donates(monkeypatch):
    from jaxcontracts import _steps

    _pair_step()  # a donating hot step exists: the hook is installed
    ys = [jnp.ones(2), jnp.ones(2)]
    ys[0].delete()
    ys[1].delete()
    with pytest.raises(jc.DonationError, match=r"an array \(f32\[2\]\) " + re.escape(DELETED)) as e:
        str(ys.pop())
    assert isinstance(e.value, RuntimeError)
    monkeypatch.setattr(_steps, "donating", lambda: [])  # no hot step donates: nothing to add to JAX's error
    with pytest.raises(RuntimeError, match="Array has been deleted") as e:
        str(ys.pop())
    assert not isinstance(e.value, jc.ContractError)


def test_a_donated_foreign_leaf_read_inside_a_loop_names_its_path():
    step, s = _pair_step()
    old = s
    s = step(s)
    named = "`old.x`, " if NAMES else ""
    with pytest.raises(jc.DonationError, match=re.escape(f"str() / print() of {named}an array (f32[5,7]) that was donated to advance")):
        with jc.hot_loop():
            print(old.x)


def test_a_read_only_step_that_saw_a_leaf_is_never_named_as_its_donor():
    # jax-md's rollback: measure(state) reads, advance(state) donates.
    def rollout(s):
        return {"x": s["x"] + 1}

    def energy(s):
        return s["x"].sum()

    advance = jc.hot_step(rollout, state="s")
    measure = jc.hot_step(energy, stateless=True)
    s = {"x": jnp.zeros((2, 9))}
    with pytest.raises(jc.DonationError) as e:
        with jc.hot_loop(compiles="warmup") as loop:
            for i in loop.iterate(range(3)):
                measure(s)
                new = advance(s)
                if i == 1:
                    print(s["x"])
                s = new
    text = str(e.value)
    assert "donated to rollout" in text, text  # rollout consumed it ...
    assert "energy" not in text.split("Fix:")[0]  # ... the read-only step is never named
    assert measure.stats.calls == 2 and advance.stats.calls == 2


class _Sim(typing.NamedTuple):
    position: jax.Array
    energy: jax.Array


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_plain_jit_given_a_consumed_array_in_a_nested_allowing_loop_names_it_and_its_step(level):
    # issue 39 R2a, jax-md's overflow rollback with donate="all": the state the step
    # consumed, given to a plain jax.jit inside a nested transfers="allow" loop, was a
    # raw `ValueError: ... Buffer has been deleted or donated`.
    def simulate(s):
        return _Sim(s.position + 1, s.energy + 1)

    def drift(p):
        return Particles(pos=p.pos + 1, vel=p.vel, t=p.t, dt=p.dt)

    advance = jc.hot_step(simulate, state="s", donate="all")
    move = jc.hot_step(drift, state="p", donate="all")
    measure = jax.jit(lambda a: (a * a).sum())
    s, p = advance(_Sim(jnp.zeros((6, 3)), jnp.zeros(()))), move(make_particles(6))
    measure(s.position)  # warm: the loop refuses no compile

    def rollback(state, step, read):
        """A loop whose rollback branch reads the state the step consumed: the error."""
        with pytest.raises(jc.DonationError) as e:  # noqa: PT012
            with jc.hot_loop(compiles="warmup") as loop:
                for i in loop.iterate(range(3)):
                    old = state
                    state = step(state)
                    if i == 1:
                        with jc.hot_loop(transfers="allow"):  # the rollback branch
                            measure(read(old))
        return str(e.value), e.value

    with jc.checks_level(level):
        text, err = rollback(s, advance, lambda old: old.position)
        spec = "(f32[6,3]) "
        heads = (f"`old.position` {spec}",) if NAMES else ("an array that ", f"an array {spec}")
        title = "use of a donated array inside jc.hot_loop: "
        if level == "full" and "was donated to simulate" in text:  # the record of what its call consumed
            assert any(text.startswith(title + h + "was donated to simulate") for h in heads), text
        else:  # no record below full, or (a warm jit's error names no array) not the array itself:
            # the steps that donate are listed
            assert any(text.startswith(title + h + DELETED) for h in heads), text
            names = re.search(r"hot steps that donate: ([^;]*);", text)[1].split(", ")
            # sorted, three at most (other tests' steps may still be live): simulate, or three before it
            assert "simulate" in names or (names[-1] == "..." and names[2] < "simulate"), names
        assert "measure(read(old))" in text
        assert err.contract == "no-donated-use"
        text, err = rollback(p, move, lambda old: old.pos)
        # a jc.state's consumed class proves which step consumed it: that one is named
        assert "Particles.pos: f32[6,3] was donated to drift" in text, text
        assert "lambda old: old.pos" in text and err.contract == "no-donated-use"  # the read: the field


def test_a_nan_under_debug_nans_is_jaxs_floating_point_error_not_a_donation_story():
    # It used to say "s['x'] was already deleted ... your inputs are intact": false.
    def step_fn(s):
        return {"x": jnp.log(s["x"] - 1.0)}

    step = jc.hot_step(step_fn, state="s")
    s = step({"x": jnp.array([3.0, 3.0, 3.0], jnp.float32)})
    for level in ("off", "full"):
        with jc.checks_level(level), jax.debug_nans(True):
            with pytest.raises(FloatingPointError, match=r"invalid value \(nan\) encountered in the output of"):
                step({"x": jnp.zeros(3, jnp.float32)})
    keep = jc.hot_step(step_fn, state="s", donate="none")
    keep({"x": jnp.array([3.0, 3.0, 3.0], jnp.float32)})
    with jax.debug_nans(True), pytest.raises(FloatingPointError, match="encountered in log") as e:
        keep({"x": jnp.zeros(3, jnp.float32)})  # inputs intact: re-run op by op, as jax.jit does
    assert any("re-running" in n for n in e.value.__notes__)
    assert s["x"].shape == (3,)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_debug_infs_reading_a_step_s_outputs_in_a_loop_says_so_and_what_it_cost(level):
    # jax_debug_infs makes JAX copy every output to the host after the call:
    # inside a loop that read is refused, after XLA took the donated state. It
    # said "s['x'] was already deleted ... your other inputs are intact": false.
    step = jc.hot_step(lambda s: {"x": s["x"] + 1.0}, state="s")
    s = step({"x": jnp.zeros(3)})
    jax.config.update("jax_debug_infs", True)
    try:
        with jc.checks_level(level), pytest.raises(jc.TransferError, match="device-to-host") as info:
            with jc.hot_loop():
                step(s)
    finally:
        jax.config.update("jax_debug_infs", False)
    notes = "\n".join(info.value.__notes__)
    assert "s['x']: f32[3] deleted" in notes, notes
    assert info.value.fix.startswith("jax_debug_infs is on: after each call JAX copies every output")
    assert s["x"].is_deleted()


def test_debug_nans_reading_outputs_in_a_loop_is_the_fix_named_for_any_call(tmp_path):
    # JAX's look at the outputs is a read the user's line never wrote: the fix
    # names the option first, for a hot step compiled with it on (JAX donates
    # nothing then: the state stays intact) and for a plain jax.jit. (A fresh
    # process: whether JAX's C++ path looks at the outputs of a warm plain
    # jax.jit depends on what ran before.)
    script = tmp_path / "debug_nans_loop.py"
    script.write_text(
        "import jax, jax.numpy as jnp, jaxcontracts as jc\n"
        "jax.config.update('jax_debug_nans', True)\n"
        "for call in (jc.hot_step(lambda s: s * 0.5, state='s', donate='all'), jax.jit(lambda s: s * 0.25)):\n"
        "    s = call(jnp.ones(3))\n"
        "    try:\n"
        "        with jc.hot_loop():\n"
        "            call(s)\n"
        "    except jc.TransferError as e:\n"
        "        print(e.fix[:64], float(s[0]))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    prefix = "jax_debug_nans is on: after each call JAX copies every output to"
    assert done.stdout.splitlines() == [f"{prefix} 0.5", f"{prefix} 0.25"], done


@pytest.mark.parametrize("level", ["fast", "off"])
def test_a_stale_leaf_refused_inside_jax_s_call_is_not_a_call_that_ran(level):
    # at fast and off only the first donated leaf is looked at before the call:
    # a stale second leaf is refused by its read inside JAX's call, before the
    # program runs; that refusal is no "the call ran and consumed the state"
    step = jc.hot_step(lambda s, x: {"a": s["a"] + x, "b": s["b"] * 2}, state="s")
    with jc.checks_level(level):
        s0, x = {"a": jnp.ones(4), "b": jnp.ones(4)}, jnp.ones(4)
        s1 = step(s0, x)
        mixed = {"a": s1["a"], "b": s0["b"]}  # b is stale: donated by the call before
        with pytest.raises(jc.DonationError, match=r"s\['b'\]: f32\[4\] was already deleted") as info:
            step(mixed, x)
    assert not any("did run" in n for n in getattr(info.value, "__notes__", []))
    assert not mixed["a"].is_deleted()


@pytest.mark.parametrize("filtering", ["auto", "off"])
def test_a_kept_traceback_of_a_failed_trace_holds_none_of_the_arrays(filtering):
    # IPython keeps the last error's traceback (sys.last_traceback): the slow
    # path's frames in it held the flat leaves, so the fixed step's first call
    # was refused ("arrays you still hold elsewhere") though nothing of the
    # user's held them
    s = {"x": jnp.ones(3), "y": jnp.ones(3)}
    broken = jc.hot_step(lambda s: {"x": s["x"] + s["y"][:2], "y": s["y"]}, state="s")
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", filtering)
    try:
        with pytest.raises(TypeError) as info:
            broken(s)
    finally:
        jax.config.update("jax_traceback_filtering", before)
    kept = info.value.__traceback__  # what IPython keeps
    fixed = jc.hot_step(lambda s: {"x": s["x"] + s["y"], "y": s["y"]}, state="s")
    s = fixed(s)
    assert s["x"].tolist() == [2.0] * 3
    names = [f.name for f in traceback.extract_tb(kept)]
    # filtered, the library's frames left the traceback; unfiltered, they stay and their locals went
    assert ("_decide" in names) == (filtering == "off"), names


def test_a_step_compiled_under_debug_nans_donates_nothing_as_jax_jit():
    # jax.jit donates nothing while jax_debug_nans is on (it re-runs a failing
    # program on its inputs); a hot step compiled then was refused at compile
    # ("XLA found no output to reuse the buffer for"), clean code included
    with jax.debug_nans(True):
        step = jc.hot_step(lambda s: {"x": s["x"] * 2.0 + 1.0}, state="s")
        s = {"x": jnp.ones(3)}
        out = step(s)
        assert out["x"].tolist() == [3.0] * 3 and not s["x"].is_deleted()
        bad = jc.hot_step(lambda s: {"x": jnp.log(s["x"] - 2.0)}, state="s")
        s = {"x": jnp.ones(3)}
        with pytest.raises(FloatingPointError, match="encountered in log"):
            bad(s)
        assert s["x"].tolist() == [1.0] * 3  # intact, as jax.jit leaves it


def test_an_error_tracing_a_step_says_which_step_was_compiling():
    # issue 39: a TypeError from tracing (a scan carry changing dtype) left
    # .compile() raw, naming no step
    def rollout(s):
        def body(c, _):
            return c.astype(jnp.float16), None  # the carry changes dtype

        c, _ = jax.lax.scan(body, s["x"], None, length=3)
        return {"x": c.astype(jnp.float32)}

    step = jc.hot_step(rollout, state="s")
    with pytest.raises(TypeError, match="scan body function carry") as info:
        step.compile({"x": jax.ShapeDtypeStruct((3,), jnp.float32)})
    assert any("raised while compiling the hot step" in n and "rollout" in n for n in info.value.__notes__)


def test_jax_mds_rollback_outside_a_loop_names_the_step_where_python_sees_the_array():
    # jax-md's rollback as users write it: the state a hot step consumed, passed
    # to a plain jax.jit outside any loop to restore it. A jit meeting the
    # arrays for the first time checks them in Python (the step is named); one
    # that compiled for their shape already passes them to XLA in C++, with no
    # Python in between: JAX's own error (inside a loop, the loop names the step).
    def nve(s):
        return _Sim(s.position + 1, s.energy + 1)

    step = jc.hot_step(nve, state="s")
    s = step(_Sim(jnp.zeros((3, 11)), jnp.zeros(())))
    saved = s
    s = step(s)
    cold = jax.jit(lambda old: _Sim(old.position * 1.0, old.energy * 1.0))
    with pytest.raises(jc.DonationError) as info:
        cold(saved)  # its first call: its Python path checks each argument
    assert "donated to nve" in str(info.value) and info.value.step == "nve"
    warm = jax.jit(lambda old: _Sim(old.position * 2.0, old.energy * 2.0))
    warm(s)  # compiled for this shape
    if JAX_VERSION < (0, 11):
        with pytest.raises(ValueError, match="deleted or donated"):  # XLA's own words, from C++
            warm(saved)
    else:  # its dispatch checks deleted arguments in Python first: named
        with pytest.raises(jc.DonationError, match="donated to nve"):
            warm(saved)
    with pytest.raises(jc.DonationError) as info, jc.hot_loop():
        warm(saved)
    # jax 0.10's C++ error names no array: there, before 3.13 (where a function's
    # variables are not read), the steps that donate; else the consumer
    named = NAMES or JAX_VERSION >= (0, 11)
    assert ("was donated to nve" if named else "hot steps that donate: ") in str(info.value), str(info.value)
