"""The ``python -m jaxcontracts demo`` command: runs, reports, catches, and is right.

The demo lives in ``jaxcontracts/demo/`` and is written as a user would write
it: public API only (checked here by parsing its source).
"""

from __future__ import annotations

import ast
import inspect
import io
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import own_lines

import jaxcontracts as jc
from jaxcontracts import demo as demo_pkg
from jaxcontracts.__main__ import main
from jaxcontracts.demo import cli, regressions, simulation
from jaxcontracts.demo.cli import run_demo
from jaxcontracts.demo.simulation import Particles, simulate

TIMEOUT = 300  # seconds; the small runs below take a few seconds
DEMO_DIR = Path(demo_pkg.__file__).parent
ROOT = DEMO_DIR.parent.parent  # the checkout whose jaxcontracts these tests import

# Each planted regression and the error class(es) it must report.
CAUGHT = {
    "Regression 1/3": ("TransferError",),
    "Regression 2/3": ("SpecError", "RecompileError"),
    "Regression 3/3": ("DonationError",),
}


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxcontracts", *args],
        cwd=ROOT,  # `-m` then imports this checkout's package, as the tests do
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m is not None, f"{pattern!r} not found in:\n{text}"
    return float(m.group(1))


def _planted(fn: object, text: str) -> int:
    """The line number, in its file, of the one line of ``fn`` that is ``text``."""
    lines, first = inspect.getsourcelines(fn)
    found = [first + i for i, line in enumerate(lines) if line.strip() == text]
    assert len(found) == 1, (text, found)
    return found[0]


def _where(message: str) -> tuple[str, int]:
    """(file, line) of the ``at FILE:LINE:`` a violation message names."""
    m = re.search(r"\bat (\S+):(\d+):", message)
    assert m is not None, message
    return m.group(1), int(m.group(2))


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
    progress = re.findall(r"\d+%\|[#0-9 ]*\| *(\d+)/5 \[", out)
    assert progress and progress[-1] == "5", out  # plain lines (not a TTY), up to 5/5
    assert "\r" not in out
    assert "buffers consumed" in out and "is_deleted() is True" in out
    # Part 2: a report per step, after the loop.
    reports = _section(out, "== 2.", "== 3.")
    for name in ("kick_drift", "force_kick"):
        assert re.search(rf"^\S*\.{name}  \[OK\]$", reports, re.M), reports
    assert len(re.findall(r"^  p\.pos +f32\[64,3\] ", reports, re.M)) == 2  # the leaf tables
    # The stats lines wrap where the compile times (machine-dependent widths) end.
    flat = " ".join(reports.split())
    assert flat.count("calls: 5 | refused: 0") == 2, reports
    assert flat.count("[pass] donation verified in the executable (7 leaves donated)") == 2
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
    # Both loop violations point at the planted line in the demo's own file.
    print_line = _planted(regressions.regression_print_in_loop, "print(p.t)")
    stale_line = _planted(
        regressions.regression_stale_read,
        'print(f"t went from {float(before.t)} to {jc.fetch(p.t)}")',
    )
    for title, line in (("Regression 1/3", print_line), ("Regression 3/3", stale_line)):
        path, lineno = _where(_section(out, title, None))
        assert Path(path).as_posix().endswith("jaxcontracts/demo/regressions.py"), path
        assert lineno == line, (title, lineno, line)
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
    assert simulation.check_result(r) == []
    # The progress bar read rarely (and only with jc.fetch): 4 times, the last at the end.
    assert r.reads == 4
    for info in r.steps_info:
        assert info["donated"] == set(range(len(info["leaves"])))
        if r.checks != "off":
            assert info["aliased"] == info["donated"]
            assert info["stats"].calls == steps
        assert info["stats"].compiles == 1 and info["stats"].refused == 0
        assert info["compile_seconds"] > 0
        assert [spec for _, spec in info["leaves"]][:2] == [f"f32[{n},3]"] * 2
    # The reports describe this run.
    buf = io.StringIO()
    assert cli.print_reports(buf, *r.hot_steps)
    for step in r.hot_steps:
        assert step.__name__ in buf.getvalue()
        assert dict(step.report().facts)["calls"] == str(steps)
    # Two runs in one process use fresh steps: another size compiles again.
    r2 = simulate(2, n + 1)
    assert r2.step == 2 and r2.finite


