"""``jc.hot_loop(callbacks="disallow")``: no host callbacks in a loop's
compiled steps (issue 52, section 2: a contract added through the recipe).

A compiled program that calls back to the host (``jax.debug.print``,
``jax.debug.callback``, ``jax.pure_callback``, ``io_callback``) makes a
device-to-host round trip at every call. Allowed by default and listed in the
step's report; with ``"disallow"`` a hot step or a plain ``jax.jit`` whose
program has one is refused before its call runs, naming the step, the
callback's primitive and the line that wrote it, the inputs intact.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxcontracts as jc
from jaxcontracts._compat import callbacks
from jaxcontracts._errors import CONTRACTS, VIOLATIONS, loop_options
from jaxcontracts._userline import place

# as messages name this file: relative to the working folder when below it (CI runs
# the suite from outside the checkout, where the path is absolute)
HERE = place(__file__, 1)[0].rsplit(":", 1)[0]


def _line(text: str) -> int:
    lines = pathlib.Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line(" not in line)


@jc.hot_step(state="x")
def printing(x):
    jax.debug.print("x0 {}", x[0])  # the callback
    return x + 1


@jc.hot_step(state="x")
def quiet(x):
    return x + 1


def test_the_contract_is_declared_once_and_every_table_reads_it():
    contract = CONTRACTS["no-host-callback"]
    assert contract.error is jc.TransferError and contract.option == "callbacks"
    assert VIOLATIONS["callback"].contract == "no-host-callback"
    assert loop_options()["callbacks"] == ("allow", "disallow")  # the default first
    with pytest.raises(jc.DefinitionError, match=r"jc.hot_loop\(callbacks='never'\): valid values are 'allow', 'disallow'"):
        jc.hot_loop(callbacks="never")  # type: ignore[arg-type]


def test_allowed_by_default_and_listed_in_the_report(capfd):
    x = jnp.zeros(3)
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in range(2):
            x = printing(x)
    jax.effects_barrier()
    assert capfd.readouterr().out.count("x0 ") == 2 and not loop.violations
    facts = dict(printing.report().facts)
    assert facts["host callbacks"].startswith(f"debug_print at {HERE}:{_line('# the callback')}")
    assert "host callbacks" not in dict(quiet.report().facts)
    assert any(c.key == "no-host-callback" for c in loop.report().contracts)


def test_a_hot_step_with_a_callback_is_refused_before_it_runs_naming_the_line():
    x = jnp.zeros(3)
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop(callbacks="disallow", compiles="warmup"):
            x = quiet(x)
            x = printing(x)  # refused
    err = info.value
    assert err.contract == "no-host-callback"
    assert f"`printing` calls back to the host at every call: debug_print at {HERE}:{_line('# the callback')}" in str(err)
    assert f"at {HERE}:{_line('# refused')}" in str(err)
    assert 'jc.hot_loop(callbacks="allow")' in err.fix
    assert err.__traceback__ is not None
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_filename == __file__  # the traceback ends at the user's line
    assert not x.is_deleted() and np.array_equal(jc.fetch(x), np.ones(3))  # the call did not run


def test_a_plain_jit_with_a_callback_in_a_nested_body_is_refused_and_keeps_its_donated_input():
    def body(c, _):
        jax.debug.callback(lambda v: None, c)  # inside a scan
        return c + 1, None

    @jax.jit
    def rollout(x):
        return jax.lax.scan(body, x, None, length=2)[0]

    donating = jax.jit(lambda x: rollout(x) * 2, donate_argnums=0)
    x = jnp.zeros(3)
    with pytest.raises(jc.TransferError, match=r"debug_callback at .*:" + str(_line("# inside a scan"))):
        with jc.hot_loop(callbacks="disallow", compiles="warmup"):
            x = donating(x)
    assert not x.is_deleted()


@pytest.mark.parametrize("kind", ["pure_callback", "io_callback"])
def test_pure_and_io_callbacks_are_named(kind):
    def host(a):
        return np.asarray(a) + 1

    def f(x):
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.pure_callback(host, out, x) if kind == "pure_callback" else io_callback(host, out, x)

    step, x = jc.hot_step(f, state="x"), jnp.zeros(2)
    with pytest.raises(jc.TransferError, match=f"`f` calls back to the host at every call: {kind} at "):
        with jc.hot_loop(callbacks="disallow", compiles="warmup"):
            step(x)


def test_record_mode_records_it_once_per_line_and_the_calls_run():
    x = jnp.zeros(3)
    with jc.hot_loop(callbacks="disallow", compiles="warmup", on_violation="record") as loop:
        for _ in range(3):
            x = printing(x)
    jax.effects_barrier()
    [v] = loop.violations
    assert v.kind == "callback" and v.count == 3
    assert np.array_equal(jc.fetch(x), np.full(3, 3.0))


def test_a_nested_loop_inherits_the_option_and_the_loops_end_clean():
    x = jnp.zeros(3)
    with jc.hot_loop(callbacks="disallow", compiles="warmup"):
        with pytest.raises(jc.TransferError):
            with jc.hot_loop(transfers="allow"):  # callbacks= inherited
                x = printing(x)
        with jc.hot_loop(callbacks="allow"):
            x = printing(x)  # let through here
    x = printing(x)  # outside every loop: as jax.jit
    jax.effects_barrier()
    assert np.array_equal(jc.fetch(x), np.full(3, 2.0))


def test_what_the_compile_found_is_kept_with_the_signature_and_only_there():
    # the refusal is built into a call path only where the compile found a callback
    quiet(jnp.zeros(3))
    printing(jnp.zeros(3))
    assert quiet._current.found == {}
    [site] = printing._current.found["no-host-callback"]
    assert (site.primitive, site.line, site.function) == ("debug_print", _line("# the callback"), "printing")


_FRESH_PROCESS = """
import jax, jax.numpy as jnp, jaxcontracts as jc
from jaxcontracts import _contracts


