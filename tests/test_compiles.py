"""Compiles inside a hot loop: a RecompileError naming what compiles, or the true cause.

A ``jax.jit`` call, a cold eager op or a hot step meeting a new signature
inside a loop raises a RecompileError naming the function. A compile is often
a symptom, and then the message names the cause: the host read on the user's
line that follows it, a donated array the op was given, a jit warmed on
uncommitted arrays and now called with a step's committed outputs.

Issue 10: ``if s.loss < 1e-3:`` reported the cold ``less`` compile and advised
running it once before the loop (the real problem is the ``bool()`` read that
follows), and ``jc.fetch(d["w"] - prev["w"])`` on a donated ``prev`` reported
a ``subtract`` compile without mentioning donation.
"""

from __future__ import annotations

import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, advance_fn, make_particles
from jaxtyping import Array, Float32

import jaxcontracts as jc

# -- what compiles is named ---------------------------------------------------


def test_compiles_raise_naming_the_function():
    x = jnp.arange(3.0)

    def fresh(a):
        return a - 1

    with pytest.raises(jc.RecompileError, match="`fresh`") as info:
        with jc.hot_loop():
            jax.jit(fresh)(x)
    assert "test_compiles.py:" in str(info.value)
    with pytest.raises(jc.RecompileError, match="`tanh`"):
        with jc.hot_loop():
            jnp.tanh(x)  # a cold eager op
    jnp.tanh(x)
    with jc.hot_loop():
        jnp.tanh(x)  # warm now: allowed


def test_hot_step_first_compile_or_new_signature_inside_the_loop():
    advance = jc.hot_step(advance_fn, signature=Particles, max_compiles=2)
    p = make_particles()
    with pytest.raises(jc.RecompileError, match="hot_step advance_fn would compile a new signature"):
        with jc.hot_loop():
            advance(p)
    assert advance.stats.compiles == 0
    p = advance(p)
    bigger = make_particles(8)
    with pytest.raises(jc.RecompileError, match="would compile a new signature"):
        with jc.hot_loop():
            advance(bigger)
    with jc.hot_loop():
        p = advance(p)


# -- the true cause: a read on the line, a donated array, an uncommitted warm-up ---


@jc.state
class S:
    w: Float32[Array, "n"]
    loss: Float32[Array, ""]


@jc.hot_step(signature=S)
def st(s: S) -> S:
    return S(w=s.w + 1, loss=s.loss * 0.5)


def fresh() -> S:
    return st(S(w=jnp.zeros(3), loss=jnp.float32(1)))


def test_an_if_on_an_eager_comparison_is_the_read_not_the_compile():
    s = fresh()
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            s = st(s)
            if s.loss < 1e-3:  # the planted line
                pass
    text = str(info.value)
    assert "device-to-host read: the `if` on this line reads the result of an eager `less`" in text
    assert "if s.loss < 1e-3:  # the planted line" in text
    assert "jnp.where / lax.cond" in info.value.fix and "run it once" not in text


def test_in_a_loop_that_allows_reads_the_cold_eager_op_is_the_compile():
    # the sixth hostile round: with transfers="allow" the read is allowed, and
    # the error blamed it (a TransferError telling the user to fetch rarely)
    jax.clear_caches()
    s = fresh()
    with pytest.raises(jc.RecompileError) as info:
        with jc.hot_loop(transfers="allow"):
            float(s.w[1] * 0.4375)  # a cold eager op, read on the host
    assert "compile" in str(info.value) and "device-to-host read" not in str(info.value)


