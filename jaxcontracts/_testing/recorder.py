"""What hot steps and loops were proven to be, as a :class:`Snapshot`, from records
and counters only: ``jc.snapshot(*steps)``, and the pytest plugin's :class:`Recorder`
of a test's steps and ``jc.hot_loop`` runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import _steps
from .._config import get_checks
from .._errors import DefinitionError
from .._format import fmt_aval, fmt_sharding
from .._records import CompiledSignature, StepDescription
from .._runtime import observers
from .._step.hot_step import HotStep
from .._tracebacks import boundary
from .snapshot import TOLERANCED, Path, Snapshot, version_of

__all__ = ["Recorder", "snapshot"]


def _sharding(spec: Any) -> str:
    sharding = getattr(spec, "sharding", None)
    devices = getattr(sharding, "device_set", None)
    if devices is not None and len(devices) == 1 and getattr(sharding, "mesh", None) is None:
        return "single device"  # which device is no part of the contract
    return fmt_sharding(sharding)


def _leaf_line(leaf: Any) -> str:
    spec = leaf.spec
    aval = fmt_aval(spec.shape, spec.dtype, bool(getattr(spec, "weak_type", False)))
    aliased = "-" if not leaf.donated else (
        "unverified" if leaf.aliased is None else ("yes" if leaf.aliased else "no")
    )
    return (
        f"{aval} donated={'yes' if leaf.donated else 'no'} aliased={aliased} "
        f"bytes={leaf.nbytes} sharding={_sharding(spec)}"
    )


def _costs(cs: CompiledSignature) -> Mapping[str, Any] | None:
    try:
        analysis = cs.compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend has one
        return None
    return analysis if isinstance(analysis, Mapping) else None


def _step_fields(head: str, desc: StepDescription) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = [((head, "compiles"), str(desc.stats.compiles))]
    for n, cs in enumerate(desc.signatures, 1):
        sig = (head, f"signature {n}")
        out += [((*sig, f"leaf {leaf.path}"), _leaf_line(leaf)) for leaf in cs.leaves]
        costs = _costs(cs)
        for key in TOLERANCED:  # memory.*, then cost.* (XLA's keys have spaces: "bytes accessed")
            kind, name = key.split(".")
            if kind == "memory":
                value = getattr(cs.memory, name)
            elif costs is not None:
                value = int(round(float(costs.get(name.replace("_", " "), 0.0))))
            else:
                continue
            if value is not None:
                out.append(((*sig, key), str(value)))
    return out


def _names(steps: Iterable[Any]) -> dict[int, str]:
    """A unique, stable name per step: ``module.qualname`` (``#2`` for a twin)."""
    names: dict[int, str] = {}
    seen: dict[str, int] = {}
    for step in steps:
        base = step.describe().name
        seen[base] = seen.get(base, 0) + 1
        names[id(step)] = base if seen[base] == 1 else f"{base} #{seen[base]}"
    return names


def _build(steps: Sequence[Any], loops: Sequence[_LoopRun] = ()) -> Snapshot:
    import jax

    names = _names(steps)
    fields: list[tuple[Path, str]] = []
    for step in sorted(steps, key=lambda s: names[id(s)]):
        fields += _step_fields(f"step {names[id(step)]}", step.describe())
    for n, run in enumerate(loops, 1):
        head = f"loop {n}"
        fields.append(((head, "options"), run.options))
        # named as in the steps section (else as the loop named them)
        called = {sid: names.get(sid, name) for sid, name in run.names.items()}
        for sid, calls in sorted(run.calls.items(), key=lambda kv: called[kv[0]]):
            fields.append(((head, f"calls {called[sid]}"), "?" if calls is None else str(calls)))
        fields.append(((head, "fetches"), str(run.fetches)))
        fields.append(((head, "violations"), str(sum(v[3] for v in run.violations))))
        for i, (kind, what, where, count) in enumerate(run.violations, 1):
            where = where.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]  # file:line, no folders
            fields.append(((head, f"violation {i}"), f"{kind}: {what} (x{count}, at {where})"))
    versions = {"jax": version_of("jax"), "jaxlib": version_of("jaxlib")}
    return Snapshot(jax.default_backend(), jax.device_count(), versions, tuple(fields))


