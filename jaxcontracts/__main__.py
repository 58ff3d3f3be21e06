"""``python -m jaxcontracts demo``: a small N-particle simulation, end to end.

Particles orbit in a softened central (Plummer) potential, integrated with
velocity Verlet split into two hot steps driven by a plain Python loop:

* ``kick_drift``: half kick with the stored acceleration, then drift;
* ``force_kick``: new accelerations, second half kick, energy bookkeeping.

Both steps are compiled ahead of time from ``Particles.spec(n=...)`` (no data),
every state buffer is donated and verified to alias, and nothing is read back
to the host until the loop is over.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc
from jaxcontracts._format import fmt_aval

GM = 1.0  # mass of the central body (G = 1)
EPS = 0.2  # Plummer softening length


@jc.state
class Particles:
    pos: Float32[Array, "n 3"]
    vel: Float32[Array, "n 3"]
    acc: Float32[Array, "n 3"]  # acceleration at pos (for the first half kick)
    t: Float32[Array, ""]
    step: Int32[Array, ""]
    energy0: Float32[Array, ""]  # total energy at t = 0
    max_drift: Float32[Array, ""]  # max |E - E0| / |E0| seen so far
    dt: float = jc.static(0.01)


# --------------------------------------------------------------------------
# Physics (pure jnp, used inside the steps and once for the initial state)


def acceleration(pos: jax.Array) -> jax.Array:
    """a = -GM x / (r^2 + eps^2)^(3/2)."""
    r2 = jnp.sum(pos * pos, axis=-1, keepdims=True)
    return -GM * pos * jax.lax.rsqrt(r2 + EPS**2) ** 3


def total_energy(pos: jax.Array, vel: jax.Array) -> jax.Array:
    """Kinetic plus potential energy, phi = -GM / sqrt(r^2 + eps^2)."""
    kinetic = 0.5 * jnp.sum(vel * vel)
    potential = jnp.sum(-GM * jax.lax.rsqrt(jnp.sum(pos * pos, axis=-1) + EPS**2))
    return kinetic + potential


def total_energy_host(pos: np.ndarray, vel: np.ndarray) -> float:
    """The same energy, on the host in float64 (an independent check)."""
    pos = pos.astype(np.float64)
    vel = vel.astype(np.float64)
    r2 = np.sum(pos * pos, axis=-1)
    return float(0.5 * np.sum(vel * vel) - GM * np.sum(1.0 / np.sqrt(r2 + EPS**2)))


def initial_state(n: int, seed: int = 0) -> Particles:
    """Random positions (exact float32), near-circular orbits about the z axis."""
    k_pos, k_vel = jax.random.split(jax.random.key(seed))
    pos = jax.random.normal(k_pos, (n, 3), jnp.float32)
    r2 = jnp.sum(pos * pos, axis=-1, keepdims=True)
    v_circ = jnp.sqrt(GM * r2 * jax.lax.rsqrt(r2 + EPS**2) ** 3)
    tangent = jnp.cross(jnp.array([0.0, 0.0, 1.0], jnp.float32), pos)
    tangent = tangent / jnp.maximum(jnp.linalg.norm(tangent, axis=-1, keepdims=True), 1e-6)
    vel = v_circ * (tangent + 0.1 * jax.random.normal(k_vel, (n, 3), jnp.float32))
    return Particles(
        pos=pos,
        vel=vel,
        acc=acceleration(pos),
        t=0.0,
        step=0,
        energy0=total_energy(pos, vel),
        max_drift=0.0,
    )


def make_steps() -> tuple[jc.HotStep, jc.HotStep]:
    """Two fresh hot steps (fresh stats, one signature each) for one run."""

    @jc.hot_step(signature=Particles, donate="all")
    def kick_drift(p: Particles) -> Particles:
        vel = p.vel + 0.5 * p.dt * p.acc
        step = p.step + 1
        return p.replace(
            pos=p.pos + p.dt * vel,
            vel=vel,
            step=step,
            t=step.astype(jnp.float32) * p.dt,
        )

    @jc.hot_step(signature=Particles, donate="all")
    def force_kick(p: Particles) -> Particles:
        acc = acceleration(p.pos)
        vel = p.vel + 0.5 * p.dt * acc
        drift = jnp.abs(total_energy(p.pos, vel) - p.energy0) / jnp.abs(p.energy0)
        return p.replace(acc=acc, vel=vel, max_drift=jnp.maximum(p.max_drift, drift))

    return kick_drift, force_kick


# --------------------------------------------------------------------------
# One run, and its report


@dataclasses.dataclass
class DemoResult:
    """What a run produced (host values, fetched after the loop)."""

    n: int
    steps: int
    dt: float
    t: float
    step: int
    energy0: float  # device float32, computed from the initial state
    energy: float  # host float64, from the final positions and velocities
    drift: float  # |energy - energy0| / |energy0|
    max_drift: float  # tracked on the device by force_kick, every step
    dispatch_seconds: float
    run_seconds: float
    first_state_consumed: dict[str, bool]
    checks: str  # the checks level the steps ran under
    steps_info: list[dict[str, Any]]

    @property
    def finite(self) -> bool:
        values = (self.t, self.energy0, self.energy, self.drift, self.max_drift)
        return all(np.isfinite(v) for v in values)


def _step_info(step: jc.HotStep) -> dict[str, Any]:
    entry = step._entry
    assert entry is not None, "compile the step first"
    leaves = [(path, fmt_aval(spec.shape, spec.dtype)) for path, spec in entry.flat_specs]
    return {
        "name": step.__name__,
        "compile_seconds": step.stats.compile_seconds,
        "leaves": leaves,
        "donated": set(entry.donated),
        "aliased": None if entry.aliased is None else set(entry.aliased),
        "stats": dataclasses.replace(step.stats),
    }


def simulate(steps: int, n: int, seed: int = 0, out: TextIO | None = None) -> DemoResult:
    """Compile both steps from specs, run the loop, fetch the results once.

    Progress lines (what is being compiled, the signature) go to ``out``.
    """

    def write(line: str = "") -> None:
        if out is not None:
            print(line, file=out)

    kick_drift, force_kick = make_steps()
    spec = Particles.spec(n=n)
    write(f"Compiling ahead of time from Particles.spec(n={n}) (specs only, no data):")
    for s in (kick_drift, force_kick):
        s.compile(spec)
    write(f"  signature: {kick_drift.signature[0]!r}")

    p = initial_state(n, seed)
    first = p
    t0 = time.perf_counter()
    for _ in range(steps):
        p = kick_drift(p)
        p = force_kick(p)
    t1 = time.perf_counter()
    jax.block_until_ready(p)
    t2 = time.perf_counter()

    # The only device-to-host reads of the run, after the loop.
    host = jax.device_get(p)
    energy = total_energy_host(np.asarray(host.pos), np.asarray(host.vel))
    energy0 = float(host.energy0)
    consumed = {
        jax.tree_util.keystr(path, simple=True): leaf.is_deleted()
        for path, leaf in jax.tree_util.tree_leaves_with_path(first)
    }
    return DemoResult(
        n=n,
        steps=steps,
        dt=p.dt,
        t=float(host.t),
        step=int(host.step),
        energy0=energy0,
        energy=energy,
        drift=abs(energy - energy0) / abs(energy0),
        max_drift=float(host.max_drift),
        dispatch_seconds=t1 - t0,
        run_seconds=t2 - t0,
        first_state_consumed=consumed,
        checks=jc.get_checks(),
        steps_info=[_step_info(kick_drift), _step_info(force_kick)],
    )


def _yes(flag: bool | None) -> str:
    return "n/a" if flag is None else ("yes" if flag else "NO")


def report(r: DemoResult, out: TextIO) -> bool:
    """Print the compiled steps and the results; return whether all is well."""
    ok = True
    a, b = r.steps_info

    def write(line: str = "") -> None:
        print(line, file=out)

    for s in r.steps_info:
        n_leaves = len(s["leaves"])
        if s["aliased"] is None:
            verified = "aliasing not verified (checks level 'off')"
        else:
            good = len(s["donated"] & s["aliased"])
            verified = f"{good}/{len(s['donated'])} verified to alias an output"
            ok &= good == len(s["donated"])
        write(
            f"  {s['name']:<10}  compiled in {s['compile_seconds']:.3f} s, "
            f"{len(s['donated'])}/{n_leaves} leaves donated, {verified}"
        )
    width = max(len(path) for path, _ in a["leaves"])
    write(
        f"    {'leaf':<{width}}  {'spec':<12} {a['name'] + ' donated/aliased':<28} "
        f"{b['name']} donated/aliased"
    )
    for i, (path, aval) in enumerate(a["leaves"]):
        cols = [
            f"{_yes(i in s['donated'])}/{_yes(None if s['aliased'] is None else i in s['aliased'])}"
            for s in (a, b)
        ]
        write(f"    {path:<{width}}  {aval:<12} {cols[0]:<28} {cols[1]}")
    write()
    write(
        f"Running {r.steps} steps: for i in range({r.steps}): p = {a['name']}(p); "
        f"p = {b['name']}(p)"
    )
    per = 1e6 * r.run_seconds / max(1, 2 * r.steps)
    write(
        f"  dispatched in {r.dispatch_seconds:.3f} s, done in {r.run_seconds:.3f} s "
        f"({per:.1f} us per call), no host reads inside the loop"
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
    counted = r.checks != "off"  # at level "off" a call is the bare executable
    for s in r.steps_info:
        st = s["stats"]
        write(
            f"  {s['name']}.stats: calls={st.calls} compiles={st.compiles} "
            f"refused={st.refused} traced_calls={st.traced_calls}"
            + ("" if counted else "  (calls are not counted at checks level 'off')")
        )
        ok &= st.compiles == 1 and st.refused == 0 and (st.calls == r.steps or not counted)
    consumed = all(r.first_state_consumed.values())
    write(
        f"  donation: first input state's {len(r.first_state_consumed)} buffers consumed "
        f"({', '.join(r.first_state_consumed)}): is_deleted() is {consumed}"
    )
    ok &= consumed and r.finite and r.step == r.steps
    write("OK" if ok else "FAILED: see the lines above")
    return ok


def run_demo(steps: int = 200, n: int = 4096, out: TextIO | None = None, seed: int = 0) -> int:
    """Run the demo, print its report to ``out`` (stdout); return the exit code."""
    out = sys.stdout if out is None else out
    print(
        f"jaxcontracts {jc.__version__} demo: {n} particles in a Plummer potential "
        f"(GM={GM}, eps={EPS}),\nvelocity Verlet with dt={Particles.spec(n=1).dt}, "
        f"backend {jax.default_backend()}, checks level '{jc.get_checks()}'",
        file=out,
    )
    print(file=out)
    try:
        result = simulate(steps, n, seed, out=out)
    except jc.ContractError as e:
        print(f"contract violated: {type(e).__name__}: {e}", file=out)
        return 1
    return 0 if report(result, out) else 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jaxcontracts",
        description="jaxcontracts command line.",
        epilog="Run `python -m jaxcontracts demo --help` for the demo's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run a small particle simulation driven by two hot steps",
        description=(
            "Simulate N particles orbiting a softened central mass with velocity "
            "Verlet, split into two jc.hot_step functions (kick_drift, force_kick) "
            "driven by a plain Python loop. Both are compiled ahead of time from "
            "Particles.spec(n=N); every state buffer is donated and its aliasing "
            "verified. Prints what was compiled, the final time, the energy drift and "
            "the call statistics. Exit code 0 when every check passes."
        ),
    )
    demo.add_argument(
        "--steps",
        type=_positive_int,
        default=200,
        help="number of Verlet steps (default: %(default)s)",
    )
    demo.add_argument(
        "--n", type=_positive_int, default=4096, help="number of particles (default: %(default)s)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(steps=args.steps, n=args.n)
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
