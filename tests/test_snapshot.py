"""Contract snapshots: jc.snapshot, the Snapshot record and the jc_snapshot marker.

The plugin tests write a small simulation test file, record its snapshot with
``--jc-snapshot-update``, then plant one regression at a time in the program
(a dtype drift, a lost donation, an unfused intermediate, an extra compile, a
new violation) and check that a plain run fails with that field's row.
"""

from __future__ import annotations

import re
import textwrap

import jax
import jax.numpy as jnp
import pytest
from helpers import CPU_SIZES, STRICT_WARNINGS
from jaxtyping import Array, Float32

import jaxcontracts as jc
from jaxcontracts._testing.recorder import Recorder
from jaxcontracts._testing.snapshot import Snapshot, parse_tolerance
from jaxcontracts._testing.snapshot_file import parse, render_file

pytest_plugins = ["pytester"]


@jc.state
class Sim:
    x: Float32[Array, "n"]
    t: Float32[Array, ""]


def _advance(s: Sim) -> Sim:
    return Sim(x=s.x + jnp.sort(s.x * 2), t=s.t + 1)


# -- jc.snapshot and the record -------------------------------------------


@pytest.mark.cpu_only(CPU_SIZES)
def test_snapshot_of_a_step_lists_each_leaf_memory_cost_and_compiles():
    step = jc.hot_step(signature=Sim)(_advance)
    step.compile(Sim.spec(n=1024))
    snap = jc.snapshot(step)
    name = f"step {step.describe().name}"
    assert snap.backend == jax.default_backend()
    assert snap.devices == jax.device_count()
    assert set(snap.versions) == {"jax", "jaxlib"}
    assert snap.get(name, "compiles") == "1"
    assert snap.get(name, "signature 1", "leaf s.x") == (
        "f32[1024] donated=yes aliased=yes bytes=4096 sharding=single device"
    )
    assert snap.get(name, "signature 1", "leaf s.t").startswith("f32[] donated=yes aliased=yes")
    assert snap.get(name, "signature 1", "memory.temporaries") == "4096"  # the sort
    assert snap.get(name, "signature 1", "memory.aliased") == "4100"
    assert int(snap.get(name, "signature 1", "cost.flops")) > 0
    text = str(snap)
    assert text.splitlines()[0] == f"[{snap.key}]"
    assert "    leaf s.x: f32[1024] donated=yes" in text
    assert "<table>" in snap._repr_html_() and "s.x" in snap._repr_html_()


def test_snapshot_text_round_trips_and_an_unchanged_step_has_no_diff():
    step = jc.hot_step(signature=Sim)(_advance)
    step(Sim.zeros(n=8))
    snap = jc.snapshot(step)
    back = parse(render_file("t.py::test", [snap]))
    assert list(back) == [snap.key]
    assert back[snap.key] == snap
    diff = snap.diff(jc.snapshot(step))
    assert diff.ok and not diff
    assert str(diff) == "snapshot unchanged"


def test_snapshot_of_an_uncompiled_step_and_of_a_non_step():
    step = jc.hot_step(signature=Sim)(_advance)
    assert jc.snapshot(step).fields == ((("step " + step.describe().name, "compiles"), "0"),)
    with pytest.raises(jc.DefinitionError, match=r"expected hot steps"):
        jc.snapshot(_advance)  # type: ignore[arg-type]


