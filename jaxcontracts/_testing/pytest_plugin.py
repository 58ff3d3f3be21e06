"""pytest plugin: the ``jc_hot_loop`` fixture and marker, ``--jc-checks``, and contract
snapshots (``docs/guides/pytest.md``). Every name starts with ``jc`` (a ``hot_loop``
fixture would shadow the import). Loading it imports no jax, so ``JAX_*`` settings
made in a ``conftest.py`` still apply.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # importing jaxcontracts imports jax: only when needed
    from jaxcontracts import HotLoop, Violation
    from jaxcontracts._testing.recorder import Recorder

__all__ = [
    "jc_hot_loop",
    "pytest_addoption",
    "pytest_configure",
    "pytest_ignore_collect",
    "pytest_pyfunc_call",
    "pytest_runtest_call",
    "pytest_runtest_setup",
    "pytest_runtest_teardown",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "pytest_testnodedown",
    "pytest_unconfigure",
]

MARKER = "jc_hot_loop"
_LEVELS_HELP = "full, fast or off"
_SAVED_LEVEL = pytest.StashKey[str]()
SNAPSHOT_MARKER = "jc_snapshot"
SNAPSHOT_DIR = "__jc_snapshots__"
_RECORDER = pytest.StashKey["Recorder"]()
_TOLERANCES = pytest.StashKey[dict[str, Any]]()
_SUMMARY = pytest.StashKey[dict[str, list[str]]]()
#: The key of a pytest-xdist worker's summary in ``config.workeroutput``.
_WORKER_SUMMARY = "jaxcontracts_snapshots"


def _format(violations: list[Violation], label: str) -> str:
    """The failure message: a header, then one entry per violation (``format_violations``)."""
    from jaxcontracts._report.render import format_violations

    events = sum(v.count for v in violations)
    header = (
        f"{label}: {len(violations)} violation{'s' * (len(violations) != 1)} "
        f"({events} event{'s' * (events != 1)}) inside the loop"
    )
    return "\n".join(format_violations(violations, header))


@contextlib.contextmanager
def _recording(label: str, **options: str) -> Iterator[HotLoop]:
    """A recording ``jc.hot_loop`` that fails the test if it saw violations;
    ``options``: the loop's (every contract's option, ``loop_options``)."""
    __tracebackhide__ = True
    import jaxcontracts as jc
    from jaxcontracts._config import require_valid_env

    require_valid_env()  # a bad JAXCONTRACTS_CHECKS fails where the plugin is used
    loop = jc.hot_loop(**options, on_violation="record")  # type: ignore[arg-type]
    # the user's own error (pytest.fail, a DonationError) wins; the loop notes its record
    loop.label = label
    with loop:
        yield loop
    if loop.violations:
        pytest.fail(_format(loop.violations, label), pytrace=False)


def _checked_options(label: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` if each is a loop option of a contract (``loop_options``,
    on_violation aside: the plugin records)."""
    from jaxcontracts._errors import loop_options

    known = [k for k in loop_options() if k != "on_violation"]
    unknown = [k for k in options if k not in known]
    if unknown:
        pytest.fail(
            f"{label} takes only the keyword arguments {', '.join(f'{k}=...' for k in known)} "
            f"(a jc.hot_loop's options); got {', '.join(unknown)}",
            pytrace=False,
        )
    return options


