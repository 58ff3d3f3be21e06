"""audit: what ``jc.watch()`` (and so ``python -m jaxcontracts audit``) costs a loop.

The issue's budget: the audit costs at most 2x the plain run on a
dispatch-bound loop. Three dispatch-bound loops of plain ``jax.jit`` code,
each timed plain (no watch open anywhere) and inside a watch, interleaved,
in one process:

* ``dict state``: ``state = step(state, batch)``, a dict of ``--leaves``
  small arrays, device batches (the wrapper's flatten and its type check on
  every call; the donation window's weak references after the compile);
* ``numpy batches``: the same step given a numpy batch of the same values
  each call (the "same array at each call" finding counted at every call);
* ``loader batches``: a numpy batch of new values each call, as a data
  loader gives (no finding: each call's values are looked at afresh).

Printed: the median us per call of each form and the ratio watch / plain
(paired by block). With ``--programs``, each program of
``tests/audit_programs`` is also run as ``python P.py`` and as ``python -m
jaxcontracts audit P.py`` (alternating, ``--runs`` times each; whole
processes, so imports and compiles are in both), with the median wall time
of each and their ratio.

Run: ``python -m benchmarks.audit [--leaves 10 100] [--repeats 20] [--programs [--runs 3]]``.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxcontracts as jc


def _loop(step, state, batches) -> tuple[float, object]:
    t0 = time.perf_counter()
    for b in batches:
        state = step(state, b)
    jax.block_until_ready(state)
    return (time.perf_counter() - t0) / len(batches) * 1e6, state


_BATCHES = {
    "": lambda i: jnp.ones(4),
    ", numpy batches": lambda i: np.ones(4, np.float32),
    ", loader batches": lambda i: np.full(4, i, np.float32),
}


_WARM = 12  # calls before a watched loop is timed: the watch follows the first ones closely


def _case(n: int, batches_kind: str, repeats: int, calls: int) -> tuple[float, float, float]:
    def body(state, b):
        return {k: v + b.sum() for k, v in state.items()}

    plain = jax.jit(body, donate_argnums=0)
    batches = [_BATCHES[batches_kind](i) for i in range(calls)]
    s1 = {f"x{i}": jnp.zeros(4) for i in range(n)}
    s2 = {f"x{i}": jnp.zeros(4) for i in range(n)}
    _, s1 = _loop(plain, s1, batches[:3])
    ratios, tp, tw = [], [], []
    for _ in range(repeats):
        # plain: no watch open (a watch's process-wide hooks would slow it too);
        # watched: a new watch each block, its first calls (where it follows the
        # arguments) untimed
        a, s1 = _loop(plain, s1, batches)
        with jc.watch() as w:
            watched = jax.jit(body, donate_argnums=0)
            _, s2 = _loop(watched, s2, batches[:_WARM])
            b, s2 = _loop(watched, s2, batches)
        assert w.calls == _WARM + calls
        tp.append(a)
        tw.append(b)
        ratios.append(b / a)
    return statistics.median(tp), statistics.median(tw), statistics.median(ratios)


def _programs(runs: int) -> None:
    here = pathlib.Path(__file__).resolve().parent.parent / "tests" / "audit_programs"
    print(f"\n{'program':<24}{'plain s':>10}{'audit s':>10}{'audit/plain':>13}  (whole processes, median of {runs})")
    for path in sorted(here.glob("*.py")):
        plain, audited = [], []
        for _ in range(runs):
            for cmd, out in (([sys.executable, str(path)], plain),
                             ([sys.executable, "-m", "jaxcontracts", "audit", str(path)], audited)):
                t0 = time.perf_counter()
                done = subprocess.run(cmd, capture_output=True, timeout=600)
                out.append(time.perf_counter() - t0)
                if done.returncode:
                    print(f"  {path.name}: exit {done.returncode}")
        p, a = statistics.median(plain), statistics.median(audited)
        print(f"{path.stem:<24}{p:>10.2f}{a:>10.2f}{a / p:>13.3f}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.audit")
    p.add_argument("--leaves", type=int, nargs="+", default=[10, 100])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--programs", action="store_true", help="also time tests/audit_programs, plain and audited")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    print(f"{'case':<40}{'plain us/call':>14}{'watch us/call':>15}{'watch/plain':>13}  (budget <= 2.00)")
    for n in args.leaves:
        for kind in _BATCHES:
            name = f"dict state, {n} leaves{kind}"
            plain, watched, ratio = _case(n, kind, args.repeats, args.calls)
            print(f"{name:<40}{plain:>14.1f}{watched:>15.1f}{ratio:>13.3f}")
    if args.programs:
        _programs(args.runs)


if __name__ == "__main__":
    main()
