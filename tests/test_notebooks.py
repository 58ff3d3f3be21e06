"""The notebooks run from top to bottom and show what their text says.

Each notebook is executed once (module scope) with nbclient in a temporary
copy, on a kernel that runs this interpreter. Cells that the text makes claims
about carry tags (see ``notebooks/_execute.py``); the tests read those
cells' outputs, so they do not depend on cell positions.
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("01_quickstart.ipynb", "02_fixing_a_slow_loop.ipynb")
CELL_TIMEOUT = 600  # seconds per cell; each notebook takes well under a minute


# --------------------------------------------------------------------------
# Executing


def _python3_kernelspec(root: Path) -> Path:
    """A ``python3`` kernelspec that starts this interpreter (not whatever
    ``python3`` kernel happens to be installed)."""
    spec_dir = root / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (under test)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return root


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both notebooks, executed in a temporary copy of the notebooks folder."""
    work = tmp_path_factory.mktemp("notebooks")
    jupyter_path = _python3_kernelspec(tmp_path_factory.mktemp("jupyter"))
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        # JUPYTER_PATH comes first in the kernelspec search path; the kernel
        # inherits the rest of the environment (XLA_FLAGS, JAX_PLATFORMS).
        mp.setenv("JUPYTER_PATH", str(jupyter_path))
        for name in NAMES:
            shutil.copy(NOTEBOOKS / name, work / name)
            nb = nbformat.read(work / name, as_version=4)
            client = nbclient.NotebookClient(
                nb,
                timeout=CELL_TIMEOUT,
                kernel_name="python3",
                allow_errors=False,
                resources={"metadata": {"path": str(work)}},
            )
            client.execute()
            out[name] = nb
    return out


# --------------------------------------------------------------------------
# Reading outputs


def _tagged(nb: Any, prefix: str) -> list[tuple[str, Any]]:
    """(tag, cell) for every code cell with a tag starting with prefix, in order."""
    return [
        (tag, cell)
        for cell in nb.cells
        if cell.cell_type == "code"
        for tag in cell.metadata.get("tags", [])
        if tag.startswith(prefix)
    ]


def _stdout(cell: Any) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _html(cell: Any) -> str:
    htmls = [
        o.data["text/html"]
        for o in cell.outputs
        if o.output_type in ("execute_result", "display_data") and "text/html" in o.data
    ]
    assert len(htmls) == 1, f"expected one HTML output in cell:\n{cell.source}"
    return htmls[0]


