"""``jc.hot_loop``: critical sections that catch transfers and compiles.

JAX's device-to-host transfer guard never fires on CPU: a CPU ``jax.Array``
lends its buffer to numpy without copying, so no "transfer" happens. A hot loop
therefore intercepts the *reads* themselves, on every backend:

* **Python-level reads.** ``ArrayImpl`` is a C++ type whose read methods
  (``__float__``, ``__int__``, ``__bool__``, ``__complex__``, ``__index__``,
  ``__format__``, ``__repr__``, ``__str__``, ``__reduce__``, ``__array__``,
  ``__iter__``, ``tolist``, ``item``, ``tobytes`` and the ``_value`` property)
  are Python functions on a mutable heap type (``_compat.arrays``). While at least one loop is
  active anywhere, they are replaced on the class (which updates the C slots,
  so existing arrays are covered) by wrappers that check a thread-local flag.
  The last loop to exit puts the originals back, the same objects, so nothing
  stays patched and nothing costs anything outside a loop. Iterating or
  unpacking a single-device or fully replicated array slices it on the device
  (``k, sub = jax.random.split(k)``) and is let through; a sharded array's
  iteration reads ``_value`` and is caught there.
* **The buffer protocol.** On one CPU device ``np.asarray(x)``, ``np.array``,
  ufuncs such as ``np.add(x, 1)`` and ``memoryview`` read the buffer through
  the C buffer protocol and never call ``__array__``. On Python >= 3.12 the
  class's ``__buffer__`` (PEP 688) is replaced; on 3.11 the type's
  ``bf_getbuffer`` slot is swapped, through ctypes, for a callback that
  refuses the export on a guarded thread and calls the original otherwise.
  When the export is refused numpy falls back to ``__array__``, which raises
  the contract error with the array named. Other consumers (``memoryview``,
  ``np.frombuffer``, ``hashlib``) see that error on 3.12; on 3.11 a ctypes
  callback cannot raise through C, so they raise ``SystemError`` and the
  refusal's error replaces it when it leaves the loop. ``__dlpack__``
  (``np.from_dlpack``) of a CPU array is guarded like the read methods.
* **Host-to-device.** JAX's own ``transfer_guard_host_to_device`` works on CPU:
  it is engaged (thread-locally) for the loop, and its bare runtime error is
  turned into a :class:`TransferError` naming the user's line when it leaves
  the loop. On GPU/TPU JAX's device-to-host guard is engaged too.
* **Compiles.** ``jax.monitoring`` reports the start of every trace, MLIR
  lowering and backend compile on the calling thread; a listener turns them
  into :class:`RecompileError`. A hot step meeting a new signature reports
  itself first, by name. Warm calls emit nothing, and ``jax.debug.print``
  callbacks (which read arrays on the host) are recognised and allowed.

Explicit transfers stay allowed: ``jc.fetch(tree)``, ``jax.device_get``,
``jax.device_put``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import io
import os
import re
import sys
import sysconfig
import threading
import time
import tokenize
import types
from collections.abc import Callable
from types import FrameType
from typing import Any, Literal, TypeVar, overload

import jax
import numpy as np
import numpy.typing as npt

from . import _timing
from ._compat import arrays, events, frames, guardlog, hostcopy, runtime_errors, threadguard
from ._config import get_checks
from ._donation import is_deleted_array
from ._dtypes import is_key
from ._errors import DefinitionError, DonationError, RecompileError, TransferError
from ._format import fmt_aval
from ._records import Violation
from ._report import Report, loop_report
from ._runtime import (
    PRODUCED_BY,
    LoopStack,
    clear_calls,
    consumed_by,
    consumer_of,
    find,
    local,
    observers,
    states_in,
    tracking,
)
from ._timing import LoopTiming

__all__ = ["HotLoop", "Violation", "fetch", "hot_loop"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_READ_WORDS = {
    "__float__": "float()",
    "__int__": "int()",
    "__bool__": "bool() (an `if` or `while` on an array?)",
    "__complex__": "complex()",
    "__index__": "use as an index (list index, range(), slice bound)",
    "__format__": "formatting (f-string or format())",
    "__repr__": "repr()",
    "__str__": "str() / print()",
    "__reduce__": "pickling",
    "__array__": "conversion to numpy (np.asarray / np.array / a numpy ufunc)",
    "__iter__": "iteration (one dispatch and read per element)",  # sharded arrays only
    "tolist": ".tolist()",
    "item": ".item()",
    "tobytes": ".tobytes()",
    "_value": "reading its value",
    "buffer": "the buffer protocol (np.asarray, memoryview, np.frombuffer, hashlib)",
    "__dlpack__": "a DLPack export of a CPU array (np.from_dlpack)",
}
_lock = threading.Lock()


# --------------------------------------------------------------------------
# Where a violation happened: the user's line


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(arrays.__file__)))
_SKIP_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (jax, np, contextlib)
    if getattr(m, "__file__", None)
)
try:
    import jaxlib

    _SKIP_DIRS += (os.path.dirname(os.path.abspath(jaxlib.__file__)) + os.sep,)
except ImportError:  # pragma: no cover
    pass
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _is_installed(filename: str) -> bool:
    """Code of an installed package (site-packages / dist-packages): jax_md,
    flax, optax... A message points at the user's line that called into it."""
    return any(marker in os.path.abspath(filename) for marker in _INSTALLED)


def _is_library(filename: str, installed: bool = True) -> bool:
    """Library code: JAX, numpy, the standard library, our private modules,
    and (``installed=True``) any installed package.

    A module of this package is library code when its path below the package
    has a component starting with ``_`` (``_guard.py``, ``_compat/...``,
    ``__main__.py``); public subpackages such as ``jaxcontracts.demo`` are
    code written as a user would, and messages point into them.
    """
    if filename.startswith("<frozen"):
        return True
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep):
        # Checked first: an installed package may sit under a skipped folder.
        parts = path[len(_PACKAGE_DIR) + 1 :].split(os.sep)
        return any(part.startswith("_") for part in parts)
    if path.startswith(_SKIP_DIRS):
        return True
    if installed and _is_installed(path):
        return True
    return path.startswith(_STDLIB) and "site-packages" not in path