def test_a_sharded_leaf_records_its_layout_not_device_ids(mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    step = jc.hot_step(signature=Sim)(_advance)
    step.compile(Sim.spec(n=8, sharding=NamedSharding(mesh2, P())))
    line = jc.snapshot(step).get(f"step {step.describe().name}", "signature 1", "leaf s.x")
    assert line.endswith("sharding=replicated on mesh(x=2)")


def _snap(*fields, versions=None):
    return Snapshot("cpu", 8, versions or {"jax": "1", "jaxlib": "1"}, tuple(fields))


SIG = ("step m.f", "signature 1")


def test_diff_exact_fields_show_the_leaf_attribute_that_changed():
    leaf = "f32[4] donated=yes aliased=yes bytes=16 sharding=single device"
    before = _snap(((*SIG, "leaf s.x"), leaf), (("step m.f", "compiles"), "1"))
    after = _snap(
        ((*SIG, "leaf s.x"), leaf.replace("donated=yes aliased=yes", "donated=no aliased=-")),
        (("step m.f", "compiles"), "2"),
    )
    diff = before.diff(after)
    rows = [(c.field, c.before, c.after) for c in diff.changes]
    assert rows == [
        ("step m.f / signature 1 / leaf s.x", "donated=yes aliased=yes", "donated=no aliased=-"),
        ("step m.f / compiles", "1", "2"),
    ]
    assert str(diff).splitlines()[0] == "2 contract fields changed:"
    assert "<table" in diff._repr_html_()


def test_diff_sizes_may_grow_within_their_tolerance_and_shrink_freely():
    key = (*SIG, "memory.temporaries")
    before = _snap((key, "1000"))
    assert before.diff(_snap((key, "1100"))).ok  # +10%: the default
    assert before.diff(_snap((key, "10"))).ok  # smaller is never a regression
    (change,) = before.diff(_snap((key, "1101"))).changes
    assert (change.before, change.after, change.rule) == ("1000", "1101 (+10%)", "+10%")
    assert not before.diff(_snap((key, "1101")), tolerances={"temporaries": 0.2})
    assert before.diff(_snap((key, "1001")), tolerances={"temporaries": 0.0})
    assert not before.diff(_snap((key, "9999")), tolerances={"memory.temporaries": None})
    out = (*SIG, "memory.outputs")  # follows the specs: exact by default, both ways
    assert _snap((out, "16")).diff(_snap((out, "8")))
    with pytest.raises(jc.DefinitionError, match=r"only sizes and costs have a tolerance"):
        before.diff(before, tolerances={"compiles": 0.5})


def test_diff_across_versions_compares_only_the_version_stable_fields():
    leaf = "f32[4] donated=yes aliased=yes bytes=16 sharding=single device"
    before = _snap(((*SIG, "leaf s.x"), leaf), ((*SIG, "memory.temporaries"), "0"))
    after = _snap(
        ((*SIG, "leaf s.x"), leaf), ((*SIG, "memory.temporaries"), "4096"),
        versions={"jax": "2", "jaxlib": "2"},
    )
    diff = before.diff(after)
    assert diff.ok
    assert diff.skipped == ("step m.f / signature 1 / memory.temporaries",)
    assert "jax 1, jaxlib 1" in diff.note and "jax 2, jaxlib 2" in diff.note
    drift = _snap(((*SIG, "leaf s.x"), leaf.replace("f32", "i32")), versions={"jax": "2", "jaxlib": "2"})
    assert [(c.field, c.before, c.after) for c in before.diff(drift).changes] == [
        ("step m.f / signature 1 / leaf s.x", "f32[4]", "i32[4]")
    ]
    with pytest.raises(jc.DefinitionError, match=r"cpu x8 snapshot cannot be compared with a gpu x1"):
        before.diff(Snapshot("gpu", 1, {}, ()))


@pytest.mark.parametrize(
    ("text", "value"),
    [("10%", 0.1), ("+25%", 0.25), (0.5, 0.5), ("exact", 0.0), (0, 0.0), ("any", None), ("0.2", 0.2)],
)
def test_parse_tolerance(text, value):
    assert parse_tolerance(text) == value


@pytest.mark.parametrize("bad", ["ten", "-5%", "-5", -1, True, "10 percent", float("nan")])
def test_parse_tolerance_refuses(bad):
    with pytest.raises(jc.DefinitionError, match=r"'10%' \(or 0.1\)") as info:
        parse_tolerance(bad)
    assert f"tolerance {bad!r}:" in str(info.value)  # as written (was None for "ten", -5.0 for "-5")


def test_recorder_counts_calls_fetches_and_violations_per_loop_run():
    step = jc.hot_step(signature=Sim)(_advance)
    rec = Recorder().start()
    try:
        s = step(Sim.zeros(n=8))
        with jc.hot_loop(on_violation="record") as loop:
            for _ in range(3):
                s = step(s)
            jc.fetch(s.t)
        with loop:  # the same loop entered again is a second run
            s = step(s)
            float(s.t)
    finally:
        rec.stop()
    snap = rec.snapshot()
    name = step.describe().name
    assert snap.get("loop 1", f"calls {name}") == "3"
    assert snap.get("loop 1", "fetches") == "1"
    assert snap.get("loop 1", "violations") == "0"
    assert snap.get("loop 2", f"calls {name}") == "1"
    assert snap.get("loop 2", "violations") == "1"
    assert snap.get("loop 2", "violation 1").startswith("transfer: device-to-host read: float()")
    assert snap.get("loop 1", "options") == "transfers=disallow compiles=disallow on_violation=record"


def test_recorder_at_checks_off_cannot_count_calls():
    step = jc.hot_step(signature=Sim)(_advance)
    jc.set_checks("off")
    rec = Recorder().start()
    try:
        s = step(Sim.zeros(n=8))
        with jc.hot_loop():
            s = step(s)
    finally:
        rec.stop()
    assert rec.snapshot().get("loop 1", f"calls {step.describe().name}") == "?"


# -- the pytest marker ----------------------------------------------------

# The section of a snapshot for the backend this suite runs on, and another one's.
HERE = f"{jax.default_backend()} x"
OTHER = "gpu x" if not HERE.startswith("gpu") else "tpu x"

INI = """
[pytest]
addopts = --strict-markers -p no:cacheprovider
""" + STRICT_WARNINGS

PROGRAM = """
import jax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc


@jc.state
class Sim:
    x: Float32[Array, "n"]
    t: {T}[Array, ""]


@jc.hot_step(signature=Sim, donate={DONATE}, max_compiles=2)
def advance(s: Sim) -> Sim:
    return Sim(x={BODY}, t=s.t + 1)


@pytest.mark.jc_snapshot{MARK}
def test_sim():
    s = advance(Sim.zeros(n=1024))
    {EXTRA}
    with jc.hot_loop(on_violation="record"):
        for _ in range(10):
            s = advance(s)
            {READ}
        jc.fetch(s.t)
"""

BASE = {
    "T": "Float32",
    "DONATE": '"all"',
    "BODY": "s.x + jnp.sort(s.x * 2)",
    "MARK": "",
    "EXTRA": "pass",
    "READ": "pass",
}


def _program(pytester: pytest.Pytester, **changes: str) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_sim=textwrap.dedent(PROGRAM).format(**{**BASE, **changes}))


