"""Static typing as users meet it: mypy and pyright on tests/typing/.

``good.py`` is a user's file that must type-check with zero errors; ``bad.py``
holds mistakes that both checkers must report, exactly on the lines marked
``# expect-error``. The checkers' settings are ``tests/typing/mypy.ini``
(strict) and ``tests/typing/pyrightconfig.json`` (standard); both resolve
``jaxcontracts`` from this source tree. ``pip install -e '.[dev]'`` installs them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TYPING = Path(__file__).parent / "typing"
ROOT = TYPING.parent.parent
FILES = ("good.py", "bad.py")
_MARK = re.compile(r"#\s*expect-error\s*$")
_MYPY_LINE = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<message>.*)$", re.M)


def _expected_lines() -> set[int]:
    lines = (TYPING / "bad.py").read_text().splitlines()
    return {n for n, text in enumerate(lines, 1) if _MARK.search(text)}


def _assert_errors(tool: str, errors: list[tuple[str, int, str]]) -> None:
    """No error in good.py; in bad.py, errors on exactly the marked lines."""
    good = [f"  good.py:{n}: {m}" for f, n, m in errors if f == "good.py"]
    assert not good, f"{tool} reports errors in a correct user file:\n" + "\n".join(good)
    want = _expected_lines()
    assert want, "bad.py marks no line with # expect-error"
    got = {n for f, n, _ in errors if f == "bad.py"}
    unexpected = [f"  bad.py:{n}: {m}" for f, n, m in errors if f == "bad.py" and n not in want]
    assert got == want, (
        f"{tool}: errors on unmarked lines:\n"
        + "\n".join(unexpected)
        + f"\n{tool}: no error on the marked lines {sorted(want - got)}"
    )


# CI installs the dev extra and sets this, so that a missing checker fails there.
REQUIRED = os.environ.get("JAXCONTRACTS_REQUIRE_TYPECHECKERS") == "1"


def _missing(tool: str) -> None:
    message = f"{tool} is not installed (pip install -e '.[dev]')"
    if REQUIRED:
        pytest.fail(message + " and JAXCONTRACTS_REQUIRE_TYPECHECKERS=1")
    pytest.skip(message)


def test_mypy_passes_good_and_reports_every_marked_line_of_bad():
    if importlib.util.find_spec("mypy") is None:
        _missing("mypy")
    # A cache outside the tree: a cold run reads jax's types (~30 s), a warm one ~2 s.
    cache = Path(tempfile.gettempdir()) / "jaxcontracts-mypy-cache"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(TYPING / "mypy.ini"),
            "--cache-dir",
            str(cache),
            *(str(TYPING / f) for f in FILES),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode in (0, 1), f"mypy failed to run:\n{result.stdout}{result.stderr}"
    errors = [
        (Path(m["file"]).name, int(m["line"]), m["message"])
        for m in _MYPY_LINE.finditer(result.stdout)
    ]
    _assert_errors("mypy", errors)


def test_pyright_passes_good_and_reports_every_marked_line_of_bad():
    beside = Path(sys.executable).parent / "pyright"  # a venv's, even if not activated
    pyright = str(beside) if beside.exists() else shutil.which("pyright")
    if pyright is None:
        _missing("pyright")
    result = subprocess.run(
        [
            pyright,
            "--outputjson",
            "--pythonpath",
            sys.executable,
            "-p",
            str(TYPING / "pyrightconfig.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"},
    )
    assert result.returncode in (0, 1), f"pyright failed to run:\n{result.stdout}{result.stderr}"
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert report["summary"]["filesAnalyzed"] == len(FILES), report["summary"]
    errors = [
        (Path(d["file"]).name, d["range"]["start"]["line"] + 1, d["message"])
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
        or (d["severity"] == "warning" and d["file"].endswith("good.py"))
    ]
    _assert_errors("pyright", errors)


def test_good_file_also_runs(monkeypatch):
    """The typed user file is true at run time too, not only to the checkers."""
    name = "jaxcontracts_typing_good"
    spec = importlib.util.spec_from_file_location(name, TYPING / "good.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look the module up
    spec.loader.exec_module(module)
    assert module.main() > 0