@pytest.fixture
def jc_hot_loop() -> Any:
    """A factory of recording hot loops: ``with jc_hot_loop(**loop_options) as loop:``;
    the test fails at the block's end listing every violation with its ``file:line``."""

    def start(**options: str) -> contextlib.AbstractContextManager[HotLoop]:
        return _recording("jc_hot_loop", **_checked_options("the jc_hot_loop fixture", options))

    return start


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--jc-checks`` and the ``jc_checks`` ini option."""
    group = parser.getgroup("jaxcontracts")
    group.addoption(
        "--jc-checks",
        dest="jc_checks",
        metavar="LEVEL",
        default=None,
        help=f"jaxcontracts checks level for the session: {_LEVELS_HELP} "
        "(jc.set_checks); overrides the jc_checks ini option.",
    )
    parser.addini(
        "jc_checks",
        f"jaxcontracts checks level for the session: {_LEVELS_HELP} (jc.set_checks).",
        default="",
    )
    group.addoption(
        "--jc-snapshot-update",
        dest="jc_snapshot_update",
        action="store_true",
        default=False,
        help="write the contract snapshots of @pytest.mark.jc_snapshot tests "
        f"to {SNAPSHOT_DIR}/ instead of comparing with them.",
    )
    parser.addini(
        "jc_snapshot_tolerance",
        "contract snapshot tolerances, one per line: 'temporaries = 10%', "
        "'flops = any', 'outputs = exact'.",
        type="linelist",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; apply ``--jc-checks`` / ``jc_checks`` if given.

    Raises:
        pytest.UsageError: for a level other than full, fast or off.
    """
    config.addinivalue_line(
        "markers",
        f"{MARKER}(transfers='disallow', compiles='disallow'): run the test body "
        "inside a recording jc.hot_loop (fixtures stay outside) and fail listing "
        "every implicit transfer, compile and use of a donated array, with file:line.",
    )
    config.addinivalue_line(
        "markers",
        f"{SNAPSHOT_MARKER}(**tolerances): record the hot steps this test compiles and the "
        "loops it runs, and compare them with its contract snapshot (written by "
        "--jc-snapshot-update); tolerances such as temporaries='10%' or flops='any'.",
    )
    config.stash[_SUMMARY] = {"written": [], "unstable": []}
    level, source = config.getoption("jc_checks"), "--jc-checks"
    if level is None:
        level, source = config.getini("jc_checks"), "the ini option jc_checks"
    if not level:
        return
    import jaxcontracts as jc
    from jaxcontracts._config import CHECK_LEVELS, require_valid_env

    try:
        require_valid_env()
    except jc.DefinitionError as e:
        raise pytest.UsageError(str(e)) from None
    normal = str(level).strip().lower()
    if normal not in CHECK_LEVELS:
        raise pytest.UsageError(
            f"{source} got {level!r}; valid values are "
            + ", ".join(repr(v) for v in CHECK_LEVELS)
            + "."
        )
    config.stash[_SAVED_LEVEL] = jc.get_checks()
    jc.set_checks(normal)  # type: ignore[arg-type]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Restore the checks level that ``--jc-checks`` replaced."""
    saved = config.stash.get(_SAVED_LEVEL, None)
    if saved is not None:
        import jaxcontracts as jc

        jc.set_checks(saved)  # type: ignore[arg-type]
        del config.stash[_SAVED_LEVEL]


def pytest_ignore_collect(collection_path: pathlib.Path) -> bool | None:
    """Never collect a snapshot folder (data: a ``>>>`` line must never run as a
    doctest); ``None`` elsewhere, so that other plugins still decide."""
    return True if SNAPSHOT_DIR in collection_path.parts else None


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[Any]:
    """Run a ``@pytest.mark.jc_hot_loop`` test's body (not its fixtures) in a recording loop."""
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    if marker.args:
        pytest.fail(
            f"@pytest.mark.{MARKER} takes keyword arguments only; got {marker.args!r}",
            pytrace=False,
        )
    with _recording(
        f"@pytest.mark.{MARKER}", **_checked_options(f"@pytest.mark.{MARKER}", marker.kwargs)
    ):
        return (yield)


def _snapshot_file(item: pytest.Item) -> pathlib.Path:
    """``<test dir>/__jc_snapshots__/<module>.<Class>.<test[params]>.jcsnap``
    (see ``snapshot_file.file_name``)."""
    from jaxcontracts._testing.snapshot_file import file_name

    path = pathlib.Path(item.path)
    return path.parent / SNAPSHOT_DIR / file_name(path.stem, item.nodeid.split("::")[1:])


def _legacy_file(item: pytest.Item) -> pathlib.Path:
    """The ``.txt`` name of jaxcontracts 0.1 (read when no ``.jcsnap`` exists;
    an update replaces it): pytest's doctest glob collected those."""
    path = pathlib.Path(item.path)
    name = re.sub(
        r"[^A-Za-z0-9_.\[\]=+,-]", "_", ".".join([path.stem, *item.nodeid.split("::")[1:]])
    )
    return path.parent / SNAPSHOT_DIR / f"{name}.txt"


