"""A thread's stack of loop entries, and JAX's native guard contexts on it.

Each entry into a ``jc.hot_loop`` is an :class:`Entry` on the stack of the
thread that made it. Entries may end in any order and on any thread; the
stack is repaired on its own thread (JAX's config contexts exit where they
were entered) and, from another thread, the levels are set directly.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import jax

from .._compat import threadguard
from .._runtime import LoopStack

__all__ = ["Entry", "apply_direct", "enter_native", "relink", "repair", "stacks_lock"]

_NATIVE_GUARDS = {
    "host_to_device": jax.transfer_guard_host_to_device,
    "device_to_host": jax.transfer_guard_device_to_host,
    "device_to_device": jax.transfer_guard_device_to_device,
}


stacks_lock = threading.Lock()


class Entry:
    """One entry into a loop, on the thread (``stack``) that entered it."""

    __slots__ = (
        "capture_tid", "checked", "counted", "direct", "ended", "loop", "modes", "native", "stack",
        "timing",
    )

    def __init__(
        self, loop: Any, stack: LoopStack, modes: dict[str, str], checked: bool, counted: bool
    ) -> None:
        self.loop = loop  # the HotLoop entered
        self.stack = stack
        self.modes = modes  # JAX's native guards: field -> level
        self.checked = checked  # holds the class patches and the compile listener
        self.counted = counted  # entered on the main thread, keeping the signal handler till exit
        self.timing: Any = None  # the loop clock's token, while timing
        self.native: contextlib.ExitStack | None = None
        self.ended = False
        # Entered in a generator or coroutine, whose exit may run on another
        # thread: its levels are set on the thread's record, not in JAX's config.
        self.direct = False
        self.capture_tid: int | None = None  # record mode: whose guard log lines it takes


def enter_native(modes: dict[str, str]) -> contextlib.ExitStack | None:
    if not modes:
        return None
    with contextlib.ExitStack() as native:  # a failed entry closes those entered before it
        for field, mode in modes.items():
            native.enter_context(_NATIVE_GUARDS[field](mode))
        return native.pop_all()


def relink(stack: LoopStack) -> None:
    """Point the thread at its innermost live, checking loop."""
    for entry in reversed(stack.entries):
        if not entry.ended and entry.checked:
            stack.loop = entry.loop
            return
    stack.loop = None


def repair(stack: LoopStack) -> None:
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
        entry.native = enter_native(entry.modes)
    if errors:
        raise errors[0]


def apply_direct(stack: LoopStack, left: bool = False) -> None:
    """After an entry or exit: where the innermost live entry sets its levels
    directly (:attr:`Entry.direct`), set them; ``left`` (a direct entry just
    ended, or another thread's loop ended here): set those of the innermost
    live entry, or the thread's own."""
    if stack.saved is None:
        return
    state, saved = stack.saved
    live = [e for e in stack.entries if not e.ended]
    if left or (live and live[-1].direct):
        threadguard.set_levels(state, saved, live[-1].modes if live else None)
