"""The interceptors a hot loop installs: array reads, the buffer protocol, compiles.

JAX's device-to-host guard never fires on CPU (a CPU array lends numpy its
buffer, no copy), so a loop intercepts the reads themselves, on every backend:

* **Read methods** (``_compat.arrays.READS``) are replaced on ``ArrayImpl``,
  a mutable heap type (the C slots follow, so existing arrays are covered),
  while any loop is active: nothing costs anything outside a loop.
  Iterating a single-device or fully replicated array slices it on the
  device and is let through; a sharded one reads ``_value``, caught there.
* **The buffer protocol** (``np.asarray`` on one CPU device): a refused
  export makes numpy fall back to the guarded ``__array__``, which names the
  array; on 3.11 the slot cannot raise through C, so the consumer sees a
  ``SystemError`` that the kept refusal (``pending``) replaces as it leaves
  the loop.
* **Compiles**: ``jax.monitoring`` reports each trace, lowering and backend
  compile on the calling thread; the listener names the true cause when the
  stack shows it (a donated array, a host read on the user's line).

:func:`acquire` and :func:`release` install and remove them, reference
counted across every loop of every thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from time import perf_counter
from types import FrameType
from typing import Any

import jax
import numpy as np

from .._compat import arrays, blocking, callbacks, capability, events, frames, hostcopy
from .._compat.tracing import trace_state_clean
from .._contracts.donation import donation_fix
from .._contracts.transfers import HOST_FIXES, debug_reads_fix
from .._dtypes import is_key
from .._errors import ContractError
from .._format import fmt_aval
from .._hazards import is_deleted_array
from .._report.timing import in_use
from .._runtime import arrays_named, donated, local, produced_by, take_recompile, tracking
from .._steps import clear_last_outputs, consumed_by
from .._tracebacks import trim
from .._userline import host_read_on_line, user_frame
from . import rng as _rng

__all__ = ["acquire", "pending", "plain_trace", "release"]

_lock = threading.Lock()
_TRACE_EVENT = events.COMPILE_EVENTS[0]


def _violation(kind: str, what: str, fix: str, frame: Any = None) -> None:
    __tracebackhide__ = True
    loop = local.loop
    if loop is not None:
        loop.violation(kind, what, fix, frame)


def _describe(x: Any) -> str:
    try:
        text = fmt_aval(x.shape, x.dtype, x.aval.weak_type)
    except Exception:  # noqa: BLE001
        return type(x).__name__
    key = _key_owner()
    if key is not None:  # the key data of a typed key being printed or converted
        text = f"a typed PRNG key {fmt_aval(key.shape, key.dtype)} (its key data, {text})"
        x = key
    produced = produced_by(x)
    return f"{text} ({produced})" if produced else text


def _key_owner() -> Any:
    """The typed PRNG key whose method (``repr``, ``print``) is reading its key
    data, from the library frames below the user's line."""
    if arrays.KeyArray is None:
        return None
    frame = frames.caller_frame(2)
    user = user_frame(frame)
    for _ in range(20):
        if frame is None or frame is user:
            return None
        owner = frames.library_locals(frame).get("self")
        if isinstance(owner, arrays.KeyArray):
            return owner
        frame = frame.f_back
    return None


def _named(x: Any, user: Any) -> str:
    """``"`old.x`, "`` when the user's frame names the array (see ``arrays_named``)."""
    found = arrays_named(user, user.f_lineno, only=x, limit=1) if user is not None else []
    return f"`{found[0][0]}`, " if found else ""


