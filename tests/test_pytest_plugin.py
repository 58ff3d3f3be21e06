"""The pytest plugin: the jc_hot_loop fixture and marker, and --jc-checks.

Each test writes a small test file and runs pytest on it in this process
(``pytester.runpytest``); the plugin is loaded there through its ``pytest11``
entry point, as in a user's project. One run goes through a subprocess to
check exactly that path.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from helpers import STRICT_WARNINGS

import jaxcontracts as jc

pytest_plugins = ["pytester"]

# Strict like this repository's own settings, and independent of them.
INI = """
[pytest]
addopts = --strict-markers -p no:cacheprovider
""" + STRICT_WARNINGS

HEADER = """
import jax
import jax.numpy as jnp
import pytest

import jaxcontracts as jc

double = jax.jit(lambda v: v * 2)


@pytest.fixture
def warm():
    # Compiles and reads outside any loop: never a violation.
    x = double(jnp.arange(4.0, dtype=jnp.float32))
    assert float(x.sum()) == 12.0
    yield x
    assert float(x[1]) == 2.0  # teardown reads too


def dirty_loop(s):
    for _ in range(5):
        s = double(s)
        total = float(s.sum())  # READ
    return jax.jit(lambda v: v + 1)(s)  # COMPILE
"""


def _write(pytester: pytest.Pytester, body: str, name: str = "test_inner") -> tuple[str, str]:
    """Write a test file (HEADER + body); return (its file name, its source)."""
    pytester.makeini(INI)
    path = pytester.makepyfile(**{name: textwrap.dedent(HEADER) + textwrap.dedent(body)})
    return path.name, path.read_text()


def _line(source: str, text: str) -> int:
    """The 1-based line number of the only line of ``source`` containing ``text``."""
    found = [i for i, line in enumerate(source.splitlines(), 1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


# -- the fixture -------------------------------------------------------------


def test_fixture_passes_a_clean_loop(pytester):
    _write(
        pytester,
        """
        def test_clean(warm, jc_hot_loop):
            s = warm
            with jc_hot_loop() as loop:
                for _ in range(10):
                    s = double(s)
                host = jc.fetch(s)  # an explicit read is allowed
            assert loop.violations == []
            assert host.shape == (4,)
        """,
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_fixture_fails_listing_every_violation_with_file_and_line(pytester):
    name, source = _write(
        pytester,
        """
        def test_dirty(warm, jc_hot_loop):
            with jc_hot_loop():
                dirty_loop(warm)
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    read, compile_ = _line(source, "# READ"), _line(source, "# COMPILE")
    result.stdout.fnmatch_lines(
        [
            "jc_hot_loop: 2 violations (6 events) inside the loop",
            f"  transfer  {name}:{read} * x5  device-to-host read: float() of f32[]",
            "      > total = float(s.sum())  # READ",
            "      Fix: read it deliberately*jc.fetch(x)*",
            f"  compile   {name}:{compile_} * x1  jax compiles `<lambda>`*",
            "      > return jax.jit(lambda v: v + 1)(s)  # COMPILE",
            "      Fix: let the loop*compiles=\"warmup\"*",
            "FAILED test_inner.py::test_dirty - Failed: jc_hot_loop: 2 violations*",
        ]
    )
    # pytest.fail with the list, not a traceback through the plugin.
    assert "_pytest_plugin.py" not in result.stdout.str()


