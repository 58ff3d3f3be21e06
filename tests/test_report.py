"""jc.check, jc.Report, HotStep.report and HotLoop.report."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import CPU_SIZES, Particles, advance_fn, make_particles

import jaxcontracts as jc


class _Tables(HTMLParser):
    """Collect every table as (class, header cells, rows of cells)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[str], list[list[str]]]] = []
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_head = False
        self._in_foot = False
        self.footers: list[list[str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append((dict(attrs).get("class", ""), [], []))
        elif tag == "thead":
            self._in_head = True
        elif tag in ("tbody", "tfoot"):
            self._in_head = False
            self._in_foot = tag == "tfoot"
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            _, head, rows = self.tables[-1]
            if self._in_head:
                head.extend(self._row)
            elif self._in_foot:
                self.footers.append(self._row)
            else:
                rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _tables(html: str, footers: list | None = None):
    parser = _Tables()
    parser.feed(html)
    if footers is not None:
        footers.extend(parser.footers)
    return parser.tables


@pytest.mark.cpu_only(CPU_SIZES)
def test_step_report_text_and_html():
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles(16))
    advance(p)
    report = advance.report()
    assert report.ok
    text = str(report)
    assert text.splitlines()[0] == "helpers.advance_fn  [OK]"
    assert "p.pos  f32[16,3]" in text and "192 B" in text
    assert "calls: 2" in text and "[pass] donation verified in the executable (3 leaves donated)" in text
    assert "memory (per device): arguments 388 B, outputs " in text and "aliased 388 B" in text
    footers: list = []
    (cls, head, rows), = _tables(report._repr_html_(), footers)
    assert cls == "jc-leaves"
    assert footers == [["3 leaves, 388 B donated", "388 B"]]
    assert head == ["leaf", "spec", "sharding", "donated", "aliased", "bytes"]
    assert [r[0] for r in rows] == ["p.pos", "p.vel", "p.t"]
    assert all(r[3] == "yes" and r[4] == "yes" for r in rows)
    assert "FAIL" not in report._repr_html_()


def test_check_reports_failures_without_raising():
    @jc.hot_step
    def counter(s: dict) -> dict:
        return {"x": s["x"] + 1, "t": s["t"] + 1.0}

    report = jc.check(counter, {"x": jnp.zeros(3), "t": jnp.int32(0)})
    assert not report.ok
    (failed,) = [c for c in report.contracts if not c.ok]
    assert failed.name.startswith("carry invariance") and "['t']: takes i32[]" in failed.detail
    assert "[FAIL] carry invariance" in str(report)
    assert "<pre" in report._repr_html_() and "FAIL" in report._repr_html_()
    with pytest.raises(jc.RecompileError, match=r"\['t'\]"):
        report.raise_for_failures()
    good = jc.check(jc.hot_step(advance_fn, signature=Particles), Particles.spec(n=4))
    assert good.ok
    good.raise_for_failures()


@pytest.mark.parametrize(
    ("args", "got"),
    [((), "nothing"), ((3,), "int"), (({"x": 1},), "dict")],
    ids=["no-arguments", "an-int", "a-dict"],
)
def test_check_never_raises_on_misuse(args, got):
    report = jc.check(*args)
    assert not report.ok
    (failed,) = [c for c in report.contracts if not c.ok]
    assert f"jc.check() takes a jc.hot_step, got {got}" in failed.detail
    assert "Fix: pass the step and its arguments or specs" in failed.detail
    assert failed.error is jc.DefinitionError


def test_report_counts_refused_and_not_consumed_calls(without_kept_check):
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with pytest.raises(jc.RecompileError):
        advance(make_particles(5))
    view = np.asarray(p.pos)
    with pytest.raises(jc.DonationError):
        advance(p)
    del view
    report = advance.report()
    assert not report.ok
    failed = {c.name for c in report.contracts if not c.ok}
    assert failed == {
        "no call refused (recompile, transfer or donation)",
        "every donated input consumed (XLA did not copy)",
    }


def test_loop_report():
    x = jnp.arange(3.0)
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(2):
            np.asarray(x)
    report = loop.report()
    assert not report.ok
    text = str(report)
    assert "[FAIL] no implicit transfers" in text and "[pass] no compiles" in text
    (cls, head, rows), = _tables(report._repr_html_())
    assert cls == "jc-violations" and head == ["kind", "where", "count", "what"]
    assert rows[0][0] == "transfer" and rows[0][2] == "2" and "test_report.py:" in rows[0][1]
    with pytest.raises(jc.TransferError, match="test_report.py"):
        report.raise_for_failures()


def test_what_no_call_looked_at_is_skip_not_pass():
    # at fast XLA copying a donated input is not looked for, at off no call is
    # looked at, and a loop entered at off only checks nothing: the reports said
    # "[pass]" (and "calls: 0"), as if they had looked. What is said comes from
    # the calls (a report read at another level says the same).
    advance = jc.hot_step(advance_fn)
    with jc.checks_level("fast"):
        p = advance(advance(make_particles()))

    def flat(report: object) -> str:  # (its lines wrapped at 80 columns)
        return " ".join(str(report).split())

    text = flat(advance.report())
    assert "[skip] every donated input consumed (XLA did not copy): not checked (no call was made at checks level full)" in text
    assert "[pass] no call refused" in text and "checks level: full" in text
    assert ">skip</span>" in advance.report()._repr_html_()
    with jc.checks_level("off"):
        assert flat(advance.report()) == text.replace("checks level: full | calls: 2", "checks level: off | calls: 2 (calls at checks level off are not counted)")
    p = advance(p)  # one call at full
    assert "every donated input consumed (XLA did not copy): 1 of 3 calls looked at (checks level full)" in flat(advance.report())
    with jc.checks_level("off"), jc.hot_loop(on_violation="record") as loop:
        jnp.ones(3).sum().item()
    loop_text = flat(loop.report())
    assert "[pass]" not in loop_text and "[skip] no implicit transfers: not checked (entered at checks level off only)" in loop_text
    with loop:  # entered at full once: what it looked at there passes
        pass
    assert "[pass] no implicit transfers" in flat(loop.report())
    with jc.hot_loop(on_violation="record", transfers="allow") as loop:
        pass
    assert '[skip] no implicit transfers: not checked (transfers="allow")' in flat(loop.report())


def test_importing_jaxcontracts_does_not_initialise_a_backend():
    code = (
        "import os, jaxcontracts\n"
        "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3'\n"
        "import jax; print(len(jax.devices()))"
    )
    env = {"PATH": "", "JAX_PLATFORMS": "cpu"}
    if "PYTHONPATH" in os.environ:  # where jax itself is found on some hosts
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "3", out.stderr


class _Styles(HTMLParser):
    """Every element's tag and parsed inline style, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        style = dict(attrs).get("style") or ""
        decls = (d.split(":", 1) for d in style.split(";") if ":" in d)
        self.elements.append((tag, {k.strip(): v.strip() for k, v in decls}))


def _styled(report: jc.Report) -> list[tuple[str, dict[str, str]]]:
    parser = _Styles()
    parser.feed(report._repr_html_())
    return parser.elements


def _reports() -> list[jc.Report]:
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles(4))
    x = jnp.arange(3.0)
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(2):
            p = advance(p)  # timed: the loop report gets a timing section
            np.asarray(x)

    @jc.hot_step
    def counter(s: dict) -> dict:
        return {"t": s["t"] + 1.0}

    failed = jc.check(counter, {"t": jnp.int32(0)})
    assert loop.report().timing is not None and loop.report().timing.calls == 2
    return [advance.report(), loop.report(), failed]


def test_html_reads_in_light_and_dark_notebook_themes():
    # JupyterLab's stylesheet right-aligns cells and stripes rows (black in its
    # dark theme); a light background with the theme's light text hid rows.
    # Checked by screenshots of nbconvert's lab template, light and dark; these
    # are the properties that made both read.
    for report in _reports():
        elements = _styled(report)
        tag, box = elements[0]
        assert tag == "div"
        # The box's text and background follow the theme together, with a
        # light pair of fallbacks where there are no theme variables.
        assert box["color"] == "var(--jp-content-font-color1, #1f2328)"
        assert box["background"] == "var(--jp-layout-color0, #ffffff)"
        cells = [(t, s) for t, s in elements if t in ("td", "th")]
        rows = [s for t, s in elements if t == "tr"]
        assert cells or not report.rows
        for t, s in cells:
            # Every cell sets its alignment, colour and background itself.
            assert s["text-align"] in ("left", "right"), (t, s)
            assert s["color"].startswith("var(--jp-"), (t, s)
            assert s["background"] == "transparent", (t, s)
        for s in rows:
            # Every row sets its background: transparent or a translucent
            # gray stripe that reads over light and dark boxes alike.
            assert s["background"] == "transparent" or s["background"].startswith("rgba(128, 128, 128,")
        for t, s in elements:
            for key in ("background", "color", "border-left", "border-bottom", "border"):
                value = s.get(key, "")
                # A fixed colour is only a fallback inside var(), a translucent
                # one, or the badges' white on a saturated green/red.
                if "#" in value and "var(" not in value:
                    assert t == "span" and s.get("font-weight") == "600", (t, key, value)
        pre = [s for t, s in elements if t == "pre"]
        if report.timing is not None and report.timing.calls:
            assert any("rgba(128, 128, 128" in s["border-left"] for s in pre)  # timing is no failure
        for s in pre:
            assert s["color"].startswith("var(--jp-") and s["background"].startswith("rgba(")
            assert s["word-break"] == "normal"  # JupyterLab breaks words in <pre> otherwise
    leaves = _styled(_reports()[0])
    aligns = [s["text-align"] for t, s in leaves if t == "th"]
    assert aligns == ["left"] * 5 + ["right"]  # leaf ... aliased, then bytes


def test_a_violation_row_reads_within_the_box_width():
    """Issue 21: in JupyterLab the `where` chip wrapped "Cell In[4], line 8" over
    three lines, and `what` ran past the right edge behind a scroll bar. Checked
    by headless-Chromium screenshots (light and dark, with JupyterLab's
    `code {white-space: pre-wrap; word-break: break-all}`); these are the
    properties that made a row read on one screen width."""
    loop_report = _reports()[1]
    assert loop_report.violations
    elements = _styled(loop_report)
    table = elements[next(i for i, (t, _) in enumerate(elements) if t == "table"):]  # the violations
    codes = [s for t, s in table if t == "code"]
    cells = [s for t, s in table if t == "td"]
    assert codes and all(s["white-space"] == "nowrap" for s in codes)  # the chip itself, not its cell
    prose = [s for s in cells if s["white-space"] == "normal"]
    assert prose and all(s["overflow-wrap"] == "anywhere" for s in prose)  # `what` wraps in the box
    assert "max-width" in elements[0][1]  # the box bounds the table's width


def test_text_lines_are_packed_into_80_columns():
    from jaxcontracts._report.render import _pack

    items = [f"item{i}: {'x' * 9}" for i in range(12)]
    lines = _pack(items, " | ", first="facts: ")
    assert len(lines) > 1 and max(len(line) for line in lines) <= 80, lines
    assert " | ".join(line.strip().removesuffix(" |") for line in lines) == "facts: " + " | ".join(items)
    assert _pack(["a", "b"], ", ") == ["a, b"]


def test_a_failed_carry_in_check_replaces_the_passing_row_of_an_earlier_signature():
    @jc.hot_step(max_compiles=2)
    def counter(s: dict) -> dict:
        return {"x": s["x"] + 1, "t": s["t"] + 1.0}

    counter.compile({"x": jnp.zeros(3), "t": jnp.float32(0)})  # carries: a passing row
    report = jc.check(counter, {"x": jnp.zeros(3), "t": jnp.int32(0)})
    carry = [c for c in report.contracts if c.name.startswith("carry invariance")]
    assert len(carry) == 1 and not carry[0].ok and carry[0].error is jc.RecompileError


def test_loop_report_rows_come_from_the_violation_table():
    from jaxcontracts._errors import VIOLATIONS

    x = jnp.arange(3.0)
    with jc.hot_loop(on_violation="record") as loop:
        float(x[0])
    rows = {c.name: c for c in loop.report().contracts}
    # one row per contract, in the table's order (two kinds may share a contract)
    names = list(dict.fromkeys(k.contract_name for k in VIOLATIONS.values()))
    assert [c.name for c in loop.report().contracts] == names
    for kind in VIOLATIONS.values():
        assert rows[kind.contract_name].error is kind.error
    assert not rows[VIOLATIONS["transfer"].contract_name].ok
    assert rows[VIOLATIONS["compile"].contract_name].ok


def test_raise_for_failures_lists_violations_as_the_pytest_plugin_does():
    x = jnp.float32(2.0)
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(3):
            float(x)  # READ
    with pytest.raises(jc.TransferError) as info:
        loop.report().raise_for_failures()
    lines = str(info.value).splitlines()
    assert lines[1] == "- no implicit transfers: 3 event(s)"  # the failed contract
    at = lines.index("- violations inside the loop:")
    assert lines[at + 1].startswith("  transfer  ") and "test_report.py:" in lines[at + 1]
    assert "  x3  device-to-host read: float()" in lines[at + 1]
    assert lines[at + 2] == "      > float(x)  # READ"
    assert lines[at + 3].startswith("      Fix: read it deliberately and rarely with jc.fetch(x)")


def test_check_never_raises_when_the_step_s_own_code_fails_in_its_trace():
    """Issue 20: jc.check(step, array) for a step taking a state raised the
    trace's AttributeError ("DynamicJaxprTracer has no attribute x"), under
    jax.jit or not; "jc.check never raises" is its contract."""

    @jc.hot_step(state="p")
    def advance(p):
        return p.replace(t=p.t + 1)

    def check_it(x):
        report = jc.check(advance, x)
        assert not report.ok
        text = str(report)
        assert "could not be traced for these arguments" in text and "AttributeError" in text
        assert "return p.replace(t=p.t + 1)" in text  # the line that failed
        return x

    check_it(jnp.zeros(3))
    jax.jit(check_it)(jnp.zeros(3))  # under a trace, too
