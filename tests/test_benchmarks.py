"""Smoke runs of the benchmarks at tiny sizes, so they cannot rot.

Timings are printed by the benchmarks, never asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("dispatch.py", "budgets at 10 leaves"),
        ("loop.py", "inside/outside:"),
    ],
)
def test_benchmark_smoke(script, expect):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert expect in out.stdout
