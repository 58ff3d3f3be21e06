"""Reports: what a step compiled, donated and aliased, and which contracts hold.

A :class:`Report` is plain data with two renderings: ``str()`` gives an
aligned text table for terminals, ``_repr_html_()`` a self-contained HTML table
for notebooks. ``jc.check(step, *args)`` builds one without raising;
``HotStep.report()`` describes what a step has compiled so far;
``HotLoop.report()`` lists a recording loop's violations.

Reports are built from records (``step.describe()``, a loop's violations),
never from a step's private attributes, and every report lists the
capabilities in force (see ``_compat``).
"""

from __future__ import annotations

import dataclasses
import html
import textwrap
from collections.abc import Sequence

from ._compat import capabilities
from ._errors import CONTRACTS, ContractError, DonationError, RecompileError, TransferError
from ._format import fmt_aval, fmt_bytes, fmt_sharding
from ._records import StepDescription, Violation
from ._timing import LoopTiming

__all__ = ["Contract", "LeafRow", "Report", "loop_report", "step_report"]


@dataclasses.dataclass(frozen=True)
class LeafRow:
    """One flat argument leaf of a compiled step."""

    path: str
    spec: str
    sharding: str
    donated: bool
    aliased: bool | None  # None: not verified
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Contract:
    """One contract and whether it holds."""

    name: str
    ok: bool
    detail: str = ""
    error: type[ContractError] = ContractError