def _on_read(x: Any, name: str, frame: Any = None) -> None:
    __tracebackhide__ = True
    # A read that raises normally supersedes a refused buffer export kept for
    # 3.11 (numpy falls back from the refused export to the guarded __array__).
    pending.error = None
    user = user_frame(frame or frames.caller_frame(1))
    if x.is_deleted():
        by = consumed_by(x)
        _violation(
            "donation",
            f"{arrays.READS[name]} of {_named(x, user)}an array ({fmt_aval(x.shape, x.dtype)}) "
            f"that {donated(by)}",
            donation_fix("use", by),
            frame,
        )
        return
    loop = local.loop
    if (
        loop is not None
        and not trace_state_clean()
        and (loop.compiles_admitted() or (_thread.cell is not None and _thread.cell[0]))
    ):
        # A concrete read while a compile traces (an `if` on a global flag: jax-md's
        # neighbor lists) is part of that compile, admitted with it; where the loop
        # refuses it, the compile is the violation (raised before the trace, or
        # recorded at its lowering), never its reads.
        return
    _violation(
        "transfer",
        f"device-to-host read: {arrays.READS[name]} of {_describe(x)}",
        "save a copy the loop need not wait for: pass jc.to_host(state) to the "
        "saver (an orbax CheckpointManager.save), an asynchronous copy in host "
        "memory that later steps may donate past."
        if name == "copy_to_host_async"
        else debug_reads_fix(HOST_FIXES["read"]),
        frame,
    )


def _iterates_on_device(x: Any) -> bool:
    """Whether iterating ``x`` slices it on the device, without a read (see
    the module's docstring); a 0-d array raises numpy's TypeError unread."""
    try:
        return not x.is_deleted() and (
            x.ndim == 0 or x.sharding.num_devices == 1 or x.is_fully_replicated
        )
    except Exception:  # noqa: BLE001 - unknown layout: treat as a read
        return False


def _in_host_memory(x: Any) -> bool:
    """Whether ``x`` lives in a device's host memory (``jc.to_host``): reading
    it copies host memory to host memory, no transfer from the device."""
    try:
        return x.sharding.memory_kind in ("pinned_host", "unpinned_host")
    except Exception:  # noqa: BLE001 - unknown placement: treat as a read
        return False


def _on_cpu(x: Any) -> bool:
    """Whether ``x`` lives on the host CPU (JAX exports only those buffers)."""
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
        if _in_host_memory(self):  # already in host memory (jc.to_host): not a device read,
            with jax.transfer_guard_device_to_host("allow"):  # though JAX's own guard counts it one
                return original(self, *args, **kwargs)
        if name == "__iter__" and _iterates_on_device(self):
            # Slices on the device (k, sub = jax.random.split(k)): no read.
            return original(self, *args, **kwargs)
        if name == "__dlpack__" and not _on_cpu(self):
            return original(self, *args, **kwargs)  # device to device: no host read
        timer = None
        if not frames.allowed_reader(frames.caller_frame(1)) and not (
            name in ("__repr__", "__str__") and not self.is_fully_addressable
        ):  # jax prints an array spanning other processes without reading it
            try:
                _on_read(self, name)
            except ContractError as err:  # called from the user's line: it ends there
                trim(err)
                raise
            timer = loop.read_timer  # jc.watch()'s loop: how long the read it recorded blocked
        loc.allow += 1
        t0 = perf_counter() if timer is not None else 0.0
        try:
            return original(self, *args, **kwargs)
        finally:
            loc.allow -= 1
            if timer is not None:
                timer(perf_counter() - t0, self, name)

    guarded.__name__ = getattr(original, "__name__", name)
    guarded.__qualname__ = getattr(original, "__qualname__", name)
    guarded.__doc__ = getattr(original, "__doc__", None)
    return guarded


