"""Frames: the caller's namespace, the user's line, reads made on purpose.

``sys._getframe`` is a CPython implementation detail; the names of JAX's
callback modules and pytest's assertion rewriting, and IPython's map from
cell pseudo-files to execution counts, are private too.
"""

from __future__ import annotations

import ctypes
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
    "locals_snapshot_mirrors",
]

_OPTIMIZED = 0x0001  # CO_OPTIMIZED: a function's frame (fast locals)


@define(
    "caller-frames",
    "sys._getframe (CPython)",
    "annotations naming classes local to a function; the user's line in messages",
)
def _probe_frames() -> str | None:
    return None if hasattr(sys, "_getframe") else "sys._getframe is missing (not CPython?)"


def caller_frame(depth: int) -> FrameType | None:
    """The frame ``depth`` levels above the caller of this function."""
    if not capability("caller-frames").available:
        return None
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


def locals_of(frame: Any) -> dict[str, Any]:
    """A copy of a user frame's local variables where reading them writes
    nothing; ``{}`` where it would.

    Before Python 3.13, reading a function frame's ``f_locals`` syncs the
    frame's own locals dict, the very dict ``locals()`` returned to the
    function and that ``pdb`` writes back on ``continue``: a variable bound
    since appears in the user's ``hparams = locals()``, a deleted one leaves
    it, and the dict keeps every local alive until the function returns. So
    there a function frame's locals are not read at all (a message then
    names the user's line, not the variable). Since 3.13 ``f_locals`` is a
    proxy that reads the frame and keeps nothing; a module or class body's
    ``f_locals`` is its namespace, read as it is.
    """
    if sys.version_info < (3, 13) and frame.f_code.co_flags & _OPTIMIZED:
        return {}
    try:
        return dict(frame.f_locals)
    except Exception:  # noqa: BLE001 - a frame without readable locals
        return {}


def library_locals(frame: Any) -> dict[str, Any]:
    """A copy of the locals of a frame of library code (JAX's dispatch, a
    typed key's method), which no user holds; callers stop below the user's
    frame, whose locals only ``locals_of`` reads. Before Python 3.13 the
    snapshot ``f_locals`` leaves on a function frame is emptied once copied,
    so it keeps nothing alive."""
    try:
        snapshot = frame.f_locals
    except Exception:  # noqa: BLE001 - a frame without readable locals
        return {}
    out = dict(snapshot)
    if sys.version_info < (3, 13) and type(snapshot) is dict and frame.f_code.co_flags & _OPTIMIZED:
        snapshot.clear()
    return out


# Before Python 3.13, a function frame's locals snapshot (the dict locals()
# returned, kept by the frame and synced from its variables at every
# locals() or f_locals read) sits in the frame's _PyInterpreterFrame. Offsets
# (64-bit CPython): PyFrameObject.f_frame; in _PyInterpreterFrame, f_code,
# f_locals and frame_obj. f_code and frame_obj are compared with the frame's
# own at every read: a layout that differs reads as "unknown".
_LAYOUT = {(3, 11): (24, 32, 24, 40), (3, 12): (24, 0, 40, 48)}.get(sys.version_info[:2])


@define(
    "locals-snapshot",
    "CPython 3.11/3.12's frame layout: the locals snapshot a function frame keeps and its "
    "variables' slots (read without syncing them); nothing to read on 3.13, which keeps none",
    "a donated array still held by a stale locals() snapshot nobody holds "
    "(`x = s['x']; locals(); del x`), or by a debugger's snapshot entry that "
    "mirrors the variable passed, is refused as kept; a class local to a function, named "
    "in an annotation, is read without changing that function's locals()",
)
def _probe_snapshot() -> str | None:
    if sys.version_info >= (3, 13):
        return None
    if _LAYOUT is None or sys.maxsize < 2**32 or not hasattr(sys, "getrefcount"):
        return f"no known frame layout for Python {sys.version_info[:2]} on this build"

    def probe() -> bool:  # read while the frame runs
        x = object()  # noqa: F841 - a local for the snapshot to hold
        seen = locals()
        return _snapshot_address(sys._getframe()) == id(seen)

    def variables(a: object) -> bool:  # the variables, read where the frame keeps them
        b, c = object(), object()

        def inner() -> object:  # makes c a cell variable
            return c

        frame = sys._getframe()
        return all(_variable_holds(frame, n, v) for n, v in (("a", a), ("b", b), ("c", inner())))

    ok = probe() and variables(object())
    return None if ok else "the frame layout read does not match this interpreter's"


def _word(frame: FrameType, offset: int) -> int | None:
    """The pointer at ``offset`` in ``frame``'s interpreter frame (0: NULL),
    read without syncing anything; None where the layout read does not check
    out against the frame's own code and frame object."""
    if _LAYOUT is None:
        return None
    f_frame, f_code, _, frame_obj = _LAYOUT
    word = ctypes.c_void_p.from_address
    data = word(id(frame) + f_frame).value
    if not data or word(data + f_code).value != id(frame.f_code) or word(data + frame_obj).value != id(frame):
        return None
    return word(data + offset).value or 0


def _snapshot_address(frame: FrameType) -> int | None:
    """The address of ``frame``'s locals snapshot (0: none yet); None: unreadable."""
    return None if _LAYOUT is None else _word(frame, _LAYOUT[2])


# Where _PyInterpreterFrame's localsplus array starts (3.11 and 3.12, 64-bit):
# a function's variables, co_varnames first, in that order.
_LOCALSPLUS = 72


