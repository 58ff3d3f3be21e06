"""Host glue in a hot loop: what is clean, what transfers, and what the messages say.

The glue real training/RL/simulation loops write between steps: unpacking a
key split, iterating a device array of permutations, metric math on device
scalars, a gather, a bit test on an overflow flag.
"""

from __future__ import annotations

import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcontracts as jc


def _warm_then_loop(fn, **loop):
    fn()  # the first iteration compiles the eager ops, as a loop's warm-up would
    with jc.hot_loop(**loop):
        return fn()


# --------------------------------------------------------------------------
# Clean: no transfer happens


def test_unpacking_a_key_split_is_clean():
    split = jax.jit(jax.random.split)
    key = jax.random.key(0)

    def glue():
        k, sub = split(key)
        return sub

    assert jax.dtypes.issubdtype(_warm_then_loop(glue).dtype, jax.dtypes.prng_key)


def test_iterating_a_device_array_of_permutations_is_clean():
    perms = jnp.stack([jax.random.permutation(jax.random.key(i), 8) for i in range(3)])

    def glue():
        return [perm for perm in perms]

    assert len(_warm_then_loop(glue)) == 3


def test_metric_math_on_device_scalars_is_clean():
    loss, count = jnp.float32(3.0), jnp.float32(2.0)

    def glue():
        return (loss + loss) / count

    assert isinstance(_warm_then_loop(glue), jax.Array)


def test_gather_and_bit_test_with_device_constants_or_a_jit_helper_are_clean():
    x = jnp.arange(10.0)
    idx = jnp.array([1, 2, 3])
    flag = jnp.int32(5)
    one = jnp.int32(1)  # the constant made once, before the loop
    gather = jax.jit(lambda a, i: a[i])

    def glue():
        return gather(x, idx), flag & one

    _warm_then_loop(glue)


# --------------------------------------------------------------------------
# A Python constant in an eager op is a host-to-device copy: the message says so


@pytest.mark.parametrize(
    "glue",
    [
        pytest.param(lambda x, idx, flag: flag & 1, id="bit-test"),
        pytest.param(lambda x, idx, flag: x * 0.5, id="metric-math"),
        pytest.param(lambda x, idx, flag: x[idx], id="fancy-gather"),
    ],
)
def test_python_constants_in_eager_ops_name_the_idiomatic_fix(glue):
    args = (jnp.arange(10.0), jnp.array([1, 2, 3]), jnp.int32(5))
    glue(*args)
    with pytest.raises(jc.TransferError) as e, jc.hot_loop():
        glue(*args)
    text = str(e.value)
    assert "host-to-device, a Python constant in an eager op" in text
    assert "test_glue.py" in text  # the user's line
    assert "jax.jit" in e.value.fix and "one = jnp.int32(1)" in e.value.fix
    assert 'transfers="allow_host_to_device"' in e.value.fix


def test_transfers_allow_host_to_device_lets_constants_through_but_not_reads():
    x, idx, flag = jnp.arange(10.0), jnp.array([1, 2, 3]), jnp.int32(5)

    def glue():
        return flag & 1, x * 0.5, x[idx]

    _warm_then_loop(glue, transfers="allow_host_to_device")
    with pytest.raises(jc.TransferError, match="device-to-host read: float"):
        with jc.hot_loop(transfers="allow_host_to_device"):
            float(flag)


def test_allow_host_to_device_does_not_let_host_arguments_into_a_hot_step():
    @jc.hot_step(signature=dict)
    def step(d: dict) -> dict:
        return {"x": d["x"] + 1}

    d = step({"x": jnp.zeros(3)})
    with pytest.raises(jc.TransferError, match="on the host"):
        with jc.hot_loop(transfers="allow_host_to_device"):
            step({"x": np.zeros(3, np.float32)})
    assert not d["x"].is_deleted()


def test_allow_host_to_device_nests_inside_a_refusing_loop():
    flag = jnp.int32(5)
    flag & 1
    with pytest.raises(jc.TransferError, match="a Python constant"), jc.hot_loop():
        with jc.hot_loop(transfers="allow_host_to_device"):
            flag & 1
        flag & 1  # the outer loop refuses it again


def test_transfers_option_lists_valid_values():
    with pytest.raises(jc.DefinitionError, match="'disallow', 'allow_host_to_device', 'allow'"):
        jc.hot_loop(transfers="host")  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Messages: donated arrays in a warm jit, installed packages' frames, commitment


def test_a_donated_array_in_a_warm_jit_is_a_donation_error_naming_it_and_the_step():
    @jc.hot_step(signature=dict)
    def step(d: dict) -> dict:
        return {"x": d["x"] + 1}

    double = jax.jit(lambda a: a * 2)
    d = step({"x": jnp.zeros(3)})
    double(d["x"])
    with pytest.raises(jc.DonationError) as e, jc.hot_loop():
        x = d["x"]
        d = step(d)
        double(x)  # x was pulled out of the state before it was donated
    text = str(e.value)
    assert "`x` (f32[3]) was donated to step" in text
    assert e.value.contract == "no-donated-use"
    assert "test_glue.py" in text


def test_messages_point_past_installed_packages_to_the_users_line(tmp_path, monkeypatch):
    site = tmp_path / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "fakesim.py").write_text(
        textwrap.dedent(
            """
            def check_overflow(flag):
                if flag:  # a read deep inside a third-party library
                    return True
                return False
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    import fakesim

    flag = jnp.bool_(False)
    try:
        with pytest.raises(jc.TransferError) as e, jc.hot_loop():
            fakesim.check_overflow(flag)
    finally:
        sys.modules.pop("fakesim", None)
    assert "test_glue.py" in str(e.value) and "fakesim.check_overflow(flag)" in str(e.value)
    assert "fakesim.py" not in str(e.value)


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