def _recorded(pytester: pytest.Pytester, *args: str) -> str:
    _program(pytester)
    result = pytester.runpytest("--jc-snapshot-update", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*jaxcontracts snapshots*", "written: *test_sim.test_sim.jcsnap"])
    return (pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap").read_text()


def _fails_with(pytester: pytest.Pytester, rows: list[str], **changes: str) -> str:
    _recorded(pytester)
    _program(pytester, **changes)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            f"*@pytest.mark.jc_snapshot: the contract of test_sim.py::test_sim changed ({HERE}*",
            "*contract field* changed:",
            "*field*before*after*rule",
            *(row.replace("[", "[[]") for row in rows),  # fnmatch: brackets are literal
            "*Fix: if the change is intended, run pytest --jc-snapshot-update*",
        ]
    )
    return out


@pytest.mark.cpu_only(CPU_SIZES)
def test_the_file_is_stable_readable_and_holds_steps_loops_and_versions(pytester):
    text = _recorded(pytester)
    assert text.startswith("# jaxcontracts contract snapshot of test_sim.py::test_sim\n")
    assert f"jax: {jc.snapshot.__module__ and __import__('jax').__version__}" in text
    body = text[text.index(f"[{HERE}") :]
    assert re.search(r"^step test_sim\.advance\n  compiles: 1\n  signature 1\n", body, re.M)
    assert "    leaf s.x: f32[1024] donated=yes aliased=yes bytes=4096 sharding=single device\n" in body
    assert "    memory.temporaries: 4096\n" in body
    assert "loop 1\n  options: transfers=disallow compiles=disallow on_violation=record\n" in body
    assert "  calls test_sim.advance: 10\n  fetches: 1\n  violations: 0\n" in body
    # An unchanged program passes, run after run, and rewriting changes nothing.
    for _ in range(2):
        pytester.runpytest().assert_outcomes(passed=1)
    again = pytester.runpytest("--jc-snapshot-update")
    again.assert_outcomes(passed=1)
    assert "written:" not in again.stdout.str()