def test_a_missed_donation_settled_as_the_marked_loop_ends_is_placed_at_its_call(pytester):
    # hostile round 64: settled at the loop's end, inside pluggy's hook wrapper, the
    # violation's file:line and source line were pluggy's
    name, source = _write(
        pytester,
        """
        @pytest.mark.jc_hot_loop(compiles="warmup")
        def test_missed():
            f = jax.jit(lambda a: a + 1)
            x = jnp.ones(2)
            for _ in range(3):
                x = f(x)  # CALL
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    call = _line(source, "# CALL")
    result.stdout.fnmatch_lines(
        [f"  missed_donation  {name}:{call}  x1  `<lambda>` (called at {name}:{call})*",
         "      > x = f(x)  # CALL"]
    )
    assert "pluggy/" not in result.stdout.str()  # (no line of its files)


def test_fixture_options_and_several_loops(pytester):
    _write(
        pytester,
        """
        def test_allowed(warm, jc_hot_loop):
            with jc_hot_loop(compiles="allow"):
                jax.jit(lambda v: v - 1)(warm)
            with jc_hot_loop(transfers="allow"):
                float(warm.sum())

        def test_second_loop_fails(warm, jc_hot_loop):
            with jc_hot_loop():
                double(warm)
            with jc_hot_loop():
                warm.tolist()  # LATER
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*transfer  test_inner.py:* x1  device-to-host read: .tolist()*"])


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python >= 3.11")
def test_an_error_in_the_loop_propagates_with_the_violations_noted(pytester):
    _write(
        pytester,
        """
        def test_raises(warm, jc_hot_loop):
            with jc_hot_loop():
                float(warm.sum())
                raise ValueError("the user's own error")
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E *ValueError: the user's own error",
            "E *jc_hot_loop had recorded 1 violation(s) before this error ended it:",
            "E *transfer  test_inner.py:* x1  device-to-host read: float()*",
        ]
    )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python >= 3.11")
def test_a_pytest_failure_in_the_loop_has_the_violations_noted_once(pytester):
    # pytest.raises's "DID NOT RAISE" and pytest.fail are BaseExceptions: the
    # record was dropped, the hint this test's author needed (the read was
    # recorded, not raised); a user's error had it twice
    _write(
        pytester,
        """
        import jaxcontracts as jc

        def test_expects_a_raise(warm, jc_hot_loop):
            with jc_hot_loop():
                with pytest.raises(jc.TransferError):
                    float(warm.sum())

        def test_own_error(warm, jc_hot_loop):
            with jc_hot_loop():
                float(warm.sum())
                raise ValueError("boom")
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=2)
    # counted in the failure sections only: on CI (the CI variable set) pytest's
    # short summary repeats each failure's whole message
    noted = [
        line
        for line in result.stdout.lines
        if line.startswith("E ") and "jc_hot_loop had recorded 1 violation(s) before this error" in line
    ]
    assert len(noted) == 2, result.stdout.str()
    result.stdout.fnmatch_lines(["*DID NOT RAISE*"])


# -- the marker --------------------------------------------------------------


def test_marker_passes_a_clean_body_and_leaves_fixtures_outside(pytester):
    _write(
        pytester,
        """
        @pytest.mark.jc_hot_loop
        def test_clean(warm):
            s = warm
            for _ in range(10):
                s = double(s)

        @pytest.mark.jc_hot_loop(compiles="allow")
        def test_compiles_allowed(warm):
            jax.jit(lambda v: v - 1)(warm)

        @pytest.mark.jc_hot_loop
        class TestClass:
            def test_in_class(self, warm):
                double(warm)
        """,
    )
    pytester.runpytest().assert_outcomes(passed=3)


def test_marker_fails_listing_every_violation(pytester):
    name, source = _write(
        pytester,
        """
        @pytest.mark.jc_hot_loop
        def test_dirty(warm):
            dirty_loop(warm)
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    read, compile_ = _line(source, "# READ"), _line(source, "# COMPILE")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.jc_hot_loop: 2 violations (6 events) inside the loop",
            f"  transfer  {name}:{read} * x5  device-to-host read: float() of f32[]",
            "      Fix: *",
            f"  compile   {name}:{compile_} * x1  jax compiles `<lambda>`*",
            "      Fix: *",
        ]
    )
    # The fixture's compiles and reads (setup and teardown) are not listed.
    for text in ("x = double(", "float(x.sum())", "float(x[1])"):
        assert f"{name}:{_line(source, text)}" not in result.stdout.str()


def test_marker_rejects_unknown_arguments(pytester):
    _write(
        pytester,
        """
        @pytest.mark.jc_hot_loop(on_violation="raise")
        def test_it(warm):
            pass
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.jc_hot_loop takes only the keyword arguments*; got on_violation"]
    )


def test_marker_and_fixture_take_every_loop_option_a_contract_declares(pytester):
    # the options are the contracts' (callbacks="disallow" from its own module)
    _write(
        pytester,
        """
        printing = jc.hot_step(lambda s: (jax.debug.print("s {}", s[0]), s + 1)[1], state="s", donate="none")


        @pytest.mark.jc_hot_loop(callbacks="disallow")
        def test_marked(warm):
            printing(warm)  # CALLBACK


        def test_fixture(warm, jc_hot_loop):
            with jc_hot_loop(callbacks="disallow"):
                printing(warm)
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*callback  test_inner.py:* `<lambda>` calls back to the host at every call: debug_print at test_inner.py:*"
    ])
    assert "The call did not run" not in result.stdout.str()  # record mode: the calls ran


def test_marker_is_registered(pytester):
    pytester.makeini(INI)
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.jc_hot_loop(transfers='disallow'*: run the test*"])


# -- the checks level ---------------------------------------------------------


def test_jc_checks_option_sets_the_level_and_restores_it(pytester):
    _write(
        pytester,
        """
        def test_level():
            assert jc.get_checks() == "fast"
        """,
    )
    assert jc.get_checks() == "full"
    pytester.runpytest("--jc-checks=fast").assert_outcomes(passed=1)
    assert jc.get_checks() == "full"  # restored at unconfigure


def test_jc_checks_ini_option_and_the_command_line_wins(pytester):
    pytester.makeini(INI + "jc_checks = off\n")
    pytester.makepyfile(
        test_inner="""
        import jaxcontracts as jc

        def test_level(pytestconfig):
            expected = pytestconfig.getoption("jc_checks") or "off"
            assert jc.get_checks() == expected
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)
    pytester.runpytest("--jc-checks", "full").assert_outcomes(passed=1)
    assert jc.get_checks() == "full"


@pytest.mark.parametrize("where", ["command line", "ini"])
def test_an_invalid_level_is_a_usage_error_listing_the_valid_ones(pytester, where):
    pytester.makeini(INI + ("jc_checks = bogus\n" if where == "ini" else ""))
    pytester.makepyfile(test_inner="def test_never_runs(): pass")
    args = ["--jc-checks=bogus"] if where == "command line" else []
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: * got 'bogus'; valid values are 'full', 'fast', 'off'."])
    assert jc.get_checks() == "full"


def test_the_entry_point_loads_the_plugin_in_a_fresh_process(pytester, monkeypatch):
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    name, source = _write(
        pytester,
        """
        def test_level():
            assert jc.get_checks() == "fast"

        @pytest.mark.jc_hot_loop
        def test_dirty(warm):
            warm.tolist()  # TOLIST
        """,
    )
    # fast, not off: at off a hot loop keeps only JAX's native guards.
    result = pytester.runpytest_subprocess("--jc-checks=fast")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [f"  transfer  {name}:{_line(source, '# TOLIST')}  x1  device-to-host read: .tolist()*"]
    )