@dataclasses.dataclass
class Report:
    """A step's or a loop's contracts, in a form for terminals and notebooks.

    Attributes:
        title: what the report is about (``module.step`` or ``jc.hot_loop``).
        rows: per-leaf rows (steps only).
        totals: byte totals from the compiled executable's memory analysis.
        facts: other figures, as (label, value) pairs.
        contracts: each contract with pass/fail and its message.
        violations: a recording loop's violations.
        timing: a loop's :class:`jc.LoopTiming` (None for a step, or a loop
            at checks level ``off``): steps per second, host time per call,
            time blocked on the device, and the verdict.
        capabilities: each private mechanism (see ``python -m jaxcontracts
            info``) and whether it is in force on the installed versions.
    """

    title: str
    rows: list[LeafRow] = dataclasses.field(default_factory=list)
    totals: dict[str, int | None] = dataclasses.field(default_factory=dict)
    facts: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    contracts: list[Contract] = dataclasses.field(default_factory=list)
    violations: list[Violation] = dataclasses.field(default_factory=list)
    capabilities: list[tuple[str, bool]] = dataclasses.field(
        default_factory=lambda: [(c.name, c.available) for c in capabilities()]
    )
    # A loop's timing section (``HotLoop.report``): where the time went.
    timing: LoopTiming | None = None

    @property
    def ok(self) -> bool:
        """Whether every contract holds (and a loop saw no violation)."""
        return all(c.ok for c in self.contracts) and not self.violations

    def raise_for_failures(self) -> None:
        """Raise the failing contracts' error (their messages joined).

        Raises:
            ContractError: the subclass of the first failing contract.
        """
        __tracebackhide__ = True
        failed = [c for c in self.contracts if not c.ok]
        if not failed and not self.violations:
            return
        lines = [f"{self.title}: {len(failed) + len(self.violations)} contract failure(s)"]
        lines += [f"- {c.name}: {c.detail}" for c in failed]
        lines += [f"- {v.kind} at {v.where} (x{v.count}): {v.what}" for v in self.violations]
        error = failed[0].error if failed else _VIOLATION_ERRORS.get(self.violations[0].kind, ContractError)
        raise error("\n".join(lines))

    # -- text ------------------------------------------------------------

    def __str__(self) -> str:
        out = [f"{self.title}  [{'OK' if self.ok else 'FAILED'}]"]
        if self.rows:
            header = ("leaf", "spec", "sharding", "donated", "aliased", "bytes")
            table = [header] + [
                (
                    r.path,
                    r.spec,
                    r.sharding,
                    "yes" if r.donated else "no",
                    "-" if r.aliased is None else ("yes" if r.aliased else "NO"),
                    fmt_bytes(r.nbytes),
                )
                for r in self.rows
            ]
            out += _align(table, right={5})
        if self.totals:
            out.append(
                "memory (per device): "
                + ", ".join(f"{k} {fmt_bytes(v) if v is not None else 'n/a'}" for k, v in self.totals.items())
            )
        if self.facts:
            out.append(" | ".join(f"{k}: {v}" for k, v in self.facts))
        if self.violations:
            table = [("kind", "where", "count", "what")] + [
                (v.kind, v.where, str(v.count), v.what) for v in self.violations
            ]
            out += _align(table, right={2})
        if self.timing is not None and self.timing.calls:
            out += self.timing.lines()
        for c in self.contracts:
            mark = "pass" if c.ok else "FAIL"
            out.append(f"  [{mark}] {c.name}" + (f": {c.detail}" if c.detail and c.ok else ""))
            if not c.ok and c.detail:
                out += ["         " + line for line in c.detail.splitlines()]
        out += textwrap.wrap(
            self.capabilities_line(),
            width=88,
            initial_indent="  ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
        return "\n".join(out)

    def capabilities_line(self) -> str:
        """``capabilities in force (12/12): a, b, ...; missing: ...``."""
        on = [n for n, ok in self.capabilities if ok]
        off = [n for n, ok in self.capabilities if not ok]
        text = f"capabilities in force ({len(on)}/{len(self.capabilities)}): " + ", ".join(on)
        return text + (f"; MISSING: {', '.join(off)}" if off else "")

    def __repr__(self) -> str:
        state = "ok" if self.ok else "FAILED"
        return f"<jc.Report {self.title} ({state}, {len(self.contracts)} contracts)>"

    # -- HTML ------------------------------------------------------------

    def _repr_html_(self) -> str:
        e = html.escape
        status = "ok" if self.ok else "failed"
        parts = [
            f'<div class="jc-report jc-{status}" style="{_CSS_BOX}">',
            f'<div style="{_CSS_TITLE}"><code>{e(self.title)}</code> '
            f'<span style="{_badge(self.ok)}">{"OK" if self.ok else "FAILED"}</span></div>',
        ]
        if self.rows:
            total = sum(r.nbytes for r in self.rows)
            donated = sum(r.nbytes for r in self.rows if r.donated)
            parts.append(f'<table class="jc-leaves" style="{_CSS_TABLE}"><thead><tr>')
            for h, right in (("leaf", 0), ("spec", 0), ("sharding", 0), ("donated", 0), ("aliased", 0), ("bytes", 1)):
                parts.append(f'<th style="{_CSS_TH}{"text-align:right;" if right else ""}">{h}</th>')
            parts.append("</tr></thead><tbody>")
            for i, r in enumerate(self.rows):
                shade = _CSS_ODD if i % 2 else ""
                aliased = "&ndash;" if r.aliased is None else ("yes" if r.aliased else "<b>NO</b>")
                alias_style = "" if r.aliased is not False or not r.donated else "color:#b00020;"
                parts.append(
                    f'<tr style="{shade}"><td style="{_CSS_TD}"><code style="{_CSS_CODE}">{e(r.path)}</code></td>'
                    f'<td style="{_CSS_TD}"><code style="{_CSS_CODE}">{e(r.spec)}</code></td>'
                    f'<td style="{_CSS_TD}">{e(r.sharding)}</td>'
                    f'<td style="{_CSS_TD}">{"yes" if r.donated else "no"}</td>'
                    f'<td style="{_CSS_TD}{alias_style}">{aliased}</td>'
                    f'<td style="{_CSS_TD}text-align:right;font-variant-numeric:tabular-nums;">'
                    f"{e(fmt_bytes(r.nbytes))}</td></tr>"
                )
            parts.append(
                f'</tbody><tfoot><tr><td style="{_CSS_FOOT}" colspan="5">'
                f"{len(self.rows)} leaves, {e(fmt_bytes(donated))} donated</td>"
                f'<td style="{_CSS_FOOT}text-align:right;">{e(fmt_bytes(total))}</td></tr></tfoot></table>'
            )
        if self.violations:
            parts.append(f'<table class="jc-violations" style="{_CSS_TABLE}"><thead><tr>')
            for h in ("kind", "where", "count", "what"):
                parts.append(f'<th style="{_CSS_TH}">{h}</th>')
            parts.append("</tr></thead><tbody>")
            for i, v in enumerate(self.violations):
                shade = _CSS_ODD if i % 2 else ""
                parts.append(
                    f'<tr style="{shade}"><td style="{_CSS_TD}">{e(v.kind)}</td>'
                    f'<td style="{_CSS_TD}"><code>{e(v.where)}</code></td>'
                    f'<td style="{_CSS_TD}text-align:right;">{v.count}</td>'
                    f'<td style="{_CSS_TD}">{e(v.what)}</td></tr>'
                )
            parts.append("</tbody></table>")
        memory = [(k, fmt_bytes(v)) for k, v in self.totals.items()]
        for label, facts in (("memory (per device)", memory), ("", self.facts)):
            if not facts:
                continue
            parts.append(f'<div class="jc-facts" style="{_CSS_FACTS}">')
            if label:
                parts.append(f'<span style="{_CSS_FACT}color:#57606a;">{label}:</span>')
            parts += [
                f'<span style="{_CSS_FACT}"><span style="color:#57606a;">{e(k)}</span> '
                f"<b>{e(str(v))}</b></span>"
                for k, v in facts
            ]
            parts.append("</div>")
        if self.timing is not None and self.timing.calls:
            parts.append(f'<pre class="jc-timing" style="{_CSS_PRE}">'
                         f'{e(chr(10).join(self.timing.lines()))}</pre>')
        if self.contracts:
            parts.append('<ul class="jc-contracts" style="list-style:none;padding:0;margin:6px 0 0 0;">')
            for c in self.contracts:
                if not c.detail:
                    detail = ""
                elif not c.ok and "\n" in c.detail:
                    detail = f'<pre style="{_CSS_PRE}">{e(c.detail)}</pre>'
                else:
                    color = "#57606a" if c.ok else "#b00020"
                    detail = f' <span style="color:{color};">&mdash; {e(c.detail)}</span>'

                parts.append(
                    f'<li style="margin:2px 0;"><span style="{_badge(c.ok)}">'
                    f'{"pass" if c.ok else "FAIL"}</span> {e(c.name)}{detail}</li>'
                )
            parts.append("</ul>")
        color = "#57606a" if all(ok for _, ok in self.capabilities) else "#b00020"
        parts.append(
            f'<div class="jc-capabilities" style="{_CSS_FACTS}font-size:11px;color:{color};">'
            f"{e(self.capabilities_line())}</div>"
        )
        parts.append("</div>")
        return "".join(parts)


_VIOLATION_ERRORS: dict[str, type[ContractError]] = {
    "transfer": TransferError,
    "compile": RecompileError,
    "donation": DonationError,
}

_CSS_CODE = "font-size:12px;"
_CSS_BOX = (
    "font-family:-apple-system,BlinkMacSystemFont,'Segoe UI',Roboto,sans-serif;"
    "font-size:13px;border:1px solid #d0d7de;border-radius:6px;padding:10px 12px;"
    "max-width:960px;width:fit-content;background:#fff;color:#1f2328;"
)
_CSS_TITLE = "font-size:14px;margin-bottom:8px;"
_CSS_TABLE = "border-collapse:collapse;margin:4px 0 8px 0;"
_CSS_TH = (
    "text-align:left;padding:3px 10px;border-bottom:2px solid #d0d7de;font-weight:600;"
    "font-size:12px;color:#57606a;"
)
_CSS_TD = "padding:3px 10px;border-bottom:1px solid #eaeef2;font-size:13px;"
_CSS_FACT = "display:inline-block;white-space:nowrap;margin-right:1.2em;"
_CSS_ODD = "background:#f6f8fa;"
_CSS_FOOT = "padding:3px 10px;font-size:12px;color:#57606a;font-weight:600;"
_CSS_FACTS = "margin:2px 0;"
_CSS_PRE = (
    "white-space:pre-wrap;margin:4px 0 6px 0;padding:6px 8px;background:#fff5f5;"
    "border-left:3px solid #b00020;font-size:12px;"
)


def _badge(ok: bool) -> str:
    color = "#1a7f37" if ok else "#b00020"
    return (
        f"display:inline-block;min-width:3.2em;text-align:center;border-radius:10px;"
        f"padding:0 6px;font-size:11px;font-weight:600;color:#fff;background:{color};"
    )


def _align(rows: Sequence[Sequence[str]], right: set[int] = frozenset()) -> list[str]:  # type: ignore[assignment]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
        if k == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


# --------------------------------------------------------------------------
# Builders



def step_report(desc: StepDescription, extra: Sequence[Contract] = ()) -> Report:
    """The report of a hot step's current signature (see ``HotStep.report``)."""
    cs = desc.current
    stats = desc.stats
    report = Report(title=desc.name)
    report.facts = [
        ("compiles", str(stats.compiles)),
        ("compile time", f"{stats.compile_seconds * 1e3:.0f} ms"),
        *(
            [("compiled", _compiled_from(cs.cache, cs.compile_seconds))]
            if cs is not None
            else []
        ),
        ("calls", str(stats.calls)),
        ("refused", str(stats.refused)),
        ("not consumed", str(stats.not_consumed)),
        ("donate", repr(desc.donate)),
    ]
    if cs is None:
        report.contracts = list(extra) or [
            Contract("compiled", False, "not compiled yet: call it or use .compile(specs)")
        ]
        return report
    for leaf in cs.leaves:
        report.rows.append(
            LeafRow(
                path=leaf.path,
                spec=fmt_aval(leaf.spec.shape, leaf.spec.dtype, leaf.spec.weak_type),
                sharding=fmt_sharding(leaf.spec.sharding),
                donated=leaf.donated,
                aliased=leaf.aliased,
                nbytes=leaf.nbytes,
            )
        )
    report.totals = {
        "arguments": cs.memory.arguments,
        "outputs": cs.memory.outputs,
        "aliased": cs.memory.aliased,
        "temporaries": cs.memory.temporaries,
    }
    missing = [leaf.path for leaf in cs.leaves if leaf.donated and leaf.aliased is False]
    unverified = cs.donated and cs.aliased is None
    n_donated = len(cs.donated)
    report.contracts = [
        Contract(CONTRACTS["carry"], True),
        Contract(
            f"{CONTRACTS['aliasing']} ({n_donated} leaves donated)",
            not missing and not unverified,
            "not aliased: " + ", ".join(missing)
            if missing
            else ("not verified: the executable's alias table could not be read" if unverified else ""),
            DonationError,
        ),
        Contract(
            "no call refused (recompile, transfer or donation)",
            stats.refused == 0,
            f"{stats.refused} call(s) refused" if stats.refused else "",
            RecompileError,
        ),
        Contract(
            CONTRACTS["consumed"],
            stats.not_consumed == 0,
            f"{stats.not_consumed} call(s) where XLA copied instead" if stats.not_consumed else "",
            DonationError,
        ),
        *extra,
    ]
    return report


def _compiled_from(cache: str | None, seconds: float) -> str:
    """Where the current signature's executable came from, and how long it took."""
    ms = f"{seconds * 1e3:.0f} ms"
    return {
        "hit": f"from the persistent compilation cache ({ms}, contracts verified)",
        "miss": f"by XLA, stored in the persistent compilation cache ({ms})",
        "off": f"by XLA ({ms}; persistent compilation cache not used)",
    }.get(cache or "", f"by XLA ({ms}; cache use unknown)")


def error_contract(err: ContractError) -> Contract:
    """A failed contract from a contract error, read from its fields."""
    return Contract(err.contract_name, False, str(err), type(err))


def loop_report(violations: Sequence[Violation], mode: str) -> Report:
    """The report of a (recording) hot loop."""
    violations = list(violations)
    report = Report(title="jc.hot_loop", violations=violations)
    counts = {k: sum(v.count for v in violations if v.kind == k) for k in ("transfer", "compile", "donation")}
    report.facts = [
        ("violations", str(len(violations))),
        ("events", str(sum(v.count for v in violations))),
        ("mode", mode),
    ]
    report.contracts = [
        Contract(CONTRACTS["no-transfer"], counts["transfer"] == 0, _n(counts["transfer"]), TransferError),
        Contract(CONTRACTS["no-compile"], counts["compile"] == 0, _n(counts["compile"]), RecompileError),
        Contract(CONTRACTS["no-donated-use"], counts["donation"] == 0, _n(counts["donation"]), DonationError),
    ]
    return report


def _n(count: int) -> str:
    return f"{count} event(s)" if count else ""
