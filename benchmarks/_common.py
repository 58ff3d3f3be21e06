"""What every benchmark shares: options, statistics, verdicts, the table.

A benchmark module builds a :class:`Result` (rows of medians and ratios,
budget lines, notes), prints it as a table and, with ``--json PATH``, writes
it for the runner (``python -m benchmarks``), which prints every benchmark's
rows as one table.

Statistics are chosen for a noisy shared machine: variants are timed in
short, adjacent, shuffled blocks, so drift hits all of them alike; a figure
is the median over repeats; ``x base`` is the ratio of medians; ``paired`` is
the median over repeats of the ratio to the base *of the same repeat*, which
cancels slow drift best; ``spread%`` is the interquartile range as a
percentage of the median. A budget is judged on the ratio of medians, and is
marked ``(uncertain)`` when a bootstrap 95 % interval of the paired ratio
straddles the limit or lies on the other side of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "Result",
    "Row",
    "format_table",
    "machine",
    "median_ci",
    "parser",
    "row",
]


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes (``--quick``, ``--json``, ``--seed``)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a few seconds")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled orders")
    return p


# --------------------------------------------------------------------------
# Statistics


def quantile(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q))


def spread_pct(xs: Sequence[float]) -> float:
    """Interquartile range as a percentage of the median."""
    med = statistics.median(xs)
    return (quantile(xs, 0.75) - quantile(xs, 0.25)) / med * 100 if med else 0.0


def median_ci(xs: Sequence[float], seed: int = 0, n_boot: int = 2000) -> tuple[float, float]:
    """Bootstrap 95 % interval of the median of ``xs``."""
    a = np.asarray(xs, dtype=float)
    if len(a) < 2:
        return float(a[0]), float(a[0])
    idx = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
    meds = np.median(a[idx], axis=1)
    return float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


@dataclasses.dataclass
class Row:
    """One line of the table: a variant's median, and how it compares."""

    case: str  # e.g. "10 leaves"
    variant: str
    median: float | None  # None: not measured (see note)
    unit: str
    x_base: float | None = None  # ratio of medians to the case's base variant
    x_jit: float | None = None  # ratio of medians to jax.jit, where there is one
    paired: float | None = None  # median of per-repeat ratios to the base
    spread: float | None = None  # IQR, % of the median
    n: int = 0  # samples
    note: str = ""


def row(
    case: str,
    variant: str,
    samples: Sequence[float] | None,
    unit: str,
    base: Sequence[float] | None = None,
    jit: Sequence[float] | None = None,
    note: str = "",
) -> Row:
    """A :class:`Row` from raw samples (same length as ``base`` for pairing)."""
    if not samples:
        return Row(case, variant, None, unit, note=note or "not measured")
    med = statistics.median(samples)
    r = Row(case, variant, med, unit, spread=spread_pct(samples), n=len(samples), note=note)
    if base:
        r.x_base = med / statistics.median(base)
        if len(base) == len(samples):
            r.paired = statistics.median([a / b for a, b in zip(samples, base)])
    if jit:
        r.x_jit = med / statistics.median(jit)
    return r


# --------------------------------------------------------------------------
# Results


@dataclasses.dataclass
class Result:
    """What one benchmark process reports."""

    benchmark: str
    title: str
    rows: list[Row] = dataclasses.field(default_factory=list)
    budgets: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def check_clean(self, label: str, step: Any) -> None:
        """Note (and print) a hot step that compiled more than once or refused calls.

        A benchmark is only meaningful if every timed call took the steady path.
        """
        st = step.stats
        if st.compiles != 1 or st.refused or st.not_consumed:
            warning = f"WARNING: {label}: {st}"
            self.notes.append(warning)
            print(warning, file=sys.stderr)

    def budget(
        self,
        line: str,
        value: float | None,
        limit: float,
        paired: Sequence[float] | None = None,
        seed: int = 0,
        why: str = "",
    ) -> dict[str, Any]:
        """Add a budget line ``value <= limit``, judged on ``value``.

        ``paired`` (per-repeat ratios) gives the bootstrap interval that marks
        the verdict uncertain when it straddles the limit or disagrees.
        """
        b: dict[str, Any] = {"benchmark": self.benchmark, "line": line, "limit": limit,
                             "value": value, "why": why}
        if value is None:
            b.update(verdict="not run", met=None, uncertain=False)
            self.budgets.append(b)
            return b
        met = value <= limit
        uncertain = False
        if paired:
            lo, hi = median_ci(paired, seed)
            b.update(paired=statistics.median(paired), ci=[lo, hi])
            uncertain = (lo <= limit) != met or (hi <= limit) != met
        b.update(met=met, uncertain=uncertain,
                 verdict=("met" if met else "missed") + (" (uncertain)" if uncertain else ""))
        self.budgets.append(b)
        return b

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> Result:
        rows = [Row(**r) for r in d.get("rows", [])]
        return Result(
            benchmark=d["benchmark"],
            title=d.get("title", ""),
            rows=rows,
            budgets=list(d.get("budgets", [])),
            notes=list(d.get("notes", [])),
            meta=dict(d.get("meta", {})),
            seconds=float(d.get("seconds", 0.0)),
        )

    def emit(self, args: argparse.Namespace) -> None:
        """Print this benchmark's table and budgets; write JSON if asked."""
        print(format_table([self]))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=1)