def _variable_holds(frame: FrameType, name: str, obj: Any) -> bool:
    """Whether the running function ``frame``'s variable ``name`` holds
    ``obj`` now, read from the interpreter frame without syncing its
    locals; False where that cannot be read."""
    found = _read_variable(frame, name)
    return found is not None and found[0] and found[1] is obj


def _read_variable(frame: FrameType, name: str) -> tuple[bool, Any] | None:
    """``(bound, value)`` of the running function ``frame``'s variable
    ``name`` (a local, a cell or a free variable), read from its slot in the
    interpreter frame without syncing its locals (3.11/3.12); None where
    the layout cannot be read here."""
    code = frame.f_code
    cells = [c for c in code.co_cellvars if c not in code.co_varnames]
    order = (*code.co_varnames, *cells, *code.co_freevars)  # the slots, in localsplus order
    if name not in order:
        return (False, None)
    address = _word(frame, _LOCALSPLUS + 8 * order.index(name))
    if address is None:
        return None
    if not address:
        return (False, None)  # unbound
    value = ctypes.cast(address, ctypes.py_object).value  # the frame holds it: alive
    if name in code.co_cellvars or name in code.co_freevars:  # the slot holds its cell
        try:
            return (True, value.cell_contents)
        except ValueError:  # an empty cell
            return (False, None)
    return (True, value)


def _locals_snapshot(frame: FrameType | None) -> tuple[dict[str, Any], bool] | None:
    """A running function ``frame``'s locals snapshot (3.11/3.12), read
    without syncing it, and whether nothing but the frame holds it; None: no
    snapshot, Python 3.13 (which keeps none), or the layout cannot be read."""
    if frame is None or sys.version_info >= (3, 13) or not frame.f_code.co_flags & _OPTIMIZED:
        return None
    if not capability("locals-snapshot").available:
        return None
    address = _snapshot_address(frame)
    if not address:
        return None
    snapshot = ctypes.cast(address, ctypes.py_object).value  # the frame holds it: alive
    if type(snapshot) is not dict:
        return None
    alone = sys.getrefcount(snapshot) == 3  # the frame's reference, this variable, the argument
    return snapshot, alone


def locals_snapshot_mirrors(frame: FrameType | None) -> dict[int, int] | None:
    """Per ``id``, the entries of a running function ``frame``'s locals
    snapshot (3.11/3.12) that are not holders of their own. Where only the
    frame holds the snapshot, all of those under its variable names: they
    are stale, and every read of the snapshot (``locals()``, ``f_locals``, a
    tracer's) syncs it first. Where something else holds it too (a debugger
    stopped there, ``hparams = locals()``), only those holding the very
    object their variable holds now. None: nothing to discount (3.13, no
    snapshot, the layout unknown)."""
    found = _locals_snapshot(frame)
    if found is None:
        return None
    snapshot, alone = found
    assert frame is not None
    code = frame.f_code
    names = {*code.co_varnames, *code.co_cellvars, *code.co_freevars}
    out: dict[int, int] = {}
    for name, value in snapshot.items():
        if name in names and (alone or _variable_holds(frame, name, value)):
            out[id(value)] = out.get(id(value), 0) + 1
    return out


def caller_locals(depth: int) -> Mapping[str, Any]:
    """The local namespace of the frame ``depth`` levels above the caller,
    for resolving names in annotations (a class local to the caller's
    function), read only for a name that is one of that frame's variables.

    A decorator applied inside a function must not change its ``hparams =
    locals()`` (see :func:`locals_of`): a name the frame's code has no
    variable for is "absent" without reading anything, and a function's own
    local is read from its slot in the frame, without syncing (3.11/3.12;
    3.13's ``f_locals`` writes nothing). Only iterating the mapping reads
    ``f_locals`` whole."""
    frame = caller_frame(depth + 1)
    return {} if frame is None else namespace_of(frame)


def namespace_of(frame: FrameType) -> Mapping[str, Any]:
    """:func:`caller_locals` of ``frame`` itself."""
    return _Namespace(frame)


class _Namespace(Mapping[str, Any]):
    def __init__(self, frame: FrameType) -> None:
        code = frame.f_code
        self._frame: FrameType | None = frame
        self._names = (
            {*code.co_varnames, *code.co_cellvars, *code.co_freevars} if code.co_flags & _OPTIMIZED else None
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
        if self._names is not None and self._read is None and sys.version_info < (3, 13):
            assert self._frame is not None
            found = _read_variable(self._frame, name) if capability("locals-snapshot").available else None
            if found is not None:
                if not found[0]:
                    raise KeyError(name)
                return found[1]
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
    "that host callbacks (jax.debug.print, pure_callback) and jax.device_get may read arrays in a hot loop",
)
def _probe_callbacks() -> str | None:
    from jax._src import api, callback, debugging

    modules = (debugging, callback, api)  # in _ALLOWED's order
    wrong = [m.__name__ for m, (suffix, _) in zip(modules, _ALLOWED) if not (m.__file__ or "").endswith(suffix)]
    if not hasattr(api, "device_get"):
        wrong.append("jax._src.api.device_get")
    return ("moved: " + ", ".join(wrong)) if wrong else None


def allowed_reader(frame: FrameType | None) -> bool:
    """Is a read made from this frame (or a caller of it) a read on purpose?"""
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
    if ipython is None or "ipykernel_" not in filename and not filename.startswith("<ipython-input"):
        return None
    if not capability("ipython-cells").available:
        return None
    try:
        shell = ipython.get_ipython()
        return shell.compile._filename_map.get(filename) if shell else None  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - IPython internals vary
        return None
