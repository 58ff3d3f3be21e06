"""JAX's refs (jax.new_ref) in the loops users write today (issue 38 item 2).

The training cookbook holds its train state in refs and updates them in
place from a jitted step. A hot loop guards such a loop as any other (a read
of a ref is a transfer unless through jc.fetch, which reads refs); a hot step
does not take refs yet, and says so (it said they were "on the host").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxcontracts as jc

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


def test_a_hot_step_given_refs_says_it_does_not_take_them_with_the_refs_intact():
    state = _refs()

    @jc.hot_step(state="state")
    def step(state, x):
        state["w"][...] = state["w"][...] + x

    for attempt in (lambda: step(state, jnp.ones(3)), lambda: step.compile(state, jnp.ones(3))):
        with pytest.raises(jc.DefinitionError) as info:
            attempt()
        text = str(info.value)
        assert "state['n'], state['w'] are JAX refs (2)" in text and "on the host" not in text
        assert "jax.jit" in info.value.fix
    assert jc.fetch(state["w"]).tolist() == [0.0] * 3  # nothing ran


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