def test_progress_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for columns in (80, 50):
        monkeypatch.setenv("COLUMNS", str(columns))
        term = Terminal()
        r = simulate(200, 16, out=term)
        text = term.getvalue()
        assert r.reads == 100  # a deliberate fetch every total // 100 steps on a terminal
        assert text.count("\r") >= 2  # redrawn in place (tqdm), not one line per update
        assert "200/200" in text
        assert ("t=2.00, max dE/E=" in text) == (columns == 80)  # tqdm cuts the postfix to fit
        drawn = [seg for line in text.split("\n") for seg in line.split("\r") if seg]
        assert drawn and max(len(seg) for seg in drawn) <= columns, drawn


def _lines_too_wide(text: str, columns: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > columns]


def test_every_demo_line_fits_80_columns() -> None:
    # The whole demo, regressions and their messages included, in a pipe.
    proc = _run("demo", "--steps", "40", "--n", "4096", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("\n") > 80 and "\r" not in proc.stdout
    assert _lines_too_wide(proc.stdout, 80) == []
    assert own_lines(proc.stderr) == []  # (JAX's own start-up warning on a TPU host aside)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_demo_bar_in_a_real_terminal_fits_and_moves() -> None:
    # A real pseudo-terminal of 80 columns: tqdm redraws the bar in place.
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxcontracts", "demo", "--steps", "3000", "--n", "256",
         "--no-regressions"],
        cwd=ROOT,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=TIMEOUT) == 0
    text = b"".join(chunks).decode()
    drawn = [seg for line in own_lines(text) for seg in line.split("\r") if seg.strip()]
    bars = [seg for seg in drawn if "/3000" in seg]
    assert len(bars) >= 2, text  # the bar was drawn more than once: it moved
    assert "3000/3000" in bars[-1]
    assert max(len(seg) for seg in drawn) <= 80, [seg for seg in drawn if len(seg) > 80]


def test_each_regression_raises_its_error() -> None:
    n = 16
    with pytest.raises(jc.TransferError, match=r"str\(\) / print\(\) .*\(force_kick -> \.t\)"):
        regressions.regression_print_in_loop(n)
    with pytest.raises(jc.SpecError, match=r"\.t: expected f32\[\], got i32\[\]"):
        regressions.regression_int32_field(n)
    step = jc.hot_step(signature=dict, donate="all")(regressions.drift)
    with pytest.raises(jc.RecompileError, match=r"\['t'\]: takes i32\[\], returns ~f32\[\]"):
        regressions.regression_int32_dict(step, n)
    assert step.stats.calls == 0 and step.stats.compiles == 0  # caught before anything ran
    with pytest.raises(jc.DonationError, match=r"donated to \S*scaled_kick_drift"):
        regressions.regression_stale_read(n)
    found = regressions.inserted_parameter(n)
    assert found["jit_scale_deleted"] and found["jit_consumed"] == 0  # what jax.jit would do
    assert found["jc_consumed"] == found["leaves"] == 7 and found["jc_scale_alive"]


@pytest.mark.parametrize(
    ("planted", "error", "text"),
    [
        (regressions.regression_print_in_loop, jc.TransferError, "print(p.t)"),
        (
            regressions.regression_stale_read,
            jc.DonationError,
            'print(f"t went from {float(before.t)} to {jc.fetch(p.t)}")',
        ),
    ],
)
def test_regression_messages_name_the_planted_line(
    planted: object, error: type[Exception], text: str
) -> None:
    """The demo is user code to the loop guard: messages point into it, not past it."""
    with pytest.raises(error) as caught:
        planted(16)  # type: ignore[operator]
    path, lineno = _where(str(caught.value))
    assert Path(path).resolve() == DEMO_DIR / "regressions.py"
    assert lineno == _planted(planted, text)
    assert f":  {text}" in str(caught.value)


