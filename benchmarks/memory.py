"""memory: peak resident memory of a 1 GiB state loop, as a multiple of the state.

What is measured
----------------
A ``@jc.state`` of four ``f32`` leaves, 1 GiB in all, and an elementwise step
(``x * 0.5 + 1`` on every leaf). One sample: note the resident set size,
create the state (``S.zeros``), run ``s = f(s)`` 20 times, wait for it, and
read the peak resident set size; the figure is ``(peak - before) / state
size``. Variants, interleaved in shuffled order after one warm-up round (so
compiles are not counted):

* ``jax.jit donated``: ``jax.jit(step, donate_argnums=0)``, the reference
  (expected ~1.0x: XLA updates the state in place);
* ``jax.jit undonated``: ``jax.jit(step)`` (expected ~2.0x: input and output
  are alive at once);
* ``hot_step full``: ``jc.hot_step(step, signature=S)``, donated by default.

The peak is read from ``VmHWM`` in ``/proc/self/status`` and reset between
samples by writing ``5`` to ``/proc/self/clear_refs`` (Linux), so every sample
runs in this one process. Where that is unavailable, each sample runs in a
fresh child process and the peak is ``resource.getrusage().ru_maxrss``.

Budget: ``hot_step`` peak growth ``<= 1.10x`` the state.

Memory per compiled signature
-----------------------------
A sweep, methods bound per instance, ``max_compiles > 1`` or a test suite
hold many compiled signatures. Each sample is a fresh process that compiles
20 tiny steps (two leaves, a distinct function each) to warm up, then
``--signatures`` more, keeping each, and reads the growth of the resident set
per signature. Variants: ``raw AOT compile`` (``jax.jit(f,
donate_argnums=0).lower(spec).compile()``, the function dropped: the base),
``jax.jit first call`` (the jitted function kept, as a program keeps it) and
``hot_step compile`` (``jc.hot_step(f).compile(S.spec(n=16))``, the step kept).
Budget: ``hot_step`` ``<= 1.20x`` the raw AOT compile per signature.

Run: ``python -m benchmarks.memory`` (``--quick``: an 8 MiB state, 10 signatures
after 5 to warm up, one sample of them).
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any

import jax
from jaxtyping import Array, Float32

import jaxcontracts as jc
from benchmarks._common import Result, machine, parser, row

LIMIT = 1.10
VARIANTS = ("jax.jit donated", "jax.jit undonated", "hot_step full")
LEAVES = 4


@jc.state
class Big:
    a: Float32[Array, "n"]
    b: Float32[Array, "n"]
    c: Float32[Array, "n"]
    d: Float32[Array, "n"]


def step(s: Big) -> Big:
    return jax.tree_util.tree_map(lambda x: x * 0.5 + 1, s)


def make(name: str, n: int) -> Any:
    if name == "jax.jit donated":
        return jax.jit(step, donate_argnums=0)
    if name == "jax.jit undonated":
        return jax.jit(step)
    hot = jc.hot_step(step, signature=Big)
    hot.compile(Big.spec(n=n))
    return hot


# --------------------------------------------------------------------------
# Resident memory


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


def can_reset_peak() -> bool:
    """Whether this process can reset and read its own peak RSS."""
    if _status_kib("VmHWM") is None or not _reset_peak():
        return False
    return _status_kib("VmHWM") is not None


def _maxrss_bytes() -> int:
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    try:
        import psutil
    except ImportError:
        return _maxrss_bytes()  # the best there is: a lower bound on growth
    return int(psutil.Process().memory_info().rss)


def one_sample(f: Any, n: int, steps: int, reset: bool) -> float:
    """Peak growth in bytes of: create the state, run ``steps`` steps."""
    gc.collect()
    if reset:
        _reset_peak()
    before = _rss_bytes()
    s = Big.zeros(n=n)
    for _ in range(steps):
        s = f(s)
    jax.block_until_ready(s)
    peak = (_status_kib("VmHWM") or 0) * 1024 if reset else _maxrss_bytes()
    del s
    gc.collect()
    return float(peak - before)


def child(name: str, n: int, steps: int) -> int:
    """One sample in a fresh process (where the peak cannot be reset)."""
    f = make(name, n)
    s = Big.zeros(n=n)
    for _ in range(2):  # compile, and let the allocator settle
        s = f(s)
    del s
    gc.collect()
    print(json.dumps({"growth": one_sample(f, n, steps, reset=False)}))
    return 0


def sample_in_child(name: str, n: int, steps: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", "--child", name, "--n", str(n),
         "--steps", str(steps)],
        capture_output=True, text=True, check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["growth"])


SIG_LIMIT = 1.20
SIG_VARIANTS = ("raw AOT compile", "jax.jit first call", "hot_step compile")


@jc.state
class Tiny:
    x: Float32[Array, "n"]
    t: Float32[Array, ""]


def _tiny_signature(name: str, i: int) -> Any:
    def f(s: Tiny) -> Tiny:
        return Tiny(x=s.x * (1.5 + i) + s.t, t=s.t + 1)

    if name == "raw AOT compile":
        return jax.jit(f, donate_argnums=0).lower(Tiny.spec(n=16)).compile()
    if name == "jax.jit first call":
        jitted = jax.jit(f, donate_argnums=0)
        jitted(Tiny.zeros(n=16))
        return jitted
    hot = jc.hot_step(f)
    hot.compile(Tiny.spec(n=16))
    return hot


def signature_child(name: str, count: int, warmup: int = 20) -> int:
    """KiB of resident memory per compiled signature, in this fresh process."""
    kept = [_tiny_signature(name, i) for i in range(warmup)]  # warm-up: JAX's own first costs
    gc.collect()
    before = _rss_bytes()
    kept += [_tiny_signature(name, warmup + i) for i in range(count)]
    gc.collect()
    print(json.dumps({"kib": (_rss_bytes() - before) / 1024 / count, "kept": len(kept)}))
    return 0


def sample_signatures(name: str, count: int, quick: bool) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", "--signature-child", name,
         "--signatures", str(count), *(["--quick"] if quick else [])],
        capture_output=True, text=True, check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["kib"])


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--mib", type=float, help="state size in MiB (default 1024)")
    p.add_argument("--steps", type=int, default=20, help="steps per sample")
    p.add_argument("--repeats", type=int, help="samples per variant (default 3)")
    p.add_argument("--n", type=int, help=argparse_hidden())
    p.add_argument("--child", choices=VARIANTS, help=argparse_hidden())
    p.add_argument("--signatures", type=int, help="signatures per sample (default 150)")
    p.add_argument("--signature-child", choices=SIG_VARIANTS, help=argparse_hidden())
    p.add_argument("--force-children", action="store_true",
                   help="one process per sample even where the peak can be reset")
    args = p.parse_args(argv)
    mib = args.mib or (8.0 if args.quick else 1024.0)
    n = args.n or int(mib * 2**20) // (4 * LEAVES)
    count = args.signatures or (10 if args.quick else 150)
    if args.child:
        return child(args.child, n, args.steps)
    if args.signature_child:
        return signature_child(args.signature_child, count, warmup=5 if args.quick else 20)
    repeats = args.repeats or (2 if args.quick else 3)
    state_bytes = n * 4 * LEAVES
    start = time.perf_counter()
    res = Result("memory", "peak RSS growth of 20 steps on a state, x the state size")
    res.meta = machine()

    in_process = not args.force_children and can_reset_peak()
    fns = {name: make(name, n) for name in VARIANTS} if in_process else {}
    growth: dict[str, list[float]] = {name: [] for name in VARIANTS}
    rng = random.Random(args.seed)
    order = list(VARIANTS)
    for r in range(repeats + (1 if in_process else 0)):
        rng.shuffle(order)
        for name in order:
            if in_process:
                g = one_sample(fns[name], n, args.steps, reset=True)
                if r > 0:  # round 0 compiles and warms the allocator up
                    growth[name].append(g / state_bytes)
            else:
                growth[name].append(sample_in_child(name, n, args.steps) / state_bytes)

    case = f"{state_bytes / 2**20:,.0f} MiB, {LEAVES} leaves, {args.steps} steps"
    expect = {"jax.jit donated": "expected ~1.0", "jax.jit undonated": "expected ~2.0"}
    for name in VARIANTS:
        res.rows.append(row(case, name, growth[name], "x state", note=expect.get(name, "")))
    value = statistics.median(growth["hot_step full"])
    res.budget(f"hot_step peak growth <= {LIMIT:.2f}x the state", value, LIMIT,
               why="(a raw donated jax.jit measures "
               f"{statistics.median(growth['jax.jit donated']):.3f}x here, an undonated one "
               f"{statistics.median(growth['jax.jit undonated']):.3f}x)")
    per_sig: dict[str, list[float]] = {name: [] for name in SIG_VARIANTS}
    sig_order = list(SIG_VARIANTS)
    for _ in range(1 if args.quick else repeats):  # a fresh process each: the smoke run takes one
        rng.shuffle(sig_order)
        for name in sig_order:
            per_sig[name].append(sample_signatures(name, count, args.quick))
    sig_case = f"{count} compiled signatures, 2 leaves"
    for name in SIG_VARIANTS:
        res.rows.append(row(sig_case, name, per_sig[name], "KiB/sig", base=per_sig["raw AOT compile"]))
    raw = statistics.median(per_sig["raw AOT compile"])
    ratios = [h / r for h, r in zip(per_sig["hot_step compile"], per_sig["raw AOT compile"])]
    res.budget(
        f"hot_step memory per compiled signature <= {SIG_LIMIT:.2f}x a raw AOT compile",
        statistics.median(per_sig["hot_step compile"]) / raw if raw > 0 else None,
        SIG_LIMIT,
        paired=ratios,
        why=f"(jax.jit, whose function stays alive with its trace and lowering caches, "
        f"{statistics.median(per_sig['jax.jit first call']) / raw if raw > 0 else float('nan'):.2f}x)",
    )
    res.notes.append(
        ("peak reset in-process (/proc/self/clear_refs)" if in_process
         else "one child process per sample (ru_maxrss)")
        + f"; {repeats} samples per variant; state {state_bytes:,} bytes"
    )
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
