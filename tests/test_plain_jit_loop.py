"""Plain jax.jit functions inside jc.hot_loop (issue 40, item 1): a cache
miss in the loop is seen with its function, options and arguments
(capability jit-cache-miss), so a host argument is named by function and
parameter at the user's line, a wrong donation is refused before the call
runs, and a second compile says which leaf changed."""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcontracts as jc
from jaxcontracts._compat import capability

pytestmark = pytest.mark.skipif(
    not capability("jit-cache-miss").available, reason="jax.jit cache misses cannot be observed on this JAX"
)


def _fn1():
    @functools.partial(jax.jit, donate_argnums=(0,))  # lr inserted before state: the index drifted
    def fn1(lr, state):
        return {"w": state["w"] - lr * state["w"], "t": state["t"] + 1}

    return fn1


def _state():
    return {"w": jnp.ones((4,)), "t": jnp.int32(0)}


def test_the_requests_loop_in_record_mode_names_the_scalar_and_the_drifted_donation():
    fn1, state = _fn1(), _state()
    with jc.hot_loop(compiles="warmup", on_violation="record") as loop:
        for _ in range(10):
            state = fn1(0.5, state)  # the line every finding names
    by_kind = {v.kind: v for v in loop.violations if v.where.endswith(".py:" + str(_line("state = fn1(0.5, state)")))}
    assert "`fn1` is given a Python float at `lr`" in by_kind["transfer"].what
    # a float made static folds its arithmetic in double precision: results differ in their last bits
    assert "jax.device_put" in by_kind["transfer"].fix and "static_argnames" not in by_kind["transfer"].fix
    assert "lr is donated, but it is a Python float" in by_kind["wrong_donation"].what
    assert "state could be donated instead" in by_kind["wrong_donation"].what
    assert "donate_argnames=('state',)" in by_kind["wrong_donation"].fix
    # JAX's own log line for the first call's scalar is not listed a second time
    assert not [v for v in loop.violations if "weakly typed: a Python scalar" in v.what]
    assert int(state["t"]) == 10
    # record mode: the calls ran, and the recorded fix does not say they did not
    assert "did not run" not in by_kind["wrong_donation"].fix


def test_a_drifted_donation_is_refused_before_the_call_with_the_inputs_intact():
    fn1, state = _fn1(), _state()
    lr = jax.device_put(jnp.float32(0.5))  # on the device: no transfer, only the donation is wrong
    with pytest.raises(jc.DonationError, match=r"lr is donated, but no output has the shape and dtype") as info:
        with jc.hot_loop(compiles="warmup"):
            state = fn1(lr, state)
    assert "donate_argnames=('state',)" in info.value.fix and "The call did not run" in info.value.fix
    assert not lr.is_deleted() and not state["w"].is_deleted()  # nothing ran, nothing donated


def test_a_second_compile_of_a_plain_jit_names_the_leaf_that_changed():
    @functools.partial(jax.jit, donate_argnums=0)
    def accumulate(state, x):
        return {"result": state["result"] + x, "n": state["n"] + 1}

    s, one = {"result": jnp.int32(0), "n": jnp.int32(0)}, jnp.float32(1)
    with pytest.raises(jc.RecompileError) as info:  # noqa: PT012
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(3)):
                s = accumulate(s, one)
    text = str(info.value)
    assert "jax compiles `accumulate` again, because:" in text
    assert "state['result']: i32[] -> f32[]" in text  # worded as a hot step's RecompileError
    assert "a float where an integer is expected" in text  # its cause, as the fix
    assert "in iteration 1 of loop.iterate()" in text


def test_record_mode_lists_the_recompile_diff_once_per_line():
    @functools.partial(jax.jit, static_argnames=("k",))
    def top(x, k):
        return jax.lax.top_k(x, k)[0]

    x = jnp.arange(8.0)
    with jc.hot_loop(compiles="warmup", on_violation="record") as loop:
        for i in loop.iterate(range(3)):
            top(x, k=i + 1)
    compiles = [v for v in loop.violations if v.kind == "compile"]
    assert compiles and "static k: 1 -> 2" in compiles[0].what


def test_jax_own_jits_and_allowed_sections_are_not_looked_at():
    x = jnp.ones(3)
    with jc.hot_loop(compiles="allow") as loop:
        jc.fetch(jax.jit(lambda v: v + 1)(x))  # a fresh jit, device arguments: nothing to say
    assert loop.violations == []