def test_a_regression_that_is_not_caught_fails_the_demo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(regressions, "regression_print_in_loop", lambda n: None)
    monkeypatch.setattr(regressions, "regression_stale_read", lambda n: float("x"))
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
    assert "default: 20000" in text and "default: 4096" in text
    for part in ("1. The simulation", "2. The reports", "3. Three planted regressions"):
        assert part in text
    for name in ("TransferError", "SpecError", "RecompileError", "DonationError"):
        assert name in text
    assert "Exit code 0" in text


def test_main_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2  # no command: the help, and a usage exit code
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["simulate"])
    assert exc.value.code == 2
    assert "invalid choice: 'simulate'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--steps", "0"])
    assert exc.value.code == 2
    assert "--steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--n", "many"])
    assert exc.value.code == 2
    assert "'many' is not an integer" in capsys.readouterr().err


# --------------------------------------------------------------------------
# The demo is user code: public API only, and no private module names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(source: str, filename: str = "<source>") -> list[str]:
    """Every reach into jaxcontracts' private names (or any private attribute)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "jaxcontracts" and any(map(_is_private, parts)):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            names = [a.name for a in node.names]
            if node.level >= 2:  # out of the demo, into the package's modules
                found.append(f"{where}: from {'.' * node.level}{node.module or ''} import ...")
            elif (node.level == 1 or parts[0] == "jaxcontracts") and (
                any(map(_is_private, parts)) or any(map(_is_private, names))
            ):
                found.append(f"{where}: from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            texts = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            if (
                name in ("getattr", "hasattr", "setattr", "delattr")
                and texts
                and _is_private(texts[0])
            ):
                found.append(f"{where}: {name}(..., {texts[0]!r})")
            found += [f"{where}: {t!r}" for t in texts if re.match(r"jaxcontracts(\.\w+)*\._", t)]
    return found


def test_demo_files_are_public_modules() -> None:
    """The loop guard counts a module with a ``_`` path component as library code."""
    files = sorted(p.relative_to(DEMO_DIR).as_posix() for p in DEMO_DIR.rglob("*.py"))
    assert {"simulation.py", "regressions.py", "cli.py"} <= set(files), files
    private = [f for f in files if f != "__init__.py" and any(map(_is_private, f.split("/")))]
    assert private == []


def test_demo_uses_public_api_only() -> None:
    files = sorted(DEMO_DIR.rglob("*.py"))
    assert files
    found = [use for p in files for use in _private_uses(p.read_text(), p.name)]
    assert found == [], "the demo reaches into private names:\n" + "\n".join(found)
    # And the command line that runs it is the thin wrapper it is meant to be.
    assert len((ROOT / "jaxcontracts" / "__main__.py").read_text().splitlines()) <= 30


@pytest.mark.parametrize(
    "source",
    [
        "from jaxcontracts._format import fmt_aval",
        "from jaxcontracts import _guard",
        "import jaxcontracts._loop.guard",
        "import jaxcontracts._loop.guard as g",
        "from .._format import fmt_aval",
        "from .. import hot_step",
        "from ._helpers import x",
        "import jaxcontracts\nf = jaxcontracts._format.fmt_aval",
        "import jaxcontracts as jc\njc._guard._local.allow += 1",
        "def f(step):\n    return step._entry.flat_specs",
        "def f(step):\n    return getattr(step, '_entry')",
        "import importlib\nimportlib.import_module('jaxcontracts._loop.guard')",
    ],
)
def test_private_use_checker_catches(source: str) -> None:
    assert _private_uses(source)


def test_private_use_checker_allows_public_code() -> None:
    source = (
        "import jaxcontracts as jc\nfrom jaxcontracts import fetch\nfrom .simulation import Particles\n"
        "print(jc.__version__, fetch.__name__, Particles.spec(n=2), getattr(jc, 'hot_step'))"
    )
    assert _private_uses(source) == []
