"""A hot step served by JAX's persistent compilation cache is still proven.

A second process compiling the same step from the same spec loads the
executable from the cache (``describe().current.cache == "hit"``), and every
contract is verified on it as on a fresh compile: carry invariance (from the
trace), aliasing (read from the loaded executable's alias table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from jaxtyping import Array, Float32

import jaxcontracts as jc

WORKER = Path(__file__).with_name("_cache_worker.py")


def run_worker(cache_dir: Path) -> dict:
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    root = str(Path(__file__).resolve().parents[1])  # this checkout's jaxcontracts
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(cache_dir)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JC_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("JC_RESULT "):])


def test_a_second_process_loads_the_step_from_the_cache_with_every_contract_verified(tmp_path):
    first = run_worker(tmp_path)
    second = run_worker(tmp_path)
    print(
        f"\ncold: compile {first['compile_seconds'] * 1e3:.0f} ms ({first['cache']}); "
        f"warm: compile {second['compile_seconds'] * 1e3:.0f} ms ({second['cache']})"
    )
    assert first["cache"] == "miss" and second["cache"] == "hit"
    assert first["cache_hits"] == 0 and second["cache_hits"] == 1
    assert "from the persistent compilation cache" in second["compiled_fact"]
    for run in (first, second):
        assert run["ok"] and all(ok for _, ok in run["contracts"])
        # aliasing was read from the executable's table, not assumed
        assert run["aliased"] is not None and run["aliased"] == run["donated"] != []
        assert run["t"] == 2
    assert second["contracts"] == first["contracts"]


def test_without_the_persistent_cache_a_compile_says_so():
    class S(jc.State):
        x: Float32[Array, "n"]

    @jc.hot_step
    def inc(s: S) -> S:
        return s.replace(x=s.x + 1)

    inc.compile(S.spec(n=5))
    cs = inc.describe().current
    if jax.config.jax_compilation_cache_dir:
        pytest.skip("this run has a persistent compilation cache configured")
    assert cs.cache == "off" and cs.compile_seconds > 0
    assert "not used" in dict(inc.report().facts)["compiled"]


FORGER = Path(__file__).with_name("_forged_cache_worker.py")


def test_a_forged_cache_entry_is_refused_and_the_message_says_it_came_from_the_cache(tmp_path):
    """Issue 21: the refusal named a symptom ("every output of this shape and
    dtype already reuses another buffer"), never that the executable was loaded
    from the persistent cache, which is the cause."""
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(FORGER), str(tmp_path)], capture_output=True, text=True, timeout=300, env=env
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JC_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("JC_RESULT "):])
    assert result["error"] == "DonationError" and result["contract"] == "aliasing"
    message = result["message"]
    assert "persistent compilation cache" in message
    assert str(tmp_path) in message  # the folder to clear
    assert "already reuses another buffer" not in message