@pytest.mark.parametrize(
    ("line", "construct"),
    [
        ("while s.loss > 12.5: break", "the `while` on this line"),
        ("assert s.loss >= -7.0", "the `assert` on this line"),
        ("y = 1 if s.loss != 3.5 else 0", "the `if` on this line"),
        ("y = float(s.loss * 0.25)", "float() on this line"),
        ("y = (s.loss + 0.75).item()", "item() on this line"),
        ("y = np.asarray(s.loss - 0.125)", "np.asarray() on this line"),
    ],
)
def test_each_host_construct_is_named(line, construct, tmp_path):
    jax.clear_caches()  # cold: an op an earlier test warmed copies its constant first (an accelerator)
    s = fresh()
    path = tmp_path / "planted.py"  # a file, so that the message can quote the line
    path.write_text(f"with jc.hot_loop():\n    {line}  # planted\n")
    code = compile(path.read_text(), str(path), "exec")
    with pytest.raises(jc.TransferError, match=re.escape(f"device-to-host read: {construct} reads the result of an eager")):
        exec(code, {"jc": jc, "s": s, "np": np})


@pytest.mark.parametrize(
    "line",
    [
        "y = jnp.asarray(s.loss * 0.375)",  # jax.numpy's asarray reads nothing
        "y = jnp.array(s.loss * 0.625)",
        "y = jax.nn.relu(s.w * 0.875) if relu else s.w",  # a Python bool's if: the op is in the branch
        "y = jnp.cos(s.w * 0.3125) if cfg.flag else s.w",  # an attribute's truth: nothing computed
        "y = jnp.tan(s.w * 0.4375) if s.w.shape[0] > 2 else s.w",  # an array's metadata
        "y = jnp.sin(s.w * 0.5625) if len(cfg.__dict__) > 0 else s.w",
        # the second review: names whose values are Python numbers, a dtype test, attributes' and
        "y = jnp.cos(s.w * 0.15625) if s.w.shape[0] > n else s.w",
        "y = jnp.tan(s.w * 0.21875) if i % 10 == 0 else s.w",
        "y = jnp.sin(s.w * 0.28125) if s.w.dtype == jnp.float32 else s.w",
        "y = jnp.exp(s.w * 0.34375) if cfg.flag and not cfg.other else s.w",
    ],
)
def test_a_cold_op_on_a_line_with_a_look_alike_is_the_compile(line, tmp_path):
    # "asarray" by its name alone and any `if` were taken for a host read: the
    # message named a read that never happens and the fix was for reads
    # (hostile round 3); the compile is what is proven
    jax.clear_caches()
    s = fresh()
    path = tmp_path / "planted.py"
    path.write_text(f"with jc.hot_loop():\n    {line}  # planted\n")
    code = compile(path.read_text(), str(path), "exec")
    with pytest.raises(jc.RecompileError, match=r"jax compiles `"):
        cfg = types.SimpleNamespace(flag=1, other=0)
        exec(code, {"jc": jc, "s": s, "jax": jax, "jnp": jnp, "relu": True, "cfg": cfg, "n": 2, "i": 10})


def test_a_cold_jit_called_in_the_body_of_a_one_line_if_is_the_compile_not_a_read(tmp_path):
    # hostile round 64: the logging idiom inside a function (its locals unknown
    # before 3.13) and a set's `in` (any version) were taken for a host read of
    # the test: a TransferError whose fix was for reads, where a jax.jit never
    # compiled before compiles in the body
    path = tmp_path / "planted.py"
    path.write_text(
        "import jax, jax.numpy as jnp\n"
        "evaluate = jax.jit(lambda a: jnp.sum(a * 2.0625))\n"
        "h = jax.jit(lambda a: a * 3.0625)\n"
        "eval_epochs = {0, 2}\n"
        "def train(x, steps=3, log_every=10):\n"
        "    with jc.hot_loop():\n"
        "        for step in range(steps):\n"
        "            if step % log_every == 0: m = evaluate(x)  # planted\n"
        "def epochs(x):\n"
        "    with jc.hot_loop():\n"
        "        for epoch in range(3):\n"
        "            if epoch in eval_epochs: acc = h(x)  # planted\n"
    )
    scope = {"jc": jc}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    for run in (scope["train"], scope["epochs"]):
        with pytest.raises(jc.RecompileError, match=r"jax compiles `<lambda>`"):
            run(jnp.ones(3))
    # a read in the test itself is still the read
    path = tmp_path / "read.py"  # (another file: linecache keeps the first one's lines)
    path.write_text("with jc.hot_loop():\n    if jnp.sum(s.w * 0.40625) > 0: y = g(s.w)  # planted\n")
    with pytest.raises(jc.TransferError, match="the `if` on this line reads the result of an eager"):
        exec(compile(path.read_text(), str(path), "exec"),
             {"jc": jc, "jnp": jnp, "s": fresh(), "g": jax.jit(lambda a: a)})


