"""The concrete array class and the hooks that intercept reads of it.

``ArrayImpl`` is a C++ heap type whose read methods are Python functions;
assigning a class attribute updates the C slots, so replacing them covers
every existing array. On one CPU device numpy reads an array through the C
buffer protocol instead: ``__buffer__`` (>= 3.12) or, on 3.11, the type's
``bf_getbuffer`` slot through ctypes.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax

from .blocking import ArrayImpl, wrap_function, wrap_method
from .registry import capability, define

__all__ = [
    "UNRAISING_CODES",
    "NON_METHOD_READS",
    "OPTIONAL_READ_METHODS",
    "READS",
    "READ_METHODS",
    "is_unset_error",
    "ArrayImpl",
    "KeyArray",
    "buffer_hooks",
    "hook_deleted_reads",
    "read_methods",
    "set_class_attr",
]


def _key_array_class() -> type | None:
    # The class of typed PRNG key arrays (jax.random.key): jax._src.prng up
    # to jax 0.10, jax._src.random.prng since.
    import importlib

    for module in ("jax._src.random.prng", "jax._src.prng"):
        try:
            cls = getattr(importlib.import_module(module), "PRNGKeyArray", None)
        except ImportError:
            continue
        if isinstance(cls, type):
            return cls
    return None


KeyArray = _key_array_class()


@define(
    "key-array-class",
    "jax's PRNGKeyArray class (jax._src.random.prng / jax._src.prng)",
    "the per-call fast path for typed PRNG key leaves (without it they take the slow path, "
    "still checked)",
)
def _probe_key_array() -> str | None:
    return None if KeyArray is not None else "PRNGKeyArray moved"

#: Every read a hot loop intercepts, and how its messages word it: the read
#: methods of ``ArrayImpl``, its ``_value`` property, and the buffer protocol.
READS: dict[str, str] = {
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
    "__dlpack__": "a DLPack export of a CPU array (np.from_dlpack)",
    "copy_to_host_async": ".copy_to_host_async() (a copy to the host, started now)",
    "_value": "reading its value",
    "buffer": "the buffer protocol (np.asarray, memoryview, np.frombuffer, hashlib)",
}
#: Entries of READS that are not methods: a property and the C buffer slot.
NON_METHOD_READS = ("_value", "buffer")
#: Read methods guarded where this jax has them (the probe does not require them).
OPTIONAL_READ_METHODS = ("__dlpack__", "copy_to_host_async")
#: The read methods intercepted inside a hot loop (a new one: an entry in READS).
READ_METHODS = tuple(n for n in READS if n not in NON_METHOD_READS + OPTIONAL_READ_METHODS)


@define(
    "array-read-hooks",
    "replacing jax._src.array.ArrayImpl's read methods (float, repr, __array__, _value, ...)",
    "implicit device-to-host reads inside jc.hot_loop on CPU (JAX's own guard never fires there)",
)
def _probe_reads() -> str | None:
    if ArrayImpl is None:
        return "jax._src.array.ArrayImpl is gone"
    absent = [n for n in READ_METHODS if not callable(ArrayImpl.__dict__.get(n))]
    if not isinstance(ArrayImpl.__dict__.get("_value"), property):
        absent.append("_value")
    if absent:
        return "these read methods moved: " + ", ".join(absent)
    original = ArrayImpl.__dict__["tolist"]
    try:
        ArrayImpl.tolist = original  # settable from Python?
    except TypeError as e:
        return f"its attributes are read-only ({e})"
    return None


def read_methods() -> dict[str, Any]:
    """The class's current read methods (and ``_value``) by name."""
    capability("array-read-hooks")  # warns once if any of them moved
    if ArrayImpl is None:
        return {}
    found = {
        n: ArrayImpl.__dict__[n]
        for n in READ_METHODS + OPTIONAL_READ_METHODS
        if n in ArrayImpl.__dict__
    }
    value = ArrayImpl.__dict__.get("_value")
    if isinstance(value, property):
        found["_value"] = value
    return found