def _user_frame(frame: FrameType | None = None) -> FrameType | None:
    """The innermost frame of the user's own code (not JAX's, not an
    installed package's); when every frame is installed code (a program run
    from site-packages), the innermost one outside JAX, numpy and the
    standard library."""
    frame = frame or frames.caller_frame(2)
    for installed in (True, False):
        f = frame
        while f is not None and _is_library(f.f_code.co_filename, installed):
            f = f.f_back
        if f is not None:
            return f
    return frame


def _where(frame: FrameType | None, lineno: int | None = None) -> tuple[str, str]:
    """(``file:line``, the source text of that line)."""
    if frame is None:
        return "<unknown>", ""
    import linecache

    filename = frame.f_code.co_filename
    lineno = frame.f_lineno if lineno is None else lineno
    text = linecache.getline(filename, lineno).strip()
    cell = frames.notebook_cell(filename)
    if cell is not None:  # name it as IPython's tracebacks do
        return f"Cell In[{cell}], line {lineno}", text
    short = filename
    if not filename.startswith("<"):
        try:
            rel = os.path.relpath(filename)
            short = rel if not rel.startswith(".." + os.sep + "..") else filename
        except ValueError:  # another drive
            pass
    return f"{short}:{lineno}", text


_TITLES = {
    "transfer": "implicit transfer inside jc.hot_loop",
    "compile": "compile inside jc.hot_loop",
    "donation": "use of a donated array inside jc.hot_loop",
}
_LOGGED_FIX = (
    "rerun with on_violation=\"raise\" to stop at the line; the usual cause is an "
    "eager op or a jax.jit call given a Python scalar or a numpy array (x * 2.0 "
    "on an array, f(np_array)): make constants device arrays before the loop "
    "(two = jnp.float32(2.0)) or move the arithmetic into the step."
)
_LOGGED_AVAL = re.compile(r"^(?P<dtype>[a-z]+\d*)\[(?P<shape>[\d,]*)\](?P<weak>, weak_type=True)?")


def _logged_aval(text: str) -> str:
    """``float32[3], weak_type=True`` -> ``f32[3] (weak: a Python scalar?)``."""
    m = _LOGGED_AVAL.match(text)
    if m is None:
        return text or "an argument (jaxlib's jit fast path gives no shape: a numpy array or Python scalar passed to a jax.jit function?)"
    try:
        shape = tuple(int(d) for d in m["shape"].split(",") if d)
        out = fmt_aval(shape, np.dtype(m["dtype"]))
    except TypeError:
        return text
    return out + (" (weakly typed: a Python scalar)" if m["weak"] else "")


_CONTRACT_OF = {"transfer": "no-transfer", "compile": "no-compile", "donation": "no-donated-use"}


def _violation(kind: str, what: str, fix: str, error: type[Exception], frame: Any = None) -> None:
    """Raise or record one violation for the current thread's loop."""
    __tracebackhide__ = True
    loop = local.loop
    if loop is not None:
        loop.violation(kind, what, fix, error, frame)


# --------------------------------------------------------------------------
# Naming arrays and the read interceptors


def _describe(x: Any, frame: Any = None) -> str:
    try:
        text = fmt_aval(x.shape, x.dtype, x.aval.weak_type)
    except Exception:  # noqa: BLE001
        return type(x).__name__
    key = _key_owner()
    if key is not None:  # the key data of a typed key being printed or converted
        text = f"a typed PRNG key {fmt_aval(key.shape, key.dtype)} (its key data, {text})"
        x = key
    produced = find(x, frame)[1]
    return f"{text} ({produced})" if produced else text


def _key_owner() -> Any:
    """The typed PRNG key whose method is reading its key data, if any.

    A key's ``repr``/``print`` reads its ``uint32`` key data; the message
    names the key. Only frames a few levels up are looked at, and only when
    a violation is being reported.
    """
    if arrays.KeyArray is None:
        return None
    frame = frames.caller_frame(2)
    for _ in range(20):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, arrays.KeyArray):
            return owner
        frame = frame.f_back
    return None


def _on_read(x: Any, name: str, frame: Any = None) -> None:
    __tracebackhide__ = True
    # A read that raises normally supersedes a refused buffer export kept for
    # 3.11 (numpy falls back from the refused export to the guarded __array__).
    _pending.error = None
    user = _user_frame(frame or frames.caller_frame(1))
    if x.is_deleted():
        by = consumed_by(x, user)
        _violation(
            "donation",
            f"{_READ_WORDS.get(name, name)} of an array that was donated"
            + (f" to {by}" if by else " (deleted)")
            + f": {fmt_aval(x.shape, x.dtype)}",
            "use the state the step returned (s = step(s)); keep what you need "
            "from the old state by returning it from the step.",
            DonationError,
            frame,
        )
        return
    _violation(
        "transfer",
        f"device-to-host read: {_READ_WORDS.get(name, name)} of {_describe(x, user)}",
        "read it deliberately and rarely with jc.fetch(x) (e.g. every 1000 "
        "steps), or move the read after the loop; an `if` on an array belongs "
        "in the step (jnp.where / lax.cond).",
        TransferError,
        frame,
    )


def _iterates_on_device(x: Any) -> bool:
    """Whether iterating ``x`` slices it on the device, without a read.

    JAX iterates (and unpacks) a single-device or fully replicated array with
    device slices; any other layout goes through ``_value``, which is guarded
    on its own. A 0-d array raises numpy's TypeError without a read. A
    donated array still goes to ``_on_read`` (DonationError).
    """
    try:
        return not x.is_deleted() and (
            x.ndim == 0 or x.sharding.num_devices == 1 or x.is_fully_replicated
        )
    except Exception:  # noqa: BLE001 - unknown layout: treat as a read
        return False