@pytest.mark.parametrize("level", ["full", "fast", "off"])
def test_an_unchanged_program_passes_at_every_checks_level(pytester, level):
    _recorded(pytester)
    pytester.runpytest(f"--jc-checks={level}").assert_outcomes(passed=1)


def test_a_dtype_drift_fails_with_the_leaf(pytester):
    _fails_with(
        pytester,
        ["*step test_sim.advance / signature 1 / leaf s.t  *f32[]  *i32[]  *exact"],
        T="Int32",
    )


@pytest.mark.cpu_only(CPU_SIZES)
def test_a_lost_donation_fails_with_the_leaf(pytester):
    _fails_with(
        pytester,
        [
            "*leaf s.t  *donated=yes aliased=yes  *donated=no aliased=-  *exact",
            "*signature 1 / memory.aliased*4100*4096 (-0%)*exact",
        ],
        DONATE='("x",)',
    )


@pytest.mark.cpu_only(CPU_SIZES)
def test_doubled_temporaries_fail_beyond_the_tolerance(pytester):
    out = _fails_with(
        pytester,
        ["*signature 1 / memory.temporaries*4096*8192 (+100%)*+10%"],
        BODY="s.x + jnp.sort(s.x * 2) + jnp.sort(s.x * 3)",  # one more unfused intermediate
    )
    assert "leaf s.x" not in out  # the contract of the leaves did not change


def test_a_tolerance_on_the_marker_or_in_the_ini_admits_growth(pytester):
    _recorded(pytester)
    _program(pytester, BODY="s.x + jnp.sort(s.x * 2) + jnp.sort(s.x * 3)", MARK='(temporaries="100%", flops="any", bytes_accessed="any")')
    pytester.runpytest().assert_outcomes(passed=1)
    _program(pytester, BODY="s.x + jnp.sort(s.x * 2) + jnp.sort(s.x * 3)")
    pytester.makeini(INI + "jc_snapshot_tolerance =\n    temporaries = +100%\n    flops = any\n    bytes_accessed = any\n")
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_bad_tolerance_is_an_error_naming_the_fields(pytester):
    _program(pytester, MARK='(compiles="10%")')
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.jc_snapshot: *only sizes and costs have a tolerance*"])


def test_an_extra_compile_fails(pytester):
    _fails_with(
        pytester,
        ["*step test_sim.advance / compiles*1*2*exact", "*step test_sim.advance / signature 2*-*s.x f32[512], s.t f32[]*exact"],
        EXTRA="advance(Sim.zeros(n=512))",
    )


def test_a_new_violation_fails(pytester):
    _fails_with(
        pytester,
        [
            "*loop 1 / violations*0*10*exact",
            "*loop 1 / violation 1*-*transfer: device-to-host read: float() of f32[] (advance -> .t) (x10, at test_sim.py:*",
        ],
        READ="float(s.t)",
    )


