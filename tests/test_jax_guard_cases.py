"""JAX's own transfer-guard and donation cases, walked inside ``jc.hot_loop`` (issue 20).

JAX's ``tests/transfer_guard_test.py`` lists, per direction, the transfers its
guard must allow (explicit: ``device_put``, ``device_get``) and refuse
(implicit: a numpy argument to ``jax.jit``, ``jnp.ones``, ``np.asarray``,
``copy_to_host_async``, ``np.add``, ``str``, ``pickle.dumps``, a ``jax.jit``
placed on another device), and how guards nest. These are our own programs of
those cases: each explicit one must pass inside a loop and each implicit one
be refused, on every backend (JAX skips device-to-host on CPU; jc checks it
there too). The suite runs them on its 8 simulated CPU devices, and the last
test runs this file again on one device.

Two deliberate differences from JAX's guard:
- JAX lets a second read of an array whose value it already copied to the
  host pass ("no new transfer"); a loop refuses every read: the next
  iteration's array has no copy, so the read is the same bug.
- JAX's CPU backend copies between devices without asking its
  device-to-device guard; a raising loop engages that guard (enforced on GPU
  and TPU), and the CPU case is checked to be at ``disallow``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import NUMPY_VIEW
from jaxtyping import Array, Float32

import jaxcontracts as jc


def _on_device(n: int = 1) -> jax.Array:
    return jax.device_put(jnp.ones(n))


def _explicit_cases():
    """(name, fn): transfers JAX allows under "disallow": allowed in a loop."""
    cases = [
        ("host_to_device device_put", lambda: jax.device_put(np.ones(10))),
        ("device_to_host device_get", lambda: jax.device_get(_arrays["get"])),
        ("device_to_host jc.fetch", lambda: jc.fetch(_arrays["fetch"])),
    ]
    if jax.local_device_count() > 1:
        cases.append(
            ("device_to_device device_put", lambda: jax.device_put(_arrays["d2d"], jax.local_devices()[1]))
        )
    return cases


def _implicit_cases():
    """(name, fn): transfers JAX refuses under "disallow": refused in a loop."""
    cases = [
        ("host_to_device jax.jit(numpy)", lambda: _identity(np.ones(1))),
        ("host_to_device jnp.ones", lambda: jnp.ones(1)),
        # a numpy scalar into a warm jnp function (fetched metrics: jnp.exp(np.float32(x)));
        # JAX's C++ call raises it, so it is a TransferError as it leaves the loop
        ("host_to_device jnp.exp(np.float32)", lambda: jnp.exp(np.float32(1.0))),
        ("device_to_host np.asarray", lambda: np.asarray(_arrays["asarray"])),
        ("device_to_host copy_to_host_async", lambda: _arrays["async"].copy_to_host_async()),
        ("device_to_host np.add", lambda: np.add(_arrays["add"], 1)),
        ("device_to_host str", lambda: str(_arrays["str"])),
        ("device_to_host pickle.dumps", lambda: pickle.dumps(_arrays["pickle"])),
    ]
    return cases


_identity = jax.jit(lambda x: x)
_arrays: dict[str, jax.Array] = {}


@pytest.fixture(autouse=True)
def fresh_arrays():
    """Fresh device arrays per test (no host copy cached yet), and warm jits."""
    for key in ("get", "fetch", "d2d", "asarray", "async", "add", "str", "pickle"):
        _arrays[key] = _on_device()
    _identity(_on_device())  # compiled: a refusal is the transfer, never the compile
    jnp.exp(np.float32(1.0))
    yield
    _arrays.clear()


@pytest.mark.parametrize("name", [n for n, _ in _explicit_cases()])
def test_an_explicit_transfer_is_allowed_inside_a_loop(name):
    fn = dict(_explicit_cases())[name]
    fn()  # compiled outside (a first device_put compiles nothing, a get neither)
    with jc.hot_loop():
        fn()


@pytest.mark.parametrize("name", [n for n, _ in _implicit_cases()])
def test_an_implicit_transfer_is_refused_inside_a_loop(name):
    fn = dict(_implicit_cases())[name]
    with pytest.raises(jc.TransferError):
        with jc.hot_loop():
            fn()


@pytest.mark.parametrize("name", [n for n, _ in _implicit_cases()])
def test_an_implicit_transfer_is_recorded_in_record_mode(name):
    fn = dict(_implicit_cases())[name]
    fn()  # warm: the record is of the transfer, not of a first compile
    for key in list(_arrays):
        _arrays[key] = _on_device()
    with jc.hot_loop(on_violation="record") as loop:
        fn()
    assert [v.kind for v in loop.violations] == ["transfer"], loop.violations


@pytest.mark.parametrize("name", [n for n, _ in _implicit_cases()])
def test_an_inner_allow_loop_lets_it_through_and_the_outer_refuses_again(name):
    """JAX's test_nesting: an inner "allow" allows; after it, "disallow" again."""
    fn = dict(_implicit_cases())[name]
    fn()
    with pytest.raises(jc.TransferError):
        with jc.hot_loop():
            with jc.hot_loop(transfers="allow"):
                fn()
            for key in list(_arrays):
                _arrays[key] = jax.device_put(jnp.ones(1))  # explicit: allowed
            fn()