def set_class_attr(name: str, value: Any) -> None:
    setattr(ArrayImpl, name, value)


@define(
    "deleted-read-hook",
    "replacing jax._src.array.ArrayImpl._check_if_deleted (the Python check every read and "
    "eager use runs) and wrapping its C++ block_until_ready and jax.block_until_ready",
    "a read of a donated array outside jc.hot_loop names its leaf and the step "
    "(else JAX's 'Array has been deleted')",
)
def _probe_deleted_reads() -> str | None:
    if ArrayImpl is None:
        return "jax._src.array.ArrayImpl is gone"
    if not callable(ArrayImpl.__dict__.get("_check_if_deleted")):
        return "ArrayImpl._check_if_deleted moved"
    return None


_deleted_hook: list[Any] = []


def hook_deleted_reads(
    explain: Callable[[Any], BaseException | None],
    explain_wait: Callable[[Any], BaseException | None],
) -> None:
    """Make ``ArrayImpl._check_if_deleted`` raise ``explain(array)`` (once), and
    a deleted array's ``block_until_ready`` error ``explain_wait(array)``'s
    (None from either: JAX's own error). JAX calls it before every Python
    read and before an op or ``jax.jit`` call takes the array."""
    if _deleted_hook or not capability("deleted-read-hook").available:
        return
    original = ArrayImpl.__dict__["_check_if_deleted"]

    def _check_if_deleted(self: Any) -> None:
        if self.is_deleted():
            __tracebackhide__ = True
            error = explain(self)
            if error is not None:
                raise error
            original(self)

    _deleted_hook.append(original)
    ArrayImpl._check_if_deleted = _check_if_deleted
    if "block_until_ready" in ArrayImpl.__dict__ and capability("block-timing").available:
        wrap_method(functools.partial(_explained_wait, explain=explain_wait))
        wrap_function(functools.partial(_explained_tree_wait, explain=explain_wait))


def _explained_wait(
    wait: Callable[[Any], Any], explain: Callable[[Any], BaseException | None]
) -> Any:
    """``block_until_ready`` (jaxlib's C++ method, which runs no Python check),
    its error for a deleted array replaced by ``explain``'s."""

    def block_until_ready(self: Any) -> Any:
        try:
            return wait(self)
        except Exception:
            if not self.is_deleted():
                raise
            __tracebackhide__ = True
            error = explain(self)
            if error is None:
                raise
            raise error from None

    block_until_ready.__doc__ = getattr(wait, "__doc__", None)
    return block_until_ready


def _explained_tree_wait(
    wait: Callable[[Any], Any], explain: Callable[[Any], BaseException | None]
) -> Any:
    """``jax.block_until_ready(tree)`` (several arrays at once in C++, without
    the method): its error replaced by ``explain``'s for a deleted leaf."""

    def block_until_ready(x: Any) -> Any:
        try:
            return wait(x)
        except RuntimeError:  # JAX's (another leaf's own block_until_ready may raise its own)
            __tracebackhide__ = True
            for leaf in jax.tree_util.tree_leaves(x):
                if isinstance(leaf, ArrayImpl) and leaf.is_deleted():
                    error = explain(leaf)
                    if error is not None:
                        raise error from None
            raise

    block_until_ready.__doc__ = getattr(wait, "__doc__", None)
    block_until_ready.__wrapped__ = wait  # type: ignore[attr-defined]
    return block_until_ready


# --------------------------------------------------------------------------
# The buffer protocol


@define(
    "buffer-hook",
    "ArrayImpl.__buffer__ (Python >= 3.12) or its tp_as_buffer->bf_getbuffer slot via "
    "ctypes (3.11)",
    "np.asarray / np.array / numpy ufuncs / memoryview reads inside jc.hot_loop on one CPU device",
)
def _probe_buffer() -> str | None:
    if ArrayImpl is None:
        return "jax._src.array.ArrayImpl is gone"
    if sys.version_info >= (3, 12):
        return None if "__buffer__" in ArrayImpl.__dict__ else "ArrayImpl has no __buffer__"
    return None if _buffer_slot() is not None else "the PyTypeObject layout is not the expected one"


