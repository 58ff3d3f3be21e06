"""Smoke runs of every benchmark at tiny sizes, so they cannot rot.

One ``python -m benchmarks --quick`` run (each benchmark in its own process,
as in a real run) is shared by the tests below. Timings are printed by the
benchmarks, never asserted here: only that each one ran and printed its rows
and its budget lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# benchmark -> (a variant its rows must show, how many budget lines it has)
EXPECTED = {
    "dispatch": ("hot_step full", 6),
    "states": ("hot_step full", 18),  # six state kinds x three levels
    "async": ("hot_step full: return", 1),
    "loop": ("inside hot_loop", 2),  # the loop, and entry against live steps
    "memory": ("hot_step compile", 2),  # the peak on a big state; memory per signature
    "compile": ("hot_step.compile(spec)", 1),
    "state": ("s.replace(x0=...)", 2),  # --quick: 10 fields only (100 in a full run)
    "ports": ("port full", 8),  # NNX, NNX in place, PPO, CMA-ES, refs, diffrax, MJX, equinox stateful
    "floor": ("floor full", 0),  # rows and notes only: each level's checks written inline
}
PEERS = ("eqx.filter_jit(donate=all)", "jax.jit(chex.assert_max_traces)", "jaxtyped(beartype)(jax.jit)")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out_json = tmp_path_factory.mktemp("bench") / "results.json"
    # The suite's simulated 8-device CPU (conftest) is not what a user runs.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--json", str(out_json)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    with open(out_json, encoding="utf-8") as f:
        results = {r["benchmark"]: r for r in json.load(f)["results"]}
    return proc.stdout, results


@pytest.mark.parametrize("name", list(EXPECTED))
def test_benchmark_ran_and_printed_its_rows(quick_run, name):
    stdout, results = quick_run
    variant, n_budgets = EXPECTED[name]
    res = results[name]
    assert res["rows"], f"{name} reported no rows"
    assert any(r["variant"] == variant for r in res["rows"])
    assert len(res["budgets"]) == n_budgets
    table_lines = [line for line in stdout.splitlines() if line.startswith(name + " ")]
    assert any(variant in line for line in table_lines), stdout
    for b in res["budgets"]:
        skipped = name in ("ports", "states") and b["verdict"] == "not run" and "not installed" in b["why"]
        assert skipped or b["verdict"].split()[0] in ("met", "missed"), b
        assert b["line"] in stdout


def test_one_table_with_header_and_budgets(quick_run):
    stdout, _ = quick_run
    assert stdout.startswith("jaxcontracts benchmarks")
    assert "machine:" in stdout and "date:" in stdout
    assert stdout.count("\nbenchmark  case") == 1  # one table
    assert "budgets:" in stdout


def test_dispatch_covers_every_leaf_count_and_peer(quick_run):
    _, results = quick_run
    rows = results["dispatch"]["rows"]
    cases = {r["case"] for r in rows}
    assert {"1 leaf", "10 leaves", "100 leaves"} <= cases
    for peer in PEERS:  # measured, or marked "not installed": never an error
        peer_rows = [r for r in rows if r["variant"] == peer]
        assert peer_rows
        assert all(r["median"] is not None or r["note"] == "not installed" for r in peer_rows)


def test_states_covers_every_kind_with_its_control_and_peers(quick_run):
    _, results = quick_run
    res = results["states"]
    cases = {r["case"] for r in res["rows"]}
    kinds = ("sealed", "PyTree field", "TrainState", "NamedTuple", "dict", "dict, keyword + static")
    assert {f"{k}, 10 leaves" for k in kinds} <= cases
    for case in cases:
        variants = {r["variant"]: r for r in res["rows"] if r["case"] == case}
        assert {"raw compiled", "raw A/A", "jax.jit donated", "jax.jit plain", "eqx.filter_jit"} <= set(variants)
        assert variants["raw compiled"]["note"] == "base"
        assert variants["raw A/A"]["x_base"] is not None  # the control is measured, not assumed
    overhead = res["meta"]["overhead"]
    assert set(overhead) == set(kinds)
    assert all(points[0][0] == 10 for series in overhead.values() for points in series.values())


@pytest.fixture
def benchmarks_importable(monkeypatch):
    # CI's version legs run the suite from outside the checkout (the installed
    # package, not the source tree), where the benchmarks package is not on sys.path.
    monkeypatch.syspath_prepend(str(ROOT))


def test_the_plot_draws_the_states_result(quick_run, tmp_path, benchmarks_importable):
    pytest.importorskip("matplotlib")
    from benchmarks._common import Result
    from benchmarks._plot import plot_states

    _, results = quick_run
    path = tmp_path / "states.png"
    assert plot_states([Result.from_json(results["states"])], str(path)) == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    with pytest.raises(LookupError, match="no states benchmark"):
        plot_states([Result.from_json(results["dispatch"])], str(tmp_path / "none.png"))


def test_the_full_call_profile_prints_every_piece(capsys, benchmarks_importable):
    from benchmarks import profile_full

    assert profile_full.main(["--leaves", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("full call pieces, dict state of 3 f32[4] leaves")
    timed = [line for line in lines[1:] if line.rstrip().endswith(" us")]
    assert len(timed) == len(profile_full.pieces(3)) == 7
    assert all(float(line.split()[-2]) > 0 for line in timed)


def test_the_floor_makes_every_check_its_level_promises(benchmarks_importable):
    """The floor's inline checks are real: each refuses what its level refuses,
    and a clean call runs (so the floor it prints is the cost of those checks)."""
    import jax
    import jax.numpy as jnp

    from benchmarks import floor

    def step(s):
        return jax.tree_util.tree_map(lambda x: x + 1, s)

    def fresh():
        return {"a": jnp.zeros(4), "b": jnp.ones(4)}

    donated = jax.jit(step, donate_argnums=0).lower(fresh()).compile()
    full = floor.floor_full(donated, (fresh(),))
    fast = floor.floor_fast(donated, lambda s: s["a"])
    out = full(fresh())
    assert float(out["b"][0]) == 2.0
    assert float(fast(fresh())["a"][0]) == 1.0

    stale = fresh()
    full(stale)  # consumed
    for check in (full, fast):
        with pytest.raises(AssertionError, match="a floor check fired"):
            check(stale)
    partly = fresh()
    partly["b"].delete()  # only a leaf past the first: fast does not look, full does
    with pytest.raises(AssertionError, match="a floor check fired"):
        full(partly)
    kept = fresh()
    sample = kept["b"]  # a donated leaf held elsewhere
    with pytest.raises(AssertionError, match="a floor check fired"):
        full(kept)
    assert not sample.is_deleted()  # refused before the call: nothing donated
    with pytest.raises(AssertionError, match="a floor check fired"):
        full({"a": jnp.zeros(4), "c": jnp.ones(4)})  # another tree structure
    undonated = jax.jit(step).lower(fresh()).compile()
    with pytest.raises(AssertionError, match="a floor check fired"):  # the donation did not happen
        floor.floor_full(undonated, (fresh(),))(fresh())
    # One donated leaf XLA cannot reuse ("b"'s output has another shape): the
    # first is consumed, "b" is not, and the check after the call sees it.
    partial = jax.jit(lambda s: {"a": s["a"] + 1, "b": s["b"].sum()}, donate_argnums=0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX's "Some donated buffers were not usable"
        partial = partial.lower(fresh()).compile()
    with pytest.raises(AssertionError, match="a floor check fired"):
        floor.floor_full(partial, (fresh(),))(fresh())


def test_the_floor_sets_each_floor_against_its_budget(quick_run):
    _, results = quick_run
    notes = results["floor"]["notes"]
    cases = [n for n in notes if "(paired medians against" in n]
    assert any(n.startswith("dict, 10 leaves") for n in cases)
    for note in cases:
        assert "full: floor" in note and "budget" in note and "the hot step" in note
    variants = {r["variant"] for r in results["floor"]["rows"]}
    assert {"raw compiled", "flat call", "floor fast", "floor full", "hot_step fast", "hot_step full"} <= variants
