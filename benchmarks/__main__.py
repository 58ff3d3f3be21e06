"""Run every benchmark, one process each, and print one table.

Usage (from the repository root)::

    python -m benchmarks                 # the full suite (a few minutes)
    python -m benchmarks --quick         # tiny sizes: a smoke run
    python -m benchmarks --only dispatch async
    python -m benchmarks --only states --plot states.png   # and draw it
    python benchmarks/run.py             # the same, as a script

Each benchmark module runs in its own ``python -m benchmarks.<module>``
process (a fresh JAX, no caches or allocator state shared with another
benchmark; the memory benchmark needs its own process anyway), one after the
other so they never compete for the machine. Inside each, the variants that
are compared are interleaved in shuffled order, so machine drift cancels in
their ratios. Each writes its result as JSON; this runner prints every row in
one table, then every budget line as met or missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import Result, format_table

ROOT = Path(__file__).resolve().parent.parent

# name in the table -> module (run in this order)
BENCHMARKS = {
    "dispatch": "benchmarks.dispatch",
    "states": "benchmarks.states",
    "async": "benchmarks.async_dispatch",
    "loop": "benchmarks.loop",
    "memory": "benchmarks.memory",
    "compile": "benchmarks.compile",
    "state": "benchmarks.construction",
    "ports": "benchmarks.ports",
    "floor": "benchmarks.floor",
}


def run_one(name: str, module: str, quick: bool, extra: list[str], timeout: float) -> Result:
    """Run one benchmark in its own process; its result, or a failure row."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, f"{name}.json")
        cmd = [sys.executable, "-m", module, "--json", out_path, *(["--quick"] if quick else []), *extra]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return _failed(name, f"timed out after {timeout:.0f} s", time.perf_counter() - t0)
        if proc.returncode != 0 or not os.path.exists(out_path):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
            return _failed(name, f"exit code {proc.returncode}: " + " | ".join(tail),
                           time.perf_counter() - t0)
        with open(out_path, encoding="utf-8") as f:
            res = Result.from_json(json.load(f))
        res.seconds = time.perf_counter() - t0
        return res


def _failed(name: str, why: str, seconds: float) -> Result:
    res = Result(name, "FAILED", seconds=seconds)
    res.notes.append(f"FAILED: {why}")
    res.budgets.append({"benchmark": name, "line": f"{name} ran", "limit": 0, "value": None,
                        "verdict": "failed", "met": False, "why": why[:500]})
    return res


def header(results: list[Result], wall: float, quick: bool) -> str:
    meta = next((r.meta for r in results if r.meta), {})
    versions = meta.get("versions", {})
    lines = [
        "jaxcontracts benchmarks" + (" (--quick: tiny sizes, figures not meaningful)" if quick else ""),
        f"date: {meta.get('date', '?')}; wall time {wall:.0f} s "
        f"({', '.join(f'{r.benchmark} {r.seconds:.0f} s' for r in results)})",
        f"machine: {meta.get('cpu', '?')}, {meta.get('cores', '?')} cores, "
        f"{meta.get('memory_gib', '?')} GiB, {meta.get('os', '?')}; device {meta.get('device', '?')}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    p.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these")
    p.add_argument("--json", metavar="PATH", help="also write every result as JSON to PATH")
    p.add_argument("--plot", metavar="PATH", nargs="?", const="benchmarks-states.png",
                   help="draw the states benchmark's overhead against leaves into PATH "
                        "(default benchmarks-states.png; needs matplotlib)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    p.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    start = time.perf_counter()
    results = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results.append(run_one(name, BENCHMARKS[name], args.quick, args.extra, args.timeout))
    wall = time.perf_counter() - start
    print(header(results, wall, args.quick))
    print()
    print(format_table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"wall_seconds": wall, "results": [r.to_json() for r in results]}, f, indent=1)
    if args.plot:
        from benchmarks._plot import plot_states

        try:
            print(f"\nplot: {plot_states(results, args.plot)}")
        except (LookupError, ImportError) as e:
            print(f"\nplot: not drawn: {e}", file=sys.stderr)
            return 1
    failed = [r.benchmark for r in results if r.title == "FAILED"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