def test_a_cold_asarray_of_a_numpy_batch_says_it_is_a_transfer_to_put_on_the_device():
    # hostile round 64: the first refusal named JAX's `stage` and its fix (a warm-up)
    # only led to the TransferError the line really is
    if not hasattr(jax.lax, "stage"):  # jax 0.10.0: asarray puts it explicitly (JAX allows it)
        pytest.skip("this jax's jnp.asarray of a numpy array is an explicit device_put")
    batch = np.ones(3, np.float32)
    jax.clear_caches()
    with pytest.raises((jc.RecompileError, jc.TransferError)) as info:
        with jc.hot_loop():
            jnp.asarray(batch)
    if isinstance(info.value, jc.RecompileError):  # a JAX whose asarray compiles lax.stage
        assert "jax compiles `stage`" in str(info.value)
        assert info.value.fix.startswith("JAX's `stage` turns a host value into a device array")
        assert "put it on the device once, before the loop" in info.value.fix
    with pytest.raises(jc.TransferError):  # following it the other way: the transfer
        with jc.hot_loop(compiles="warmup"):
            jnp.asarray(batch)


def test_a_cold_op_without_a_read_stays_a_compile():
    s = fresh()
    with pytest.raises(jc.RecompileError, match=r"jax compiles `multiply`.*\n.*y = s\.w \* 31\.5"):
        with jc.hot_loop():
            y = s.w * 31.5  # noqa: F841 - a cold eager op, result kept on device


def test_an_eager_op_on_a_donated_array_is_the_donation():
    @jc.hot_step
    def dstep(d: dict) -> dict:
        return {"w": d["w"] + 1}

    d = dstep({"w": jnp.zeros(3)})
    with pytest.raises(jc.DonationError) as info:
        with jc.hot_loop():
            prev = d
            d = dstep(d)
            jc.fetch(d["w"] - prev["w"])
    text = str(info.value)
    named = "`prev['w']`, " if sys.version_info >= (3, 13) else ""  # see test_runtime_errors.NAMES
    assert f"`subtract` on {named}an array (f32[3]) that was donated to dstep" in text, text
    assert 'jc.fetch(d["w"] - prev["w"])' in text
    assert "kept = jnp.copy(value)" in info.value.fix


def test_a_field_of_a_donated_state_is_named_before_any_op():
    s = fresh()
    with pytest.raises(jc.DonationError, match=r"S\.w: f32\[3\] was donated to st"):
        with jc.hot_loop():
            prev = s
            s = st(s)
            jc.fetch(s.w - prev.w)


def test_a_jit_warmed_on_uncommitted_arrays_recompiles_for_step_outputs_and_says_why():
    # Verified on jax 0.10.0, 0.10.2 and 0.12: committed and uncommitted
    # inputs are different jit cache entries.
    @jc.hot_step(signature=dict)
    def step(d: dict) -> dict:
        return {"x": d["x"] + 1}

    d = step(jc.device_tree({"x": jnp.zeros(3)}))
    assert d["x"].committed
    norm = jax.jit(lambda a: jnp.sum(a * a))
    norm(jnp.zeros(3))  # warmed on an uncommitted array
    with pytest.raises(jc.RecompileError) as e, jc.hot_loop():
        norm(d["x"])
    assert "committed" in e.value.fix and "jc.device_tree(x)" in e.value.fix
    # Warmed on a committed array (jc.device_tree), the same call is clean.
    norm2 = jax.jit(lambda a: jnp.sum(a * a))
    norm2(jc.device_tree(jnp.zeros(3)))
    with jc.hot_loop():
        d = step(d)
        norm2(d["x"])


