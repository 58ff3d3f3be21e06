"""Reports: what a step compiled, donated and aliased, and which contracts hold.

A :class:`Report` is plain data, built from records (never a step's private
attributes), rendered as text (``str()``) or HTML (``_repr_html_()``).
"""

from __future__ import annotations

import dataclasses
import html
import textwrap
from collections.abc import Sequence

from .._compat import capabilities, capability
from .._config import get_checks
from .._errors import VIOLATIONS, ContractError, hooked
from .._format import fmt_aval, fmt_bytes, fmt_sharding
from .._records import StepDescription, Violation, WarmupCompile
from .timing import LoopTiming

__all__ = [
    "Contract", "Report", "error_contract", "findings_html", "format_violations", "loop_report",
    "step_report",
]


_LEAF_COLUMNS = ("leaf", "spec", "sharding", "donated", "aliased", "bytes")
_VIOLATION_COLUMNS = ("kind", "where", "count", "what")


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
    key: str = ""  # the contract's key in ``_errors.CONTRACTS``
    unchecked: str = ""  # why it was not looked at (``checks level fast``): neither pass nor FAIL


def _mark(c: Contract) -> str:
    return "skip" if c.unchecked else ("pass" if c.ok else "FAIL")


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
            at checks level ``off``).
        capabilities: each private mechanism (``python -m jaxcontracts
            info``) and whether it is in force.
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
    timing: LoopTiming | None = None
    # A compiles="warmup" loop's warm-up compiles (the first of each kind).
    warmup: list[WarmupCompile] = dataclasses.field(default_factory=list)

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
        if self.violations:
            lines += format_violations(self.violations, "- violations inside the loop:")
        error = failed[0].error if failed else VIOLATIONS[self.violations[0].kind].error
        raise error("\n".join(lines))

    # -- text ------------------------------------------------------------

    def __str__(self) -> str:
        out = [f"{self.title}  [{'OK' if self.ok else 'FAILED'}]"]
        if self.rows:
            table = [_LEAF_COLUMNS] + [
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
            out += _pack(
                [f"{k} {fmt_bytes(v) if v is not None else 'n/a'}" for k, v in self.totals.items()],
                ", ",
                first="memory (per device): ",
            )
        if self.facts:
            out += _pack([f"{k}: {v}" for k, v in self.facts], " | ")
        if self.violations:
            table = [_VIOLATION_COLUMNS] + [
                (v.kind, v.where, str(v.count), v.what) for v in self.violations
            ]
            out += _align(table, right={2})
        if self.warmup:
            out.append("warm-up compiles (let through once each):")
            out += [
                f"  {w.what} at {w.where}"
                + (f" (iteration {w.iteration})" if w.iteration is not None else "")
                for w in self.warmup
            ]
        if self.timing is not None and self.timing.calls:
            out += self.timing.lines()
        for c in self.contracts:
            note = (
                f": not checked ({c.unchecked})"
                if c.unchecked
                else (f": {c.detail}" if c.detail and c.ok else "")
            )
            out += textwrap.wrap(
                f"[{_mark(c)}] {c.name}" + note,
                TEXT_WIDTH,
                initial_indent="  ",
                subsequent_indent="         ",
            )
            if not c.ok and c.detail:
                out += ["         " + line for line in c.detail.splitlines()]
        out += textwrap.wrap(
            self.capabilities_line(),
            width=TEXT_WIDTH,
            initial_indent="  ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
        return "\n".join(out)

    def capabilities_line(self) -> str:
        """The capabilities missing here and what each switches off (``""``
        where every one is in force: ``python -m jaxcontracts info`` lists them)."""
        off = [n for n, ok in self.capabilities if not ok]
        if not off:
            return ""
        named = "; ".join(f"{n} (so not checked: {capability(n).checks})" for n in off)
        return f"capabilities MISSING ({len(off)} of {len(self.capabilities)}): {named}"

    def __repr__(self) -> str:
        state = "ok" if self.ok else "FAILED"
        return f"<jc.Report {self.title} ({state}, {len(self.contracts)} contracts)>"

    # -- HTML ------------------------------------------------------------

    def _repr_html_(self) -> str:
        e = html.escape
        status = "ok" if self.ok else "failed"
        parts = [
            f'<div class="jc-report jc-{status}" style="{_CSS_BOX}">',
            f'<div style="{_CSS_TITLE}">{_code(self.title)} '
            f'<span style="{_badge(self.ok)}">{"OK" if self.ok else "FAILED"}</span></div>',
        ]
        if self.rows:
            parts += _html_leaves(self.rows)
        if self.violations:
            parts += _html_violations(self.violations)
        memory = [(k, fmt_bytes(v)) for k, v in self.totals.items()]
        for label, facts in (("memory (per device)", memory), ("", self.facts)):
            if facts:
                parts += _html_facts(label, facts)
        if self.warmup:
            lines = [f"{w.what} at {w.where}" for w in self.warmup]
            parts.append(
                f'<pre class="jc-warmup" style="{_CSS_PRE_INFO}">'
                'warm-up compiles (let through once each):\n'
                f"{e(chr(10).join(lines))}</pre>"
            )
        if self.timing is not None and self.timing.calls:
            parts.append(f'<pre class="jc-timing" style="{_CSS_PRE_INFO}">'
                         f'{e(chr(10).join(self.timing.lines()))}</pre>')
        if self.contracts:
            parts += _html_contracts(self.contracts)
        if self.capabilities_line():
            parts.append(
                f'<div class="jc-capabilities" style="{_CSS_FACTS}font-size:11px;color:{_RED};">'
                f"{e(self.capabilities_line())}</div>"
            )
        parts.append("</div>")
        return "".join(parts)


def _html_leaves(rows: Sequence[LeafRow]) -> list[str]:
    e = html.escape
    total = sum(r.nbytes for r in rows)
    donated = sum(r.nbytes for r in rows if r.donated)
    cells = [[
        (_td(), _code(r.path)), (_td(), _code(r.spec)), (_td(), e(r.sharding)),
        (_td(), "yes" if r.donated else "no"),
        (_td(color=_RED if r.aliased is False and r.donated else _FG),
         "&ndash;" if r.aliased is None else ("yes" if r.aliased else "<b>NO</b>")),
        (_td(right=True), e(fmt_bytes(r.nbytes))),
    ] for r in rows]
    foot = (
        f'<tfoot><tr style="{_CSS_TR}"><td style="{_foot()}" colspan="5">'
        f"{len(rows)} leaves, {e(fmt_bytes(donated))} donated</td>"
        f'<td style="{_foot(right=True)}">{e(fmt_bytes(total))}</td></tr></tfoot>'
    )
    return _table("jc-leaves", _LEAF_COLUMNS, "bytes", cells, foot)


def _html_violations(violations: Sequence[Violation]) -> list[str]:
    e = html.escape
    cells = [
        [(_td(), e(v.kind)), (_td(), _code(v.where, nowrap=True)), (_td(right=True), str(v.count)),
         (_PROSE, e(v.what))]
        for v in violations
    ]
    return _table("jc-violations", _VIOLATION_COLUMNS, "count", cells)


def findings_html(
    head: str, ok: bool, rows: Sequence[tuple[str, str, str, int, str, str]],
    notes: Sequence[str] = (),
) -> str:
    """A ``jc.watch()`` or audit report as HTML, styled as the other reports
    (any notebook theme): ``rows`` are (kind, function, where, count, what, fix)."""
    e = html.escape
    parts = [
        f'<div class="jc-report jc-findings jc-{"ok" if ok else "failed"}" style="{_CSS_BOX}">',
        f'<div style="{_CSS_TITLE}">{e(head)} <span style="{_badge(ok)}">'
        f'{"OK" if ok else "TO FIX"}</span></div>',
    ]
    for note in notes:
        parts.append(f'<pre class="jc-blind" style="{_CSS_PRE}">NOT CHECKED: {e(note)}</pre>')
    if rows:
        columns = ("kind", "function", "where", "count", "what, and the fix")
        cells = [
            [(_td(), e(kind)), (_td(), _code(function)), (_td(), _code(where, nowrap=True)),
             (_td(right=True), str(count)), (_PROSE, f"{e(what)}<br><b>fix:</b> {e(fix)}")]
            for kind, function, where, count, what, fix in rows
        ]
        parts += _table("jc-findings", columns, "count", cells)
    parts.append("</div>")
    return "".join(parts)


def _table(
    cls: str, headers: Sequence[str], right: str, rows: Sequence[Sequence[tuple[str, str]]],
    foot: str = "",
) -> list[str]:
    """A table: column ``right`` right-aligned; each row's cells as (style, HTML)."""
    head = "".join(f'<th style="{_th(h == right)}">{h}</th>' for h in headers)
    body = "".join(
        f'<tr style="{_tr(i)}">' + "".join(f'<td style="{st}">{c}</td>' for st, c in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    return [
        f'<table class="{cls}" style="{_CSS_TABLE}"><thead><tr style="{_CSS_TR}">{head}</tr>'
        f"</thead><tbody>{body}</tbody>{foot}</table>"
    ]


def _code(text: str, nowrap: bool = False) -> str:
    """A code chip (``nowrap``: kept on one line, whatever the theme's code style)."""
    style = _CSS_CODE + ("white-space:nowrap;" if nowrap else "")
    return f'<code style="{style}">{html.escape(text)}</code>'


def _html_facts(label: str, facts: Sequence[tuple[str, str]]) -> list[str]:
    e = html.escape
    parts = [f'<div class="jc-facts" style="{_CSS_FACTS}">']
    if label:
        parts.append(f'<span style="{_CSS_FACT}color:{_MUTED};">{label}:</span>')
    parts += [
        f'<span style="{_CSS_FACT}"><span style="color:{_MUTED};">{e(k)}</span> '
        f"<b>{e(str(v))}</b></span>"
        for k, v in facts
    ]
    parts.append("</div>")
    return parts


def _html_contracts(contracts: Sequence[Contract]) -> list[str]:
    e = html.escape
    parts = [f'<ul class="jc-contracts" style="{_CSS_LIST}">']
    for c in contracts:
        if c.unchecked:
            detail = f' <span style="color:{_MUTED};">&mdash; not checked ({e(c.unchecked)})</span>'
        elif not c.detail:
            detail = ""
        elif not c.ok and "\n" in c.detail:
            detail = f'<pre style="{_CSS_PRE}">{e(c.detail)}</pre>'
        else:
            color = _MUTED if c.ok else _RED
            detail = f' <span style="color:{color};">&mdash; {e(c.detail)}</span>'
        parts.append(
            f'<li style="{_CSS_ITEM}"><span style="{_badge(c.ok, bool(c.unchecked))}">'
            f'{_mark(c)}</span> {e(c.name)}{detail}</li>'
        )
    parts.append("</ul>")
    return parts


# The HTML must read in any notebook theme (JupyterLab right-aligns cells and
# stripes rows, dark on dark): every box, row and cell sets its own color,
# background and alignment inline (survives sanitizers that drop <style>), from
# the theme's --jp-* variables with light fallbacks; grays are translucent.
# tests/test_report.py pins these properties.
_FG = "var(--jp-content-font-color1, #1f2328)"
_MUTED = "var(--jp-content-font-color2, #57606a)"
_BG = "var(--jp-layout-color0, #ffffff)"
_RED = "var(--jp-error-color1, #b00020)"
_STRIPE = "rgba(128, 128, 128, 0.10)"
_CHIP = "rgba(128, 128, 128, 0.16)"
_LINE = "rgba(128, 128, 128, 0.35)"
_HAIR = "rgba(128, 128, 128, 0.20)"

_CSS_CODE = (
    f"font-size:12px;color:{_FG};background:{_CHIP};padding:0 4px;border-radius:3px;"
    "font-family:var(--jp-code-font-family, ui-monospace, SFMono-Regular, Menlo, Consolas, "
    "monospace);"
)
_CSS_BOX = (
    "font-family:var(--jp-ui-font-family, -apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, "
    f"sans-serif);font-size:13px;border:1px solid {_LINE};border-radius:6px;padding:10px 12px;"
    f"max-width:960px;width:fit-content;background:{_BG};color:{_FG};text-align:left;"
)
_CSS_TITLE = "font-size:14px;margin-bottom:8px;"
_CSS_TABLE = "border-collapse:collapse;margin:4px 0 8px 0;border:none;table-layout:auto;"
_CSS_TR = "background:transparent;"
_CSS_FACT = "display:inline-block;white-space:nowrap;margin-right:1.2em;"
_CSS_FACTS = "margin:2px 0;"
_CSS_LIST = "list-style:none;padding:0;margin:6px 0 0 0;"
_CSS_ITEM = f"margin:2px 0;padding:0;color:{_FG};background:transparent;"
_CSS_PRE = (
    "white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere;margin:4px 0 6px 0;"
    f"padding:6px 8px;color:{_FG};background:rgba(176, 0, 32, 0.08);"
    f"border:none;border-left:3px solid {_RED};font-size:12px;"
)

# The same block for information (a loop's timing), not a failure.
_CSS_PRE_INFO = (
    _CSS_PRE.replace("rgba(176, 0, 32, 0.08)", _STRIPE).replace(f"solid {_RED}", f"solid {_LINE}")
)


def _cell(right: bool, color: str, wrap: bool = False) -> str:
    """Alignment, colors and padding of one cell: nothing left to the theme.
    ``wrap``: a prose cell, wrapped at the box's width (others stay on one line)."""
    align = "right;font-variant-numeric:tabular-nums" if right else "left"
    space = "white-space:normal;overflow-wrap:anywhere;" if wrap else "white-space:nowrap;"
    return (
        f"text-align:{align};vertical-align:top;color:{color};background:transparent;"
        f"padding:3px 10px;line-height:1.4;{space}border:none;"
    )


def _th(right: bool = False) -> str:
    return _cell(right, _MUTED) + f"border-bottom:2px solid {_LINE};font-weight:600;font-size:12px;"


def _td(right: bool = False, color: str = _FG, wrap: bool = False) -> str:
    return _cell(right, color, wrap) + f"border-bottom:1px solid {_HAIR};font-size:13px;"


# A prose cell (`what`) wraps inside the box: a row reads within the report's width.
_PROSE = _td(wrap=True) + "min-width:24em;"


def _foot(right: bool = False) -> str:
    return _cell(right, _MUTED) + "font-weight:600;font-size:12px;"


def _tr(i: int) -> str:
    """Every row sets its background (the theme's stripes would show otherwise)."""
    return f"background:{_STRIPE if i % 2 else 'transparent'};"


def _badge(ok: bool, skipped: bool = False) -> str:
    color = "#6e7781" if skipped else ("#1a7f37" if ok else "#b00020")
    return (
        f"display:inline-block;min-width:3.2em;text-align:center;border-radius:10px;"
        f"padding:0 6px;font-size:11px;font-weight:600;color:#fff;background:{color};"
    )


#: The text report's lines fit an 80-column terminal (the leaf table's rows
#: excepted when a leaf's path or sharding is longer).
TEXT_WIDTH = 80


def _pack(items: Sequence[str], sep: str, first: str = "") -> list[str]:
    """``first + items`` joined by ``sep``, in lines of at most ``TEXT_WIDTH``: items stay whole."""
    lines = [first]
    for item in items:
        line = lines[-1]
        if line.strip() and len(line) + len(sep) + len(item) + len(sep.rstrip()) > TEXT_WIDTH:
            lines[-1] = line + sep.rstrip()
            lines.append("    " + item)
        else:
            lines[-1] = line + (sep if line.strip() and line != first else "") + item
    return lines


def _align(
    rows: Sequence[Sequence[str]], right: set[int] = frozenset()  # type: ignore[assignment]
) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ]
        lines.append("  " + "  ".join(cells).rstrip())
        if k == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


def step_report(desc: StepDescription, extra: Sequence[Contract] = ()) -> Report:
    """The report of a hot step's current signature (see ``HotStep.report``);
    what the checks level now in force does not look at is said, not passed."""
    cs = desc.current
    stats = desc.stats
    level = get_checks()
    report = Report(title=desc.name)
    report.facts = [
        ("compiles", str(stats.compiles)),
        ("compile time", f"{stats.compile_seconds * 1e3:.0f} ms"),
    ]
    if cs is not None:
        report.facts.append(("compiled", _compiled_from(cs.cache, cs.compile_seconds)))
    report.facts += [
        ("checks level", level),
        (
            "calls",
            str(stats.calls)
            + (" (calls at checks level off are not counted)" if level == "off" else ""),
        ),
        ("refused", str(stats.refused)),
        ("not consumed", str(stats.not_consumed)),
        ("donate", repr(desc.donate)),
    ]
    if cs is not None and cs.host:
        transfers = f"{stats.host_calls} call(s), {fmt_bytes(stats.host_bytes)}"
        report.facts.append(("host transfers", transfers))
    if stats.shared:
        report.facts.append((
            "shared executable",
            f"{stats.shared} new argument structure(s) took a compiled signature "
            "(functools.partial statics equal by value); each is matched on the slow path, "
            "so a partial made at every call pays that at every call: make it once",
        ))
    bare = [desc.params[i] for i in cs.donated_arrays(desc.params)] if cs is not None else []
    if bare:
        report.facts.append((
            "kept references",
            f"{', '.join(bare)}: passed as one array, donated as jax.jit donates it "
            "(no count can tell a kept copy from the name it is passed from); a later read of a "
            "copy names this step",
        ))
    if cs is not None:  # what declared contracts found in the program (its host callbacks)
        report.facts.extend(
            fact
            for c in hooked("fact")
            if c.key in cs.found
            and (fact := c.fact(cs.found[c.key])) is not None  # type: ignore[misc]
        )
    if cs is None:
        report.contracts = list(extra) or [
            Contract("compiled", False, "not compiled yet: call it or use .compile(specs)")
        ]
        return report
    report.rows = [
        LeafRow(
            leaf.path, fmt_aval(leaf.spec.shape, leaf.spec.dtype, leaf.spec.weak_type),
            fmt_sharding(leaf.spec.sharding), leaf.donated, leaf.aliased, leaf.nbytes,
        )
        for leaf in cs.leaves
    ]
    memory = ("arguments", "outputs", "aliased", "temporaries")
    report.totals = {k: getattr(cs.memory, k) for k in memory}
    failed_now = {c.key for c in extra if not c.ok}  # jc.check: this compile's failure
    report.contracts = [
        Contract((c.row or c.sentence) + suffix, ok, detail, c.error, c.key, why)
        for c in hooked("verdict")
        if c.key not in failed_now
        for ok, detail, suffix, why in [c.verdict(cs, stats)]  # type: ignore[misc]
    ] + list(extra)
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
    return Contract(err.contract_name, False, str(err), type(err), err.contract)


def loop_report(
    violations: Sequence[Violation],
    mode: str,
    warmup: Sequence[WarmupCompile] = (),
    iterations: int = 0,
    sampler_calls: int = 0,
    unchecked: dict[str, str] | None = None,
) -> Report:
    """The report of a (recording) hot loop: one contract per kind of violation.
    ``unchecked``: contract key -> why the loop did not look for it."""
    violations = list(violations)
    report = Report(title="jc.hot_loop", violations=violations)
    report.facts = [
        ("violations", str(len(violations))),
        ("events", str(sum(v.count for v in violations))),
        ("mode", mode),
        *([("iterations", str(iterations))] if iterations else []),
        *([("warm-up compiles", str(len(warmup)))] if warmup else []),
        *([("jax.random parameter copies", f"{sampler_calls} calls")] if sampler_calls else []),
    ]
    report.warmup = list(warmup)
    by_contract: dict[str, list[str]] = {}  # one row per contract (two kinds may share one)
    for kind, info in VIOLATIONS.items():
        by_contract.setdefault(info.contract, []).append(kind)
    for contract, kinds in by_contract.items():
        info = VIOLATIONS[kinds[0]]
        count = sum(v.count for v in violations if v.kind in kinds)
        detail = f"{count} event(s)" if count else ""
        why = (unchecked or {}).get(contract, "") if not count else ""
        report.contracts.append(
            Contract(info.contract_name, count == 0, detail, info.error, contract, why)
        )
    return report


def format_violations(violations: Sequence[Violation], header: str) -> list[str]:
    """The lines that list violations: ``header``, then per violation
    ``kind  file:line  xCOUNT  what``, the source line and the fix, indented."""
    kind_w = max(len(v.kind) for v in violations)
    where_w = max(len(v.where) for v in violations)
    count_w = max(len(str(v.count)) for v in violations) + 1
    lines = [header]
    for v in violations:
        lines.append(
            f"  {v.kind:<{kind_w}}  {v.where:<{where_w}}  {'x' + str(v.count):<{count_w}}  {v.what}"
        )
        if v.source:
            lines.append(f"      > {v.source}")
        if v.fix:
            lines.append(f"      Fix: {v.fix}")
    return lines
