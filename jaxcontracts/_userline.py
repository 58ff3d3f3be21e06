"""Finding the user's line: the frame, ``file:line`` and source text a message
points at (a read inside flax is reported at the user's call into it).
"""

from __future__ import annotations

import ast
import io
import linecache
import os
import tokenize
from collections.abc import Mapping
from types import FrameType, ModuleType
from typing import Any

from ._compat import frames
from ._tracebacks import is_library

__all__ = ["host_read_on_line", "is_library", "place", "traceback_where", "user_frame", "where"]


def user_frame(frame: FrameType | None = None) -> FrameType | None:
    """The innermost frame of the user's own code (not JAX's, not an
    installed package's); when every frame is installed code (a program run
    from site-packages), the innermost one outside JAX, numpy and the
    standard library."""
    frame = frame or frames.caller_frame(2)
    for installed in (True, False):
        f = frame
        while f is not None and is_library(f.f_code.co_filename, installed, f.f_code.co_name):
            f = f.f_back
        if f is not None:
            return f
    return frame


def where(frame: FrameType | None, lineno: int | None = None) -> tuple[str, str]:
    if frame is None:
        return "<unknown>", ""
    return place(frame.f_code.co_filename, frame.f_lineno if lineno is None else lineno)


def place(filename: str, lineno: int) -> tuple[str, str]:
    """(``file:line``, the line's source text): the path relative to the working
    folder where it is below it, a notebook cell as IPython names it."""
    text = linecache.getline(filename, lineno).strip()
    cell = frames.notebook_cell(filename)
    if cell is not None:
        return f"Cell In[{cell}], line {lineno}", text
    short = filename
    if not filename.startswith("<"):
        try:
            rel = os.path.relpath(filename)
            short = rel if not rel.startswith(".." + os.sep + "..") else filename
        except ValueError:  # another drive
            pass
    return f"{short}:{lineno}", text


def traceback_where(tb: Any) -> tuple[str, str]:
    """``file:line`` of the innermost user frame of a traceback."""
    found: dict[bool, tuple[Any, int]] = {}
    while tb is not None:
        for installed in (True, False):
            code = tb.tb_frame.f_code
            if not is_library(code.co_filename, installed, code.co_name):
                found[installed] = (tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    best = found.get(True) or found.get(False)
    return where(*best) if best else ("<unknown>", "")


def _strip_comment(line: str) -> str:
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return line[: tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return line.rstrip()


_BUILTIN_READS = {"bool", "float", "int", "complex"}
_METHOD_READS = {"item", "tolist"}
_NUMPY_READS = {"asarray", "array"}
_METADATA = {"shape", "ndim", "dtype", "size"}
_PLAIN = (bool, int, float, str, bytes, type(None))


def _calls(node: ast.AST, name: str, test: ast.expr, values: Mapping[str, Any]) -> bool:
    """Whether ``node`` calls a function named ``name`` outside ``test``: by
    the name it is called by, or the ``__name__`` of what that name holds
    (``h = jax.jit(lambda a: a * 3)`` compiles ``<lambda>``)."""
    inside = {id(n) for n in ast.walk(test)}
    for n in ast.walk(node):
        if not isinstance(n, ast.Call) or id(n) in inside:
            continue
        f = n.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        held = values.get(called) if isinstance(f, ast.Name) else None
        if name in (called, getattr(held, "__name__", None)):
            return True
    return False


def _static_test(test: ast.expr, names: Mapping[str, Any]) -> bool:
    """Whether a test makes no eager op: names, constants, attributes alone
    (``if cfg.relu:``) and their ``not``/``and``/``or``, or expressions of
    array metadata, constants, ``len``/``isinstance`` and Python values in
    the frame (``x.shape[0] > n``); ``s.loss < 1e-3`` may compute on the device."""
    if isinstance(test, ast.BoolOp):
        return all(_static_test(v, names) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _static_test(test.operand, names)
    chain = test
    while isinstance(chain, ast.Attribute):
        chain = chain.value
    return isinstance(chain, (ast.Name, ast.Constant)) or _metadata_only(test, names)


def _metadata_only(e: ast.expr, names: Mapping[str, Any]) -> bool:
    if isinstance(e, ast.Constant):
        return True
    if isinstance(e, ast.Name):
        return isinstance(names.get(e.id, _UNKNOWN), _PLAIN)
    if isinstance(e, ast.Attribute):  # an array's metadata, or a module's name (jnp.float32)
        return e.attr in _METADATA or (
            isinstance(e.value, ast.Name) and isinstance(names.get(e.value.id), ModuleType)
        )
    if isinstance(e, ast.Call):
        return isinstance(e.func, ast.Name) and e.func.id in ("len", "isinstance")
    if isinstance(e, ast.Subscript):
        return _metadata_only(e.value, names) and _metadata_only(e.slice, names)
    if isinstance(e, ast.UnaryOp):
        return _metadata_only(e.operand, names)
    if isinstance(e, ast.BoolOp):
        return all(_metadata_only(v, names) for v in e.values)
    if isinstance(e, ast.BinOp):
        return _metadata_only(e.left, names) and _metadata_only(e.right, names)
    if isinstance(e, ast.Compare):
        return _metadata_only(e.left, names) and all(
            _metadata_only(c, names) for c in e.comparators
        )
    return False


_UNKNOWN = object()


def host_read_on_line(user: FrameType | None, compiled: str = "") -> str | None:
    """How the user's line reads an eager result on the host, if it visibly does:
    a computing ``if``/``while``/``assert``/ternary test (``bool()``), or
    ``float()``, ``int()``, ``.item()``, ``.tolist()``, numpy's ``asarray``
    (resolved in the frame's globals: ``jnp.asarray`` is no read). A test
    is not the cause where ``compiled``, the function compiling now, is
    called in that statement outside its test (``if step % k == 0: m =
    evaluate(x)`` compiles ``evaluate``)."""
    text = where(user)[1]
    if not text or user is None:
        return None
    source = _strip_comment("if" + text[4:] if text.startswith("elif ") else text)
    try:
        tree = ast.parse(source + " pass" if source.endswith(":") else source)
    except SyntaxError:
        return None
    names = user.f_globals
    # (a function's locals from 3.13 on: unknown before)
    values = {**names, **frames.locals_of(user)}
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert))
            and not _static_test(node.test, values)
            and not (compiled and _calls(node, compiled, node.test, values))
        ):
            kinds = {ast.Assert: "assert", ast.While: "while"}
            return f"the `{kinds.get(type(node), 'if')}` on this line"
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in _BUILTIN_READS and f.id not in names:
                return f"{f.id}() on this line"
            if isinstance(f, ast.Attribute) and f.attr in _METHOD_READS:
                return f"{f.attr}() on this line"
            if (
                isinstance(f, ast.Attribute)
                and f.attr in _NUMPY_READS
                and isinstance(f.value, ast.Name)
            ):
                module = names.get(f.value.id)
                if getattr(module, "__name__", None) == "numpy":
                    return f"{f.value.id}.{f.attr}() on this line"
    return None