@boundary
def snapshot(*steps: HotStep[Any, Any]) -> Snapshot:
    """The contract snapshot of these hot steps, as compiled so far.

    Per step: its compiles and, per compiled signature, one line per argument
    leaf (spec, donated, aliased, bytes, sharding), the executable's memory
    analysis and XLA's cost analysis where the backend gives one. Nothing is
    compiled or run; a step not compiled yet has ``compiles: 0`` and no
    signature.

    Args:
        *steps: hot steps (``@jc.hot_step``).

    Returns:
        A :class:`jc.Snapshot`: ``str()`` is the text form that
        ``pytest --jc-snapshot-update`` writes, ``a.diff(b)`` compares two.

    Raises:
        DefinitionError: an argument is not a hot step.

    Examples:
        >>> import jaxcontracts as jc
        >>> from jaxtyping import Array, Float32
        >>> @jc.state
        ... class S:
        ...     x: Float32[Array, "n"]
        >>> @jc.hot_step(signature=S)
        ... def step(s: S) -> S:
        ...     return S(x=s.x + 1)
        >>> _ = step.compile(S.spec(n=4))
        >>> before = jc.snapshot(step)
        >>> [value for path, value in before.fields if path[-1] == "leaf s.x"]
        ['f32[4] donated=yes aliased=yes bytes=16 sharding=single device']
        >>> before.diff(jc.snapshot(step)).ok
        True
    """
    for step in steps:
        if not isinstance(step, HotStep):
            raise DefinitionError(
                f"jc.snapshot({step!r}): expected hot steps (made with @jc.hot_step).",
                fix="pass the decorated step itself: jc.snapshot(advance).",
            )
    return _build(steps)


@dataclasses.dataclass
class _LoopRun:
    options: str
    names: dict[int, str]
    calls: dict[int, int | None]
    fetches: int
    violations: list[tuple[str, str, str, int]]


@dataclasses.dataclass
class _Open:
    loop: Any
    calls: dict[int, int] | None  # None: calls are not counted (checks "off")
    fetches: int
    violations: dict[tuple[str, str, str], int]


class Recorder:
    """Records, between ``start()`` and ``stop()``, the hot steps compiled or called
    (calls are counted at checks ``fast``/``full``) and the loop runs, in the order
    they end: each step's calls (``?`` at checks ``off``), fetches and violations.
    """

    def __init__(self) -> None:
        self._steps: dict[int, Any] = {}
        self._start_calls: dict[int, tuple[Any, int, int]] = {}
        self._open: list[_Open] = []
        self.loops: list[_LoopRun] = []

    def start(self) -> Recorder:
        """Begin recording (hooks into hot steps and loops)."""
        self._start_calls = {
            id(s): (s, s.stats.calls, s.stats.compiles) for s in _steps.live()
        }
        observers.recorders.append(self)
        return self

    def stop(self) -> None:
        """Stop recording; steps called since :meth:`start` are added."""
        if self in observers.recorders:
            observers.recorders.remove(self)
        for step in _steps.live():
            was = self._start_calls.get(id(step))
            if was is None or was[0] is not step:
                continue
            if (step.stats.calls, step.stats.compiles) != was[1:]:
                self._steps.setdefault(id(step), step)
        self._start_calls = {}

    def on_compile(self, step: Any) -> None:
        self._steps.setdefault(id(step), step)

    def on_loop(self, loop: Any, entering: bool) -> None:
        if entering:
            counted = get_checks() != "off"
            self._open.append(
                _Open(
                    loop,
                    {id(s): s.stats.calls for s in _steps.live()} if counted else None,
                    observers.fetches,
                    {(v.kind, v.what, v.where): v.count for v in loop.violations},
                )
            )
            return
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].loop is loop:
                self._close(self._open.pop(i))
                return

    def _close(self, entry: _Open) -> None:
        loop = entry.loop
        live = {id(s): s for s in _steps.live()}
        calls: dict[int, int | None] = {}
        for sid, step in live.items():
            if entry.calls is None:
                if sid in self._steps:
                    calls[sid] = None
                continue
            n = step.stats.calls - entry.calls.get(sid, 0)
            if n:
                calls[sid] = n
                self._steps.setdefault(sid, step)
        violations = []
        for v in loop.violations:
            n = v.count - entry.violations.get((v.kind, v.what, v.where), 0)
            if n:
                violations.append((v.kind, v.what, v.where, n))
        opts = loop.options
        options = " ".join(
            f"{k}={opts[k]}" for k in ("transfers", "compiles", "on_violation") if k in opts
        )
        self.loops.append(
            _LoopRun(
                options,
                _names(live[s] for s in calls),
                calls,
                observers.fetches - entry.fetches,
                violations,
            )
        )

    def snapshot(self) -> Snapshot:
        """The snapshot of everything recorded."""
        return _build(list(self._steps.values()), self.loops)

