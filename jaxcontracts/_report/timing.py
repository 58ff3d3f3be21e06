"""Where a hot loop's time goes: host time in steps, time blocked on the device.

While a timing loop is active (``_steps.timing_on``), a step's first ``FIRST``
calls, then one in ``SAMPLE``, are timed into its counters (:func:`timed`); a
:class:`LoopClock` takes their difference between a loop's entry and exit. The
estimate and its limits: ``docs/guides/performance.md``.
"""

from __future__ import annotations

import dataclasses
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .. import _steps
from .._compat import blocking
from .._steps import HOOK_EVERY

__all__ = [
    "LoopClock", "LoopTiming", "StepTiming", "blocked", "enter", "in_use", "leave", "start",
    "timed",
]  # fmt: skip

# Shares of the loop's wall time that decide the verdict.
DEVICE_BOUND_SHARE = 0.25  # blocked at least this share: the host waited on the device
DISPATCH_BOUND_SHARE = 0.05  # blocked under this share, nothing pending: the device waited
USER_BOUND_SHARE = 0.5  # the caller's own code between calls took at least this share

perf = time.perf_counter
_lock = threading.Lock()
_active = 0  # clocks entered, all threads


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """One hot step's calls inside a loop.

    Attributes:
        name: the step's qualified name.
        calls: calls that returned (a refused call is not counted).
        host_seconds: their total host time, dispatch included, estimated
            from the timed calls (the first 64 as timed, the rest at the
            mean of one in 64), scaled down to fit the loop's unblocked time.
        timed_calls: how many calls were timed.
    """

    name: str
    calls: int
    host_seconds: float
    timed_calls: int = 0

    @property
    def host_us_per_call(self) -> float:
        """Mean host time per call, in microseconds."""
        return self.host_seconds / self.calls * 1e6 if self.calls else 0.0


@dataclasses.dataclass(frozen=True)
class LoopTiming:
    """Where a hot loop's wall time went (see ``HotLoop.report``).

    Attributes:
        wall_seconds: time inside the loop (every entry, outermost on its thread).
        steps: per hot step, calls and host time.
        blocked: seconds blocked waiting for the device, by where
            (``jc.fetch``, ``block_until_ready``).
        pending_at_exit: how many step outputs seen at the last exit were
            still being computed (``is_ready()`` false).
        outputs_at_exit: how many outputs were looked at.
        verdict: ``"dispatch-bound"``, ``"device-bound"``, ``"mixed"``,
            ``"user-code-bound"`` (the caller's own code between step calls
            took at least half the loop) or ``"no steps"``.
    """

    wall_seconds: float
    steps: tuple[StepTiming, ...]
    blocked: dict[str, float]
    pending_at_exit: int
    outputs_at_exit: int
    verdict: str

    @property
    def calls(self) -> int:
        """Hot step calls in the loop, all steps."""
        return sum(s.calls for s in self.steps)

    @property
    def steps_per_second(self) -> float:
        """Hot step calls per second of the loop's wall time."""
        return self.calls / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def host_seconds(self) -> float:
        """Host time inside hot step calls."""
        return sum(s.host_seconds for s in self.steps)

    @property
    def blocked_seconds(self) -> float:
        """Time blocked waiting for the device, everywhere it was measured."""
        return sum(self.blocked.values())

    @property
    def other_seconds(self) -> float:
        """The rest of the wall time: the caller's own Python between calls."""
        return max(0.0, self.wall_seconds - self.host_seconds - self.blocked_seconds)

    def advice(self) -> str:
        """One sentence: what the verdict means and what to do."""
        wall = self.wall_seconds or 1.0
        share = self.blocked_seconds / wall
        if self.verdict == "no steps":
            return "no hot step was called inside the loop."
        if self.verdict == "device-bound":
            why = f"the host waited on the device for {share:.0%} of the loop"
            if self.pending_at_exit:
                why += (f"{' and' if self.blocked_seconds else ';'} {self.pending_at_exit} of "
                        f"{self.outputs_at_exit} outputs were still being computed at exit")
            return (f"device-bound: {why}. The device is the bottleneck: a cheaper step "
                    "(or more work per byte) helps; fusing steps or cutting host "
                    "overhead does not.")
        if self.verdict == "user-code-bound":
            return (f"user-code-bound: your own code between step calls took "
                    f"{self.other_seconds / wall:.0%} of the loop, the hot steps "
                    f"{self.host_seconds / wall:.0%}: speed up that code first (the "
                    "loop's recorded violations, transfers and compiles, are the usual "
                    "cause); fusing steps would not help.")
        if self.verdict == "dispatch-bound":
            return (f"dispatch-bound: the host never waited long on the device ({share:.0%} "
                    "of the loop) and the device had finished by the exit, so it idled "
                    "while the host prepared calls. Fuse steps into one hot_step, or run "
                    "several iterations per call with lax.scan / lax.fori_loop.")
        return (f"mixed: the host waited on the device for {share:.0%} of the loop; "
                "neither side clearly dominates.")

    def lines(self) -> list[str]:
        """The timing section of a loop report, as text lines."""
        wall = self.wall_seconds
        out = [
            f"timing: {self.calls} step calls in {wall * 1e3:.1f} ms "
            f"({self.steps_per_second:,.0f} steps/s); verdict: {self.verdict}"
        ]
        pct = (lambda s: f"{s / wall:.0%}") if wall > 0 else (lambda s: "-")
        for s in self.steps:
            out.append(f"  {s.name.rsplit('.', 1)[-1]}: {s.calls} calls, "
                       f"{s.host_us_per_call:,.1f} us host/call "
                       f"({pct(s.host_seconds)} of the loop)")
        blocked = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(self.blocked.items()))
        out.append(f"  blocked on the device: {self.blocked_seconds * 1e3:.2f} ms "
                   f"({pct(self.blocked_seconds)})" + (f": {blocked}" if blocked else ""))
        out.append(f"  other host time (your code between calls): "
                   f"{self.other_seconds * 1e3:.2f} ms ({pct(self.other_seconds)})")
        out.append(f"  at exit: {self.pending_at_exit} of {self.outputs_at_exit} step outputs "
                   "still computing")
        out.append("  " + self.advice())
        return [part for line in out for part in textwrap.wrap(
            line, width=80, subsequent_indent="    " if line.startswith("  ") else "  ",
            break_on_hyphens=False, drop_whitespace=True) or [""]]