def test_a_new_violation_is_not_written(pytester):
    _program(pytester, READ="float(s.t)")
    result = pytester.runpytest("--jc-snapshot-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not written: a snapshot records clean loops*1 violation(s)*"])
    assert not (pytester.path / "__jc_snapshots__").exists()


def test_no_snapshot_for_this_backend_fails_and_update_keeps_other_sections(pytester):
    text = _recorded(pytester)
    path = pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap"
    other = text[text.index(f"[{HERE}") :].replace(f"[{HERE}", f"[{OTHER}", 1)
    path.write_text(text[: text.index(f"[{HERE}")] + other)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [f"*no contract snapshot of this test for {HERE}* (sections there: {OTHER}*", "*Fix: run pytest --jc-snapshot-update on this machine*"]
    )
    pytester.runpytest("--jc-snapshot-update").assert_outcomes(passed=1)
    both = path.read_text()
    first, second = sorted([HERE, OTHER])
    assert both.index(f"[{first}") < both.index(f"[{second}")  # sorted by key
    pytester.runpytest().assert_outcomes(passed=1)


def test_another_jax_version_compares_the_contract_only(pytester):
    text = _recorded(pytester)
    path = pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap"
    path.write_text(re.sub(r"^jax: .*$", "jax: 0.0.1", text, flags=re.M))
    _program(pytester, BODY="s.x + jnp.sort(s.x * 2) + jnp.sort(s.x * 3)")  # XLA's numbers only
    result = pytester.runpytest("-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["compared without memory/cost: test_sim.py::test_sim: recorded with jax 0.0.1*"])
    _program(pytester, T="Int32")  # the contract itself is still held
    pytester.runpytest().assert_outcomes(failed=1)


def test_a_test_that_records_nothing_fails(pytester):
    pytester.makeini(INI)
    pytester.makepyfile(
        test_empty="""
        import pytest

        @pytest.mark.jc_snapshot
        def test_nothing():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*compiled no hot step and ran no jc.hot_loop*"])


def test_a_step_compiled_in_a_fixture_and_the_jc_hot_loop_marker_are_recorded(pytester):
    pytester.makeini(INI)
    pytester.makepyfile(
        test_fx=textwrap.dedent(PROGRAM).format(**BASE)
        + textwrap.dedent(
            """
            @pytest.fixture
            def warm():
                return advance(Sim.zeros(n=1024))

            @pytest.mark.jc_snapshot
            @pytest.mark.jc_hot_loop
            def test_marked(warm):
                s = warm
                for _ in range(3):
                    s = advance(s)
            """
        )
    )
    pytester.runpytest("--jc-snapshot-update", "-k", "marked").assert_outcomes(passed=1)
    text = (pytester.path / "__jc_snapshots__" / "test_fx.test_marked.jcsnap").read_text()
    assert "step test_fx.advance\n  compiles: 1\n" in text
    assert "  calls test_fx.advance: 3\n" in text
    pytester.runpytest("-k", "marked").assert_outcomes(passed=1)


# -- the demo's own snapshot (tests/__jc_snapshots__/) ----------------------


@pytest.mark.jc_snapshot
def test_demo_simulation_contract():
    """The demo's two steps and its loop, held against the committed snapshot.

    Written on CPU with 8 simulated devices (conftest.py); on another backend
    there is no section to compare with, so the test is skipped there.
    """
    if jax.default_backend() != "cpu":
        pytest.skip("the committed snapshot is a CPU one")
    from jaxcontracts.demo.simulation import simulate

    result = simulate(steps=20, n=64)
    assert result.finite and result.reads == 4


# -- hostile snapshot files (issue 20) -------------------------------------


def test_snapshot_files_are_never_collected_as_doctests(pytester):
    # Named test*.txt they matched pytest's default doctest glob: `>>>` lines ran.
    text = _recorded(pytester)
    path = pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap"
    path.write_text(text + ">>> open('PWNED', 'w').close()\n")  # a hostile edit
    result = pytester.runpytest("--doctest-glob=test*.txt", "--doctest-glob=*.jcsnap.txt")
    result.stdout.fnmatch_lines(["collected 1 item"])  # the test, no doctest
    result.assert_outcomes(failed=1)  # the edit is a contract change, read as data
    assert not (pytester.path / "PWNED").exists()
    path.write_text(text)
    (pytester.path / "__jc_snapshots__" / "other.jcsnap").write_bytes(b"\x00\xff binary")
    pytester.runpytest().assert_outcomes(passed=1)  # a stray binary file is never read


def test_nothing_in_a_snapshot_folder_is_ever_collected(pytester):
    """Issue 39: a legacy `test_sim.test_sim.txt` matches pytest's default
    doctest glob `test*.txt`; plain `pytest` collected it and ran its `>>>`
    line. The plugin refuses the whole folder, a planted module included."""
    text = _recorded(pytester)
    folder = pytester.path / "__jc_snapshots__"
    (folder / "test_sim.test_sim.jcsnap").unlink()
    (folder / "test_sim.test_sim.txt").write_text(text + '>>> open("PWNED", "w").close()\n')
    (folder / "test_planted.py").write_text('open("PWNED", "w").close()\n')
    result = pytester.runpytest()  # pytest's default doctest glob
    result.stdout.fnmatch_lines(["collected 1 item"])  # the test, no doctest, no module
    result.assert_outcomes(failed=1)  # the `>>>` line is a contract change, read as data
    assert not (pytester.path / "PWNED").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"<<<<<<< HEAD\n[cpu x1]\n=======\n>>>>>>> other\n", "line 1: '<<<<<<< HEAD' is a merge conflict marker"),
        (b"[cpu x1]\n\x00\x01\x02", "line 2: binary data"),
        (b"[cpu x1]\n\xff\xfe not utf-8", "line 2: not UTF-8 text"),
    ],
    ids=["conflict", "binary", "not-utf8"],
)
def test_a_hostile_snapshot_file_fails_its_test_naming_the_file_and_line(pytester, content, message):
    _recorded(pytester)
    path = pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap"
    path.write_bytes(content)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)  # the test fails; the session runs on
    result.stdout.fnmatch_lines([f"*cannot read *test_sim.test_sim.jcsnap: {message}*"])


def test_a_huge_snapshot_file_fails_its_test_without_being_read(pytester):
    from jaxcontracts._testing import snapshot_file as _snapshot_file

    _recorded(pytester)
    path = pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap"
    with path.open("wb") as f:  # sparse: its size is all that is read
        f.truncate(_snapshot_file.MAX_BYTES + 1)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)  # the test fails; the session runs on
    result.stdout.fnmatch_lines([f"*cannot read *test_sim.test_sim.jcsnap: {_snapshot_file.MAX_BYTES + 1:,} bytes*"])


def test_a_bom_and_crlf_from_a_windows_editor_are_no_difference(pytester):
    text = _recorded(pytester)
    path = pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    pytester.runpytest().assert_outcomes(passed=1)


def test_an_update_never_writes_through_a_link(pytester, tmp_path_factory):
    _program(pytester)
    outside = tmp_path_factory.mktemp("outside") / "target.jcsnap"
    folder = pytester.path / "__jc_snapshots__"
    folder.mkdir()
    (folder / "test_sim.test_sim.jcsnap").symlink_to(outside)  # dangling
    result = pytester.runpytest("--jc-snapshot-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*is a symbolic link; snapshot files are never read or written through links*"])
    assert not outside.exists()


@pytest.mark.parametrize("update", [False, True], ids=["check", "update"])
def test_a_snapshot_folder_that_is_a_file_fails_its_test_clearly(pytester, update):
    """Issue 20: `__jc_snapshots__` existing as a file gave "no contract snapshot"
    (checking) or a raw FileExistsError (updating)."""
    _program(pytester)
    (pytester.path / "__jc_snapshots__").write_text("not a folder\n")
    result = pytester.runpytest(*(["--jc-snapshot-update"] if update else []))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*__jc_snapshots__ is a file, where the snapshot folder of these tests goes*"])
    assert (pytester.path / "__jc_snapshots__").read_text() == "not a folder\n"  # left as it was


def test_a_writer_killed_mid_write_leaves_the_old_file_or_the_new_one(tmp_path):
    """Issue 20 (must show): writes are atomic under a killed process. A child
    process rewrites one snapshot file in a loop, alternating two versions, and
    is killed with SIGKILL at random moments; after each kill the file parses
    and is whole: one version or the other, never a mix or a truncation."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from jaxcontracts._testing.snapshot_file import read

    folder = tmp_path / "__jc_snapshots__"
    file = folder / "test_m.test_x.jcsnap"
    writer = textwrap.dedent(f"""
        import itertools, pathlib
        from jaxcontracts._testing.snapshot import Snapshot
        from jaxcontracts._testing.snapshot_file import write
        folder, file = pathlib.Path({str(folder)!r}), pathlib.Path({str(file)!r})
        fields = {{n: tuple((("step m.advance", f"leaf s.w{{i}}"), f"f32[{{n}}]") for i in range(400)) for n in (2, 3)}}
        print("ready", flush=True)
        for n in itertools.cycle((2, 3)):
            snap = Snapshot("cpu", 1, {{"jax": "x", "jaxlib": "x"}}, fields[n])
            write(folder, file, lambda current: {{snap.key: snap}}, "test_m::test_x")
    """)
    rng = random.Random(0)
    seen = set()
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.02, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        if not file.exists():
            continue  # killed before its first rename
        (snap,) = read(folder, file).values()  # parses: never a torn file
        specs = {value for _, value in snap.fields}
        assert len(snap.fields) == 400 and len(specs) == 1, specs  # one version, whole
        seen |= specs
    assert seen, "the writer never completed a write: the test saw nothing"
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) <= 12  # a killed writer may leave its temporary, never a broken file


def test_concurrent_writer_processes_keep_every_section(tmp_path):
    """Issue 20 (must show): xdist workers updating one file at once. Four
    processes, started together, each merge their own backend's section into
    one file 25 times; the file ends with all four (a read-modify-write
    without the lock loses sections to the last writer)."""
    import subprocess
    import sys

    from jaxcontracts._testing.snapshot_file import read

    folder = tmp_path / "__jc_snapshots__"
    file = folder / "test_m.test_x.jcsnap"
    go = tmp_path / "go"
    writer = textwrap.dedent(f"""
        import pathlib, sys, time
        from jaxcontracts._testing.snapshot import Snapshot
        from jaxcontracts._testing.snapshot_file import write
        folder, file, go = pathlib.Path({str(folder)!r}), pathlib.Path({str(file)!r}), pathlib.Path({str(go)!r})
        backend = sys.argv[1]
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.001)
        for i in range(25):
            snap = Snapshot(backend, 1, {{"jax": "x", "jaxlib": "x"}}, ((("step m.f", "leaf s.w"), f"f32[{{i}}]"),))
            write(folder, file, lambda current: {{**current, snap.key: snap}}, "test_m::test_x")
    """)
    procs = [
        subprocess.Popen([sys.executable, "-c", writer, f"dev{k}"], stdout=subprocess.PIPE, text=True)
        for k in range(4)
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=120) == 0
        proc.stdout.close()
    sections = read(folder, file)
    assert sorted(snap.backend for snap in sections.values()) == ["dev0", "dev1", "dev2", "dev3"]
    assert {value for snap in sections.values() for _, value in snap.fields} == {"f32[24]"}


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(pytester, monkeypatch):
    from jaxcontracts._testing import snapshot_file as _snapshot_file

    text = _recorded(pytester)
    path = pytester.path / "__jc_snapshots__" / "test_sim.test_sim.jcsnap"

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_snapshot_file.os, "fsync", full_disk)
    _program(pytester, T="Int32")  # a new contract: the update must write
    result = pytester.runpytest_inprocess("--jc-snapshot-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not written: *No space left on device*"])
    assert path.read_text() == text  # the old file, whole
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".tmp-")] == []


