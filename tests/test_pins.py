"""Issue 10 items whose behaviour was right but unprotected: pinned here."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float32

import jaxcontracts as jc
from jaxcontracts._compat import guardlog


@jc.state
class S:
    x: Float32[Array, "n"]


@jc.hot_step(signature=S)
def scaled(s: S, k: Float32[Array, ""]) -> S:
    return S(x=s.x * k)


def test_a_python_float_to_a_step_in_a_loop_is_named_without_touching_the_device():
    """The message used to call jnp.asarray, and the user got `RecompileError:
    jax compiles 'stage'`, which was about the library."""
    s = scaled(S(x=jnp.ones(3)), jnp.float32(2))
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            scaled(s, 2.5)
    text = str(info.value)
    assert "k: ~f32[] (Python float)" in text or "k: f32[] (Python float)" in text
    assert "compile" not in text.split("Fix:")[0]
    assert info.value.contract == "device-arguments"


@pytest.mark.parametrize(
    ("args", "got"),
    [((), "nothing"), ((3,), "int"), (({"x": 1},), "dict")],
    ids=["no-arguments", "an-int", "a-dict"],
)
def test_check_never_raises_on_misuse(args, got):
    report = jc.check(*args)
    assert not report.ok
    (failed,) = [c for c in report.contracts if not c.ok]
    assert f"jc.check() takes a jc.hot_step, got {got}" in failed.detail
    assert "Fix: pass the step and its arguments or specs" in failed.detail
    assert failed.error is jc.DefinitionError


@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_a_user_error_that_quotes_a_guard_message_is_left_alone(error):
    """Only JAX's own runtime errors become contract errors at loop exit."""
    text = "Disallowed host-to-device transfer: aval=ShapedArray(float32[3]) (quoted by user code)"
    with pytest.raises(error) as info:
        with jc.hot_loop():
            raise error(text)
    assert type(info.value) is error and str(info.value) == text


def test_unreadable_guard_log_lines_are_counted_in_the_report():
    """What record mode could not record is said in the report."""
    loop = jc.hot_loop(on_violation="record")
    with loop:
        pass
    loop._record_logged([guardlog.GuardEvent("host-to-device", "float32[3]", "")], unparsed=2)
    whats = [v.what for v in loop.violations]
    assert "implicit host-to-device transfer of f32[3]" in whats
    assert any(w.startswith("2 transfer-guard log line(s) from jaxlib that this version") for w in whats)
    assert not loop.report().ok


def test_a_guard_line_in_a_new_format_is_passed_through_and_counted(capfd):
    cap = guardlog.Capture()
    assert cap.start()
    import os

    try:
        os.write(2, b"W1130 00:00:00.0 1 guard_lib.cc:99] something new about a transfer\n")
        os.write(2, b"an ordinary line\n")
    finally:
        events, unparsed = cap.take(0)
        cap.stop()
    assert (events, unparsed) == ([], 1)
    err = capfd.readouterr().err
    assert "something new about a transfer" in err and "an ordinary line" in err