def _host_seconds(
    calls: int, seconds: float, timed: int, first_seconds: float, first_timed: int
) -> float:
    """A step's host time: the first-phase calls (often slower) as timed, the others
    at the mean of the sampled ones."""
    if not timed:
        return 0.0
    sampled = timed - first_timed
    if sampled <= 0 or calls <= first_timed:
        return seconds / timed * calls
    return first_seconds + (seconds - first_seconds) / sampled * (calls - first_timed)


def _verdict(wall: float, calls: int, blocked: float, pending: int, host: float = 0.0) -> str:
    if not calls:
        return "no steps"
    share = blocked / wall if wall > 0 else 0.0
    if pending or share >= DEVICE_BOUND_SHARE:
        return "device-bound"
    if wall > 0 and (wall - host - blocked) / wall >= USER_BOUND_SHARE:
        return "user-code-bound"
    if share < DISPATCH_BOUND_SHARE:
        return "dispatch-bound"
    return "mixed"


class LoopClock:
    """A loop's running sums: the steps' counters at entry, the difference added at exit."""

    def __init__(self) -> None:
        self.wall = 0.0
        # name -> [calls, seconds timed, calls timed, the same two for the first
        # phase, calls and seconds of entries that timed none (at the step's mean)]
        self.steps: dict[str, list[float]] = {}
        self.blocked: dict[str, float] = {}
        # told of each block_until_ready while open on its thread: (seconds, value)
        self.on_wait: Callable[[float, Any], None] | None = None
        self.pending = 0
        self.outputs = 0
        self._open: dict[int, tuple[int, float, dict[int, _Joined]]] = {}  # per thread

    def timing(self) -> LoopTiming:
        """The figures so far (entries that have exited), as a frozen record."""
        blocked = sum(self.blocked.values())
        calls = int(sum(r[0] for r in self.steps.values()))
        hosts = [
            min(self.wall, _host_seconds(r[0] - r[5], *r[1:5]) + r[6]) for r in self.steps.values()
        ]
        # one slow sample can push the sum past the loop's time: scaled to fit
        room, total = max(0.0, self.wall - blocked), sum(hosts)
        if total > room:
            hosts = [h * room / total for h in hosts]
        return LoopTiming(
            wall_seconds=self.wall,
            steps=tuple(
                StepTiming(n, int(r[0]), h, int(r[2]))
                for (n, r), h in zip(self.steps.items(), hosts)
            ),
            blocked=dict(self.blocked),
            pending_at_exit=self.pending,
            outputs_at_exit=self.outputs,
            verdict=_verdict(self.wall, calls, blocked, self.pending, sum(hosts)),
        )

    def _close(self, start: float, snapshot: dict[int, _Joined], held: Sequence[Any] = ()) -> None:
        self.wall += perf() - start
        looked: dict[int, Any] = {id(x): x for x in held}
        for joined in snapshot.values():
            calls0, *acc0 = joined.baseline
            calls = joined.stats.calls
            if calls == calls0:
                step = joined.step()
                if step is not None:  # (a freed step has left use already)
                    _idle(step)
                continue
            rec = self.steps.setdefault(joined.name, [0, 0.0, 0, 0.0, 0, 0, 0.0])
            rec[0] += calls - calls0
            counters = joined.counters
            if counters[1] == acc0[1] and counters[1]:  # none of these calls was sampled
                rec[5] += calls - calls0
                rec[6] += counters[0] / counters[1] * (calls - calls0)  # at the step's mean
                continue
            for i, (now, then) in enumerate(zip(counters, acc0), 1):
                rec[i] += now - then
        # Are the step outputs still being computed? (never blocks)
        pending = outputs = 0
        for leaf in looked.values():
            is_ready = getattr(leaf, "is_ready", None)
            if is_ready is None:
                continue
            try:
                pending += not is_ready()
            except Exception:  # noqa: BLE001 - deleted (donated since): done
                continue
            outputs += 1
        self.pending, self.outputs = pending, outputs