def show(x):
    jax.debug.print("x {}", x[0])
    return x + 1


f = jax.jit(show, donate_argnums=0)
x = jnp.zeros(3)
with jc.hot_loop(compiles="allow"):  # callbacks="allow": a miss here scans nothing
    x = f(x)
print("scanned:", len(_contracts._scanned))
try:
    with jc.hot_loop(callbacks="disallow", compiles="warmup"):
        x = f(x)
except jc.TransferError as err:
    print("refused:", str(err).splitlines()[0])
"""


def test_in_a_fresh_process_a_default_loop_scans_nothing_and_disallow_still_refuses():
    # the scan (its capability's probe traces a function of its own) ran at every
    # plain jax.jit miss in any loop: inside a default loop the probe's trace was
    # refused as the user's compile, and the probe, failing, switched the contract off
    proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "scanned: 0" in proc.stdout
    assert "refused: a host callback inside jc.hot_loop: `show` calls back to the host" in proc.stdout
    assert "CapabilityWarning" not in proc.stderr


_PROBES_IN_A_LOOP = """
import jax, jax.numpy as jnp, jaxcontracts as jc
from jaxcontracts._compat import registry

x = jnp.ones(3) + 0
with jc.hot_loop() as loop:
    loop.report()  # the first report of the process: its capabilities probed here
    missing = [c.name for c in registry.capabilities() if not c.available]
with jc.hot_loop(on_violation="record") as recording:
    recording.report()
print("missing:", missing, "recorded:", len(recording.violations))
step = jc.hot_step(lambda s: (jax.debug.print("s {}", s[0]), s + 1)[1], state="s")
x = step(x)
try:
    with jc.hot_loop(callbacks="disallow"):
        x = step(x)
except jc.TransferError as err:
    print("refused:", str(err).splitlines()[0][:60])
"""


def test_capabilities_probed_first_inside_a_loop_are_the_library_s_code_not_the_loop_s():
    # a probe first run inside the user's raising loop (loop.report() lists the
    # capabilities) traced a function of its own: refused as the user's
    # compile, which failed the loop and switched the capability off for the
    # process (callbacks="disallow" then refused nothing) (hostile round 3)
    proc = subprocess.run([sys.executable, "-c", _PROBES_IN_A_LOOP], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "missing: [] recorded: 0", proc.stdout
    assert "refused: a host callback inside jc.hot_loop: `<lambda>` calls back" in proc.stdout, proc.stdout
    assert "CapabilityWarning" not in proc.stderr, proc.stderr


def test_explain_knows_the_contract_in_a_fresh_process():
    # the declaration is imported with the package (light: no JAX), not with the first loop
    for topic in ("callback", "no-host-callback"):
        proc = subprocess.run(
            [sys.executable, "-m", "jaxcontracts", "explain", topic], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0 and proc.stdout.startswith("TransferError"), proc.stderr


def test_a_print_inside_a_pallas_kernel_is_the_devices_not_a_host_callback():
    pl = pytest.importorskip("jax.experimental.pallas")

    def kernel(x_ref, o_ref):
        pl.debug_print("in kernel {}", x_ref[0, 0])  # lowered on the device (Mosaic)
        o_ref[...] = x_ref[...] + 1

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    closed = jax.make_jaxpr(f)(jnp.ones((8, 128)))
    assert callbacks.callback_sites(closed, lambda file, function: True) == ()
    plain = jax.make_jaxpr(lambda x: (jax.debug.print("{}", x), x)[1])(jnp.ones(2))
    assert [s.primitive for s in callbacks.callback_sites(plain, lambda file, function: True)] == ["debug_print"]
