"""pytest plugin: assert that a loop in a test is clean, in one or two lines.

Installed with jaxcontracts (the ``pytest11`` entry point ``jaxcontracts``), so
it is active in every pytest run of an environment that has jaxcontracts;
``pytest -p no:jaxcontracts`` turns it off. Everything it adds starts with
``jc``, like ``import jaxcontracts as jc``, so that it claims no generic name
(a fixture called ``hot_loop`` would shadow ``from jaxcontracts import
hot_loop`` in every test that asks for it).

**The fixture** ``jc_hot_loop``: a factory of recording loops. Only the code
inside the ``with`` block is watched::

    def test_sim(jc_hot_loop):
        s = init()
        s = step(s)  # warm-up: the compile happens here, outside the loop
        with jc_hot_loop():
            for _ in range(100):
                s = step(s)

**The marker** ``@pytest.mark.jc_hot_loop``: the whole test body (the call
phase) is the loop. Fixtures are set up and torn down outside it, so a
fixture may compile and read arrays freely::

    @pytest.mark.jc_hot_loop
    def test_sim(warm_state):
        s = warm_state
        for _ in range(100):
            s = step(s)

Both run :func:`jaxcontracts.hot_loop` with ``on_violation="record"``, so the
loop runs to its end and *every* violation is collected; then the test fails
(``pytest.fail``, outside the user's code) with one entry per violation: its
kind, ``file:line``, how many times it happened, what happened, the source
line and the fix. Both take ``transfers="allow"`` and/or ``compiles="allow"``
(``with jc_hot_loop(compiles="allow"):``,
``@pytest.mark.jc_hot_loop(compiles="allow")``). ``with jc_hot_loop() as
loop:`` gives the :class:`jaxcontracts.HotLoop`. An exception raised in the
loop propagates unchanged; the violations seen before it are attached to it as
a note (Python >= 3.11).

**The checks level** for the session: ``--jc-checks=full|fast|off`` on the
command line, or ``jc_checks = fast`` in the ini file (the command line wins).
It is applied with :func:`jaxcontracts.set_checks` when pytest configures and
the previous level is restored when pytest unconfigures. A fixture that sets
the level itself (an autouse ``jc.set_checks("full")``) wins for the tests it
covers.

Like ``jc.hot_loop``, the loop watches the thread that runs the test only, and
in record mode an implicit host-to-device transfer in an eager op is logged by
JAX, not recorded. Loading the plugin does not import jax (the package
re-exports lazily, and this module imports jaxcontracts' internals only when a
test uses them), so ``JAX_*`` settings made in a ``conftest.py`` still apply.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # importing jaxcontracts imports jax: only when needed
    from jaxcontracts import HotLoop, Violation

__all__ = [
    "jc_hot_loop",
    "pytest_addoption",
    "pytest_configure",
    "pytest_pyfunc_call",
    "pytest_unconfigure",
]

MARKER = "jc_hot_loop"
_LEVELS_HELP = "full, fast or off"
_OPTIONS = ("transfers", "compiles")
_SAVED_LEVEL = pytest.StashKey[str]()


# --------------------------------------------------------------------------
# The failure message


def _format(violations: list[Violation], label: str) -> str:
    """The failure message: a header, then one entry per violation.

    Each entry's first line is ``kind  file:line  xCOUNT  what``; the source
    line and the fix follow, indented.
    """
    events = sum(v.count for v in violations)
    kind_w = max(len(v.kind) for v in violations)
    where_w = max(len(v.where) for v in violations)
    count_w = max(len(str(v.count)) for v in violations) + 1
    lines = [
        f"{label}: {len(violations)} violation{'s' * (len(violations) != 1)} "
        f"({events} event{'s' * (events != 1)}) inside the loop"
    ]
    for v in violations:
        lines.append(
            f"  {v.kind:<{kind_w}}  {v.where:<{where_w}}  {'x' + str(v.count):<{count_w}}  {v.what}"
        )
        if v.source:
            lines.append(f"      > {v.source}")
        if v.fix:
            lines.append(f"      Fix: {v.fix}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# The recording loop shared by the fixture and the marker


@contextlib.contextmanager
def _recording(
    label: str, *, transfers: str = "disallow", compiles: str = "disallow"
) -> Iterator[HotLoop]:
    """A recording ``jc.hot_loop`` that fails the test if it saw violations."""
    __tracebackhide__ = True
    import jaxcontracts as jc
    from jaxcontracts._config import require_valid_env

    require_valid_env()  # a bad JAXCONTRACTS_CHECKS fails where the plugin is used
    loop = jc.hot_loop(
        transfers=transfers,  # type: ignore[arg-type]
        compiles=compiles,  # type: ignore[arg-type]
        on_violation="record",
    )
    try:
        with loop:
            yield loop
    except Exception as exc:
        # The user's own error (or a DonationError) wins; keep the record.
        if loop.violations and hasattr(exc, "add_note"):
            exc.add_note(_format(loop.violations, label))
        raise
    if loop.violations:
        pytest.fail(_format(loop.violations, label), pytrace=False)


# --------------------------------------------------------------------------
# The fixture


@pytest.fixture
def jc_hot_loop() -> Any:
    """A factory of recording hot loops: ``with jc_hot_loop(): ...``.

    The block runs inside ``jc.hot_loop(on_violation="record")``; at its end
    the test fails, listing every implicit transfer, compile and use of a
    donated array with its ``file:line``, if there was any. Keyword arguments
    ``transfers="allow"`` and ``compiles="allow"`` turn a kind of check off;
    ``as loop`` gives the :class:`jaxcontracts.HotLoop`.
    """

    def start(
        *, transfers: str = "disallow", compiles: str = "disallow"
    ) -> contextlib.AbstractContextManager[HotLoop]:
        return _recording("jc_hot_loop", transfers=transfers, compiles=compiles)

    return start


# --------------------------------------------------------------------------
# Hooks


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


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[Any]:
    """Run a ``@pytest.mark.jc_hot_loop`` test's body in a recording loop.

    This wraps only the call of the test function: its fixtures were set up
    before and are torn down after, outside the loop.
    """
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    unknown = [repr(a) for a in marker.args] + [k for k in marker.kwargs if k not in _OPTIONS]
    if unknown:
        pytest.fail(
            f"@pytest.mark.{MARKER} takes only the keyword arguments "
            f"transfers='allow' and compiles='allow'; got {', '.join(unknown)}",
            pytrace=False,
        )
    with _recording(f"@pytest.mark.{MARKER}", **marker.kwargs):
        return (yield)
