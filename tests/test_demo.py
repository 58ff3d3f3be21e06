"""The ``python -m jaxcontracts demo`` command: runs, reports, and is right."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import pytest

from jaxcontracts.__main__ import Particles, main, run_demo, simulate

TIMEOUT = 300  # seconds; the small runs below take a few seconds


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


def test_demo_subprocess_small() -> None:
    proc = _run("demo", "--steps", "5", "--n", "64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "kick_drift" in out and "force_kick" in out
    assert "Particles.spec(n=64)" in out
    assert "f32[64,3]" in out
    # Every donated leaf of both steps was verified to alias an output.
    assert len(re.findall(r"7/7 leaves donated, 7/7 verified to alias", out)) == 2, out
    assert "kick_drift.stats: calls=5 compiles=1 refused=0" in out
    assert "force_kick.stats: calls=5 compiles=1 refused=0" in out
    assert "buffers consumed" in out and "is_deleted() is True" in out
    assert out.rstrip().splitlines()[-1] == "OK"


def test_run_demo_in_process() -> None:
    steps, n = 7, 32
    buf = io.StringIO()
    assert run_demo(steps=steps, n=n, out=buf) == 0
    out = buf.getvalue()
    dt = Particles.spec(n=1).dt
    t = _number(r"\bt = ([-+0-9.eE]+)", out)
    e0 = _number(r"E0 = ([-+0-9.eE]+)", out)
    e = _number(r"\bE = ([-+0-9.eE]+)", out)
    drift = _number(r"\|E - E0\|/\|E0\| = ([-+0-9.eE]+)", out)
    assert all(math.isfinite(v) for v in (t, e0, e, drift))
    assert t == pytest.approx(steps * dt, rel=1e-6)
    assert f"step = {steps}" in out
    assert drift < 1e-3
    assert out.rstrip().splitlines()[-1] == "OK"


def test_simulate_values() -> None:
    steps, n = 11, 48
    r = simulate(steps, n, seed=3)
    assert r.finite
    assert r.step == steps
    assert r.t == pytest.approx(steps * r.dt, rel=1e-6)
    assert r.energy0 < 0  # bound orbits in the central potential
    assert r.drift < 1e-3 and r.max_drift < 1e-3
    assert r.first_state_consumed and all(r.first_state_consumed.values())
    for info in r.steps_info:
        assert info["donated"] == set(range(len(info["leaves"])))
        if r.checks != "off":
            assert info["aliased"] == info["donated"]
            assert info["stats"].calls == steps
        assert info["stats"].compiles == 1 and info["stats"].refused == 0
        assert info["compile_seconds"] > 0
    # Two runs in one process use fresh steps: another size compiles again.
    r2 = simulate(2, n + 1)
    assert r2.step == 2 and r2.finite


def test_help() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "demo" in proc.stdout
    proc = _run("demo", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--steps" in proc.stdout and "--n" in proc.stdout
    assert "default: 200" in proc.stdout and "default: 4096" in proc.stdout


def test_main_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2  # no command: the help, and a usage exit code
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--steps", "0"])
    assert exc.value.code == 2
    assert "--steps" in capsys.readouterr().err