def _on_cpu(x: Any) -> bool:
    try:
        return all(d.platform == "cpu" for d in x.devices())
    except Exception:  # noqa: BLE001 - unknown placement: treat as a read
        return True


def _guarded(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        loc = local
        loop = loc.loop
        if loop is None or loc.allow or not loop.checks_transfers:
            return original(self, *args, **kwargs)
        if name == "__iter__" and _iterates_on_device(self):
            # Slices on the device (k, sub = jax.random.split(k)): no read.
            return original(self, *args, **kwargs)
        if name == "__dlpack__" and not _on_cpu(self):
            return original(self, *args, **kwargs)  # device to device: no host read
        if not frames.allowed_reader(frames.caller_frame(1)) and not (
            name in ("__repr__", "__str__") and not self.is_fully_addressable
        ):  # jax prints an array spanning other processes without reading it
            _on_read(self, name)
        loc.allow += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            loc.allow -= 1

    guarded.__name__ = getattr(original, "__name__", name)
    guarded.__qualname__ = getattr(original, "__qualname__", name)
    guarded.__doc__ = getattr(original, "__doc__", None)
    return guarded


def _must_refuse_buffer(x: Any) -> bool:
    """For the buffer hooks: refuse the export (numpy then calls __array__)?

    In raise mode the refusal makes numpy fall back to the guarded
    ``__array__``, which raises the contract error; in record mode the read is
    recorded here and the export goes on.
    """
    loop = local.loop
    if loop is None or local.allow or not loop.checks_transfers:
        return False
    if frames.allowed_reader(frames.caller_frame(1)):
        return False
    if loop.on_violation == "raise":
        return True
    _on_read(x, "buffer", frames.caller_frame(1))
    return False


_pending = threading.local()  # 3.11: the error of a refused buffer export


def _buffer_refused(x: Any) -> None:
    # Python >= 3.12: memoryview() sees this error; numpy falls back to the
    # guarded __array__, which raises the same. On 3.11 the slot cannot raise
    # it: it is kept here and replaces the consumer's SystemError ("returned
    # NULL without setting an exception") when that leaves the loop.
    __tracebackhide__ = True
    try:
        _on_read(x, "buffer")
    except Exception as e:
        _pending.error = e
        raise


def _value_without_pin(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``_value`` for a jaxlib that pins a CPU buffer after a host read.

    Reads a hot loop lets through (record mode, host callbacks, jc.fetch's
    own) then copy instead of leaving a cached view that would make the next
    donated call copy the whole buffer.
    """

    def _value(self: Any) -> Any:
        if self.is_deleted() or jax.dtypes.issubdtype(self.dtype, jax.dtypes.extended):
            return original(self)
        out = hostcopy.host_copy(self)
        out.flags.writeable = False  # as JAX's own _value
        return out

    return _value


class _Patches:
    """Install and remove the class-level interceptors (reference counted)."""

    def __init__(self) -> None:
        self.originals = arrays.read_methods()
        self.guarded: dict[str, Any] = {}
        for name, original in self.originals.items():
            if isinstance(original, property):
                assert original.fget is not None
                fget = original.fget
                if name == "_value" and hostcopy.pins_host_views():
                    fget = _value_without_pin(fget)
                self.guarded[name] = property(_guarded(name, fget))
            else:
                self.guarded[name] = _guarded(name, original)
        self.depth = 0
        self._buffer_on, self._buffer_off = arrays.buffer_hooks(_must_refuse_buffer, _buffer_refused)
        self.listening = False

    def install(self) -> None:
        for name, fn in self.guarded.items():
            arrays.set_class_attr(name, fn)
        self._buffer_on()
        from ._compat import capability

        if capability("compile-events").available:
            events.listen(_on_monitoring_event)
            self.listening = True

    def uninstall(self) -> None:
        for name, fn in self.originals.items():
            arrays.set_class_attr(name, fn)
        self._buffer_off()
        if self.listening:
            events.unlisten(_on_monitoring_event)
            self.listening = False
        clear_calls()


def _on_monitoring_event(event: str, value: float, **kwargs: Any) -> None:
    __tracebackhide__ = True
    if event not in events.COMPILE_EVENTS:
        return
    loop = local.loop
    if loop is None or local.allow or not loop.checks_compiles:
        return
    # Raise at the first phase; record each compile once (every compile lowers
    # to MLIR, while a cold eager op may skip the trace event).
    if loop.on_violation != "raise" and event != events.LOWERING_EVENT:
        return
    name = str(kwargs.get("fun_name") or "a function")
    if name.startswith("jit(") and name.endswith(")"):
        name = name[4:-1]
    # The compile is often a symptom: say the cause when the stack shows it.
    user = _user_frame(frames.caller_frame(1))
    stale = _deleted_in_stack(user)
    if stale is not None:
        by = consumed_by(stale, user)
        _violation(
            "donation",
            f"`{name}` on an array that was donated"
            + (f" to {by}" if by else " (deleted)")
            + f": {fmt_aval(stale.shape, stale.dtype)} (jax would compile it, then "
            "fail on the deleted buffer)",
            "use the state the step returned (s = step(s)); to compare with the "
            "old value, keep a copy before the call (old = jnp.copy(s.w)) or "
            "compute the difference inside the step.",
            DonationError,
            user,
        )
        return
    read = _host_read_on_line(user)
    if read is not None:
        _violation(
            "transfer",
            f"device-to-host read: {read} reads the result of an eager `{name}` "
            "on the host (the op compiles here, then its result is copied to "
            "the host)",
            "decide on the device (jnp.where / lax.cond in the step, returning a "
            "flag), or read deliberately and rarely: `if jc.fetch(x) < 1e-3:` "
            "every N steps.",
            TransferError,
            user,
        )
        return
    _violation(
        "compile",
        f"jax compiles `{name}` (a fresh jax.jit, a new input signature, or a "
        "cold eager op)",
        "run it once before the loop so it is compiled and cached, or move the "
        "eager op into a hot_step. Warm it on what the loop will pass: a jax.jit "
        "warmed on arrays made outside any step (jnp.zeros, jax.random.key: "
        "uncommitted) compiles again for a hot step's outputs, which are committed "
        "to their device; warm it on a step's outputs, or on jc.device_tree(x) "
        "(committed).",
        RecompileError,
    )


def _deleted_in_stack(user: FrameType | None, limit: int = 80) -> Any | None:
    """A deleted array among the arguments of the JAX calls below ``user``.

    The frames between the compile event and the user's line are JAX's own
    dispatch of the op; a deleted (donated) array among their locals is the
    op's argument, and the real error.
    """
    frame = frames.caller_frame(2)
    while frame is not None and frame is not user and limit:
        for value in list(frame.f_locals.values()):
            for x in value if isinstance(value, (tuple, list)) else (value,):
                if is_deleted_array(x):
                    return x
        frame, limit = frame.f_back, limit - 1
    return None


def _held_outputs(frame: FrameType | None) -> list[Any]:
    """The leaves of the live states hot steps returned that ``frame`` holds
    (for the loop clock: are they still being computed at exit?)."""
    if frame is None:
        return []
    held: list[Any] = []
    live = 0
    for state in states_in(frame):
        if PRODUCED_BY in state.__dict__ and consumer_of(state) is None:
            try:
                held.extend(jax.tree_util.tree_leaves(state))
            except Exception:  # noqa: BLE001 - not flattenable: not looked at
                continue
            live += 1
            if live == 64:  # a long history of live states: enough to tell
                break
    return held


def _strip_comment(line: str) -> str:
    """``line`` without its trailing ``# comment`` (strings are respected)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return line[: tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return line.rstrip()


_READ_CALLS = {"bool", "float", "int", "complex", "item", "tolist", "asarray", "array"}


def _host_read_on_line(user: FrameType | None) -> str | None:
    """How the user's line reads an eager result on the host, if it visibly does.

    ``if``/``while``/``assert``/a ternary test a value on the host (``bool()``),
    and ``float()``, ``int()``, ``.item()``, ``.tolist()``, ``np.asarray`` copy
    it; the compile the guard saw is that expression's eager op.
    """
    text = _where(user)[1]
    if not text:
        return None
    source = _strip_comment("if" + text[4:] if text.startswith("elif ") else text)
    try:
        tree = ast.parse(source + " pass" if source.endswith(":") else source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            return f"the `{'while' if isinstance(node, ast.While) else 'if'}` on this line"
        if isinstance(node, ast.Assert):
            return "the `assert` on this line"
        if isinstance(node, ast.Call):
            f = node.func
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if called in _READ_CALLS:
                return f"{called}() on this line"
    return None


_patches: _Patches | None = None


def _acquire() -> None:
    global _patches
    with _lock:
        if _patches is None:
            _patches = _Patches()
        if _patches.depth == 0:
            _patches.install()
        _patches.depth += 1
        tracking.count += 1


def _release() -> None:
    with _lock:
        assert _patches is not None
        _patches.depth -= 1
        tracking.count -= 1
        if _patches.depth == 0:
            _patches.uninstall()


# --------------------------------------------------------------------------
# Entries: what one entry into a loop changed, undone by its own exit


_NATIVE_GUARDS = {
    "host_to_device": jax.transfer_guard_host_to_device,
    "device_to_host": jax.transfer_guard_device_to_host,
}
_stacks_lock = threading.Lock()


class _Entry:
    """One entry into a loop, on the thread (``stack``) that entered it."""

    __slots__ = ("capture_tid", "checked", "ended", "loop", "modes", "native", "stack", "timing")

    def __init__(self, loop: HotLoop, stack: LoopStack, modes: dict[str, str], checked: bool) -> None:
        self.loop = loop
        self.stack = stack
        self.modes = modes  # JAX's native guards: field -> level
        self.checked = checked  # holds the class patches and the compile listener
        self.timing: Any = None  # the loop clock's token, while timing
        self.native: contextlib.ExitStack | None = None
        self.ended = False
        # Record mode: the native thread id whose guard log lines this entry takes.
        self.capture_tid: int | None = None


def _enter_native(modes: dict[str, str]) -> contextlib.ExitStack | None:
    if not modes:
        return None
    native = contextlib.ExitStack()
    try:
        for field, mode in modes.items():
            native.enter_context(_NATIVE_GUARDS[field](mode))
    except BaseException:
        native.close()
        raise
    return native


def _relink(stack: LoopStack) -> None:
    """Point the thread at its innermost live, checking loop."""
    for entry in reversed(stack.entries):
        if not entry.ended and entry.checked:
            stack.loop = entry.loop
            return
    stack.loop = None


def _repair(stack: LoopStack) -> None:
    """On the stack's own thread: drop ended entries and unwind their native guards.

    JAX's guard contexts restore what they saw at entry, so they must exit in
    reverse order of entry: every context above the first ended entry exits,
    then the live ones among them enter again, in order. An in-order exit
    (the innermost loop) exits its own contexts only.
    """
    first = next((i for i, e in enumerate(stack.entries) if e.ended), None)
    if first is None:
        return
    above = stack.entries[first:]
    errors: list[BaseException] = []
    for entry in reversed(above):
        if entry.native is not None:
            try:
                entry.native.close()
            except BaseException as e:  # noqa: BLE001 - finish unwinding, then raise
                errors.append(e)
            entry.native = None
    live = [e for e in above if not e.ended]
    del stack.entries[first:]
    for entry in live:
        stack.entries.append(entry)
        entry.native = _enter_native(entry.modes)
    if errors:
        raise errors[0]


def _restore_elsewhere(stack: LoopStack) -> None:
    """A loop of another thread ended here: give that thread its guard levels.

    Its JAX config contexts can only exit on that thread; they do at its next
    loop entry or exit (``_repair``). Until then the levels JAX's transfers
    read are set directly.
    """
    if stack.saved is None or not stack.thread.is_alive():
        return
    state, saved = stack.saved
    live = [e for e in stack.entries if not e.ended]
    threadguard.set_levels(state, saved, live[-1].modes if live else None)


# --------------------------------------------------------------------------
# Public API


@overload
def fetch(tree: jax.Array) -> npt.NDArray[Any]: ...
@overload
def fetch(tree: T) -> T: ...
def fetch(tree: Any) -> Any:
    """Copy a pytree of device arrays to the host, deliberately.

    The one way to read device values inside a :func:`hot_loop`; it works the
    same outside one.

    Args:
        tree: any pytree of ``jax.Array`` s (a ``jc.state`` instance included).

    Returns:
        The same tree with numpy arrays as leaves. They are copies: on CPU a
        plain ``np.asarray(x)`` shares the device buffer, and a live view of a
        donated buffer makes XLA copy instead of donating at the next step.
        A typed PRNG key (``jax.random.key``) comes back as its key data, a
        numpy ``uint32`` array of shape ``key.shape + (2,)`` for the default
        threefry implementation (what ``jax.random.key_data`` holds):
        a typed key always lives on a device, and ``jax.device_get(key)``
        itself puts the data back on the device (a host-to-device transfer a
        hot loop refuses). ``jax.random.wrap_key_data(data)`` makes it a key
        again.

    Raises:
        DonationError: a leaf was donated to (consumed by) a hot step.

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> with jc.hot_loop():
        ...     jc.fetch({"t": jnp.float32(2)})
        {'t': array(2., dtype=float32)}
    """
    __tracebackhide__ = True
    observers.fetches += 1  # counted by contract snapshots
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    for n, x in enumerate(leaves):
        if (
            isinstance(x, jax.Array)
            and not x.is_fully_addressable
            and not x.is_fully_replicated
        ):
            raise TransferError(
                f"jc.fetch(): a {fmt_aval(x.shape, x.dtype)} leaf spans devices of "
                "other processes, so this process cannot read all of it.",
                fix="fetch a replicated value (reduce it in the step), this process's "
                "shards (jc.fetch([s.data for s in x.addressable_shards])), or gather "
                "it with jax.experimental.multihost_utils.process_allgather.",
            )
        if isinstance(x, jax.Array) and x.is_deleted():
            by = consumed_by(x) or consumer_of(tree)
            path = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(tree)[0][n][0])
            raise DonationError(
                f"jc.fetch(): {path + ': ' if path else ''}{fmt_aval(x.shape, x.dtype)} was donated to "
                f"{by or 'a step'} and no longer exists.",
                fix="fetch from the state the step returned (s = step(s); jc.fetch(s.t)).",
                contract="no-donated-use",
            )
    local.allow += 1
    t0 = time.perf_counter()
    try:
        copies = [
            hostcopy.host_copy(jax.random.key_data(x) if is_key(x.dtype) else x)
            if isinstance(x, jax.Array)
            else (np.array(x, copy=True) if isinstance(x, np.ndarray) else x)
            for x in leaves
        ]
    finally:
        local.allow -= 1
        _timing.blocked("jc.fetch", time.perf_counter() - t0)
    return jax.tree_util.tree_unflatten(treedef, copies)


_OPTIONS = {
    "transfers": ("disallow", "allow_host_to_device", "allow"),
    "compiles": ("disallow", "allow"),
    "on_violation": ("raise", "record"),
}


class HotLoop:
    """A critical section: see :func:`hot_loop`.

    Attributes:
        violations: in record mode, every violation seen (one per kind and
            source line, with a count).
        timing: a :class:`jc.LoopTiming`: steps per second, host time per
            step call, time blocked on the device, and whether the loop is
            dispatch-bound or device-bound (see :meth:`report`).
    """

    def __init__(
        self,
        *,
        transfers: str = "disallow",
        compiles: str = "disallow",
        on_violation: str = "raise",
    ) -> None:
        for option, value in (
            ("transfers", transfers),
            ("compiles", compiles),
            ("on_violation", on_violation),
        ):
            if value not in _OPTIONS[option]:
                raise DefinitionError(
                    f"jc.hot_loop({option}={value!r}): valid values are "
                    + ", ".join(repr(v) for v in _OPTIONS[option])
                    + "."
                )
        self._options = {"transfers": transfers, "compiles": compiles, "on_violation": on_violation}
        self.on_violation = on_violation
        # Device-to-host reads are refused unless every transfer is allowed;
        # implicit host-to-device copies only with transfers="disallow".
        self.checks_transfers = transfers != "allow"
        self.checks_host_to_device = transfers == "disallow"
        self.checks_compiles = compiles == "disallow"
        self._violations: dict[tuple[str, str, str], Violation] = {}
        self._entries: list[_Entry] = []  # active entries (re-entrant, any thread)
        self._clock = _timing.LoopClock()

    @property
    def violations(self) -> list[Violation]:
        return list(self._violations.values())

    def violation(
        self, kind: str, what: str, fix: str, error: type[Exception], frame: Any = None
    ) -> None:
        """Raise (or, in record mode, record) one violation at the user's line."""
        __tracebackhide__ = True
        where, text = _where(_user_frame(frame))
        message = f"{_TITLES[kind]}: {what}\n  at {where}" + (f":  {text}" if text else "")
        if self.on_violation == "raise":
            if issubclass(error, TransferError | RecompileError | DonationError):
                raise error(message, fix=fix, contract=_CONTRACT_OF[kind])
            raise error(f"{message}\nFix: {fix}")
        self._record(kind, what, where, f"{message}\nFix: {fix}", text, fix)

    def _record(
        self, kind: str, what: str, where: str, message: str, source: str = "", fix: str = ""
    ) -> None:
        key = (kind, where, what)
        if kind == "donation" and key not in self._violations and any(
            k[0] == "donation" and k[1] == where for k in self._violations
        ):
            return  # the same stale value's use at this line, already recorded
        found = self._violations.get(key)
        if found is None:
            self._violations[key] = Violation(kind, what, where, 1, message, source, fix)  # type: ignore[arg-type]
        else:
            found.count += 1

    @property
    def timing(self) -> LoopTiming:
        """Where the loop's time went so far: see :meth:`report`."""
        return self._clock.timing()

    def _record_logged(self, logged: list[guardlog.GuardEvent], unparsed: int) -> None:
        """Record the transfers JAX's guard logged on this entry's thread."""
        where = "(jaxlib's log)"
        for event in logged:
            what = f"implicit {event.direction} transfer of {_logged_aval(event.aval)}"
            self._record(
                "transfer",
                what,
                where,
                f"{_TITLES['transfer']}: {what}\n  at {where}: JAX logs it from C++, "
                "with no Python line\nFix: " + _LOGGED_FIX,
                "",
                _LOGGED_FIX,
            )
        if unparsed:
            what = (
                f"{unparsed} transfer-guard log line(s) from jaxlib that this version "
                "of jaxcontracts cannot read (left on stderr)"
            )
            self._record("transfer", what, where, f"{_TITLES['transfer']}: {what}", "", _LOGGED_FIX)

    def report(self) -> Report:
        """A :class:`jc.Report` of the violations and of where the time went.

        ``str()`` of it is text; in a notebook it renders as HTML. Besides the
        contracts, it has a timing section (``report.timing``, a
        :class:`jc.LoopTiming`) that says whether the loop is dispatch-bound
        or device-bound, with the figures.

        How the timing is measured
        --------------------------
        At checks level ``fast`` or ``full`` (not ``off``), while any loop is
        active, every ``jc.hot_step`` call goes through a thin wrapper that
        counts it and, for a step's first 64 calls inside loops and then one
        call in 64, reads ``time.perf_counter()`` before the call and after
        it returns; the difference is the call's *host time*: argument
        checks, XLA's dispatch of the executable, the after-call
        bookkeeping. A step's host time is its first 64 calls as timed plus
        its other calls at the mean of the sampled ones; where sampling
        noise makes the steps' sum exceed the wall time less the blocked
        time, they are scaled down to fit. The counters belong to the step
        and the loop takes their difference between entry and exit, so
        calls of the same step on another thread meanwhile are counted too. Time *blocked on the
        device* is the time the loop's own thread spent inside ``jc.fetch``
        (the copy waits for the value to be computed) and inside
        ``jax.block_until_ready`` / ``x.block_until_ready()``. The loop's *wall time* runs from its entry
        to its exit (summed over entries). At exit the loop asks, without
        waiting, whether the step outputs it can see are ready
        (``is_ready()``): the states hot steps returned that the exiting
        frame's local variables hold (directly, or in a list, tuple or dict),
        and the recorded last output of each step that takes or returns more
        than the one state; work still queued means the host ran ahead.

        The verdict: **device-bound** when the host was blocked for at least
        25% of the wall time or work was still queued at exit (the device is
        the bottleneck: make the step cheaper; fusing steps does not help);
        **dispatch-bound** when it was blocked under 5% and everything was
        done at exit (the device finished each step before the host sent the
        next: fuse steps into one hot_step, or run iterations with
        ``lax.scan``/``lax.fori_loop`` inside one call); **mixed** between.
        The rest of the wall time is the caller's own Python between calls.

        What it cannot see: the device's own busy time (there is no device
        clock here: "blocked" is host-side waiting, and a loop that never
        waits and exits with work queued tells only that the device lagged);
        a wait that happens inside dispatch itself when XLA's queue is full,
        or a computation the CPU backend runs on the calling thread (both
        show up as host time per call); freeing the previous state's
        buffers after ``s = step(s)`` (it happens after the call returns, in
        "other host time"); waits on other threads; reads through
        ``jax.device_get`` or a ``block_until_ready`` imported by name before
        the loop (``from jax import block_until_ready``); outputs the exiting
        frame does not hold (queued work behind them is missed); time before
        the first and after the last entry. The cost is a counter test per
        step call and two clock reads per timed call, inside the loop's 5%
        budget; at
        checks level ``off`` nothing is timed and the section is empty.
        """
        report = loop_report(self.violations, self.on_violation)
        report.timing = self._clock.timing()
        return report

    def __enter__(self) -> HotLoop:
        modes: dict[str, str] = {}
        if self.checks_transfers:
            if self.checks_host_to_device:
                modes["host_to_device"] = "disallow" if self.on_violation == "raise" else "log"
            else:  # allow_host_to_device: even inside an outer loop that refuses them
                modes["host_to_device"] = "allow"
            if jax.default_backend() != "cpu":
                modes["device_to_host"] = "disallow" if self.on_violation == "raise" else "allow"
        stack = local.stack
        # At checks level off only JAX's native guards: no class patches, no
        # compile listener, no active loop for the call path to report to.
        checked = get_checks() != "off"
        entry = _Entry(self, stack, modes, checked=checked)
        if checked:
            _acquire()
        try:
            with _stacks_lock:
                _repair(stack)
                if not stack.entries and modes:
                    state = threadguard.current()
                    stack.saved = None if state is None else (state, threadguard.levels(state))
                entry.native = _enter_native(modes)
                if checked and modes.get("host_to_device") == "log" and guardlog.start():
                    entry.capture_tid = threading.get_native_id()
                stack.entries.append(entry)
                _relink(stack)
                self._entries.append(entry)
            if checked:
                entry.timing = _timing.enter(self._clock)
        except BaseException:
            if checked:
                _release()
            raise
        if observers.recorders:
            observers.loop(self, True)
        return self

    def _take_entry(self) -> _Entry:
        """This exit's entry: the latest one made on this thread, else the latest."""
        mine = local.stack
        for i in range(len(self._entries) - 1, -1, -1):
            if self._entries[i].stack is mine:
                return self._entries.pop(i)
        if not self._entries:
            raise RuntimeError("jc.hot_loop: __exit__ without a matching __enter__")
        return self._entries.pop()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        """End this entry, whatever the order: out-of-order exits (generators,
        asyncio tasks) and exits on another thread restore what it changed."""
        __tracebackhide__ = True
        # Translated before the last loop's exit forgets the steps' last calls
        # (they name the step that consumed a donated array).
        translated = _translate(exc, tb) if isinstance(exc, Exception) else None
        with _stacks_lock:
            entry = self._take_entry()
            stack = entry.stack
            entry.ended = True
            if entry.timing is not None:
                user = _user_frame(frames.caller_frame(1))
                _timing.leave(entry.timing, lambda: _held_outputs(user))
            _relink(stack)
            try:
                if stack is local.stack:
                    _repair(stack)
                else:
                    _restore_elsewhere(stack)
            finally:
                if entry.checked:
                    _release()
        if entry.capture_tid is not None:
            self._record_logged(*guardlog.stop(entry.capture_tid))
        if observers.recorders:
            observers.loop(self, False)
        pending, _pending.error = getattr(_pending, "error", None), None
        if exc is not None and not isinstance(exc, Exception):
            return False
        if pending is not None and exc is not None and arrays.is_unset_error(exc):
            raise pending.with_traceback(None) from None  # a refused buffer export (3.11)
        if pending is not None and exc is None and sys.version_info < (3, 12):
            # 3.11: the refusal reached the code as a SystemError it caught:
            # the read was still refused, so the loop says so as it ends.
            pending.add_note(
                "Raised as the loop ended: on Python 3.11 this refusal reached your "
                "code as `SystemError: ... returned NULL without setting an "
                "exception`, which was caught inside the loop."
            )
            raise pending.with_traceback(None) from None
        if translated is not None:
            raise translated from None
        return False

    def __call__(self, fn: F) -> F:
        """Use as a decorator: every call of ``fn`` runs in a fresh loop.

        On a generator function or an ``async def`` the call returns a
        generator or coroutine whose every resumption (each ``next``/``send``
        and each step between two ``await`` s) runs inside that call's loop;
        the caller's code between resumptions and the event loop are not
        guarded. An async generator function is refused.
        """
        options = dict(self._options)
        if inspect.isasyncgenfunction(fn):
            name = getattr(fn, "__qualname__", repr(fn))
            raise DefinitionError(
                f"@jc.hot_loop() on the async generator function {name}: its body "
                "runs in pieces between the caller's awaits, which the decorator "
                "cannot guard.",
                fix="decorate the `async def` that consumes it (`async for ...` "
                "inside), or put `with jc.hot_loop():` around the code between two "
                "awaits in its body.",
            )
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator(*args: Any, **kwargs: Any) -> Any:
                return (yield from _resumed_inside(fn(*args, **kwargs), HotLoop(**options)))

            return generator  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def coroutine(*args: Any, **kwargs: Any) -> Any:
                return await _coroutine_resumed_inside(fn(*args, **kwargs), HotLoop(**options))

            return coroutine  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with HotLoop(**options):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _resumed_inside(inner: Any, loop: HotLoop) -> Any:
    """Drive a generator or coroutine, each resumption inside ``loop``."""
    __tracebackhide__ = True
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        with loop:
            try:
                out = inner.send(sent) if thrown is None else inner.throw(thrown)
            except StopIteration as stop:
                return stop.value
            finally:
                sent, thrown = None, None
        try:
            sent = yield out
        except GeneratorExit:
            with loop:
                inner.close()
            raise
        except BaseException as e:  # noqa: BLE001 - passed on into the body
            thrown = e


@types.coroutine
def _coroutine_resumed_inside(inner: Any, loop: HotLoop) -> Any:
    return (yield from _resumed_inside(inner, loop))


# JAX runtime errors that leave a loop, and what they mean there.
_RUNTIME_ERRORS: dict[str, tuple[type[Exception], str, str, str]] = {
    "host-to-device": (
        TransferError,
        "no-transfer",
        "implicit transfer inside jc.hot_loop: host-to-device",
        "put host data on the device once, before the loop (x = "
        "jax.device_put(x)); a Python scalar in an eager op (x * 2 outside a "
        "step) is a transfer too: do the op inside a hot_step, or make the "
        "scalar a device array before the loop.",
    ),
    "device-to-host": (
        TransferError,
        "no-transfer",
        "implicit transfer inside jc.hot_loop: device-to-host (seen by JAX's own guard)",
        "read it deliberately and rarely with jc.fetch(x), or move the read after the loop.",
    ),
    "deleted": (
        DonationError,
        "no-donated-use",
        "use of a donated array inside jc.hot_loop: an array that a hot_step "
        "consumed was used again",
        "use the state the step returned (s = step(s)).",
    ),
}


# A weakly typed scalar crossing to the device is a Python constant in an
# eager op: `flag & 1`, `loss * 0.5`, or one JAX makes itself (`x[idx]`
# normalises negative indices with Python ints).
_CONSTANT_TITLE = (
    "implicit transfer inside jc.hot_loop: host-to-device, a Python constant "
    "in an eager op"
)
_CONSTANT_FIX = (
    "each eager op with a Python number copies it to the device on every call. "
    "Do the op inside the hot_step (return what you need), or in a jax.jit "
    "helper warmed before the loop (constants are compiled in); or make the "
    "constant a device array once, before the loop (one = jnp.int32(1); flag & one). "
    "If these small copies are acceptable here: "
    'jc.hot_loop(transfers="allow_host_to_device") (device-to-host reads stay refused).'
)


def _in_device_get(tb: Any) -> bool:
    """Whether the traceback passes through jax.device_get (a key rebuilt on the device)."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in ("device_get", "_device_get") and _is_library(code.co_filename, False):
            return True
        tb = tb.tb_next
    return False


def _donated_names(tb: Any) -> str:
    """Which local arrays of the user's failing frame were donated, and to what.

    JAX refuses a deleted buffer in C++ and names only an argument number;
    the user's frame still holds the array. Reads no device memory.
    """
    frame = None
    while tb is not None:
        if not _is_library(tb.tb_frame.f_code.co_filename):
            frame = tb.tb_frame
        tb = tb.tb_next
    if frame is None:
        return ""
    named = []
    code = frame.f_code
    scope = {**frame.f_globals, **frame.f_locals}
    names = dict.fromkeys((*code.co_varnames, *code.co_freevars, *code.co_cellvars, *code.co_names))
    for name in list(names)[:200]:  # the names this code refers to
        value = scope.get(name)
        if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
            try:
                deleted = value.is_deleted()
            except Exception:  # noqa: BLE001
                continue
            if deleted:
                by = consumed_by(value, frame)
                named.append(
                    f"`{name}` ({fmt_aval(value.shape, value.dtype)}) was donated"
                    + (f" to {by}" if by else "")
                )
    return "; ".join(named)


def _translate(exc: BaseException, tb: Any) -> Exception | None:
    """A JAX runtime error leaving the loop, as the contract error it is."""
    found = runtime_errors.classify(exc)
    if found is None:
        return None
    kind, detail = found
    error, contract, title, fix = _RUNTIME_ERRORS[kind]
    if kind == "host-to-device" and "weak_type=True" in detail:
        title, fix = _CONSTANT_TITLE, _CONSTANT_FIX
    elif kind == "host-to-device" and _in_device_get(tb):
        title = "implicit transfer inside jc.hot_loop: jax.device_get of a typed PRNG key"
        fix = (
            "jax.device_get rebuilds a typed key on the device (a host-to-device "
            "copy of its data); read it with jc.fetch(key), which returns the key "
            "data (jax.random.wrap_key_data(data) makes it a key again)."
        )
    where, source = _traceback_where(tb)
    if kind == "deleted":
        named = _donated_names(tb)
        if named:
            title = f"use of a donated array inside jc.hot_loop: {named}"
    return error(
        f"{title}{f' ({detail})' if detail else ''}\n  at {where}" + (f":  {source}" if source else ""),
        fix=fix,
        contract=contract,
    )


def _traceback_where(tb: Any) -> tuple[str, str]:
    """``file:line`` of the innermost user frame of a traceback."""
    found: dict[bool, tuple[Any, int]] = {}
    while tb is not None:
        for installed in (True, False):
            if not _is_library(tb.tb_frame.f_code.co_filename, installed):
                found[installed] = (tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    best = found.get(True) or found.get(False)
    return _where(*best) if best else ("<unknown>", "")


def hot_loop(
    *,
    transfers: Literal["disallow", "allow_host_to_device", "allow"] = "disallow",
    compiles: Literal["disallow", "allow"] = "disallow",
    on_violation: Literal["raise", "record"] = "raise",
) -> HotLoop:
    """A critical section where transfers and compiles are contract violations.

    On the thread that enters it, for its duration, on every backend (CPU
    included): an implicit device-to-host read of a ``jax.Array`` raises
    :class:`TransferError`; an implicit host-to-device transfer raises
    :class:`TransferError`; any trace or compile raises
    :class:`RecompileError`; reading an array a hot step consumed raises
    :class:`DonationError`. ``jc.fetch``, ``jax.device_get`` and
    ``jax.device_put`` stay allowed. Other threads are unaffected; nesting
    works; each exit restores what its own entry changed, so loops may end
    in any order (generators, asyncio tasks) and on another thread (a
    generator closed there): once every loop has ended nothing is guarded.

    Args:
        transfers: ``"disallow"`` (default): every implicit transfer is a
            violation. ``"allow_host_to_device"``: implicit host-to-device
            copies are let through (JAX's own guard set to ``"allow"`` for
            the loop), device-to-host reads are still refused. That is for
            host glue with Python constants in eager ops (``flag & 1``,
            ``loss * 0.5``, ``x[idx]``, whose index normalisation makes
            constants): each such op then copies a few bytes to the device
            per call, which is cheap, but JAX's guard has no size threshold,
            so a large numpy array sent to an eager op or a plain
            ``jax.jit`` is let through too, silently. Hot steps still refuse
            host arguments themselves (a ``TransferError`` at the call),
            loop or not. Prefer doing the glue inside a step or a
            ``jax.jit`` helper (constants are compiled in) and keep
            ``"disallow"``. ``"allow"``: no transfer checks.
        compiles: ``"disallow"`` (default) or ``"allow"``.
        on_violation: ``"raise"`` (default), or ``"record"`` to collect the
            violations in ``loop.violations`` / ``loop.report()`` instead.
            In record mode implicit host-to-device transfers in eager ops are
            left to JAX's guard in ``"log"`` mode (JAX offers no hook to
            record them and go on), and a read of a donated array is
            recorded but still fails, since its buffer is gone (a
            ``DonationError`` when it leaves the loop).

    At checks level ``off`` (``jc.set_checks("off")``,
    ``JAXCONTRACTS_CHECKS=off``) a loop engages only JAX's native transfer
    guards (host-to-device on every backend, device-to-host off CPU): no
    interception of reads or compiles, so annotated loops cost nothing. The
    level is read when the loop is entered.

    Returns:
        A context manager, also usable as a decorator.

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> x = jnp.arange(3.0)
        >>> with jc.hot_loop(on_violation="record") as loop:
        ...     _ = float(x[0])
        >>> [v.kind for v in loop.violations]
        ['transfer']
    """
    return HotLoop(transfers=transfers, compiles=compiles, on_violation=on_violation)