class _Joined:
    """A step in an open entry's snapshot: its counters as it began (or joined). The
    step is held weakly; keyed by the id of its counters list, held here (never reused)."""

    __slots__ = ("baseline", "counters", "name", "stats", "step")

    def __init__(self, step: Any, counters: list[float]) -> None:
        self.step = weakref.ref(step)
        self.name: str = step.name
        self.stats = step.stats
        self.counters = counters
        self.baseline = (step.stats.calls, *counters)


# The steps in use (called in a timing loop since the last loop that did not call
# them): an entry snapshots only theirs; another joins at its next (timed) call.
# Each operation is one atomic dict operation (no lock: a Ctrl-C may interrupt _join).
_in_use: dict[int, weakref.ref[Any]] = {}


# The clocks with an open entry on any thread: a joining step enters them all.
_open_clocks: dict[int, LoopClock] = {}


def _join(step: Any, acc: list[float]) -> None:
    """``step`` (counters ``acc``) joins every open entry that lacks it."""
    key = id(step)
    # at its death, forgotten (unless a later step has the id now)
    _in_use[key] = weakref.ref(step, lambda r: _in_use.get(key) is r and _in_use.pop(key, None))
    joined = _Joined(step, acc)
    for clock in list(_open_clocks.values()):
        for opened in list(clock._open.values()):
            opened[2].setdefault(id(acc), joined)


def _idle(step: Any) -> None:
    """``step`` was not called in a loop: it leaves use; its next call is due."""
    _in_use.pop(id(step), None)
    step.timing_due[0] = True
    step.last_output[0] = None  # nothing to keep alive


def in_use() -> list[Any]:
    """The steps called inside timing loops lately (a copy)."""
    return [step for step in (r() for r in list(_in_use.values())) if step is not None]


def enter(clock: LoopClock) -> Any:
    """Start timing ``clock`` on this thread; returns the token for :func:`leave`."""
    global _active
    with _lock:
        _active += 1
        if _active == 1:
            blocking.install(blocked)
            _steps.timing_on[0] = True
    tid = threading.get_ident()
    depth, start, snapshot = clock._open.get(tid, (0, 0.0, {}))
    if depth == 0:  # the outermost entry on this thread
        snapshot = {id(s.timing_counters): _Joined(s, s.timing_counters) for s in in_use()}
        start = perf()
    clock._open[tid] = (depth + 1, start, snapshot)
    _open_clocks[id(clock)] = clock
    return (clock, tid)


def leave(token: Any, held: Callable[[], Sequence[Any]] = tuple) -> None:
    """Stop timing (from any thread). ``held``: the step outputs' leaves the loop
    sees at the outermost exit, looked at for queued work."""
    global _active
    clock, tid = token
    depth, start, snapshot = clock._open.get(tid, (1, perf(), {}))
    if depth <= 1:
        clock._open.pop(tid, None)
        if not clock._open:
            _open_clocks.pop(id(clock), None)
        clock._close(start, snapshot, held())
    else:
        clock._open[tid] = (depth - 1, start, snapshot)
    with _lock:
        _active -= 1
        if _active == 0:
            blocking.uninstall()
            _steps.timing_on[0] = False


def blocked(where: str, seconds: float, value: Any = None) -> None:
    """Add time blocked on the device to each clock open on this thread (and tell
    the audit's what was waited on)."""
    tid = threading.get_ident()
    for clock in list(_open_clocks.values()):
        if tid in clock._open:
            clock.blocked[where] = clock.blocked.get(where, 0.0) + seconds
            if clock.on_wait is not None and where == "block_until_ready":
                clock.on_wait(seconds, value)


SAMPLE = HOOK_EVERY  # past the first FIRST calls, one call in SAMPLE is timed (two clock reads)
FIRST = 64  # a step's first calls inside timing loops are all timed


def start(step: Any, acc: list[float]) -> float:
    """A due call of ``step`` (counters ``acc``) is entered: join the open loops if
    not in use, then read the clock."""
    if id(step) not in _in_use:
        _join(step, acc)
    return perf()


def timed(step: Any, acc: list[float], seconds: float) -> None:
    """A due call took ``seconds`` of host time: add it to ``acc``."""
    first = acc[1] < FIRST
    acc[0] += seconds
    acc[1] += 1
    if first:
        acc[2] += seconds
        acc[3] += 1
    step.timing_due[0] = acc[1] < FIRST
