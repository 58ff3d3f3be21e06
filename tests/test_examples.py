"""The programs in examples/ run clean: each drives its steps inside a raising
``jc.hot_loop`` (a read, an implicit transfer or a compile there would fail
it) and asserts its own result. Run in-process (the suite already has 8 CPU
devices) and once as users run them, ``python examples/X.py``."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
NEEDS = {"flax_training.py": ("flax", "optax")}


def _require(name: str) -> None:
    for module in NEEDS.get(name, ()):
        pytest.importorskip(module)


def test_there_are_four_examples_and_the_readme_links_each():
    assert EXAMPLES == [
        "flax_training.py",
        "rl_static_config.py",
        "sharded_training.py",
        "simulation_rollback.py",
    ]
    readme = (ROOT / "README.md").read_text()
    for name in EXAMPLES:
        assert f"(examples/{name})" in readme, name


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_clean_in_a_raising_hot_loop(name, capsys):
    _require(name)
    if name == "sharded_training.py" and len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS)")
    source = (ROOT / "examples" / name).read_text()
    assert "with jc.hot_loop():" in source  # raising: the default on_violation
    module = runpy.run_path(str(ROOT / "examples" / name), run_name="example")
    module["main"]()  # each main() asserts its own result
    out = capsys.readouterr().out
    assert "compile" in out


def test_an_example_runs_as_a_script():
    # As a user runs it: its own process, its own XLA_FLAGS.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sharded_training.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hot_step: scale stays P()" in result.stdout
    assert "jax.jit: scale comes back P('data',)" in result.stdout


def test_the_readmes_example_runs_as_written(capsys, tmp_path):
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## In one example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "with jc.hot_loop():" in block  # the loop as users should write it
    (tmp_path / "readme_example.py").write_text(block)
    runpy.run_path(str(tmp_path / "readme_example.py"), run_name="readme_example")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "0.01" and len(out) == 11 and "calls=1000" in out[-1], out
