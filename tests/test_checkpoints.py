"""Checkpoints every N steps inside a hot loop, kept asynchronous (issue 38 item 3).

An orbax ``CheckpointManager.save`` of the state inside a raising loop was
refused as an implicit read (``.copy_to_host_async()``), with a fix that did
not apply; inside a branch allowing transfers, the next donating call was
refused while orbax held the array, so only ``wait_until_finished()`` after
every save got through. ``jc.to_host(state)`` gives the saver copies of its
own in host memory, made asynchronously; later steps donate past them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcontracts as jc


def _step():
    @jc.hot_step(state="s")
    def step(s):
        return {"w": s["w"] + 1, "n": s["n"] + 1}

    return step


def test_copies_in_host_memory_outlive_the_donation_and_read_freely_in_a_loop():
    step = _step()
    s = step({"w": jnp.zeros((64, 64)), "n": jnp.int32(0)})
    with jc.checks_level("full"), jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(3)):
            kept = jc.to_host(s)
            s = step(s)  # donates what `kept` was copied from
            assert np.asarray(kept["w"])[0, 0] == float(jc.fetch(s["n"])) - 1  # no transfer: host memory
    assert loop.violations == [] and step.stats.calls == 4
    if kept["w"].sharding.memory_kind == "pinned_host":  # (else: a device copy, its transfer started)
        assert kept["n"].sharding.memory_kind == "pinned_host"


def test_an_orbax_save_every_n_steps_stays_asynchronous_inside_a_raising_loop(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    step = _step()
    s = step({"w": jnp.zeros((128, 128)), "n": jnp.int32(0)})
    manager = ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(max_to_keep=5))
    try:
        with jc.checks_level("full"), jc.hot_loop(compiles="warmup") as loop:
            for i in loop.iterate(range(1, 7)):
                s = step(s)
                if i % 2 == 0:  # no wait_until_finished(): the save goes on in the background
                    manager.save(i, args=ocp.args.StandardSave(jc.to_host(s)))
        manager.wait_until_finished()
        assert list(manager.all_steps()) == [2, 4, 6] and loop.violations == []
        target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), s)
        for saved in (2, 4, 6):
            restored = manager.restore(saved, args=ocp.args.StandardRestore(target))
            assert int(restored["n"]) == saved + 1 and float(restored["w"][0, 0]) == saved + 1
    finally:
        manager.close()


def test_a_save_of_the_state_itself_is_refused_with_the_fix_that_applies(tmp_path):
    step = _step()
    s = step({"w": jnp.zeros((8, 8)), "n": jnp.int32(0)})
    with pytest.raises(jc.TransferError) as info, jc.hot_loop():
        s["w"].copy_to_host_async()  # what orbax does first with each array it saves
    assert "jc.to_host(state)" in info.value.fix