def _line(text: str) -> int:
    for n, line in enumerate(pathlib.Path(__file__).read_text().splitlines(), 1):
        if text in line and "_line(" not in line:
            return n
    raise AssertionError(text)


def test_a_refusal_from_inside_a_jitted_call_ends_at_the_users_line_without_jaxs_note():
    fn1, state = _fn1(), _state()
    with pytest.raises(jc.TransferError) as info:  # noqa: PT012
        with jc.hot_loop(compiles="warmup"):
            state = fn1(0.5, state)
    assert not getattr(info.value, "__notes__", None)  # JAX's "removed its internal frames" note
    assert "is given a Python float at `lr`" in str(info.value)


def test_inside_a_watch_a_missed_donation_in_a_raising_loop_is_refused_before_the_next_call():
    with jc.watch():
        step = jax.jit(lambda s: {"w": s["w"] * 0.5})  # state not donated
        s = {"w": jnp.ones(8)}
        s = step(s)  # the compile: warm-up
        with pytest.raises(jc.DonationError, match=r"a missed donation, inside jc.hot_loop: `<lambda>`: s: not donated") as info:  # noqa: PT012,E501
            with jc.hot_loop(compiles="warmup"):
                for _ in range(3):
                    s = step(s)
    assert "donate_argnames=('s',)" in info.value.fix and "The call did not run" in info.value.fix
    assert not s["w"].is_deleted()


def test_inside_a_watch_a_recording_loop_lists_the_missed_donation_once_per_line():
    with jc.watch():
        step = jax.jit(lambda s: {"w": s["w"] * 0.5})
        s = step({"w": jnp.ones(8)})
        with jc.hot_loop(compiles="warmup", on_violation="record") as loop:
            for _ in range(5):
                s = step(s)
    missed = [v for v in loop.violations if v.kind == "missed_donation"]
    assert len(missed) == 1 and missed[0].count >= 2
    assert any(c.key == "donation-config" and not c.ok for c in loop.report().contracts)


def _step():
    @jax.jit  # not donated: state = step(state, x) holds the state twice at each call
    def step(state, x):
        return {"w": state["w"] + x, "t": state["t"] + 1}

    return step


def test_a_missed_donation_in_a_loop_without_a_watch_is_raised_at_the_next_iteration():
    step, state, x = _step(), _state(), jnp.ones(4)
    with pytest.raises(jc.DonationError) as info:
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(5)):
                state = step(state, x)  # the call the message names
    text = str(info.value)
    assert f"test_plain_jit_loop.py:{_line('state = step(state, x)  # the call')})" in text and "`step` (called at " in text
    assert "`state` is not donated, yet the call's own statement dropped its 2 array(s) (20 B)" in text
    assert "in iteration 1 of loop.iterate()" in text
    # `@jax.jit` above the def: the fix is written in that form
    assert info.value.fix.startswith("@jax.jit(donate_argnames=('state',)) in place of @jax.jit")
    assert int(state["t"]) == 1  # raised before the second iteration's call


def test_a_missed_donation_is_recorded_and_a_kept_or_donated_state_is_not_one():
    step, state, x = _step(), _state(), jnp.ones(4)
    with jc.hot_loop(compiles="warmup", on_violation="record") as loop:
        for _ in range(3):  # no iterate(): settled at the loop's end
            state = step(state, x)
    assert [v.kind for v in loop.violations] == ["missed_donation"]
    assert not loop.report().ok
    kept, step2, state = [], _step(), _state()
    with jc.hot_loop(compiles="warmup") as loop:  # a trajectory keeps every state: nothing missed
        for _ in loop.iterate(range(3)):
            kept.append(state)
            state = step2(state, x)
    donating = jax.jit(_step().__wrapped__, donate_argnums=0)
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(3)):
            state = donating(state, x)
    assert int(state["t"]) == 6 and len(kept) == 3