def test_loading_the_plugin_does_not_import_jax(pytester):
    pytester.makeconftest(
        "import sys\n"
        "def pytest_configure(config):\n"
        "    config.jax_at_start = 'jax' in sys.modules\n"
    )
    pytester.makepyfile(
        "def test_it(pytestconfig):\n"
        "    assert pytestconfig.jax_at_start is False\n"
    )
    result = pytester.runpytest_subprocess()  # the entry point loads the plugin
    result.assert_outcomes(passed=1)


def test_a_failed_assert_is_reported_as_the_assert_not_as_a_read(pytester):
    pytester.makepyfile(
        "import jax.numpy as jnp, pytest\n"
        "x = jnp.arange(3.0)\n"
        "@pytest.mark.jc_hot_loop\n"
        "def test_it():\n"
        "    assert x is None\n"
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError*"])
    result.stdout.no_fnmatch_line("*device-to-host read*")


def _worktree_env(monkeypatch):
    """A fresh pytest process that imports this checkout, not the installed one."""
    import os
    from pathlib import Path

    root = str(Path(jc.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("JAXCONTRACTS_CHECKS", "bogus")


def test_a_bad_checks_variable_spares_a_suite_that_never_uses_the_library(pytester, monkeypatch):
    _worktree_env(monkeypatch)
    pytester.makepyfile("def test_it():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)


def test_a_bad_checks_variable_fails_where_the_library_is_used(pytester, monkeypatch):
    _worktree_env(monkeypatch)
    pytester.makepyfile(
        "import pytest\n"
        "def test_fixture(jc_hot_loop):\n"
        "    with jc_hot_loop():\n"
        "        pass\n"
        "@pytest.mark.jc_hot_loop\n"
        "def test_marker():\n"
        "    pass\n"
        "def test_api():\n"
        "    import jaxcontracts as jc\n"
        "    jc.hot_step\n"
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*JAXCONTRACTS_CHECKS got 'bogus'; valid levels are*"])
    result = pytester.runpytest_subprocess("--jc-checks=fast")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*JAXCONTRACTS_CHECKS got 'bogus'*"])


def test_a_bad_checks_variable_still_fails_a_plain_import(monkeypatch):
    import subprocess

    _worktree_env(monkeypatch)
    proc = subprocess.run([sys.executable, "-c", "import jaxcontracts"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "JAXCONTRACTS_CHECKS got 'bogus'" in proc.stderr