# -- compiles="warmup": the first pass may compile, once per thing -----------


def _warm_step():
    return jc.hot_step(advance_fn, signature=Particles)


def test_a_warmup_loop_lets_the_first_pass_compile_and_lists_it():
    step = _warm_step()
    total = jax.jit(lambda x: x.sum())
    p = make_particles()
    sums = []
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(4)):
            p = step(p)  # the step's first signature compiles in iteration 0
            sums.append(total(p.pos))  # so does the jit helper
            for _row in p.pos:  # iterating an array compiles unstack: eager glue
                pass
    names = [w.what.lstrip("_") for w in loop.warmup_compiles]  # jax 0.10.0 names it _unstack
    assert names == ["advance_fn", "<lambda>", "unstack"]
    assert all(w.iteration == 0 and "test_compiles.py:" in w.where for w in loop.warmup_compiles)
    assert step.stats.compiles == 1 and loop.iterations == 4 and not loop.violations
    text = str(loop.report())
    assert "warm-up compiles: 3" in text and "  advance_fn at " in text and "iterations: 4 (" in text
    # The numbers are the plain program's.
    q = make_particles()
    for _ in range(4):
        q = advance_fn(q)
    np.testing.assert_allclose(jc.fetch(p.pos), jc.fetch(q.pos), rtol=1e-6)


def test_a_second_compile_of_the_same_thing_is_still_refused():
    p = make_particles()
    with pytest.raises(jc.RecompileError, match="compiles `<lambda>` again") as info:  # noqa: PT012
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(3)):
                fresh = jax.jit(lambda x: x + 1)  # a new jax.jit each iteration
                fresh(p.pos)
    assert "in iteration 1 of loop.iterate()" in str(info.value)
    step = jc.hot_step(advance_fn, signature=Particles, max_compiles=2)
    four, five = make_particles(4), make_particles(5)
    with pytest.raises(jc.RecompileError, match="compiled once already in this loop's warm-up"):  # noqa: PT012
        with jc.hot_loop(compiles="warmup"):
            step(four)
            step(five)  # a new shape: max_compiles would allow it, the loop does not
    twice = jax.jit(lambda x: x * 2)
    inputs = (jnp.float32(1.0), jnp.bfloat16(2.0))
    with pytest.raises(jc.RecompileError, match="again"):  # noqa: PT012
        with jc.hot_loop(compiles="warmup"):
            for x in inputs:
                twice(x)  # a new dtype at the same line: a retrace


def test_only_the_first_iteration_may_compile_when_the_loop_iterates():
    p = make_particles()
    late = jax.jit(lambda x: x - 1)
    with jc.hot_loop(compiles="warmup", on_violation="record") as loop:
        for i in loop.iterate(range(3)):
            if i == 2:
                late(p.pos)  # a first compile, but past the warm-up pass
    (v,) = loop.violations
    assert v.kind == "compile" and v.iteration == 2 and "`<lambda>`" in v.what
    assert loop.warmup_compiles == []


def test_without_iterate_each_thing_compiles_once_anywhere_in_the_block():
    helper = jax.jit(lambda x: x * 3)
    p = make_particles()
    with jc.hot_loop(compiles="warmup") as loop:
        helper(p.pos)  # first: let through
        helper(p.pos)  # warm: nothing compiles
        helper(p.vel)  # same signature: nothing compiles
    assert [w.what for w in loop.warmup_compiles] == ["<lambda>"]
    assert loop.warmup_compiles[0].iteration is None
    with pytest.raises(jc.DefinitionError, match="'disallow', 'warmup', 'allow'"):
        jc.hot_loop(compiles="first")
