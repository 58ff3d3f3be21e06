"""JAX's refs (jax.new_ref) in the loops users write today (issue 38 item 2).

The training cookbook holds its train state in refs and updates them in
place from a jitted step. A hot loop guards such a loop as any other (a read
of a ref is a transfer unless through jc.fetch, which reads refs), and a hot
step takes a pytree of refs as its state: the arrays the refs hold are
donated and the new ones put back into the refs after each call (it once
refused them as "on the host", then as not taken).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxcontracts as jc
from jaxcontracts import _compat

if not hasattr(jax, "new_ref"):  # pragma: no cover - older jax
    pytest.skip("this jax has no jax.new_ref", allow_module_level=True)


def _refs():
    return jax.tree.map(jax.new_ref, {"w": jnp.zeros(3), "n": jnp.int32(0)})


@jax.jit
def train_step(state, x):  # the cookbook's shape: the refs written in place
    state["w"][...] = state["w"][...] + x
    state["n"][...] += 1
    return state["w"][...].sum()


def test_a_jitted_ref_loop_is_guarded_and_read_through_fetch():
    state, x = _refs(), jnp.ones(3)
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(5)):
            loss = train_step(state, x)
        values = jc.fetch(state)  # the refs' values, copied to the host
        assert float(jc.fetch(loss)) == 15.0
    assert int(values["n"]) == 5 and values["w"].tolist() == [5.0] * 3
    with pytest.raises(jc.TransferError, match=r"device-to-host read: float\(\) of i32\[\]"):
        with jc.hot_loop(compiles="allow"):
            float(state["n"][...])


def _ref_step(**options):
    @jc.hot_step(state="state", **options)
    def step(state, x):  # train_step's body, as a hot step
        state["w"][...] = state["w"][...] + x
        state["n"][...] += 1
        return state["w"][...].sum()

    return step


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_a_hot_step_carries_refs_as_the_jitted_step_does(level):
    # the cookbook's loop with the decorator swapped: the same numbers, the
    # refs updated in place, their arrays donated (nothing refused at full:
    # the arrays refs hold are theirs alone)
    state, twin, x = _refs(), _refs(), jnp.ones(3)
    with jc.checks_level(level):
        step = _ref_step()
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(5)):
                loss = step(state, x)
                train_step(twin, x)
            assert float(jc.fetch(loss)) == 15.0
    got, want = jc.fetch(state), jc.fetch(twin)
    assert got["w"].tolist() == want["w"].tolist() == [5.0] * 3
    assert int(jc.fetch(state["n"])) == 5
    sig = step.describe().current
    assert [leaf.donated for leaf in sig.leaves] == [True, True, False]
    assert step.stats.compiles == 1 and step.stats.refused == 0


def test_the_arrays_a_ref_held_are_donated_and_replaced():
    state, x = _refs(), jnp.ones(3)
    step = _ref_step()
    step(state, x)
    before = _compat.refs.buffer(state["w"])
    step(state, x)
    after = _compat.refs.buffer(state["w"])
    assert before.is_deleted() and not after.is_deleted()  # donated, replaced
    assert jc.fetch(state["w"]).tolist() == [2.0] * 3


def test_compile_takes_refs_and_the_call_then_compiles_nothing():
    state, x = _refs(), jnp.ones(3)
    step = _ref_step()
    step.compile(state, x)
    with jc.hot_loop():  # compiles="forbid": the call must find the executable
        step(state, x)
    assert step.stats.compiles == 1 and int(jc.fetch(state["n"])) == 1


def test_the_same_ref_passed_twice_is_refused_with_the_refs_intact():
    w = jax.new_ref(jnp.zeros(3))
    step = _ref_step()
    with pytest.raises(
        jc.DefinitionError,
        match=r"step: the same JAX ref is passed twice \(state\['n'\] and state\['w'\]\)",
    ):
        step({"w": w, "n": w}, jnp.ones(3))
    assert jc.fetch(w).tolist() == [0.0] * 3


def test_a_ref_tree_made_anew_each_iteration_is_refused_in_a_loop():
    # the update written into last iteration's refs is lost when they are dropped
    params, x = {"w": jnp.zeros(3), "n": jnp.int32(0)}, jnp.ones(3)
    step = _ref_step()
    step(jax.tree.map(jax.new_ref, params), x)  # outside a loop: one call, its refs
    with jc.hot_loop(compiles="allow"):
        state = jax.tree.map(jax.new_ref, params)
        step(state, x)
        with pytest.raises(
            jc.DefinitionError, match="the refs its last call updated are gone"
        ) as info:
            state = jax.tree.map(jax.new_ref, params)
            step(state, x)
    assert "make the refs once, before the loop" in info.value.fix
    assert int(jc.fetch(state["n"])) == 0  # nothing ran
    kept = _refs()  # the same refs each iteration: no refusal
    with jc.hot_loop():
        for _ in range(3):
            step(kept, x)
    assert int(jc.fetch(kept["n"])) == 3


def test_a_parameter_mixing_refs_and_arrays_is_refused():
    step = _ref_step()
    state = {"w": jax.new_ref(jnp.zeros(3)), "n": jnp.int32(0)}
    with pytest.raises(jc.DefinitionError, match=r"`state` mixes refs with 1 other leaves") as info:
        step(state, jnp.ones(3))
    assert "on the host" not in str(info.value)
    assert jc.fetch(state["w"]).tolist() == [0.0] * 3


def test_a_hot_step_on_refs_under_jit_and_with_jit_disabled_writes_them():
    state, x = _refs(), jnp.ones(3)
    step = _ref_step()

    @jax.jit
    def twice(state, x):  # the refs are traced: the step writes them itself
        step(state, x)
        return step(state, x)

    assert float(twice(state, x)) == 6.0
    with jax.disable_jit():
        step(state, x)
    step(state, x)  # and compiled again, on the refs' arrays
    assert int(jc.fetch(state["n"])) == 4 and jc.fetch(state["w"]).tolist() == [4.0] * 3


def test_a_ref_read_in_a_loop_is_a_transfer_and_a_new_shape_a_recompile():
    state, x = _refs(), jnp.ones(3)
    step = _ref_step()
    step(state, x)
    with pytest.raises(jc.TransferError, match=r"float\(\) of i32\[\]"):
        with jc.hot_loop():
            step(state, x)
            float(state["n"][...])
    wider, x4 = jax.tree.map(jax.new_ref, {"w": jnp.zeros(4), "n": jnp.int32(0)}), jnp.ones(4)
    with pytest.raises(
        jc.RecompileError, match=r"state\['w'\]: compiled with f32\[3\], called with f32\[4\]"
    ):
        with jc.hot_loop():
            step(wider, x4)
    assert jc.fetch(wider["w"]).tolist() == [0.0] * 4


def test_a_jitted_ref_step_in_a_loop_and_a_watch_is_not_taken_for_host_data():
    # the loop's cache-miss observer and jc.watch() see refs among a jitted
    # function's arguments: they are not host data (no transfer, no read of them)
    state, x = _refs(), jnp.ones(3)
    with jc.watch() as w:
        step = jax.jit(train_step.__wrapped__)
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(4)):
                step(state, x)
    assert [f.kind for f in w.findings() if f.kind == "host_transfer"] == []
    assert int(jc.fetch(state["n"])) == 4


# -- issue 51 section 5: refs as the cookbook writes them ---------------------


def test_a_weakly_typed_ref_keeps_its_type_across_calls_as_under_jax_jit():
    # The cookbook counts steps in a ref made of jnp.array(0) (~i32[]). jax.jit
    # keys a ref on the ref's own type, fixed when it was made; the array put
    # back after a call came out strongly typed, so the second call was refused
    # ("compiled with ~i32[], called with i32[]").
    state = jax.tree.map(jax.new_ref, {"w": jnp.zeros(3), "n": jnp.array(0)})
    twin = jax.tree.map(jax.new_ref, {"w": jnp.zeros(3), "n": jnp.array(0)})
    step, x = _ref_step(), jnp.ones(3)
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(3)):
            step(state, x)
            train_step(twin, x)
    assert step.stats.compiles == 1 and step.stats.refused == 0
    assert int(jc.fetch(state["n"])) == int(jc.fetch(twin["n"])) == 3
    # the ref's own type kept (~i32[] on jax 0.10; jax 0.11.2 makes every ref strongly typed)
    assert _compat.refs.buffer(state["n"]).weak_type is state["n"].aval.inner_aval.weak_type
    assert not _compat.refs.buffer(state["w"]).weak_type  # a strong ref stays strong


def test_the_cookbook_port_with_its_counter_made_by_jnp_array_prints_the_originals_numbers(tmp_path):
    import io
    import runpy
    from contextlib import redirect_stdout
    from pathlib import Path

    ports = Path(__file__).resolve().parent / "ports"
    printed = []
    for name in ("cookbook_refs_original.py", "cookbook_refs_port.py"):
        source = (ports / name).read_text()
        assert "step=jnp.int32(0)" in source
        weak = tmp_path / name
        weak.write_text(source.replace("step=jnp.int32(0)", "step=jnp.array(0)"))
        out = io.StringIO()
        with redirect_stdout(out):
            runpy.run_path(str(weak), run_name="__main__")
        printed.append(out.getvalue())
    assert printed[0].strip() and printed[1] == printed[0]


_counter = jax.new_ref(jnp.int32(0)) if hasattr(jax, "new_ref") else None


def test_a_step_closing_over_a_ref_is_refused_by_name_and_the_named_fix_works():
    # A hot step that closes over a ref failed at compile with JAX's raw
    # "ValueError: Too many leaves for PyTreeDef" (from Compiled.input_shardings,
    # which JAX cannot give for an executable with a closed-over ref). It is
    # refused before anything runs, naming the ref, and the fix it names works.
    @jc.hot_step(state="x")
    def step(x):
        _counter[...] += 1
        return x + 1

    x = jnp.zeros(3)
    with pytest.raises(jc.DefinitionError) as info:
        step(x)
    text = str(info.value)
    assert "closes over a JAX ref: `_counter` (i32[])" in text, text
    assert "pass it as an argument" in info.value.fix
    assert info.value.__traceback__.tb_frame.f_code.co_filename == __file__  # ends at the user's line
    assert int(jc.fetch(_counter)) == 0 and not x.is_deleted()  # nothing ran

    @jc.hot_step(state="x")
    def fixed(x, counter):  # as the fix says: the ref passed, carried in place
        counter[...] += 1
        return x + 1

    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(3)):
            x = fixed(x, _counter)
    assert int(jc.fetch(_counter)) == 3 and jc.fetch(x).tolist() == [3.0] * 3


def test_a_ref_closed_over_inside_a_container_is_named_by_its_path():
    held = {"n": jax.new_ref(jnp.zeros(2))}
    step = jc.hot_step(lambda x: held["n"].__setitem__(..., x) or x * 2, state="x")
    with pytest.raises(jc.DefinitionError, match=r"closes over a JAX ref: `held\['n'\]` \(f32\[2\]\)"):
        step(jnp.ones(2))


def test_a_ref_a_jitted_helper_closes_over_is_refused_and_named_from_the_module():
    @jax.jit
    def helper(x):
        _counter[...] += 1
        return x * 2

    step = jc.hot_step(lambda x: helper(x) + 1, state="x")
    with pytest.raises(jc.DefinitionError, match=r"closes over a JAX ref: `_counter` \(i32\[\]\)"):
        step(jnp.ones(2))
