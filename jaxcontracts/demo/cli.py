"""``python -m jaxcontracts demo``: the command, its options and its output.

:func:`run_demo` runs the three parts (the simulation, the reports, the
planted regressions) and prints them; :func:`main` parses the command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

import jax

import jaxcontracts as jc

from .regressions import run_regressions
from .simulation import DT, EPS, GM, DemoResult, check_result, simulate


def print_results(r: DemoResult, out: TextIO) -> None:
    """The physics, fetched once after the loop, and what donation did."""

    def write(line: str = "") -> None:
        print(line, file=out)

    per = 1e6 * r.run_seconds / max(1, 2 * r.steps)
    write(
        f"  done in {r.run_seconds:.3f} s ({per:.1f} us per call); {r.reads} deliberate "
        "reads (jc.fetch, for the bar), no other host reads"
    )
    write()
    write("Results (fetched once, after the loop):")
    write(
        f"  t = {r.t:.6f}  (expected {r.steps} x dt {r.dt} = {r.steps * r.dt:.6f}), step = {r.step}"
    )
    write(
        f"  energy: E0 = {r.energy0:.7f} (device f32), E = {r.energy:.7f} (host f64 "
        "from final pos, vel)"
    )
    write(
        f"  relative energy drift |E - E0|/|E0| = {r.drift:.2e}, "
        f"max over the run = {r.max_drift:.2e} (tracked on device)"
    )
    consumed = all(r.first_state_consumed.values())
    write(
        f"  donation: first input state's {len(r.first_state_consumed)} buffers consumed "
        f"({', '.join(r.first_state_consumed)}): is_deleted() is {consumed}"
    )


def print_reports(out: TextIO, *steps: jc.HotStep) -> bool:
    """Print each step's ``report()``; return whether every contract in them holds."""
    ok = True
    for i, s in enumerate(steps):
        if i:
            print(file=out)
        report = s.report()
        print(str(report), file=out)
        ok &= report.ok
    return ok


def run_demo(
    steps: int = 200,
    n: int = 4096,
    out: TextIO | None = None,
    seed: int = 0,
    regressions: bool = True,
) -> int:
    """Run the demo, print it to ``out`` (stdout); return the exit code."""
    out = sys.stdout if out is None else out

    def write(line: str = "") -> None:
        print(line, file=out)

    write(
        f"jaxcontracts {jc.__version__} demo: {n} particles in a Plummer potential "
        f"(GM={GM}, eps={EPS}),\nvelocity Verlet with dt={DT}, "
        f"backend {jax.default_backend()}, checks level '{jc.get_checks()}'"
    )
    write()
    write("== 1. The simulation: two hot steps in a host loop ==")
    try:
        result = simulate(steps, n, seed, out=out)
    except jc.ContractError as e:
        write(f"FAILED: contract violated: {type(e).__name__}: {e}")
        return 1
    print_results(result, out)
    write()
    write("== 2. The reports ==")
    problems = check_result(result)
    if not print_reports(out, *result.hot_steps):
        problems.append("a step's report has a failing contract")
    if result.loop_report is not None:
        write()
        write("The hot loop's report: its contracts, and where its time went")
        write(str(result.loop_report))
        if not result.loop_report.ok:
            problems.append("the hot loop's report has a failing contract")

    if regressions:
        write()
        write("== 3. Three planted regressions, each must be caught ==")
        if not run_regressions(n, out):
            problems.append("a planted regression was not caught (see above)")
    write()
    if problems:
        for p in problems:
            write(f"  problem: {p}")
        write("FAILED: see the lines above")
        return 1
    write("OK")
    return 0


# --------------------------------------------------------------------------
# The command line


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


DEMO_DESCRIPTION = """\
A small end-to-end tour of jaxcontracts, in three parts:

1. The simulation. N particles orbit a softened central mass, integrated
   with velocity Verlet split into two jc.hot_step functions (kick_drift,
   force_kick) driven by a plain Python loop inside `with jc.hot_loop():`.
   Both are compiled ahead of time from Particles.spec(n=N); every state
   buffer is donated and its aliasing verified. A progress bar is drawn
   from a periodic jc.fetch (the only reads inside the loop); the time,
   energy drift and donation are checked after it.
2. The reports: what each step compiled (leaves, specs, donation,
   aliasing), its compile time, whether the executable came from JAX's
   persistent compilation cache, and calls; then the hot loop's report:
   steps per second, host time per step call, time blocked on the device,
   and whether the loop is dispatch-bound or device-bound.
3. Three planted regressions, each run and shown caught with its message:
   print(p.t) inside the loop (TransferError); an int32-initialised float
   field (SpecError at construction; RecompileError at compile for a plain
   dict state); a donation that would have gone stale (a parameter inserted
   before the state still donates the state; reading the old state after
   the step donated it is a DonationError).

The code is in jaxcontracts/demo/ and uses the public API only.

Exit code 0 when the simulation passes every check and all three
regressions are caught; 1 otherwise."""


def build_parser() -> argparse.ArgumentParser:
    """The demo's options (``python -m jaxcontracts demo --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m jaxcontracts demo",
        description=DEMO_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--steps",
        type=_positive_int,
        default=200,
        help="number of Verlet steps in part 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--n",
        type=_positive_int,
        default=4096,
        help="number of particles, in parts 1 and 3 (default: %(default)s)",
    )
    parser.add_argument(
        "--no-regressions",
        dest="regressions",
        action="store_false",
        help="skip part 3, the planted regressions",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo with these options (``sys.argv[1:]`` by default); return the exit code."""
    args = build_parser().parse_args(argv)
    return run_demo(steps=args.steps, n=args.n, regressions=args.regressions)


if __name__ == "__main__":
    raise SystemExit(main())
