"""The documentation site: every public name documented, every error's section
present and pointed to by its messages, and (when mkdocs is installed) a
strict build."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import jaxcontracts as jc
from jaxcontracts._errors import DOCS_URL, docs_pointer

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

pytestmark = pytest.mark.skipif(
    not (DOCS / "api.md").is_file(), reason="the docs/ folder is not here (an installed package)"
)

ERROR_CLASSES = [
    jc.ContractError,
    jc.DefinitionError,
    jc.SpecError,
    jc.RecompileError,
    jc.DonationError,
    jc.TransferError,
    jc.CapabilityWarning,
]


def _anchors(page: str) -> set[str]:
    """The explicit heading anchors (``## Name {#anchor}``) of a docs page
    (the errors page: the package's, which docs/errors.md includes)."""
    text = (ROOT / "jaxcontracts" / "_pages" / page if page == "errors.md" else DOCS / page).read_text()
    return set(re.findall(r"^#+ .*\{#([\w-]+)\}\s*$", text, re.MULTILINE))


def test_every_public_name_is_in_the_api_reference():
    text = (DOCS / "api.md").read_text()
    documented = set(re.findall(r"^::: jaxcontracts\.(\w+)\s*$", text, re.MULTILINE))
    missing = sorted(set(jc.__all__) - documented)
    assert not missing, f"public names with no `::: jaxcontracts.NAME` in docs/api.md: {missing}"
    unknown = sorted(documented - set(jc.__all__))
    assert not unknown, f"docs/api.md documents names not in jaxcontracts.__all__: {unknown}"


def test_every_error_class_has_a_section_on_the_errors_page():
    exported = {
        name
        for name in jc.__all__
        if isinstance(getattr(jc, name), type)
        and issubclass(getattr(jc, name), (jc.ContractError, Warning))
    }
    assert exported == {c.__name__ for c in ERROR_CLASSES}, "update ERROR_CLASSES"
    anchors = _anchors("errors.md")
    missing = [c.__name__ for c in ERROR_CLASSES if c.__name__.lower() not in anchors]
    assert not missing, f"no `## Name {{#name}}` section in jaxcontracts/_pages/errors.md for {missing}"


@pytest.mark.parametrize("cls", [c for c in ERROR_CLASSES if issubclass(c, jc.ContractError)])
def test_every_message_ends_with_its_offline_section(cls):
    err = cls("summary", ["  .x: detail"], fix="do this.", note="Nothing has run yet.")
    lines = str(err).splitlines()
    assert lines == [
        "summary",
        "  .x: detail",
        "Fix: do this.",
        "Nothing has run yet.",
        f"See: python -m jaxcontracts explain {cls.__name__}",
    ]
    assert cls.__name__.lower() in _anchors("errors.md")  # the page the site builds from


def test_the_errors_page_of_the_site_is_the_packages():
    """docs/errors.md includes the page `explain` prints: one text, two readers."""
    assert (DOCS / "errors.md").read_text().strip() == '--8<-- "jaxcontracts/_pages/errors.md"'


def test_the_docs_site_is_named_once_in_the_package_mkdocs_and_pyproject():
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert f"site_url: {DOCS_URL}\n" in mkdocs
    assert "use_directory_urls: false" not in mkdocs  # errors.md is served as errors/
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["urls"]["Documentation"] == DOCS_URL
    assert DOCS_URL.startswith("https://")


def test_a_copy_of_the_site_can_be_added_to_the_pointer(monkeypatch):
    """JAXCONTRACTS_DOCS_URL: a mirror, a pinned version, a local mkdocs serve."""
    monkeypatch.setenv("JAXCONTRACTS_DOCS_URL", "http://127.0.0.1:8000")
    assert str(jc.SpecError("x")).splitlines()[-1] == (
        "See: python -m jaxcontracts explain SpecError (or http://127.0.0.1:8000/errors/#specerror)"
    )
    monkeypatch.delenv("JAXCONTRACTS_DOCS_URL")
    assert str(jc.SpecError("x")).splitlines()[-1] == "See: python -m jaxcontracts explain SpecError"


def test_a_raised_error_points_to_its_section():
    with pytest.raises(jc.DefinitionError) as info:
        jc.set_checks("fastest")  # type: ignore[arg-type]
    assert str(info.value).endswith("\nSee: python -m jaxcontracts explain DefinitionError")


def test_a_user_subclass_points_to_its_jaxcontracts_parent():
    class MyTransferError(jc.TransferError):
        pass

    assert docs_pointer(MyTransferError) == "See: python -m jaxcontracts explain TransferError"
    assert str(MyTransferError("x")).splitlines()[-1] == "See: python -m jaxcontracts explain TransferError"


def test_the_notebooks_in_the_docs_are_the_committed_ones():
    for link in sorted((DOCS / "notebooks").glob("*.ipynb")):
        assert link.is_symlink(), f"{link} must link to notebooks/, not be a copy"
        assert link.resolve() == (ROOT / "notebooks" / link.name).resolve()
    names = {p.name for p in (DOCS / "notebooks").glob("*.ipynb")}
    assert names == {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="the docs extra is not installed (pip install -e '.[docs]')",
)
def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("api", "errors", "getting-started", "notebooks/01_quickstart"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in jc.__all__:
        assert f'id="jaxcontracts.{name}"' in api, name