def _must_refuse_buffer(x: Any) -> bool:
    """For the buffer hooks: refuse the export? (numpy then falls back to the
    guarded ``__array__``); in record mode the read is recorded here."""
    loop = local.loop
    if loop is None or local.allow or not loop.checks_transfers or _in_host_memory(x):
        return False
    if frames.allowed_reader(frames.caller_frame(1)):
        return False
    if loop.on_violation == "raise":
        return True
    if not _on_cpu(x):  # no buffer to export: numpy falls back to __array__, which records it
        return False
    _on_read(x, "buffer", frames.caller_frame(1))
    timer = loop.read_timer
    if timer is not None:  # jc.watch()'s loop: the wait the export makes, timed here
        t0 = perf_counter()
        with contextlib.suppress(Exception):  # deleted: the export says so, as without the watch
            blocking.wait_untimed(x)  # the read's wait, not the user's block_until_ready
        timer(perf_counter() - t0, x, "buffer")
    return False


pending = threading.local()  # 3.11: the error of a refused buffer export


def _buffer_refused(x: Any) -> None:
    # On 3.11 the slot cannot raise it: kept, it replaces the consumer's SystemError
    # ("returned NULL without setting an exception") as that leaves the loop.
    __tracebackhide__ = True
    try:
        _on_read(x, "buffer")
    except Exception as e:
        pending.error = e
        raise


