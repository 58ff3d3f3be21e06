"""``jc.hot_loop``: critical sections that catch transfers and compiles.

An entry engages, on its thread, ``intercept``'s interceptors and JAX's
native transfer guards; its exit restores what that entry changed, in
whatever order loops end and on whatever thread. Costs:
``docs/guides/performance.md``.
"""

from __future__ import annotations

import collections
import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar, overload

from .._compat import arrays, frames, guardlog, jitwatch, threadguard
from .._config import get_checks
from .._contracts.transfers import host_fix
from .._errors import (
    CONTRACTS,
    VIOLATIONS,
    ContractError,
    DefinitionError,
    compose,
    loop_options,
    violation_summary,
)
from .._format import fmt_logged_aval, fmt_object
from .._records import Violation, WarmupCompile
from .._report import timing as _timing
from .._report.render import Report, format_violations, loop_report
from .._report.timing import LoopTiming
from .._runtime import held_outputs, local, observers
from .._tracebacks import boundary, trim
from .._userline import place, user_frame, where
from . import intercept, plainjit
from .intercept import pending
from .interrupts import interrupts
from .loopstack import (
    Entry,
    apply_direct,
    enter_native,
    relink,
    repair,
    stacks_lock,
)
from .translate import translate

__all__ = ["HotLoop", "hot_loop"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: A recording loop left by an exception lists this many of its violations on it.
_NOTED = 8

_LOGGED_FIX = (
    "rerun with on_violation=\"raise\" to stop at the line. The usual causes: a numpy array "
    "given to a jax.jit call (f(np_array)): " + host_fix("constant") + "; " + host_fix("eager")
    + "."
)


def acquire(checked: bool) -> None:
    """The interceptors (a checking entry's) and the observer of plain jax.jit
    cache misses, installed for one more loop entry (at checks level ``off``
    the observer only lifts JAX's guard for a trace: ``plainjit._traced``)."""
    if checked:
        intercept.acquire()
    jitwatch.add_miss_observer(plainjit.observe)


def release(checked: bool) -> None:
    jitwatch.remove_miss_observer(plainjit.observe)
    if checked:
        intercept.release()


class HotLoop:
    """A critical section: see :func:`hot_loop`.

    Attributes:
        violations: in record mode, every violation seen (one per kind and
            source line, with a count).
        warmup_compiles: with ``compiles="warmup"``, the compiles let
            through: the first of each function at each line, and each hot
            step's first signature (a :class:`jc.WarmupCompile` each).
        iterations: how many items :meth:`iterate` has yielded.
        sampler_calls: eager ``jax.random`` sampler calls whose Python-number
            parameters (``minval=0.0``, ``p=0.5``, the defaults) were copied
            to the device: let through and counted, a few bytes each.
        timing: a :class:`jc.LoopTiming`: steps per second, host time per
            step call, time blocked on the device, and whether the loop is
            dispatch-bound or device-bound (see :meth:`report`).

    Its methods ``admit_compile``, ``seen_compile``, ``compiles_admitted``
    and ``violation`` are the protocol hot steps and the library's own
    modules call (``_runtime.LoopHandle``), not user API.
    """

    def __init__(self, **given: str | None) -> None:
        choices = loop_options()  # every contract's option, and on_violation
        for option, value in given.items():
            if option not in choices:
                raise DefinitionError(
                    f"jc.hot_loop: no option {option!r}; its options are {', '.join(choices)}."
                )
            if value is not None and value not in choices[option]:
                raise DefinitionError(
                    f"jc.hot_loop({option}={value!r}): valid values are "
                    + ", ".join(repr(v) for v in choices[option])
                    + "."
                )
        # None: inherited from the enclosing loop at entry (else the default)
        self._given = {k: given.get(k) for k in choices}
        self._apply({k: v if v is not None else choices[k][0] for k, v in self._given.items()})
        self._warm: dict[Any, WarmupCompile] = {}  # compiles="warmup": once per key, any thread
        self._warm_lock = threading.Lock()
        self._raised: dict[int, ContractError] = {}  # per thread: the first violation raised
        self.iterations = 0
        self.sampler_calls = 0
        self._iterating: list[list[int]] = []  # the active iterate()s' indices, outermost first
        self._violations: dict[tuple[str, str, str], Violation] = {}
        # _loop.plainjit's: signatures by PjitInfo, undonated arguments followed until settled
        self.plain_signatures: dict[int, tuple[Any, list[Any]]] = {}
        self.plain_followed: list[plainjit.Followed] = []
        self.audit = False  # jc.watch()'s recording loop (loops inside it inherit nothing from it)
        # called with the seconds each device-to-host read it recorded blocked (jc.watch()'s loop)
        self.read_timer: Callable[[float, Any, str], None] | None = None
        # host arguments already named at the user's line, by the aval text JAX's guard
        # log gives them: those log lines are not recorded a second time
        self.named_transfers: collections.Counter[str] = collections.Counter()
        self._entries: list[Entry] = []  # active entries (re-entrant, any thread)
        self._clock = _timing.LoopClock()
        self._entered = self._checked = False  # entered; entered at checks level fast or full once
        self.label = 'jc.hot_loop(on_violation="record")'  # what its notes call it (pytest plugin)

    def _apply(self, options: dict[str, str]) -> None:
        transfers, compiles = options["transfers"], options["compiles"]
        self._options = dict(options)
        self.on_violation = options["on_violation"]
        self.checks_transfers = transfers != "allow"
        self.checks_host_to_device = transfers == "disallow"
        self.checks_compiles = compiles in ("disallow", "warmup")
        self.warmup = compiles == "warmup"

    @property
    def violations(self) -> list[Violation]:
        return list(self._violations.values())

    @property
    def options(self) -> dict[str, str]:
        """The loop's options (``transfers``, ``compiles``, ``callbacks``, ``on_violation``)."""
        return dict(self._options)

    def option(self, name: str) -> str:
        """One option's value (a contract's hook reads its own)."""
        return self._options[name]

    @property
    def warmup_compiles(self) -> list[WarmupCompile]:
        return list(self._warm.values())

    def iterate(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield ``iterable``'s items, counting iterations (``for b in loop.iterate(loader)``).

        Messages then name the iteration, and the report gives iterations
        per second. With ``compiles="warmup"`` only the first iteration may
        compile: a first compile in a later one is refused too.
        """
        cell = [0]  # this iterate's current index; nested ones (epochs x batches) stack
        self._iterating.append(cell)
        try:
            for i, item in enumerate(iterable):
                cell[0] = i
                self.iterations += 1
                if self.plain_followed:  # the last iteration's calls: what they dropped
                    plainjit.settle(self)
                yield item
        finally:
            self._iterating[:] = [c for c in self._iterating if c is not cell]

    @property
    def _iteration(self) -> int | None:  # the innermost active iterate's index
        return self._iterating[-1][0] if self._iterating else None

    def _first_pass(self) -> bool:
        """Whether every active iterate is in its first iteration (the warm-up)."""
        return all(cell[0] == 0 for cell in self._iterating)

    def admit_compile(self, key: Any, what: str, frame: Any = None) -> bool:
        """With ``compiles="warmup"``: let this compile through (and record it) if
        it is the first of its kind, in the first pass (of every nested iterate)."""
        if not self.warmup or not self._first_pass():
            return False
        record = WarmupCompile(what, where(user_frame(frame))[0], self._iteration)
        with self._warm_lock:
            return self._warm.setdefault(key, record) is record

    def seen_compile(self, key: Any) -> bool:
        return key in self._warm

    def withdraw_compile(self, key: Any) -> None:
        with self._warm_lock:
            self._warm.pop(key, None)

    def compiles_admitted(self) -> bool:
        """Whether a first compile would be let through now (see ``LoopHandle``)."""
        return not self.checks_compiles or (self.warmup and self._first_pass())

    def violation(
        self, kind: str, what: str, fix: str, frame: Any = None, before_call: bool = False,
        line: tuple[str, int] | None = None,
    ) -> None:
        """Raise (or, in record mode, record) one violation at the user's line.

        ``kind`` is a key of ``_errors.VIOLATIONS``, which gives the title,
        the contract and the error class. ``before_call``: refused before a
        call, which then does not run where the loop raises (it does in record
        mode): the raised fix says so. ``line``: (file, number) where the
        violation happened, where not the user's line running now.
        """
        __tracebackhide__ = True
        at, text = place(*line) if line is not None else where(user_frame(frame))
        summary = violation_summary(kind, what, at, text)
        if self._iteration is not None:
            summary += f"\n  in iteration {self._iteration} of loop.iterate()"
        if self.on_violation == "raise":
            info = VIOLATIONS[kind]
            if before_call:
                fix = fix.rstrip(".") + ". The call did not run."
            err = info.error(summary, fix=fix, contract=info.contract)
            # kept until this thread's exit: caught in the body, it fails the loop there
            self._raised.setdefault(threading.get_ident(), err)
            raise err
        self._record(kind, what, at, compose(summary, fix=fix), text, fix, self._iteration)

    def _record(
        self, kind: str, what: str, where: str, message: str, source: str = "", fix: str = "",
        iteration: int | None = None,
    ) -> None:
        key = (kind, where, what)
        if kind == "donation" and key not in self._violations and any(
            k[0] == "donation" and k[1] == where for k in self._violations
        ):
            return  # the same stale value's use at this line, already recorded
        found = self._violations.get(key)
        if found is None:
            self._violations[key] = Violation(
                kind, what, where, 1, message, source, fix, iteration  # type: ignore[arg-type]
            )
        else:
            found.count += 1

    @property
    def timing(self) -> LoopTiming:
        """Where the loop's time went so far: see :meth:`report`."""
        return self._clock.timing()

    def _record_logged(self, logged: list[guardlog.GuardEvent], unparsed: int) -> None:
        """Record the transfers JAX's guard logged on this entry's thread."""
        at = "(jaxlib's log)"
        for event in logged:
            if self.named_transfers[event.aval] > 0:  # named at its line by _loop.plainjit
                self.named_transfers[event.aval] -= 1
                continue
            what = f"implicit {event.direction} transfer of {fmt_logged_aval(event.aval)}"
            summary = violation_summary(
                "transfer", what, at, "JAX logs it from C++, with no Python line"
            )
            self._record("transfer", what, at, compose(summary, fix=_LOGGED_FIX), "", _LOGGED_FIX)
        if unparsed:
            what = (
                f"{unparsed} transfer-guard log line(s) from jaxlib that this version "
                "of jaxcontracts cannot read (left on stderr)"
            )
            self._record(
                "transfer", what, at, violation_summary("transfer", what, at), "", _LOGGED_FIX
            )

    def report(self) -> Report:
        """A :class:`jc.Report` of the violations and of where the time went.

        ``str()`` of it is text; in a notebook it renders as HTML. Besides the
        contracts, it has a timing section (``report.timing``, a
        :class:`jc.LoopTiming`) that says whether the loop is dispatch-bound
        or device-bound, with the figures. How they are measured, and what
        they cannot see, is in the performance guide ("How loop timing
        works"); at checks level ``off`` nothing is timed.
        """
        only_off = self._entered and not self._checked
        unchecked = {
            c.key: "entered at checks level off only" if only_off else f'{c.option}="allow"'
            for c in CONTRACTS.values()
            if c.violations and (only_off or (c.option and self._options.get(c.option) == "allow"))
        }
        report = loop_report(
            self.violations, self.on_violation, self.warmup_compiles, self.iterations,
            self.sampler_calls, unchecked,
        )
        report.timing = self._clock.timing()
        wall = report.timing.wall_seconds
        if self.iterations and wall > 0:
            report.facts = [
                (k, f"{v} ({self.iterations / wall:,.0f}/s)" if k == "iterations" else v)
                for k, v in report.facts
            ]
        return report

    def __enter__(self) -> HotLoop:
        """Enter the loop; a signal (Ctrl-C, an alarm) during the entry is held until it
        is whole (then the entry is undone and the signal delivered: never half entered)."""
        # in a generator or coroutine it may end on another thread: see interrupts.entering
        frame = frames.caller_frame(1)
        suspendable = frame is not None and bool(frame.f_code.co_flags & _SUSPENDABLE)
        depth = interrupts.depth  # (main-thread entries only: no other thread changes it now)
        counted = interrupts.entering(keep=not suspendable)
        try:
            entry = self._enter(counted and not suspendable, suspendable)
        except BaseException as err:  # the entry undid itself; it is not counted, however it failed
            interrupts.depth = depth
            interrupts.finish()
            if isinstance(err, ContractError):  # the traceback ends at the user's line
                trim(err)
            raise
        try:
            if counted and interrupts.noted:  # a signal during the entry: undo it, deliver it
                self._exit(None, None)
                interrupts.finish()
                interrupts.deliver()
                return self.__enter__()  # the handler did not raise: entered after all
            interrupts.finish()
            return self
        except BaseException:
            if entry in self._entries:  # a signal as the entry ended: not entered after all
                self._exit(None, None)
            interrupts.finish()
            raise

    def _enter(self, counted: bool, suspendable: bool) -> Entry:
        outer = local.loop
        stack = local.stack
        if not self._entries:  # an iterate() abandoned in an earlier entry counts no more
            self._iterating.clear()
        if None in self._given.values() and not self._entries:
            # what this loop does not set, it takes from the loop it is in (else the defaults)
            # (an audit's recording loop is not the user's: it passes nothing on)
            inherits = isinstance(outer, HotLoop) and not outer.audit
            base = outer._options if inherits else {k: v[0] for k, v in loop_options().items()}
            self._apply({k: v if v is not None else base[k] for k, v in self._given.items()})
        # JAX's own guards, set whatever the backend: nothing here may start it
        # (jc.watch() enters a loop before the audited script's first line, which
        # may still configure it), and a guard that has nothing to watch is free.
        raising = self.on_violation == "raise"
        modes: dict[str, str] = {}
        if self.audit:
            pass  # it reads through the array hooks: JAX's guards stay as the script set them
        elif self.checks_transfers:
            # allow_host_to_device: "allow" even inside an outer loop that refuses them;
            # JAX's CPU backend never asks its device-to-host guard (the loop's reads do)
            h2d = ("disallow" if raising else "log") if self.checks_host_to_device else "allow"
            modes = {"host_to_device": h2d, "device_to_host": "disallow" if raising else "allow"}
            if raising:
                # a committed array passed to a computation placed elsewhere: JAX
                # enforces this guard on GPU and TPU (its CPU backend copies unasked)
                modes["device_to_device"] = "disallow"
        elif stack.entries:
            # transfers="allow" inside an outer loop that refuses them: lift JAX's
            # own guards too (a user's own jax.transfer_guard outside any loop stays)
            modes = dict.fromkeys(("host_to_device", "device_to_host", "device_to_device"), "allow")
        # At checks level off only JAX's native guards (see acquire()): no active
        # loop for the call path to report to.
        checked = get_checks() != "off"
        self._entered, self._checked = True, self._checked or checked
        entry = Entry(self, stack, modes, checked, counted)
        # In a generator or coroutine its exit may run on another thread, where JAX's
        # config contexts cannot be left: the levels go on the thread's record directly.
        entry.direct = bool(modes) and suspendable and threadguard.current() is not None
        acquire(checked)
        try:
            with stacks_lock:
                repair(stack)
                if not stack.entries and modes:
                    state = threadguard.current()
                    stack.saved = None if state is None else (state, threadguard.levels(state))
                entry.native = None if entry.direct else enter_native(modes)
                if checked and modes.get("host_to_device") == "log" and guardlog.start():
                    entry.capture_tid = threading.get_native_id()
                stack.entries.append(entry)
                relink(stack)
                apply_direct(stack)
                self._entries.append(entry)
            if checked:
                entry.timing = _timing.enter(self._clock)
        except BaseException:
            if entry in self._entries:  # pushed: a whole exit undoes it
                self._exit(None, None)
            else:
                if entry.native is not None:  # the innermost contexts: they close in order
                    entry.native.close()
                release(checked)
                if counted:
                    interrupts.depth -= 1
            raise
        if observers.recorders:
            observers.loop(self, True)
        return entry

    def _take_entry(self) -> Entry:
        """This exit's entry: the latest one made on this thread, else the latest."""
        mine = local.stack
        for i in range(len(self._entries) - 1, -1, -1):
            if self._entries[i].stack is mine:
                return self._entries.pop(i)
        if not self._entries:
            raise RuntimeError("jc.hot_loop: __exit__ without a matching __enter__")
        return self._entries.pop()

    def __exit__(
        self, exc_type: Any, exc: BaseException | None, tb: Any,
        _finalizing: Any = sys.is_finalizing,
    ) -> bool:
        """End this entry, whatever the order (generators, asyncio tasks) and thread.
        At interpreter exit (a suspended generator closed during teardown) nothing
        is left to restore: it returns at once, reading no module global
        (``_finalizing`` is bound when the class is made)."""
        if _finalizing():
            return False
        __tracebackhide__ = True
        # in front already, unless the entry is a generator's
        held = interrupts.entering(keep=False)
        try:
            return self._exit(exc, tb)
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise
        finally:
            if held:
                interrupts.finish()  # the handlers given back after the last loop, last of all
                interrupts.deliver()  # a signal held during the exit, now it is whole

    def _exit(self, exc: BaseException | None, tb: Any) -> bool:
        __tracebackhide__ = True
        if isinstance(exc, ContractError):  # raised in the body: it ends at the user's line
            trim(exc)
        # Translated before the last loop's exit forgets the steps' last calls
        # (they name the step that consumed a donated array).
        translated = translate(exc, tb) if isinstance(exc, Exception) else None
        with stacks_lock:
            entry = self._take_entry()
            stack = entry.stack
            entry.ended = True
            # nothing of JAX's to unwind: it leaves its thread's stack now, from any thread
            if entry.direct:
                stack.entries.remove(entry)
            if entry.timing is not None:
                _timing.leave(entry.timing, lambda: held_outputs(_timing.in_use()))
            relink(stack)
            try:
                if stack is local.stack:
                    repair(stack)
                    apply_direct(stack, entry.direct)
                elif stack.thread.is_alive():
                    # another thread's loop: its JAX config contexts exit only on that
                    # thread (at its next entry or exit: repair); the levels, set directly
                    apply_direct(stack, left=True)
            finally:
                release(entry.checked)
                if entry.counted:
                    interrupts.depth -= 1
        if entry.capture_tid is not None:
            self._record_logged(*guardlog.stop(entry.capture_tid))
        if observers.recorders:
            observers.loop(self, False)
        refused, pending.error = getattr(pending, "error", None), None
        # the first violation raised on this thread, once its last entry of this loop ends
        still_entered = any(e.stack is local.stack for e in self._entries)
        swallowed = None if still_entered else self._raised.pop(threading.get_ident(), None)
        if exc is not None and not isinstance(exc, Exception):  # Ctrl-C, pytest.fail, SystemExit
            if self.on_violation == "record" and not still_entered and self._violations:
                self._note_recorded(exc)
            return False
        if refused is not None and exc is not None and arrays.is_unset_error(exc):
            raise refused.with_traceback(None) from None  # a refused buffer export (3.11)
        if refused is not None and exc is None and sys.version_info < (3, 12):
            # 3.11: the refusal reached the code as a SystemError it caught:
            # the read was still refused, so the loop says so as it ends.
            refused.add_note(
                "Raised as the loop ended: on Python 3.11 this refusal reached your "
                "code as `SystemError: ... returned NULL without setting an "
                "exception`, which was caught inside the loop."
            )
            raise refused.with_traceback(None) from None
        if swallowed is not None and exc is None:
            swallowed.add_note(
                "Raised again as the loop ended: it was raised inside the loop, and code "
                "there caught it (a logging call's handler prints '--- Logging error ---' "
                "and goes on). A violation fails its loop, caught or not."
            )
            raise swallowed.with_traceback(None) from None
        if self.on_violation == "record" and not still_entered and self._violations:
            self._note_recorded(translated or exc)
        if translated is not None:
            raise translated.with_traceback(tb) from None  # it ends at the line that raised it
        if exc is None and not still_entered and self.plain_followed:
            plainjit.settle(self)  # what the last calls dropped
        return False

    def _note_recorded(self, exc: BaseException | None) -> None:
        """A recording loop left by an exception: what it had recorded, on the
        exception (the program stops before anything reads ``loop.violations``)."""
        if exc is None:
            return
        found = self.violations
        header = f"{self.label} had recorded {len(found)} violation(s) before this error ended it:"
        lines = format_violations(found[:_NOTED], header)
        if len(found) > _NOTED:
            lines.append(f"  ... and {len(found) - _NOTED} more (loop.violations, loop.report())")
        exc.add_note("\n".join(lines))

    def __call__(self, fn: F) -> F:
        """Use as a decorator: every call of ``fn`` runs in a fresh loop.

        On a generator function or an ``async def`` the call returns a
        generator or coroutine whose every resumption (each ``next``/``send``
        and each step between two ``await`` s) runs inside that call's loop;
        the caller's code between resumptions and the event loop are not
        guarded. An async generator function is refused.
        """
        options = self.options
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


_SUSPENDABLE = (
    inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)


# The frames in which a signal is held (their callees' included).
interrupts.codes = frozenset({HotLoop.__enter__.__code__, HotLoop.__exit__.__code__})


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


@overload
def hot_loop(fn: F, /) -> F: ...
@overload
def hot_loop(
    *,
    transfers: Literal["disallow", "allow_host_to_device", "allow"] | None = ...,
    compiles: Literal["disallow", "warmup", "allow"] | None = ...,
    callbacks: Literal["allow", "disallow"] | None = ...,
    on_violation: Literal["raise", "record"] | None = ...,
) -> HotLoop: ...
@boundary
def hot_loop(
    fn: Any = None,
    /,
    *,
    transfers: Literal["disallow", "allow_host_to_device", "allow"] | None = None,
    compiles: Literal["disallow", "warmup", "allow"] | None = None,
    callbacks: Literal["allow", "disallow"] | None = None,
    on_violation: Literal["raise", "record"] | None = None,
) -> Any:
    """A critical section where transfers and compiles are contract violations.

    On the thread that enters it, for its duration, on every backend (CPU
    included): an implicit device-to-host read of a ``jax.Array`` or
    host-to-device transfer raises :class:`TransferError`; any trace or compile raises
    :class:`RecompileError`; reading an array a hot step consumed raises
    :class:`DonationError`. ``jc.fetch``, ``jax.device_get`` and
    ``jax.device_put`` stay allowed. Other threads are unaffected; nesting
    works; each exit restores what its own entry changed, so loops may end
    in any order (generators, asyncio tasks) and on another thread (a
    generator closed there): once every loop has ended nothing is guarded.

    A loop inside another on the same thread takes the options it does not
    set from the loop it is in (``jc.hot_loop(transfers="allow")`` inside a
    ``compiles="warmup"`` loop warms up too); a loop in no other takes the
    defaults.

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
        compiles: ``"disallow"`` (default): every trace or compile is a
            violation. ``"warmup"``: the loop's first pass may compile, once
            per thing: the first compile of each function at each line (a
            ``jax.jit`` helper, the eager glue JAX compiles on first use,
            such as ``unstack`` when iterating an array) and each hot step's
            first signature are let through and listed in
            ``loop.warmup_compiles`` and the report; a second compile of the
            same thing (a new shape, a weak-typed retrace, a fresh
            ``jax.jit`` each iteration) is refused. With
            ``for x in loop.iterate(data):`` only the first iteration may
            compile. ``"allow"``: no compile checks.
        callbacks: ``"allow"`` (default), or ``"disallow"``: a hot step or a
            plain ``jax.jit`` whose compiled program calls back to the host
            (``jax.debug.print``, ``jax.debug.callback``, ``jax.pure_callback``,
            ``io_callback``) is refused before its call runs, naming the
            callback and the line that wrote it: a device-to-host round trip
            at every call, which also keeps JAX off its C++ fast path and
            out of its persistent compilation cache.
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
    interception of reads or compiles, so annotated loops cost nothing; as
    no compile is checked, JAX's guard is lifted while a hot step or a plain
    ``jax.jit`` traces (the concrete reads of a trace are part of its
    compile). The level is read when the loop is entered.

    Returns:
        A context manager, also usable as a decorator (``@jc.hot_loop()``,
        or ``@jc.hot_loop`` bare for the defaults).

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> x = jnp.arange(3.0)
        >>> with jc.hot_loop(on_violation="record") as loop:
        ...     _ = float(x[0])
        >>> [v.kind for v in loop.violations]
        ['transfer']
    """
    loop = HotLoop(
        transfers=transfers, compiles=compiles, callbacks=callbacks, on_violation=on_violation
    )
    if fn is None:
        return loop
    if callable(fn) and not isinstance(fn, (str, type)):  # @jc.hot_loop, bare: the defaults
        return loop(fn)
    option = {"warmup": "compiles", "raise": "on_violation", "record": "on_violation"}.get(
        fn if isinstance(fn, str) else "", "transfers"
    )
    raise DefinitionError(
        f"jc.hot_loop({fmt_object(fn)}): its options are keywords.",
        fix=f"jc.hot_loop({option}={fn!r})"
        if isinstance(fn, str)
        else 'jc.hot_loop(transfers="allow")',
    )