def test_a_state_whose_buffers_another_array_holds_is_not_a_missed_donation():
    # `params = jax.device_put(init_params, device)` on the device they are on:
    # new arrays over the same buffers. The loop's fix (donate `params`) would
    # delete what `init_params` still reads after the loop.
    step, x = _step(), jnp.ones(4)
    init = _state()
    state = jax.device_put(init, jax.devices()[0])
    assert state["w"] is not init["w"]
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(4)):
            state = step(state, x)
    assert not loop.violations
    assert float(jnp.sum(state["w"] - init["w"])) != 0.0  # init, read after the loop, intact
    # once nothing else holds them, the drop is a missed donation again
    state, step = jax.device_put(init, jax.devices()[0]), _step()
    del init
    with pytest.raises(jc.DonationError, match="is not donated, yet the call's own statement dropped"):
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(4)):
                state = step(state, x)


def test_a_batch_an_output_could_also_take_is_not_a_missed_donation_while_the_state_takes_it():
    @jax.jit  # the state donated; the batch matches the output too, but the state's buffers take it
    def update(w, batch):
        return w + batch

    update = jax.jit(update.__wrapped__, donate_argnums=0)
    w = jnp.zeros(4)
    batches = (jax.device_put(np.ones(4, np.float32)) for _ in range(4))  # each dropped after its call
    with jc.hot_loop(compiles="warmup") as loop:
        for batch in loop.iterate(batches):
            w = update(w, batch)
    assert float(w[0]) == 4.0 and not loop.violations


def test_an_argument_dropped_later_by_another_statement_is_not_a_missed_donation():
    # the notebook's shape: the norm reads s, then the next step consumes it;
    # it dies at the step's line, not at the norm's: donating it to the norm
    # would have deleted what the step needed
    step = jc.hot_step(lambda s: {"w": s["w"] * 0.5, "b": s["b"] + 1}, state="s")
    norm = jax.jit(lambda p: {"w": p["w"] / jnp.sum(p["w"]), "b": p["b"]})  # outputs s's shapes
    s, norms = step({"w": jnp.ones(4), "b": jnp.float32(0)}), []
    with jc.hot_loop(compiles="warmup", on_violation="record") as loop:
        for _ in loop.iterate(range(4)):
            norms.append(norm(s))
            s = step(s)
    assert loop.violations == [] and len(norms) == 4
    bump = jax.jit(lambda p: {"w": p["w"] + 1, "b": p["b"]})
    with jc.hot_loop(compiles="warmup", on_violation="record") as loop:
        for _ in loop.iterate(range(3)):
            s = bump(s)  # rebound by the call's own statement: a missed donation
    assert [v.kind for v in loop.violations] == ["missed_donation"]


# -- issue 51, section 4: the drifted index with a device scalar ------------


def _device_lr_fn1():
    @functools.partial(jax.jit, donate_argnums=(0,))  # lr inserted before state: the index drifted
    def fn1(lr, state):
        return {"w": state["w"] - lr * state["w"], "loss": jnp.mean(state["w"])}

    return fn1


_DRIFTED_LOOP = """
state = {"w": jnp.ones((4,)), "loss": jnp.float32(0)}
with jc.hot_loop(compiles="warmup"):
    for _ in range(3):
        state = fn1(lr, state)
"""


@pytest.mark.parametrize("where", ["a script", "a function"])
def test_a_donated_device_scalar_passed_again_names_the_parameter_the_jit_line_and_the_fix(where):
    # any f32[] output "could reuse" lr's buffer: only its second use shows
    # the drift. The warm call fails inside JAX's C++ call: the message reads
    # the names on the user's line (a function's from Python 3.13 on)
    names = {"jc": jc, "jnp": jnp, "fn1": _device_lr_fn1(), "lr": jax.device_put(jnp.float32(0.1))}
    jit_line = _device_lr_fn1.__code__.co_firstlineno + 1
    from _program import run_program

    with pytest.raises(jc.DonationError) as info:
        run_program(_DRIFTED_LOOP, "state = {", where, names, "state")
    text = str(info.value)
    # the drift, whichever the loop meets first: lr passed again (jax 0.10's
    # warm C++ call fails), or the state it left undonated (newer jax)
    assert "`lr` is passed to `fn1` again" in text or "it donates `lr`" in text
    assert f"test_plain_jit_loop.py:{jit_line}" in text  # the jax.jit line that set the donation
    assert "donate_argnames=('state',)" in text and "drift" in text
    assert "Array has been deleted" not in text and "Invalid buffer" not in text