def test_test_ids_that_differ_only_in_unsafe_characters_get_their_own_files():
    from jaxcontracts._testing.snapshot_file import file_name

    a, b = file_name("test_m", ["test_x[a b]"]), file_name("test_m", ["test_x[a_b]"])
    assert a != b and b == "test_m.test_x[a_b].jcsnap"  # a plain id keeps its plain name
    long = file_name("test_m", ["test_x[" + "p" * 300 + "]"])
    assert long.endswith(".jcsnap") and len(long.encode()) < 255


def test_two_sessions_writing_one_file_keep_both_sections(pytester):
    # Two backends (or xdist workers) updating one file: each merges under a lock.
    from jaxcontracts._testing.snapshot_file import parse, read, write

    text = _recorded(pytester)
    folder = pytester.path / "__jc_snapshots__"
    path = folder / "test_sim.test_sim.jcsnap"
    cpu = parse(text)
    gpu = parse(text[text.index(f"[{HERE}") :].replace(f"[{HERE}", f"[{OTHER}", 1))
    stale = dict(cpu)  # what the second session read before the first one wrote

    write(folder, path, lambda now: {**now, **gpu}, "test_sim.py::test_sim")
    write(folder, path, lambda now: {**now, **stale}, "test_sim.py::test_sim")
    assert sorted(read(folder, path)) == sorted([*cpu, *gpu])


