"""The ``python -m jaxcontracts demo`` command: runs, reports, catches, and is right."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import pytest

import jaxcontracts as jc
from jaxcontracts import __main__ as demo
from jaxcontracts.__main__ import Particles, main, run_demo, simulate

TIMEOUT = 300  # seconds; the small runs below take a few seconds

# Each planted regression and the error class(es) it must report.
CAUGHT = {
    "Regression 1/3": ("TransferError",),
    "Regression 2/3": ("SpecError", "RecompileError"),
    "Regression 3/3": ("DonationError",),
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxcontracts", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m is not None, f"{pattern!r} not found in:\n{text}"
    return float(m.group(1))


def _section(text: str, start: str, end: str | None) -> str:
    """The text from the line starting with ``start`` to the next ``end``."""
    i = text.index(start)
    j = text.find(end, i + len(start)) if end else -1
    return text[i : j if j >= 0 else len(text)]


def test_demo_subprocess_small() -> None:
    proc = _run("demo", "--steps", "5", "--n", "64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "FAILED" not in out
    assert out.rstrip().splitlines()[-1] == "OK"
    # Part 1: both steps, compiled from a spec, in a hot loop, with progress.
    assert "kick_drift" in out and "force_kick" in out
    assert "Particles.spec(n=64)" in out and "f32[64,3]" in out
    assert "inside jc.hot_loop()" in out
    progress = re.findall(r"\[[#.]+\] +(\d+)/5 steps", out)
    assert progress and progress[-1] == "5", out  # plain lines (not a TTY), up to 5/5
    assert "\r" not in out
    assert "buffers consumed" in out and "is_deleted() is True" in out
    # Part 2: a report per step, after the loop.
    reports = _section(out, "== 2.", "== 3.")
    assert "kick_drift" in reports and "force_kick" in reports
    # Part 3: each planted regression is caught, with its error class named.
    titles = list(CAUGHT) + [None]
    for title, end in zip(titles, titles[1:]):
        block = _section(out, title, end)
        for name in CAUGHT[title]:
            assert f"{name}: " in block, block
        assert block.count("-> caught") == len(CAUGHT[title]), block
    assert "Regression 1/3: print(p.t) inside the loop" in out
    assert "(force_kick -> .t)" in out  # the read is named by its state path
    assert re.search(r"donated to\s+\S*scaled_kick_drift", out)  # the step is named
    assert "`scale` alive: True" in out and "state 7/7 consumed" in out


def test_run_demo_in_process() -> None:
    steps, n = 7, 32
    buf = io.StringIO()
    assert run_demo(steps=steps, n=n, out=buf, regressions=False) == 0
    out = buf.getvalue()
    dt = Particles.spec(n=1).dt
    t = _number(r"\bt = ([-+0-9.eE]+)  \(expected", out)
    e0 = _number(r"E0 = ([-+0-9.eE]+)", out)
    e = _number(r"\bE = ([-+0-9.eE]+)", out)
    drift = _number(r"drift \|E - E0\|/\|E0\| = ([-+0-9.eE]+)", out)
    assert all(math.isfinite(v) for v in (t, e0, e, drift))
    assert t == pytest.approx(steps * dt, rel=1e-6)
    assert f"step = {steps}" in out
    assert drift < 1e-3
    assert "Regression" not in out  # --no-regressions
    assert out.rstrip().splitlines()[-1] == "OK"


def test_simulate_values() -> None:
    steps, n = 12, 48
    r = simulate(steps, n, seed=3)
    assert r.finite
    assert r.step == steps
    assert r.t == pytest.approx(steps * r.dt, rel=1e-6)
    assert r.energy0 < 0  # bound orbits in the central potential
    assert r.drift < 1e-3 and r.max_drift < 1e-3
    assert r.first_state_consumed and all(r.first_state_consumed.values())
    assert demo.check_result(r) == []
    # The progress bar read rarely (and only with jc.fetch): 4 times, the last at the end.
    assert r.reads == 4
    for info in r.steps_info:
        assert info["donated"] == set(range(len(info["leaves"])))
        if r.checks != "off":
            assert info["aliased"] == info["donated"]
            assert info["stats"].calls == steps
        assert info["stats"].compiles == 1 and info["stats"].refused == 0
        assert info["compile_seconds"] > 0
    # The reports describe this run.
    buf = io.StringIO()
    assert demo._print_reports(buf, *r.hot_steps)
    for step in r.hot_steps:
        assert step.__name__ in buf.getvalue()
        if hasattr(step, "report") and r.checks != "off":
            assert dict(step.report().facts).get("calls", str(steps)) == str(steps)
    # Two runs in one process use fresh steps: another size compiles again.
    r2 = simulate(2, n + 1)
    assert r2.step == 2 and r2.finite


def test_progress_bar_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    r = simulate(100, 16, out=term)
    text = term.getvalue()
    assert r.reads == 50  # redrawn every total // 50 steps on a terminal
    assert text.count("\r") == 50
    assert "100/100 steps" in text
    bar_lines = [line for line in text.split("\n") if "steps  t =" in line]
    assert len(bar_lines) == 1  # one line, redrawn in place


def test_each_regression_raises_its_error() -> None:
    n = 16
    with pytest.raises(jc.TransferError, match=r"str\(\) / print\(\) .*\(force_kick -> \.t\)"):
        demo.regression_print_in_loop(n)
    with pytest.raises(jc.SpecError, match=r"\.t: expected f32\[\], got i32\[\]"):
        demo.regression_int32_field(n)
    step = jc.hot_step(signature=dict, donate="all")(demo.drift)
    with pytest.raises(jc.RecompileError, match=r"\['t'\]: takes i32\[\], returns ~f32\[\]"):
        demo.regression_int32_dict(step, n)
    assert step.stats.calls == 0 and step.stats.compiles == 0  # caught before anything ran
    with pytest.raises(jc.DonationError, match=r"donated to \S*scaled_kick_drift"):
        demo.regression_stale_read(n)
    found = demo.inserted_parameter(n)
    assert found["jit_scale_deleted"] and found["jit_consumed"] == 0  # what jax.jit would do
    assert found["jc_consumed"] == found["leaves"] == 7 and found["jc_scale_alive"]


def test_regression_messages_name_the_planted_line() -> None:
    with pytest.raises(jc.TransferError, match=r"at \S*__main__\.py:\d+:  print\(p\.t\)"):
        demo.regression_print_in_loop(16)


def test_a_regression_that_is_not_caught_fails_the_demo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(demo, "regression_print_in_loop", lambda n: None)
    monkeypatch.setattr(demo, "regression_stale_read", lambda n: float("x"))
    buf = io.StringIO()
    assert run_demo(steps=2, n=16, out=buf) == 1
    out = buf.getvalue()
    assert "FAILED: expected TransferError, but nothing was raised" in out
    assert "FAILED: expected DonationError, got ValueError" in out
    assert out.count("-> caught") == 2  # the SpecError and the RecompileError still are
    assert out.rstrip().splitlines()[-1].startswith("FAILED")


def test_help() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "demo" in proc.stdout
    proc = _run("demo", "--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for flag in ("--steps", "--n", "--no-regressions"):
        assert flag in text
    assert "default: 200" in text and "default: 4096" in text
    for part in ("1. The simulation", "2. The reports", "3. Three planted regressions"):
        assert part in text
    for name in ("TransferError", "SpecError", "RecompileError", "DonationError"):
        assert name in text
    assert "Exit code 0" in text


def test_main_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2  # no command: the help, and a usage exit code
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--steps", "0"])
    assert exc.value.code == 2
    assert "--steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--n", "many"])
    assert exc.value.code == 2
    assert "'many' is not an integer" in capsys.readouterr().err
