"""A contract error's traceback ends at the user's line, as JAX's errors do
(``jax._src.traceback_util.api_boundary``): at the outermost frame of ours it
crosses, it is rebuilt without library frames (:func:`is_library`), under
JAX's switch (``JAX_TRACEBACK_FILTERING=off`` shows them).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import sys
import sysconfig
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import jax
import numpy as np

from ._compat.runtime_errors import JAX_DIRS
from ._compat.tracing import exclude_from_source_info
from ._errors import ContractError

__all__ = ["boundary", "filtering", "is_jax_or_ours", "is_library", "let_go", "trim", "trim_ours"]

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# (the standard library is _STDLIB below: its folder holds site-packages in many layouts)
_SKIP_DIRS = (*JAX_DIRS, os.path.dirname(os.path.abspath(np.__file__)) + os.sep)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


@functools.lru_cache(maxsize=4096)
def _is_installed(path: str) -> bool:
    """Code of an installed package (flax, optax): in a site folder, or listed in
    a ``RECORD`` on ``sys.path`` (``pip install --target``); not an editable
    install (its record lists only the finder hook)."""
    if any(marker in path for marker in _INSTALLED):
        return True
    for entry in sys.path:
        root = os.path.join(os.path.abspath(entry or os.curdir), "")
        if path.startswith(root) and path[len(root) :].split(os.sep, 1)[0] in _recorded(root):
            return True
    return False


@functools.lru_cache(maxsize=64)
def _recorded(root: str) -> frozenset[str]:
    """The top-level names an installer's ``RECORD`` lists in the folder
    ``root`` (egg-info sources, ``setup.py develop``, are no record)."""
    names = set()
    for dist in importlib.metadata.distributions(path=[root]):
        if dist.read_text("RECORD") is not None:
            names.update(f.parts[0] for f in dist.files or () if f.parts)
    return frozenset(names)


@functools.lru_cache(maxsize=8192)
def is_library(filename: str, installed: bool = True, name: str = "") -> bool:
    """Library code: JAX, numpy, the standard library, our private modules (a
    path component starting with ``_``; ``jaxcontracts.demo`` is user code), a
    dataclass's generated dunder (``name``, from ``<string>``), and
    (``installed=True``) any installed package."""
    if filename.startswith("<"):
        return filename.startswith("<frozen") or (
            filename == "<string>" and name.startswith("__") and name.endswith("__")
        )
    path = os.path.abspath(filename)
    # first: an installed package may sit under a skipped folder
    if path.startswith(_PACKAGE_DIR + os.sep):
        return _private_here(path)
    if path.startswith(_SKIP_DIRS):
        return True
    if installed and _is_installed(path):
        return True
    return path.startswith(_STDLIB) and "site-packages" not in path


def filtering() -> bool:
    """Whether tracebacks are trimmed: JAX's ``JAX_TRACEBACK_FILTERING`` is not ``off``."""
    return str(jax.config.jax_traceback_filtering) != "off"


_HIDDEN = (
    "jaxcontracts: its own frames and JAX's are left out of this traceback "
    "(JAX_TRACEBACK_FILTERING=off shows them)."
)


def trim(err: BaseException) -> None:
    """Drop every library frame from a contract error's traceback, in place;
    from any other error's, ours and JAX's only (installed packages stay).
    Called at a boundary, then a bare ``raise`` (which adds no frame)."""
    if isinstance(err, ContractError):
        _drop_frames(err, lambda code: is_library(code.co_filename, False, code.co_name))
    else:  # JAX's frames go too, as JAX's own filtering drops them from a jax.jit call's error
        ours = [0]

        def drop(code: Any) -> bool:
            path = os.path.abspath(code.co_filename)
            if _private_here(path):
                ours[0] += 1
                return True
            return path.startswith(JAX_DIRS)

        _drop_frames(err, drop)
        if ours[0] and _HIDDEN not in getattr(err, "__notes__", ()):  # (a library bug reads as one)
            err.add_note(_HIDDEN)


def trim_ours(err: BaseException) -> None:
    """Drop this package's private frames from any error's traceback, in place
    (JAX's own error crossing the audit's wrapper reads as it would without it)."""
    _drop_frames(err, lambda code: _private_here(os.path.abspath(code.co_filename)))


def let_go(tb: TracebackType | None) -> None:
    """Clear the locals of our private frames in ``tb`` (past its first, still
    running): a kept traceback (``sys.last_traceback``) then holds none of the
    user's arrays, which a step's next call would count as kept."""
    tb = tb.tb_next if tb is not None else None
    while tb is not None:
        frame = tb.tb_frame
        if _private_here(os.path.abspath(frame.f_code.co_filename)):
            with contextlib.suppress(RuntimeError):  # still running (a generator's): left as is
                frame.clear()
        tb = tb.tb_next


def _drop_frames(err: BaseException, drop: Callable[[Any], bool]) -> None:
    if not filtering():
        return
    kept = []
    tb = err.__traceback__
    while tb is not None:
        if not drop(tb.tb_frame.f_code):
            kept.append(tb)
        tb = tb.tb_next
    out: TracebackType | None = None
    for t in reversed(kept):
        out = TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    err.__traceback__ = out


def is_jax_or_ours(filename: str) -> bool:
    """JAX's or jaxlib's code, or this package's private modules: what lies
    between a user's (or an installed package's) call into JAX and JAX."""
    path = os.path.abspath(filename)
    return _private_here(path) or path.startswith(JAX_DIRS)


def _private_here(path: str) -> bool:
    if not path.startswith(_PACKAGE_DIR + os.sep):
        return False
    return any(part.startswith("_") for part in path[len(_PACKAGE_DIR) + 1 :].split(os.sep))


def _private_prefixes() -> list[str]:
    return [
        os.path.join(_PACKAGE_DIR, name) + ("" if name.endswith(".py") else os.sep)
        for name in sorted(os.listdir(_PACKAGE_DIR))
        if name.startswith("_") and name != "__pycache__"
        and (name.endswith(".py") or os.path.isdir(os.path.join(_PACKAGE_DIR, name)))
    ]


# JAX's messages (jax_explain_cache_misses, the site of a callback) name the
# user's line through the library's frames, as through JAX's own
exclude_from_source_info(_private_prefixes())


def boundary(fn: F) -> F:
    """``fn``, a public entry point: a contract error leaving it is trimmed."""

    @functools.wraps(fn)
    def api(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        try:
            return fn(*args, **kwargs)
        except ContractError as err:
            trim(err)
            raise

    return api  # type: ignore[return-value]