# --------------------------------------------------------------------------
# The table


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _fmt_median(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    if unit.startswith("x"):
        return f"{x:.3f}"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def format_table(results: Sequence[Result]) -> str:
    """One aligned table of every row, then every budget line."""
    head = ("benchmark", "case", "variant", "median", "unit", "x base", "x jit",
            "paired", "spread%", "n", "note")
    lines: list[tuple[str, ...]] = []
    for res in results:
        for r in res.rows:
            lines.append((
                res.benchmark, r.case, r.variant, _fmt_median(r.median, r.unit), r.unit,
                _fmt(r.x_base, ".3f"), _fmt(r.x_jit, ".3f"), _fmt(r.paired, ".3f"),
                _fmt(r.spread, ".0f"), str(r.n) if r.n else "", r.note,
            ))
    widths = [max([len(h)] + [len(x[i]) for x in lines]) for i, h in enumerate(head)]
    right = {3, 5, 6, 7, 8, 9}

    def fmt_line(cells: tuple[str, ...]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    text = [fmt_line(head), "-" * len(fmt_line(head))]
    previous: tuple[str, str] | None = None
    for x in lines:
        key = (x[0], x[1])
        if previous is not None and key != previous:
            text.append("")
        previous = key
        text.append(fmt_line(x))
    budgets = [b for res in results for b in res.budgets]
    if budgets:
        text.append("")
        text.append("budgets:")
        for b in budgets:
            value = "-" if b.get("value") is None else f"{b['value']:.3f}"
            extra = ""
            if "ci" in b:
                extra = f"  paired {b['paired']:.3f} [95% {b['ci'][0]:.3f}, {b['ci'][1]:.3f}]"
            margin = ""
            if b.get("value") is not None:
                pct = (b["value"] / b["limit"] - 1) * 100
                margin = f"  ({'over' if pct > 0 else 'under'} by {abs(pct):.1f}%)"
            text.append(f"  [{b['verdict']}] {b['line']}: {value} (limit {b['limit']:g}){margin}{extra}")
            if b.get("why"):
                text.append(f"      {b['why']}")
    notes = [f"{res.benchmark}: {n}" for res in results for n in res.notes]
    if notes:
        text.append("")
        text.append("notes:")
        text.extend(f"  {n}" for n in notes)
    return "\n".join(text)


# --------------------------------------------------------------------------
# The machine


def machine() -> dict[str, Any]:
    """Date, machine and versions, for the table's header."""
    import jax

    import jaxcontracts as jc

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    versions = {"python": platform.python_version(), "jax": jax.__version__,
                "jaxcontracts": jc.__version__, "numpy": np.__version__}
    for name in ("jaxtyping", "beartype", "equinox", "chex"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1) if mem_gib else None,
        "os": platform.platform(terse=True),
        "device": str(jax.devices()[0]),
        "versions": versions,
    }


def donated_block(v: Any, calls: int) -> float:
    """Time ``calls`` calls ``s = v.fn(s, **kwargs)`` (``v.kwargs``, if any), then
    one ``block_until_ready``; return microseconds per call.

    ``v`` has ``fn``, ``state`` and ``level`` (a ``jc.set_checks`` level to set
    first, which switches a hot step's call path; None: leave it). The state
    is held only by the loop's variable while it runs, so donation can
    consume it and the kept-leaf check sees no other reference; garbage
    collection is off inside the clock.
    """
    import jax  # here: the runner imports this module without starting JAX

    import jaxcontracts as jc

    if v.level is not None:
        jc.set_checks(v.level)
    f, kw = v.fn, getattr(v, "kwargs", None)
    assert f is not None
    s = v.state
    v.state = None
    gc.disable()
    try:
        t0 = time.perf_counter()
        if kw:
            for _ in range(calls):
                s = f(s, **kw)
        else:
            for _ in range(calls):
                s = f(s)
        jax.block_until_ready(s)
        t1 = time.perf_counter()
    finally:
        gc.enable()
    v.state = s
    return (t1 - t0) / calls * 1e6