def _tolerances(item: pytest.Item, marker: pytest.Mark) -> dict[str, Any]:
    """Defaults, then the ini lines, then the marker's keyword arguments."""
    from jaxcontracts._testing.snapshot import field_name, parse_tolerance

    out: dict[str, Any] = {}
    where = "the ini option jc_snapshot_tolerance"
    try:
        for line in item.config.getini("jc_snapshot_tolerance"):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise pytest.UsageError(
                    f"{where}: {line!r} is not 'field = tolerance' (e.g. 'temporaries = 10%')."
                )
            out[field_name(name.strip())] = parse_tolerance(value.strip())
        where = f"@pytest.mark.{SNAPSHOT_MARKER}"
        if marker.args:
            raise ValueError(f"takes keyword arguments only; got {marker.args!r}")
        for name, value in marker.kwargs.items():
            out[field_name(name)] = parse_tolerance(value)
    except (ValueError, TypeError) as e:  # DefinitionError is a TypeError
        pytest.fail(f"{where}: {e}", pytrace=False)
    return out


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Start recording a ``@pytest.mark.jc_snapshot`` test, fixtures included."""
    marker = item.get_closest_marker(SNAPSHOT_MARKER)
    if marker is None:
        return (yield)
    from jaxcontracts._testing.recorder import Recorder

    item.stash[_RECORDER] = Recorder().start()
    result = yield
    # checked once every setup hook ran (pytest's teardowns find what they left)
    item.stash[_TOLERANCES] = _tolerances(item, marker)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """After a ``jc_snapshot`` test's body passed: write or compare its snapshot."""
    result = yield
    recorder = _stop(item)
    if recorder is not None:
        _check_snapshot(item, recorder)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Stop a recording whose test did not finish (a failed setup or body)."""
    _stop(item)
    return (yield)


def _stop(item: pytest.Item) -> Recorder | None:
    recorder = item.stash.get(_RECORDER, None)
    if recorder is not None:
        del item.stash[_RECORDER]
        recorder.stop()
    return recorder


def _check_snapshot(item: pytest.Item, recorder: Recorder) -> None:
    __tracebackhide__ = True
    from jaxcontracts._testing.snapshot_file import read, write

    label = f"@pytest.mark.{SNAPSHOT_MARKER}"
    snap = recorder.snapshot()
    if not snap.fields:
        pytest.fail(
            f"{label}: the test compiled no hot step and ran no jc.hot_loop, so its "
            "snapshot would be empty.\nFix: compile or call the steps in the test (or in a "
            "function-scoped fixture); a step compiled before the test is seen only "
            "when the test calls it at checks 'fast' or 'full'.",
            pytrace=False,
        )
    file = _snapshot_file(item)
    folder, legacy = file.parent, _legacy_file(item)
    source = legacy if not file.exists() and legacy.is_file() and not legacy.is_symlink() else file
    try:
        recorded = read(folder, source)
    except (ValueError, OSError) as e:
        pytest.fail(
            f"{label}: cannot read {source}: {e}\nFix: look at the file (a hostile or "
            "broken snapshot is never run, only read as data), then rerun with "
            "--jc-snapshot-update to rewrite it.",
            pytrace=False,
        )
    summary = item.config.stash[_SUMMARY]
    if item.config.getoption("jc_snapshot_update"):
        violations = [v for p, v in snap.fields if p[-1].startswith("violation ")]
        if violations:
            pytest.fail(
                f"{label}: not written: a snapshot records clean loops, and this test's "
                f"loops had {len(violations)} violation(s):\n"
                + "\n".join(f"  {v}" for v in violations),
                pytrace=False,
            )
        if str(recorded.get(snap.key)) != str(snap) or source is not file:

            def update(current: dict[str, Any]) -> dict[str, Any]:
                # sections written meanwhile (an xdist worker) and a legacy file's are kept
                merged = {**(recorded if source is not file else {}), **current}
                merged[snap.key] = snap
                return merged

            try:
                write(folder, file, update, item.nodeid)
            except (ValueError, OSError) as e:
                pytest.fail(f"{label}: not written: {e}", pytrace=False)
            if source is not file:
                legacy.unlink()
            summary["written"].append(str(file))
        return
    before = recorded.get(snap.key)
    if before is None:
        have = ", ".join(sorted(recorded)) or "none"
        pytest.fail(
            f"{label}: no contract snapshot of this test for {snap.key} in {file} "
            f"(sections there: {have}).\nFix: run pytest --jc-snapshot-update on this "
            "machine, review the file and commit it.",
            pytrace=False,
        )
    diff = before.diff(snap, tolerances=item.stash.get(_TOLERANCES, {}))
    if diff.note:
        summary["unstable"].append(f"{item.nodeid}: {diff.note}")
    if diff:
        pytest.fail(
            f"{label}: the contract of {item.nodeid} changed ({snap.key}, "
            f"snapshot {file}).\n{diff}\n"
            "Fix: if the change is intended, run pytest --jc-snapshot-update and "
            "review the file's diff; else find what made the leaf or field above change.",
            pytrace=False,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker, hand the summary to the controller
    (``config.workeroutput``, read in :func:`pytest_testnodedown`)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    summary = session.config.stash.get(_SUMMARY, None)
    if workeroutput is not None and summary is not None:
        workeroutput[_WORKER_SUMMARY] = summary


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the pytest-xdist controller, merge a finished worker's summary
    (``optionalhook``: loads without xdist; a crashed worker sent nothing)."""
    theirs = getattr(node, "workeroutput", {}).get(_WORKER_SUMMARY)
    summary = node.config.stash.get(_SUMMARY, None)
    if theirs and summary is not None:
        for kind, lines in summary.items():
            lines.extend(theirs.get(kind, ()))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """List the snapshot files written and the comparisons made across versions."""
    summary = config.stash.get(_SUMMARY, None)
    if not summary or not (summary["written"] or summary["unstable"]):
        return
    terminalreporter.section("jaxcontracts snapshots")
    for path in sorted(summary["written"]):  # xdist workers finish in any order
        terminalreporter.write_line(f"written: {path}")
    for line in summary["unstable"]:
        terminalreporter.write_line(f"compared without memory/cost: {line}")