def test_a_second_read_of_a_copied_array_is_still_refused():
    """JAX allows it ("no new transfer"); a loop does not (see the module's doc)."""
    x = _on_device()
    np.asarray(x)  # JAX now holds a host copy
    with pytest.raises(jc.TransferError), jc.hot_loop():
        np.asarray(x)


def test_device_to_device_is_refused_by_jax_s_own_guard_in_a_raising_loop():
    if jax.local_device_count() < 2:
        pytest.skip("needs two devices")
    with jc.hot_loop():
        assert jax.config.jax_transfer_guard_device_to_device == "disallow"
        with jc.hot_loop(transfers="allow"):
            assert jax.config.jax_transfer_guard_device_to_device == "allow"
        assert jax.config.jax_transfer_guard_device_to_device == "disallow"
        jax.device_put(_arrays["d2d"], jax.local_devices()[1])  # explicit: allowed
    with jc.hot_loop(on_violation="record"):
        assert jax.config.jax_transfer_guard_device_to_device != "disallow"  # recorded, not raised
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # jax.jit(device=...)
        moved = jax.jit(lambda x: x, device=jax.local_devices()[1])
        moved(_arrays["d2d"])
        if jax.default_backend() != "cpu":  # JAX's CPU backend copies without asking
            with pytest.raises(Exception), jc.hot_loop():  # noqa: B017 - JAX's own error
                moved(_arrays["d2d"])


def test_a_device_to_device_copy_jax_refuses_leaves_the_loop_as_a_transfer_error():
    # JAX's Python path (a call its C++ path has not cached) refuses the copy on
    # every backend, CPU included: the refusal leaves the loop as a TransferError.
    if jax.local_device_count() < 2:
        pytest.skip("needs two devices")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # jax.jit(device=...)
        moved = jax.jit(lambda x: x * 2, device=jax.local_devices()[1])
        with pytest.raises(jc.TransferError, match="device-to-device") as info, jc.hot_loop(compiles="allow"):
            moved(_arrays["d2d"])
    assert "jax.device_put(x, device)" in str(info.value)
    assert not _arrays["d2d"].is_deleted()


# Donation: JAX's donation tests name what a donated buffer cannot be used for;
# a hot step names the leaf and the step for each.


@jc.state
class S:
    x: Float32[Array, "n"]


@jc.hot_step
def scale(s: S) -> S:
    return S(x=s.x * 2)


@jc.hot_step
def combine(a: S, b: S) -> S:
    return S(x=a.x + b.x)


def test_a_buffer_donated_twice_in_one_call_is_named():
    s = jc.device_tree(S(x=jnp.ones(3)))
    with pytest.raises(jc.DonationError, match=r"a\.x and b\.x|b\.x.*a\.x|same buffer"):
        combine(s, s)
    assert not s.x.is_deleted()  # refused before dispatch


def test_a_donated_buffer_used_again_is_named():
    s = jc.device_tree(S(x=jnp.ones(3)))
    scale(s)
    with pytest.raises(jc.DonationError, match=r"S\.x: f32\[3\] was donated to scale"):
        s.x  # noqa: B018
    with pytest.raises(jc.DonationError, match="donated"):
        scale(s)


@pytest.mark.cpu_only(NUMPY_VIEW)
def test_a_donated_buffer_a_numpy_view_holds_is_refused_before_dispatch():
    s = jc.device_tree(S(x=jnp.ones(3)))
    view = np.asarray(s.x)  # a view of the CPU buffer: XLA would have to copy
    with pytest.raises(jc.DonationError):
        scale(s)
    assert not s.x.is_deleted() and view.sum() == 3.0


def test_these_cases_on_one_device():
    """The file again, in a process with one CPU device."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "tests"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
         "-k", "not one_device", "-c", str(root / "pyproject.toml"), "--rootdir", str(root)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