def test_a_donated_device_scalar_that_misses_again_is_refused_before_the_call():
    fn1, lr = _device_lr_fn1(), jax.device_put(jnp.float32(0.1))
    first = {"w": jnp.ones((4,)), "loss": jnp.float32(0)}
    with jc.hot_loop(compiles="warmup"):
        fn1(lr, first)
    state = {"w": jnp.ones((8,)), "loss": jnp.float32(0)}  # a new shape: a cache miss, seen in Python
    with pytest.raises(jc.DonationError, match="donate_argnames=\\('state',\\)") as info:
        with jc.hot_loop(compiles="allow"):
            fn1(lr, state)
    assert "The call did not run" in str(info.value) and not state["w"].is_deleted()


def test_the_drift_is_said_with_the_missed_donation_of_the_state_it_should_donate():
    fn1, lr = _device_lr_fn1(), jax.device_put(jnp.float32(0.1))
    fn2 = jax.jit(lambda s: {"w": s["w"] * 0.5, "loss": s["loss"]}, donate_argnums=(0,))
    state = {"w": jnp.ones((4,)), "loss": jnp.float32(0)}
    with pytest.raises(jc.DonationError) as info:
        with jc.hot_loop(compiles="warmup"):
            for _ in range(3):
                state = fn1(lr, state)
                state = fn2(state)
    text = str(info.value)
    assert "it donates `lr`" in text and "the index likely drifted" in text
    assert "donate_argnames=('state',)" in text


def test_a_first_compile_refused_in_a_plain_jit_loop_points_at_compiles_warmup():
    fn = jax.jit(lambda s: s + 1)
    x = jnp.ones(3)
    with pytest.raises(jc.RecompileError, match='compiles="warmup"'):
        with jc.hot_loop():
            fn(x)


def test_the_motivating_loop_alone_stops_at_the_drift_with_the_fix(tmp_path):
    import subprocess
    import sys

    program = pathlib.Path(__file__).parent / "audit_programs" / "drifted_lr.py"
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "jaxcontracts.DonationError" in proc.stderr and "it donates `lr`" in proc.stderr
    assert "drifted_lr.py:15" in proc.stderr and "donate_argnames=('state',)" in proc.stderr
    fixed = tmp_path / "fixed.py"  # the one edit the message asks for: a clean loop
    fixed.write_text(program.read_text().replace("donate_argnums=(0,)", "donate_argnames=('state',)"))
    proc = subprocess.run([sys.executable, str(fixed)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "done 5"


def test_the_first_loop_of_a_process_keeps_what_the_user_warmed_before_it(tmp_path):
    """jax.jit functions and eager ops warmed before the first jc.hot_loop run
    from their caches inside it: what the loop imports on its first entry
    leaves JAX's trace context alone (on jax 0.12, importing jax.extend
    registers Pallas's options, a new context, and every warmed function
    compiled again: a false RecompileError at the loop's first call)."""
    import subprocess
    import sys

    program = tmp_path / "warm_first.py"
    program.write_text(
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda a: a * 2)\n"
        "x = jnp.arange(3.0)\n"
        "y = f(f(x))\n"
        "z = x + x\n"
        "import jaxcontracts as jc\n"
        "with jc.hot_loop():\n"
        "    for _ in range(3):\n"
        "        y = f(y)\n"
        "        z = z + x\n"
        "print(f._cache_size(), jc.fetch(y).tolist())\n"
    )
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "[0.0,", "32.0,", "64.0]"]


def test_a_loop_left_open_in_a_generator_at_exit_ends_the_script_quietly(tmp_path):
    """A generator holding a loop across its yields (the guide's shape), left
    unfinished at the end of a script: the plain jax.jit calls it followed
    die as the interpreter shuts down, and nothing is printed after the
    script's last line (the weak-reference callbacks ran with the module's
    globals already gone: "Exception ignored in: ... Dropped._died")."""
    import subprocess
    import sys

    program = tmp_path / "open_at_exit.py"
    program.write_text(
        "import jax, jax.numpy as jnp\n"
        "import jaxcontracts as jc\n"
        "f = jax.jit(lambda v, w: v * w)\n"
        "x = jnp.ones(3); w = jnp.ones(3)\n"
        "def producer():\n"
        "    with jc.hot_loop(compiles='warmup'):\n"
        "        while True:\n"
        "            yield f(x, w)\n"
        "g = producer()\n"
        "for _ in range(3):\n"
        "    y = next(g)\n"
        "print('done')\n"
    )
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["done"]
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
