"""Real programs, as their authors wrote them, ported with the least change.

Each port is the original file with ``jax.jit`` replaced by ``jc.hot_step``
and its loop put in a raising ``jc.hot_loop``; the test runs both, checks the
numbers are the original's, and pins the lines that differ (code lines,
docstrings and comments aside), so a gap closed in the library shows as a
shorter diff.
"""

from __future__ import annotations

import ast
import difflib
import io
import runpy
import tokenize
from contextlib import redirect_stdout
from pathlib import Path

import pytest

PORTS = Path(__file__).resolve().parent / "ports"


def _code_lines(path: Path) -> list[str]:
    """The file's code lines: no docstrings, no comments, no blank lines."""
    source = path.read_text()
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    comments = {
        tok.start[0]: tok.start[1]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    out = []
    for n, line in enumerate(source.splitlines(), 1):
        if n in doc_lines:
            continue
        text = line[: comments[n]] if n in comments else line
        if text.strip():
            out.append(text.rstrip())
    return out


def _run(path: Path) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    return out.getvalue()


def test_the_nnx_functional_loop_ports_with_a_decorator_and_a_with():
    pytest.importorskip("flax.nnx")
    pytest.importorskip("optax")
    original, port = PORTS / "nnx_functional_original.py", PORTS / "nnx_functional_port.py"
    assert _run(port) == _run(original)  # the same losses, to the last digit
    changed = [
        line
        for line in difflib.unified_diff(_code_lines(original), _code_lines(port), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    added = [line[1:].strip() for line in changed if line.startswith("+")]
    assert added == [
        "import jaxcontracts as jc",  # was: import functools
        '@jc.hot_step(state="state", host="batch")',  # was: functools.partial(jax.jit, donate_argnums=0)
        'with jc.hot_loop(compiles="warmup") as loop:',
        "for step, batch in enumerate(loop.iterate(loader(200))):",
        "loss, state = train_step(state, batch)",  # re-indented under the with
        "if step % 50 == 0:",  # re-indented
        "losses.append(float(jc.fetch(loss)))",  # the one read, made explicit
    ]