def test_with_xdist_the_summary_lists_every_file_the_workers_wrote(pytester):
    """Issue 39: under pytest-xdist the workers write the files and the
    controller, which prints the summary, listed none of them."""
    pytest.importorskip("xdist")
    pytester.makeini(INI)
    pytester.makepyfile(
        test_many=textwrap.dedent(
            """
            import pytest
            from jaxtyping import Array, Float32

            import jaxcontracts as jc


            @jc.state
            class Sim:
                x: Float32[Array, "n"]


            @jc.hot_step(signature=Sim, donate="all", max_compiles=4)
            def advance(s: Sim) -> Sim:
                return Sim(x=s.x + 1)


            @pytest.mark.parametrize("n", [1, 2, 3, 4])
            @pytest.mark.jc_snapshot
            def test_n(n):
                advance(Sim.zeros(n=n))
            """
        )
    )
    # pytest-benchmark, where installed, warns that xdist disables it (an error here).
    args = ("-p", "xdist", "-n", "2", "-p", "no:benchmark", "--jc-snapshot-update")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=4)
    written = sorted(p.name for p in (pytester.path / "__jc_snapshots__").glob("*.jcsnap"))
    assert written == [f"test_many.test_n[{n}].jcsnap" for n in (1, 2, 3, 4)]
    listed = [line for line in result.outlines if line.startswith("written: ")]
    assert listed == [f"written: {pytester.path / '__jc_snapshots__' / name}" for name in written]


def test_a_legacy_txt_snapshot_is_read_and_an_update_replaces_it(pytester):
    text = _recorded(pytester)
    folder = pytester.path / "__jc_snapshots__"
    (folder / "test_sim.test_sim.jcsnap").rename(folder / "test_sim.test_sim.txt")
    pytester.runpytest().assert_outcomes(passed=1)  # 0.1's name still compares
    pytester.runpytest("--jc-snapshot-update").assert_outcomes(passed=1)
    assert not (folder / "test_sim.test_sim.txt").exists()
    assert (folder / "test_sim.test_sim.jcsnap").read_text() == text