def _buffer_slot() -> ctypes.c_void_p | None:
    """CPython 3.11: the ``bf_getbuffer`` slot of ArrayImpl, after sanity checks."""
    ptr = ctypes.sizeof(ctypes.c_void_p)
    base = id(ArrayImpl)
    # PyTypeObject: tp_name is field 3, tp_basicsize 4, tp_as_buffer 20.
    name_ptr = ctypes.c_void_p.from_address(base + 3 * ptr).value
    basicsize = ctypes.c_ssize_t.from_address(base + 4 * ptr).value
    procs = ctypes.c_void_p.from_address(base + 20 * ptr).value
    sane = (
        name_ptr
        and ctypes.string_at(name_ptr).decode(errors="replace").endswith("ArrayImpl")
        and basicsize == ArrayImpl.__basicsize__
        and procs
    )
    return ctypes.c_void_p.from_address(procs) if sane else None


_CALLBACK_KEEPALIVE: list[Any] = []
#: The code of the buffer export hooks, whose exceptions never reach the user:
#: 3.11's ctypes callback in the C slot (ctypes prints one and returns garbage)
#: and 3.12's ``__buffer__`` (numpy clears any error of an export and falls back
#: to ``__array__``). A signal's handler must not raise there (_loop.interrupts).
UNRAISING_CODES: set[Any] = set()


def buffer_hooks(
    refuse: Callable[[Any], bool], refused: Callable[[Any], None]
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(install, remove) for the buffer-protocol interceptor of this Python.

    ``refuse(array)``, on every export: True refuses it (numpy then falls back
    to ``__array__``). ``refused(array)`` then raises the error ``memoryview()``
    sees (>= 3.12); on 3.11 a ctypes callback cannot leave an exception set, so
    the consumer raises ``SystemError`` and the caller puts the error
    ``refused`` kept in its place (:func:`is_unset_error`).
    """
    if not capability("buffer-hook").available:
        return (lambda: None), (lambda: None)
    if sys.version_info >= (3, 12):
        original = ArrayImpl.__dict__["__buffer__"]

        def __buffer__(self: Any, flags: int) -> memoryview:
            if refuse(self):
                refused(self)
            return original(self, flags)  # type: ignore[no-any-return]

        UNRAISING_CODES.add(__buffer__.__code__)

        def on() -> None:
            ArrayImpl.__buffer__ = __buffer__

        def off() -> None:
            # Assign the original slot wrapper back; never `del` (NULL slot).
            ArrayImpl.__buffer__ = original

        return on, off

    slot = _buffer_slot()
    assert slot is not None
    original_ptr = slot.value
    signature = (ctypes.c_int, ctypes.py_object, ctypes.c_void_p, ctypes.c_int)
    call_original = ctypes.PYFUNCTYPE(*signature)(original_ptr)

    def getbuffer(obj: Any, view: int, flags: int) -> int:
        try:
            if refuse(obj):
                try:
                    refused(obj)
                except BaseException:  # noqa: BLE001 - kept by the caller, never across C
                    pass
                return -1  # numpy falls back to the guarded __array__
            return call_original(obj, view, flags)  # type: ignore[no-any-return]
        except BaseException:  # noqa: BLE001 - never let an error cross C
            return -1

    UNRAISING_CODES.add(getbuffer.__code__)
    c_getbuffer = ctypes.CFUNCTYPE(*signature)(getbuffer)
    _CALLBACK_KEEPALIVE.append(c_getbuffer)
    replacement = ctypes.cast(c_getbuffer, ctypes.c_void_p).value

    def on_slot() -> None:
        slot.value = replacement

    def off_slot() -> None:
        slot.value = original_ptr

    return on_slot, off_slot


def is_unset_error(exc: BaseException) -> bool:
    """The ``SystemError`` a consumer raises when the 3.11 slot refused an export."""
    return isinstance(exc, SystemError) and "without setting an exception" in str(exc)