class _ReportHTML(HTMLParser):
    """A jc.Report's HTML: its status and the rows of its violations table."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.status: str | None = None
        self.violations: list[list[str]] = []
        self._table: str | None = None
        self._in_body = False
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "div" and "jc-report" in classes and self.status is None:
            self.status = (
                "ok" if "jc-ok" in classes else "failed" if "jc-failed" in classes else None
            )
        elif tag == "table":
            self._table = "violations" if "jc-violations" in classes else "other"
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._table == "violations" and self._in_body:
            self.violations.append([])
        elif tag == "td" and self._table == "violations" and self._in_body:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.violations[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _report(cell: Any) -> _ReportHTML:
    parsed = _ReportHTML(_html(cell))
    assert parsed.status in ("ok", "failed"), f"no jc.Report in the output of:\n{cell.source}"
    return parsed


# --------------------------------------------------------------------------
# Both notebooks


@pytest.mark.parametrize("name", NAMES)
def test_executes_on_this_interpreter_without_errors(executed, name):
    nb = executed[name]
    version = nb.metadata.get("language_info", {}).get("version", "")
    assert version == ".".join(map(str, sys.version_info[:3])), version
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is not None
            assert not [o for o in cell.outputs if o.output_type == "error"]
            assert "Traceback" not in "".join(
                o.get("text", "") for o in cell.outputs if o.output_type == "stream"
            ), cell.source


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_executed_and_matches_its_source(name):
    """The committed file has its outputs and the cells of its jupytext source."""
    jupytext = pytest.importorskip("jupytext")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), "saved without outputs"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert nb.metadata["jupytext"]["formats"] == "ipynb,py:percent"  # paired
    source = jupytext.read(NOTEBOOKS / name.replace(".ipynb", ".py"))
    want = [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in source.cells]
    got = [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]
    assert got == want, f"{name} is out of date: run python notebooks/_execute.py"


def test_every_notebook_source_is_tested():
    sources = {p.stem for p in NOTEBOOKS.glob("[0-9]*.py")}
    assert sources == {Path(n).stem for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_reports_tagged_ok_read_ok(executed, name):
    cells = _tagged(executed[name], "expect-ok")
    assert cells
    for _, cell in cells:
        report = _report(cell)
        assert report.status == "ok" and report.violations == [], cell.source


# --------------------------------------------------------------------------
# 01: quickstart


def test_quickstart_catches_its_mistakes(executed):
    nb = executed["01_quickstart.ipynb"]
    ((_, spec_cell),) = _tagged(nb, "caught-spec")
    text = _stdout(spec_cell)
    assert text.startswith("SpecError:") and ".vel" in text and "n=4" in text, text
    ((_, transfer_cell),) = _tagged(nb, "caught-transfer")
    text = _stdout(transfer_cell)
    assert text.startswith("TransferError:"), text
    assert "float()" in text and "advance -> .t" in text and "jc.fetch" in text, text


def test_quickstart_step_report_lists_the_donated_leaves(executed):
    nb = executed["01_quickstart.ipynb"]
    cells = [c for _, c in _tagged(nb, "report")]
    assert len(cells) == 1
    html = _html(cells[0])
    for leaf in ("p.pos", "p.vel", "p.t"):
        assert leaf in html
    assert "calls" in html and "1000" in html


# --------------------------------------------------------------------------
# 02: fixing a slow loop


def _loop_reports(nb: Any) -> list[tuple[int, _ReportHTML]]:
    """(expected violations, parsed report) for each recorded loop, in order."""
    out = []
    for tag, cell in _tagged(nb, "expect-violations-"):
        out.append((int(tag.rsplit("-", 1)[1]), _report(cell)))
    return out


def test_one_recorded_run_finds_all_five_problems(executed):
    reports = _loop_reports(executed["02_fixing_a_slow_loop.ipynb"])
    expected, first = reports[0]
    assert expected == 5 and first.status == "failed"
    rows = first.violations
    assert len(rows) == 5, rows
    kinds = collections.Counter(row[0] for row in rows)
    assert kinds == {"transfer": 3, "compile": 1, "donation": 1}, rows
    assert len({row[1] for row in rows}) == 5, "one row per line at fault"
    what = {row[0] + ": " + row[3] for row in rows}
    for needle in (
        "float()",
        "bool()",
        ".tolist()",
        "compile: jax compiles `<lambda>`",
        "donation: ",
    ):
        assert any(needle in w for w in what), (needle, what)
    counts = {row[0] + " " + row[3].split(" of ")[0]: int(row[2]) for row in rows}
    donation = [c for k, c in counts.items() if k.startswith("donation")]
    others = [c for k, c in counts.items() if not k.startswith("donation")]
    assert donation == [1] and len(set(others)) == 1 and others[0] > 1, counts


def test_each_fix_removes_one_row_until_the_report_is_ok(executed):
    reports = _loop_reports(executed["02_fixing_a_slow_loop.ipynb"])
    assert [n for n, _ in reports] == [5, 4, 3, 2, 1, 0]
    for expected, report in reports:
        assert len(report.violations) == expected, report.violations
        assert report.status == ("ok" if expected == 0 else "failed")
    for (_, before), (_, after) in zip(reports, reports[1:]):
        remaining = {(row[0], row[3]) for row in after.violations}
        assert remaining < {(row[0], row[3]) for row in before.violations}


def test_the_fixed_loop_still_trains(executed):
    nb = executed["02_fixing_a_slow_loop.ipynb"]
    text = "\n".join(_stdout(c) for c in nb.cells if c.cell_type == "code")
    m = re.search(r"loss\s+([\d.]+) -> ([\d.]+)", text)
    assert m is not None, text
    assert float(m.group(2)) < 0.05 < float(m.group(1))
    m = re.search(r"\|w - w_true\|\s+([\d.]+)", text)
    assert m is not None and float(m.group(1)) < 0.1, text
