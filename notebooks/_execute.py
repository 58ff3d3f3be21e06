"""Execute the notebooks from their jupytext sources and save them with outputs.

The sources are the ``py:percent`` files in this folder (``01_quickstart.py``,
...), paired with the committed ``.ipynb`` (jupytext's ``formats:
ipynb,py:percent``). Edit a ``.py`` (or the notebook in Jupyter with jupytext
installed, which keeps both in step), then::

    python notebooks/_execute.py          # execute and save both notebooks
    python notebooks/_execute.py 02       # only those whose name contains "02"

The committed ``.ipynb`` files carry their outputs, so they read well on
GitHub and in the docs site. Cells that ``tests/test_notebooks.py`` inspects
carry tags (``# %% tags=["report"]`` in the source):

* ``report``: the cell's last expression is a ``jc.Report`` (HTML output);
* ``expect-violations-N``: that loop report lists N violations (0: OK);
* ``expect-ok``: that report reads OK;
* ``caught-<kind>``: the cell prints a caught ``jc`` error of that kind.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
KERNEL = "python3"
TIMEOUT = 600


def sources() -> list[Path]:
    """The notebooks' jupytext sources, in order."""
    return sorted(p for p in HERE.glob("[0-9]*.py"))


def load(source: Path) -> nbformat.NotebookNode:
    """The notebook a source describes, with stable cell ids (small diffs)."""
    nb = jupytext.read(source)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(argv: list[str]) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    for source in sources():
        if argv and not any(a in source.name for a in argv):
            continue
        nb = load(source)
        t0 = time.perf_counter()
        NotebookClient(
            nb,
            timeout=TIMEOUT,
            kernel_name=KERNEL,
            record_timing=False,  # no timestamps in the committed files
            resources={"metadata": {"path": str(HERE)}},
        ).execute()
        print(f"{source.stem}.ipynb: executed in {time.perf_counter() - t0:.1f} s")
        nbformat.validate(nb)
        nbformat.write(nb, source.with_suffix(".ipynb"))


if __name__ == "__main__":
    main(sys.argv[1:])
