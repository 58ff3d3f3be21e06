"""profile_full: where a ``full`` call's own time goes, piece by piece (issue 22).

Each piece of the ``full`` closure of a state that is not a sealed
``@jc.state`` (``jaxcontracts/_callpath.py``: ``guarded_full`` and the tail)
is timed alone with ``timeit`` (median of 15 repeats of 20 runs) on one dict
state of ``--leaves`` ``f32[4]`` leaves (default 1,000), next to JAX's own
call of the same executable, undonated so that every piece can be repeated
on the same arrays. The difference between the two calls is what the flat
call saves JAX's flatten; the rest is jaxcontracts' own work.

Run: ``python -m benchmarks.profile_full`` (``--leaves 100``). Not part of
``python -m benchmarks``: it prints microseconds, not a ratio with a budget.
"""

from __future__ import annotations

import argparse
import operator
import statistics
import timeit
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import jaxcontracts as jc
from jaxcontracts._compat import refcount
from jaxcontracts._compat.arrays import ArrayImpl
from jaxcontracts._compat.guarded import flat_in_tree, guarded_call
from jaxcontracts._compat.tracing import cpp_call, flatten


def pieces(n: int) -> list[tuple[str, Callable[[], Any]]]:
    """The timed pieces on one state of ``n`` leaves."""

    def step(s: Any) -> Any:
        return jax.tree_util.tree_map(lambda x: x + 1, s)

    s = jc.device_tree({f"x{i}": np.zeros(4, np.float32) for i in range(n)})
    compiled = jax.jit(step).lower(s).compile()
    tree_call = cpp_call(compiled)
    flat_call = guarded_call(compiled, lambda args: True, flat_in_tree(n))
    assert flat_call is not None, "the guarded-call capability is missing here"
    leaves, treedef = flatten((s,))
    donated = operator.itemgetter(*range(n))
    is_deleted, count = ArrayImpl.is_deleted, refcount.count
    return [
        ("JAX's call, the state (flatten + signature + execute)", lambda: tree_call(s)),
        ("JAX's call, the flat leaves (what full calls)", lambda: flat_call(*leaves)),
        ("flatten((state,)) (full's one flatten)", lambda: flatten((s,))),
        ("treedef == the compiled treedef", lambda: treedef == treedef),
        ("any(map(is_deleted, leaves)) (stale, before)", lambda: any(map(is_deleted, leaves))),
        ("max(map(getrefcount, leaves)) (kept leaves, before)", lambda: max(map(count, leaves))),
        # consumed: all() over deleted leaves walks them all; any() over live ones does too
        ("map(is_deleted, donated) (consumed, after)", lambda: any(map(is_deleted, donated(leaves)))),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--leaves", type=int, default=1000, help="leaves of the dict state (default 1000)")
    args = p.parse_args(argv)
    print(f"full call pieces, dict state of {args.leaves} f32[4] leaves (jax {jax.__version__}):")
    for name, fn in pieces(args.leaves):
        fn()
        us = statistics.median(timeit.repeat(fn, number=20, repeat=15)) / 20 * 1e6
        print(f"  {name:56s} {us:10.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