def _value_without_pin(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``_value`` for a jaxlib that pins a CPU buffer after a host read: reads a
    loop lets through (record mode, host callbacks, jc.fetch's) copy instead
    of caching a view that would make the next donated call copy the buffer."""

    inside = threading.local()

    def _value(self: Any) -> Any:
        if (
            self.is_deleted()
            or jax.dtypes.issubdtype(self.dtype, jax.dtypes.extended)
            # host_copy's own jax.device_get (int4): JAX's read
            or getattr(inside, "copying", False)
        ):
            return original(self)
        inside.copying = True
        try:
            out = hostcopy.host_copy(self)
        finally:
            inside.copying = False
        out.flags.writeable = False  # as JAX's own _value
        return out

    return _value


def _read_only(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        x.flags.writeable = False
    return x


def _copying_device_get(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``jax.device_get`` inside a loop: CPU arrays come back as read-only copies.
    On CPU JAX's own caches a view of the buffer on the array, which pins it:
    the next step donating it makes XLA copy (the consumed-input check refuses
    the call)."""

    def device_get(x: Any) -> Any:
        __tracebackhide__ = True
        if local.loop is None or local.allow:  # no loop, or a copy's own device_get (int4)
            return original(x)
        leaves, treedef = jax.tree_util.tree_flatten(x)
        local.allow += 1  # an explicit transfer
        try:
            out = [
                _read_only(hostcopy.host_copy(leaf))
                if type(leaf) is arrays.ArrayImpl
                and not leaf.is_deleted()
                and not is_key(leaf.dtype)
                and leaf.is_fully_addressable
                and _on_cpu(leaf)
                else original(leaf)
                for leaf in leaves
            ]
        finally:
            local.allow -= 1
        return jax.tree_util.tree_unflatten(treedef, out)

    device_get.__wrapped__ = original  # type: ignore[attr-defined]
    return device_get


class _Patches:
    """The interceptors, installed and removed (reference counted: ``depth``)."""

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
        self._buffer_on, self._buffer_off = arrays.buffer_hooks(
            _must_refuse_buffer, _buffer_refused
        )
        self.listening = False
        self.device_get = jax.device_get
        self.copying_device_get = _copying_device_get(self.device_get)

    def install(self) -> None:
        callbacks.hook_host_callbacks(_in_host_callback)  # once, for good: a no-op outside loops
        if jax.device_get is self.device_get:  # `jax.device_get(x)` in a loop: pin-free copies
            jax.device_get = self.copying_device_get
        _rng.install()  # jax.random samplers: their Python-number parameters pass
        for name, fn in self.guarded.items():
            arrays.set_class_attr(name, fn)
        self._buffer_on()
        if capability("compile-events").available:
            events.listen(on_monitoring_event)
            self.listening = True

    def uninstall(self) -> None:
        if jax.device_get is self.copying_device_get:
            jax.device_get = self.device_get
        _rng.uninstall()
        for name, fn in self.originals.items():
            arrays.set_class_attr(name, fn)
        self._buffer_off()
        if self.listening:
            events.unlisten(on_monitoring_event)
            self.listening = False
        clear_last_outputs(in_use())  # only steps called in loops lately recorded an output


def _in_host_callback(
    runner: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A host callback an executable runs (``jax.debug.callback``): inside a
    loop, with its guards lifted. The callback is the user's deliberate host
    code, run by the device program on this thread (CPU); refusing its eager
    ops would fail the step after XLA took the donated state."""
    if local.loop is None:
        return runner(*args, **kwargs)
    local.allow += 1
    try:
        with jax.transfer_guard("allow"):
            return runner(*args, **kwargs)
    finally:
        local.allow -= 1


def on_monitoring_event(event: str, value: float, **kwargs: Any) -> None:
    __tracebackhide__ = True
    if event not in events.COMPILE_EVENTS:
        return
    loop = local.loop
    if loop is None or local.allow or not loop.checks_compiles:
        return
    name = str(kwargs.get("fun_name") or "a function")
    if name.startswith("jit(") and name.endswith(")"):
        name = name[4:-1]
    user = user_frame(frames.caller_frame(1))
    key = (name, user.f_code.co_filename if user else None, user.f_lineno if user else None)
    again = False
    if loop.warmup:
        # The first compile of each (function, line) is let through, decided at
        # its lowering (every compile lowers); a trace or lowering of one seen
        # before is a second compile of the same thing. The backend compile
        # that follows a lowering was decided there.
        if event == events.BACKEND_EVENT:
            return
        again = loop.seen_compile(key)
        # After the warm-up pass no first compile is admitted either: refused at
        # its first phase, before its trace runs what reads concrete arrays.
        if (
            not again
            and loop.compiles_admitted()
            and (event != events.LOWERING_EVENT or loop.admit_compile(key, name, user))
        ):
            return
    # Raise or record at the first phase (a trace that never lowers, jax.eval_shape,
    # is one too); recording, once per compile: the lowering after its trace on this
    # thread is the same compile (a cold eager op may lower with no trace before it).
    if loop.on_violation != "raise":
        if event == events.BACKEND_EVENT:
            return
        traced, _thread.traced = _thread.traced, (key if event == _TRACE_EVENT else None)
        if event == _TRACE_EVENT:
            if _thread.cell is not None:  # a plain jax.jit's trace: its reads are part of it
                _thread.cell[0] = True
        elif traced == key:
            return
    # The compile is often a symptom: say the cause when the stack shows it
    # (a host read only where the loop refuses reads).
    stale = _deleted_in_stack(user)
    read = host_read_on_line(user, name) if stale is None and loop.checks_transfers else None
    # a plain jax.jit that compiled another signature in this loop
    changed = take_recompile(name) if stale is None and read is None else None
    if stale is not None:
        by = consumed_by(stale)
        kind, what, fix = (
            "donation",
            f"`{name}` on {_named(stale, user)}an array "
            f"({fmt_aval(stale.shape, stale.dtype)}) that {donated(by)} (jax would compile it, "
            f"then fail on the deleted buffer)",
            donation_fix("use", by),
        )
    elif read is not None:
        kind, what, fix = (
            "transfer",
            f"device-to-host read: {read} reads the result of an eager `{name}` "
            "on the host (the op compiles here, then its result is copied to "
            "the host)",
            "decide on the device (jnp.where / lax.cond in the step, returning a "
            "flag), or read deliberately and rarely: `if jc.fetch(x) < 1e-3:` "
            "every N steps.",
        )
    elif changed is not None:
        kind, what, fix = (
            "compile",
            f"jax compiles `{name}` again, because:\n    " + "\n    ".join(changed[0][:8]),
            changed[1] + ", or move it into a hot step, whose contract keeps one signature.",
        )
    elif again:
        kind, what, fix = (
            "compile",
            f"jax compiles `{name}` again (it compiled once in this loop's warm-up: "
            "a new input signature, a weak-typed retrace, or a fresh jax.jit each time)",
            "keep its inputs on one signature (the same shapes, dtypes and weak types "
            "every time: a smaller last batch, a Python scalar that is sometimes an "
            "int, a jax.jit made inside the loop), or move it into a hot_step, whose "
            "refusal shows the differing leaf.",
        )
    elif loop.warmup and not loop.compiles_admitted():
        kind, what, fix = (
            "compile",
            f"jax compiles `{name}` after the warm-up (with loop.iterate(), only its "
            "first iteration may compile: a jax.jit first called here, a new input "
            "signature, or a cold eager op)",
            "call it in the first iteration too, or warm it before the loop on what the "
            "loop will pass; where a compile is expected here (a rare branch), mark it "
            'with jc.hot_loop(compiles="allow") around that branch.',
        )
    else:
        kind, what, fix = (
            "compile",
            f"jax compiles `{name}` (a fresh jax.jit, a new input signature, or a cold eager op)"
            + ("; or it only traces it, again at each call (jax.eval_shape, jax.make_jaxpr: "
               "move them before the loop, their result does not change)"
               if event == _TRACE_EVENT else ""),
            ("JAX's `stage` turns a host value into a device array: a numpy array or Python "
             "number given to an eager op here (jnp.asarray(batch), jnp.array(values)) would be "
             "copied to the device at every call once compiled, refused too: put it on the "
             "device once, before the loop, or pass it to a hot step (host= for a loader's "
             "batch). Otherwise: " if name == "stage" else "")
            + 'let the loop\'s first pass compile it: jc.hot_loop(compiles="warmup") (the first '
            "compile of each function is let through once, a second one refused); or run it "
            "once before the loop so it is compiled and cached, or move the eager op into a "
            "hot_step. Warm it on what the loop will pass: a jax.jit "
            "warmed on arrays made outside any step (jnp.zeros, jax.random.key: "
            "uncommitted) compiles again for a hot step's outputs, which are committed "
            "to their device; warm it on a step's outputs, or on jc.device_tree(x) "
            "(committed).",
        )
    _violation(kind, what, fix, user)


class _Thread(threading.local):
    # the (function, file, line) of the trace a recording loop recorded last on
    # this thread, until the next compile event: its lowering is not recorded again
    traced: tuple[str, str | None, int | None] | None = None
    # the innermost plain jax.jit trace running on this thread (``plain_trace``):
    # [whether the loop recorded its compile]
    cell: list[bool] | None = None


_thread = _Thread()


@contextlib.contextmanager
def plain_trace() -> Iterator[None]:
    """Around a plain ``jax.jit``'s trace (``_loop.plainjit``): a compile the
    loop records as it starts (record mode, which traces on) makes the
    concrete reads of that trace part of it (``_on_read``)."""
    outer, _thread.cell = _thread.cell, [False]
    try:
        yield
    finally:
        _thread.cell = outer


def _deleted_in_stack(user: FrameType | None, limit: int = 80) -> Any | None:
    """A deleted (donated) array among the locals of JAX's dispatch frames below
    ``user``: the op's argument, and the real error behind the compile."""
    frame = frames.caller_frame(2)
    while frame is not None and frame is not user and limit:
        for value in frames.library_locals(frame).values():
            for x in value if isinstance(value, (tuple, list)) else (value,):
                if is_deleted_array(x):
                    return x
        frame, limit = frame.f_back, limit - 1
    return None


_patches: _Patches | None = None


def acquire() -> None:
    global _patches
    with _lock:
        if _patches is None:
            _patches = _Patches()
        if _patches.depth == 0:
            _patches.install()
        _patches.depth += 1
        tracking.count += 1


def release() -> None:
    with _lock:
        assert _patches is not None
        _patches.depth -= 1
        tracking.count -= 1
        if _patches.depth == 0:
            _patches.uninstall()

