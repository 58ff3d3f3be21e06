"""Frames: the caller's namespace, the user's line, reads made on purpose.

``sys._getframe`` is a CPython implementation detail; the names of JAX's
callback modules and pytest's assertion rewriting, and IPython's map from
cell pseudo-files to execution counts, are private too.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

from .registry import capability, define

__all__ = [
    "allowed_reader",
    "caller_frame",
    "caller_locals",
    "library_locals",
    "locals_of",
    "namespace_of",
    "notebook_cell",
]


@define(
    "caller-frames",
    "sys._getframe (CPython)",
    "annotations naming classes local to a function; the user's line in messages",
)
def _probe_frames() -> str | None:
    return None if hasattr(sys, "_getframe") else "sys._getframe is missing (not CPython?)"


def caller_frame(depth: int) -> FrameType | None:
    """The frame ``depth`` levels above our caller."""
    if not capability("caller-frames").available:
        return None
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


def locals_of(frame: Any) -> dict[str, Any]:
    """A copy of a user frame's locals where reading them writes nothing; ``{}``
    where it would: before 3.13 a function frame's ``f_locals`` read syncs the
    dict ``locals()`` returned (the user's ``hparams = locals()`` changes, and
    keeps every local alive)."""
    if sys.version_info < (3, 13) and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return {}
    try:
        return dict(frame.f_locals)
    except Exception:  # noqa: BLE001 - a frame without readable locals
        return {}


def library_locals(frame: Any) -> dict[str, Any]:
    """A copy of a library frame's locals (no user holds that frame); before
    3.13 the snapshot ``f_locals`` leaves is emptied once copied."""
    try:
        snapshot = frame.f_locals
    except Exception:  # noqa: BLE001 - a frame without readable locals
        return {}
    out = dict(snapshot)
    if (
        sys.version_info < (3, 13)
        and type(snapshot) is dict
        and frame.f_code.co_flags & inspect.CO_OPTIMIZED
    ):
        snapshot.clear()
    return out


def caller_locals(depth: int) -> Mapping[str, Any]:
    """The local namespace of the frame ``depth`` levels above the caller, for
    annotations: ``f_locals`` is read (before 3.13, syncing an earlier
    ``locals()``) only for a name that is one of the frame's variables."""
    frame = caller_frame(depth + 1)
    return {} if frame is None else namespace_of(frame)


def namespace_of(frame: FrameType) -> Mapping[str, Any]:
    return _Namespace(frame)


class _Namespace(Mapping[str, Any]):
    def __init__(self, frame: FrameType) -> None:
        code = frame.f_code
        self._frame: FrameType | None = frame
        self._names = (
            {*code.co_varnames, *code.co_cellvars, *code.co_freevars}
            if code.co_flags & inspect.CO_OPTIMIZED
            else None
        )
        self._read: dict[str, Any] | None = None

    def _locals(self) -> dict[str, Any]:
        if self._read is None:
            assert self._frame is not None
            self._read, self._frame = dict(self._frame.f_locals), None  # keeps no frame alive
        return self._read

    def __getitem__(self, name: str) -> Any:
        if self._names is not None and name not in self._names:
            raise KeyError(name)
        return self._locals()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._locals())

    def __len__(self) -> int:
        return len(self._locals())


# Host callbacks (jax.debug.print, pure_callback) and an explicit device_get
# read arrays on purpose; pytest explaining a failed assert shows the arrays.
_ALLOWED = (
    (os.path.join("jax", "_src", "debugging.py"), None),
    (os.path.join("jax", "_src", "callback.py"), None),
    (os.path.join("jax", "_src", "api.py"), "device_get"),
    (os.path.join("_pytest", "assertion", "rewrite.py"), None),
    (os.path.join("_pytest", "assertion", "util.py"), None),
)


@define(
    "callback-frames",
    "the file names of jax._src.debugging, jax._src.callback and jax._src.api.device_get",
    "that host callbacks (jax.debug.print, pure_callback) and jax.device_get may read arrays "
    "in a hot loop",
)
def _probe_callbacks() -> str | None:
    from jax._src import api, callback, debugging

    modules = (debugging, callback, api)  # in _ALLOWED's order
    wrong = [
        m.__name__
        for m, (suffix, _) in zip(modules, _ALLOWED)
        if not (m.__file__ or "").endswith(suffix)
    ]
    if not hasattr(api, "device_get"):
        wrong.append("jax._src.api.device_get")
    return ("moved: " + ", ".join(wrong)) if wrong else None


def allowed_reader(frame: FrameType | None) -> bool:
    """Is a read made from this frame (or a caller) a read on purpose?"""
    while frame is not None:
        code = frame.f_code
        for suffix, name in _ALLOWED:
            if code.co_filename.endswith(suffix) and (name is None or code.co_name == name):
                return True
        frame = frame.f_back
    return False


@define(
    "ipython-cells",
    "IPython's InteractiveShell.compile._filename_map",
    "naming notebook cells as 'Cell In[n], line m' (else the pseudo-file name is shown)",
)
def _probe_ipython() -> str | None:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None  # not in a notebook: nothing to name
    shell = ipython.get_ipython()
    if shell is None:
        return None
    return None if hasattr(getattr(shell, "compile", None), "_filename_map") else "no _filename_map"


def notebook_cell(filename: str) -> int | None:
    """The execution count of a notebook cell's pseudo-file, under IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None or (
        "ipykernel_" not in filename and not filename.startswith("<ipython-input")
    ):
        return None
    if not capability("ipython-cells").available:
        return None
    try:
        shell = ipython.get_ipython()
        return (  # type: ignore[no-any-return]
            shell.compile._filename_map.get(filename) if shell else None
        )
    except Exception:  # noqa: BLE001 - IPython internals vary
        return None
