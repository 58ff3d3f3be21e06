"""Record mode: what raise mode refuses is recorded, once per line, and stderr stays clean.

``jc.hot_loop(on_violation="record")`` collects each violation once per line
with its count, source line and fix, and puts it in the loop's report; the
call that raise mode refuses runs as JAX would. JAX's host-to-device log
lines (``guard_lib.cc``) are taken off stderr into the report, per thread;
lines it cannot parse are passed through and counted.

Issue 10: record mode raised on a step refusing a numpy argument and on a
donated input XLA did not consume, and left JAX's host-to-device log lines
(``guard_lib.cc``) on stderr without putting them in the report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, advance_fn, make_particles, own_lines
from jaxtyping import Array, Float32

import jaxcontracts as jc
from jaxcontracts._compat import capability, guardlog
from jaxcontracts._userline import place

HERE = place(__file__, 1)[0].rsplit(":", 1)[0]  # this file, as messages name it


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(text) and "_line(" not in line)

# -- what is recorded ---------------------------------------------------------


def test_record_mode_collects_deduplicated_violations():
    x = jnp.arange(3.0)
    s = jnp.float32(1.0)
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(5):
            float(s)
            np.asarray(x)
        jax.jit(lambda a: a + 1)(x)
    kinds = sorted((v.kind, v.count) for v in loop.violations)
    assert kinds == [("compile", 1), ("transfer", 5), ("transfer", 5)]
    assert all("test_record_mode.py:" in v.where for v in loop.violations)
    report = str(loop.report())
    assert "violations: 3 | events: 11" in report and "float() of f32[]" in report
    assert not loop.report().ok
    with jc.hot_loop(on_violation="record") as clean:
        pass
    assert clean.violations == [] and clean.report().ok


def test_recorded_violations_carry_the_source_line_and_the_fix():
    x = jnp.float32(1.0)
    with jc.hot_loop(on_violation="record") as loop:
        float(x)  # the recorded line
    (v,) = loop.violations
    assert v.source == "float(x)  # the recorded line"
    assert v.fix.startswith("read it deliberately and rarely with jc.fetch(x)")


@jc.state
class S:
    x: Float32[Array, "n"]


@jc.hot_step(signature=S)
def scaled(s: S, k: Float32[Array, ""]) -> S:
    return S(x=s.x * k)


def _kinds(loop):
    return sorted((v.kind, v.what) for v in loop.violations)


def test_an_error_ending_a_recording_loop_lists_what_it_had_recorded():
    # the program stops before anything reads loop.violations: one run names every
    # violation (issue 51's motivating loop: the print and the compiles, then the
    # deleted `lr` JAX refuses)
    x, s = jnp.arange(3.0), jnp.float32(1.0)
    with pytest.raises(ZeroDivisionError) as info:
        with jc.hot_loop(on_violation="record"):
            float(s)  # noted: a read
            np.asarray(x)  # noted: a copy
            jax.jit(lambda a: a + 1)(x)  # noted: a compile
            raise ZeroDivisionError
    (note,) = info.value.__notes__
    assert note.startswith('jc.hot_loop(on_violation="record") had recorded 3 violation(s)'), note
    rows = [line.split()[:2] for line in note.splitlines()[1:] if not line.startswith("      ")]
    assert sorted(rows) == [
        ["compile", f"{HERE}:{_line('# noted: a compile')}"],
        ["transfer", f"{HERE}:{_line('# noted: a read')}"], ["transfer", f"{HERE}:{_line('# noted: a copy')}"]]
    assert "Fix: " in note  # each with its fix, as loop.report() lists it


def test_only_a_recording_loop_with_violations_notes_the_error_once():
    x = jnp.float32(1.0)
    for options, body in (({"on_violation": "record"}, lambda: None), ({}, lambda: None)):
        with pytest.raises(KeyError) as info:
            with jc.hot_loop(**options):
                body()
                raise KeyError("k")
        assert not getattr(info.value, "__notes__", []), options
    with pytest.raises(KeyError) as info:  # nested: the outer entry notes it, once
        with jc.hot_loop(on_violation="record") as loop:
            with loop:
                float(x)
                raise KeyError("k")
    assert len(info.value.__notes__) == 1


def test_a_numpy_argument_is_recorded_and_the_call_runs_as_jax_would():
    s = scaled(S(x=jnp.ones(3)), jnp.float32(2))
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(2):
            s = scaled(s, np.float32(3))  # the host argument
    ((kind, what),) = _kinds(loop)
    assert kind == "transfer"
    assert "scaled: host argument leaf copied to the device on every call: k (f32[] (numpy scalar))" in what
    (v,) = loop.violations
    assert v.count == 2 and v.source.startswith("s = scaled(s, np.float32(3))")
    assert "jax.device_put" in v.fix
    assert jc.fetch(s.x).tolist() == [18.0] * 3  # both calls ran, in f32
    assert scaled.stats.compiles == 1  # the compiled signature served them


def test_outside_record_mode_the_numpy_argument_is_still_refused():
    s = scaled(S(x=jnp.ones(3)), jnp.float32(2))
    with pytest.raises(jc.TransferError, match=r"k: f32\[\] \(numpy scalar\)"):
        with jc.hot_loop():
            scaled(s, np.float32(3))
    with pytest.raises(jc.TransferError):
        scaled(s, np.float32(3))  # and outside any loop
    assert scaled(s, jnp.float32(1)).x.shape == (3,)


def test_a_donated_input_not_consumed_is_recorded_and_the_outputs_returned(without_kept_check):
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    view = np.asarray(p.pos)  # a numpy view pins the buffer: XLA:CPU copies
    with jc.hot_loop(on_violation="record") as loop:
        q = advance(p)
    del view
    assert isinstance(q, Particles) and q.pos.shape == (4, 3)
    (v,) = [v for v in loop.violations if v.kind == "donation"]
    assert "donated input buffer(s) not consumed (XLA copied them): p.pos" in v.what
    assert advance.stats.not_consumed == 1


# -- JAX's host-to-device log lines and stderr --------------------------------


def test_logged_host_to_device_transfers_are_recorded_and_kept_off_stderr(capfd):
    x = jnp.ones(3)
    f = jax.jit(lambda a, b: a * b)
    f(x, jnp.float32(2))
    y = x * 2.0  # warm the eager multiply
    capfd.readouterr()
    with jc.hot_loop(on_violation="record") as loop:
        y = x * 2.0  # a Python scalar: implicit host-to-device
        z = f(x, np.float32(3))  # a numpy argument to a jitted function
        print("through", file=__import__("sys").stderr)
    err = capfd.readouterr().err
    assert "guard_lib" not in err and "through" in err  # other output passes through
    logged = [v for v in loop.violations if v.where == "(jaxlib's log)"]
    assert len(logged) >= 1, loop.violations  # the eager op's scalar: JAX's log, no Python line
    # the jitted function's numpy argument compiled here: named at its line (issue 40), and
    # JAX's log line for it not listed again
    named = [v for v in loop.violations if v.where != "(jaxlib's log)"]
    if capability("jit-cache-miss").available:
        assert [v.what.split(":")[0] for v in named] == ["`<lambda>` is given a numpy scalar (f32[]) at `b`"]
    # jaxlib names the aval on its slow path only (a warm op logs no shape)
    assert all(v.what.startswith("implicit host-to-device transfer of ") for v in logged)
    assert all(v.kind == "transfer" and "on_violation=\"raise\"" in v.fix for v in logged)
    assert not loop.report().ok
    del y, z


def test_each_thread_takes_only_its_own_logged_transfers(capfd):
    x = jnp.ones(3)
    x * 2.0
    barrier = threading.Barrier(2)
    found: dict[str, int] = {}

    def work(name: str, n: int) -> None:
        with jc.hot_loop(on_violation="record") as loop:
            barrier.wait()
            for _ in range(n):
                x * 2.0
        found[name] = sum(v.count for v in loop.violations if v.where == "(jaxlib's log)")

    threads = [threading.Thread(target=work, args=(f"t{n}", n)) for n in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == {"t1": 1, "t3": 3}
    assert "guard_lib" not in capfd.readouterr().err


def test_unreadable_guard_log_lines_are_counted_in_the_report():
    """What record mode could not record is said in the report."""
    loop = jc.hot_loop(on_violation="record")
    with loop:
        pass
    loop._record_logged([guardlog.GuardEvent("host-to-device", "float32[3]")], unparsed=2)
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


def test_a_capture_stopped_before_it_started_still_captures_once_started(capfd):
    import os

    cap = guardlog.Capture()
    cap.stop()  # one stop too many: its count of users went to -1, and start() then took nothing
    assert cap.start()
    try:
        os.write(2, b"W1130 00:00:00.0 1 guard_lib.cc:99] something new about a transfer\n")
    finally:
        events, unparsed = cap.take(0)
        cap.stop()
    assert unparsed == 1


def test_raise_mode_does_not_take_stderr(capfd):
    import os

    before = os.fstat(2)
    with jc.hot_loop():
        inside = os.fstat(2)
    assert (inside.st_ino, inside.st_dev) == (before.st_ino, before.st_dev)


def test_a_subprocess_started_in_a_recording_loop_keeps_its_stderr(capfd):
    """The child inherits the capture's pipe as its stderr: the loop must not
    wait for it, and its output must still arrive (forwarded)."""
    import subprocess
    import sys
    import time

    child_code = "import sys; sys.stdin.readline(); sys.stderr.write('late child line\\n')"
    with jc.hot_loop(on_violation="record"):
        child = subprocess.Popen([sys.executable, "-c", child_code], stdin=subprocess.PIPE)
    assert child.poll() is None  # the loop ended while the child still holds the pipe
    child.communicate(b"go\n", timeout=60)
    for _ in range(50):  # the forwarding thread writes it out
        err = capfd.readouterr().err
        if "late child line" in err:
            break
        time.sleep(0.1)
    assert "late child line" in err


def test_the_main_threads_last_traceback_reaches_stderr_while_a_daemon_thread_records(tmp_path):
    # Python prints the traceback before its atexit functions run; fd 2 was
    # the capture's pipe then, and its daemon reader never ran again: 5 runs
    # of 6 showed nothing after the last line written.
    import subprocess
    import sys

    code = (
        "import threading, time, jax.numpy as jnp, jaxcontracts as jc\n"
        "def worker():\n"
        "    with jc.hot_loop(on_violation='record'):\n"
        "        while True:\n"
        "            time.sleep(0.01)\n"
        "threading.Thread(target=worker, daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "print('last line', flush=True)\n"
        "raise ValueError('the main thread dies')\n"
    )
    for run in range(3):  # to files, as a shell's redirection (the race went the reader's way with pipes)
        out, err = tmp_path / f"out{run}", tmp_path / f"err{run}"
        with out.open("w") as o, err.open("w") as e:
            rc = subprocess.run([sys.executable, "-c", code], stdout=o, stderr=e, timeout=120).returncode
        assert out.read_text() == "last line\n"
        assert "ValueError: the main thread dies" in err.read_text(), err.read_text()
        # 1, or (not this test's matter, CPython 3.11 with a daemon thread alive in JAX code
        # at interpreter exit) a crash after the traceback, in finalization
        assert rc in (1, -6, -11), rc


_SUBPROCESS_CASES = {
    # a forked child that exits normally runs the exit handlers it inherited: it
    # woke the parent's stderr reader, which stopped, and the parent hung once
    # its stderr pipe filled
    "fork": "import os, sys, threading, time\n"
    "opened, leave = threading.Event(), threading.Event()\n"
    "def recording():\n"
    "    with jc.hot_loop(on_violation='record'):\n"
    "        y = x + 1.0\n"
    "        opened.set()\n"
    "        leave.wait()\n"
    "t = threading.Thread(target=recording)\n"
    "t.start()\n"
    "opened.wait()\n"
    "if os.fork() == 0:  # the child's exit handler, run as its exit runs it; then out, without\n"
    "    from jaxcontracts._compat import guardlog  # JAX's teardown (which can hang after a fork)\n"
    "    guardlog._capture.release_at_exit()\n"
    "    os._exit(0 if guardlog.start() is True and guardlog.stop(0) is not None else 3)  # its own capture\n"
    "assert os.wait()[1] == 0\n"
    "time.sleep(0.2)\n"
    "for i in range(2000):\n"
    "    sys.stderr.write('parent progress line %05d ......................................\\n' % i)\n"
    "leave.set()\n"
    "t.join()\n"
    "print('done', flush=True)\n",
    # the default SIGPIPE action (a CLI idiom), a subprocess that outlived its
    # loop and then ended: the exit wrote to a pipe whose reader was gone, and
    # the script was killed before its own exit handlers ran
    "sigpipe": "import atexit, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
    "atexit.register(lambda: print('done', flush=True))\n"
    "with jc.hot_loop(on_violation='record'):\n"
    "    y = x + 1.0\n"
    "    p = subprocess.Popen([sys.executable, '-c', 'import time, sys; time.sleep(0.5); sys.stderr.write(\"child\\\\n\")'])\n"
    "p.wait()\n"
    "time.sleep(0.3)\n",
    # a subprocess that outlives the script, warnings made errors: the process
    # that forwards its stderr at the exit warned "subprocess ... is still
    # running" (a ResourceWarning the script alone never shows)
    "warnings": "import os, sys, warnings\n"
    "warnings.simplefilter('error')\n"
    "with jc.hot_loop(on_violation='record'):\n"
    "    y = x + 1.0\n"
    "    code = 'import time, sys; time.sleep(1); sys.stderr.write(\"late\\\\n\")'\n"
    "    os.posix_spawn(sys.executable, [sys.executable, '-c', code], os.environ)\n"
    "print('done', flush=True)\n",
    # a loop a subprocess outlives, again and again: its wake pipe was kept
    # open to the end, two descriptors per loop
    "descriptors": "import os, subprocess, sys, time\n"
    "def fds():\n"
    "    return len(os.listdir('/proc/self/fd'))\n"
    "before = None\n"
    "for i in range(12):\n"
    "    with jc.hot_loop(on_violation='record'):\n"
    "        y = x + 1.0\n"
    "        p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.7)'])\n"
    "    p.wait()\n"
    "    time.sleep(0.05)\n"
    "    before = fds() if i == 1 else before\n"
    "print('done' if fds() <= before + 2 else f'leak {before} -> {fds()}', flush=True)\n",
}


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc/self/fd"), reason="POSIX, Linux's /proc")
@pytest.mark.parametrize("case", sorted(_SUBPROCESS_CASES))
def test_a_recording_loop_and_the_processes_the_script_starts(tmp_path, case):
    script = tmp_path / "s.py"
    script.write_text("import jax, jax.numpy as jnp, jaxcontracts as jc\nx = jnp.ones(3)\n" + _SUBPROCESS_CASES[case])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "done\n"), proc.stderr[-2000:]
    if case == "fork":
        assert proc.stderr.count("parent progress line") == 2000
    if case == "warnings":
        # JAX's own start-up warning on a TPU host came before the script's filter
        lines = own_lines(proc.stderr, only_jax=True)
        assert lines[-1:] == ["late"] and not any("Warning" in line for line in lines), proc.stderr
