"""The demo's simulation: N particles in a softened central potential.

Particles orbit a central mass in a Plummer potential, integrated with
velocity Verlet split into two hot steps driven by a plain Python loop inside
``jc.hot_loop()``:

* ``kick_drift``: half kick with the stored acceleration, then drift;
* ``force_kick``: new accelerations, second half kick, energy bookkeeping.

Both steps are compiled ahead of time from ``Particles.spec(n=...)`` (no
data), every state buffer is donated and verified to alias, and the only reads
inside the loop are a periodic ``jc.fetch`` that drives the progress bar.

Public jaxcontracts API only, like any user's code.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc

GM = 1.0  # mass of the central body (G = 1)
EPS = 0.2  # Plummer softening length
DT = 0.01  # time step


@jc.state
class Particles:
    pos: Float32[Array, "n 3"]
    vel: Float32[Array, "n 3"]
    acc: Float32[Array, "n 3"]  # acceleration at pos (for the first half kick)
    t: Float32[Array, ""]
    step: Int32[Array, ""]
    energy0: Float32[Array, ""]  # total energy at t = 0
    max_drift: Float32[Array, ""]  # max |E - E0| / |E0| seen so far
    dt: float = jc.static(DT)


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


# --------------------------------------------------------------------------
# The two steps (plain functions; make_steps() wraps them in fresh hot steps)


def kick_drift(p: Particles) -> Particles:
    vel = p.vel + 0.5 * p.dt * p.acc
    step = p.step + 1
    return p.replace(
        pos=p.pos + p.dt * vel,
        vel=vel,
        step=step,
        t=step.astype(jnp.float32) * p.dt,
    )


def force_kick(p: Particles) -> Particles:
    acc = acceleration(p.pos)
    vel = p.vel + 0.5 * p.dt * acc
    drift = jnp.abs(total_energy(p.pos, vel) - p.energy0) / jnp.abs(p.energy0)
    return p.replace(acc=acc, vel=vel, max_drift=jnp.maximum(p.max_drift, drift))


def make_steps() -> tuple[jc.HotStep, jc.HotStep]:
    """Two fresh hot steps (fresh stats, one signature each) for one run."""
    hot = jc.hot_step(signature=Particles, donate="all")
    return hot(kick_drift), hot(force_kick)


def compiled_steps(n: int) -> tuple[jc.HotStep, jc.HotStep]:
    """Fresh steps, compiled ahead of time from ``Particles.spec(n=n)``."""
    steps = make_steps()
    for s in steps:
        s.compile(Particles.spec(n=n))
    return steps


# --------------------------------------------------------------------------
# One run


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
    run_seconds: float
    reads: int  # deliberate jc.fetch reads inside the loop (the progress bar)
    first_state_consumed: dict[str, bool]
    checks: str  # the checks level the steps ran under
    steps_info: list[dict[str, Any]]
    hot_steps: tuple[jc.HotStep, ...] = ()
    loop_report: jc.Report | None = None  # the hot loop's report: contracts and timing

    @property
    def finite(self) -> bool:
        values = (self.t, self.energy0, self.energy, self.drift, self.max_drift)
        return all(np.isfinite(v) for v in values)


def step_info(step: jc.HotStep) -> dict[str, Any]:
    """What a compiled step's report says about its leaves, and its stats.

    ``donated`` and ``aliased`` are sets of leaf indices; ``aliased`` is None
    when aliasing was not verified (no donated leaf has a verdict).
    """
    rows = step.report().rows
    if not rows:
        raise ValueError(f"{step.__name__} is not compiled: compile the step first")
    donated = {i for i, row in enumerate(rows) if row.donated}
    verified = [row.aliased is not None for row in rows if row.donated]
    return {
        "name": step.__name__,
        "compile_seconds": step.stats.compile_seconds,
        "leaves": [(row.path, row.spec) for row in rows],
        "donated": donated,
        "aliased": {i for i, row in enumerate(rows) if row.aliased} if any(verified) else None,
        "stats": dataclasses.replace(step.stats),
    }


def _isatty(out: TextIO | None) -> bool:
    try:
        return out is not None and out.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressBar:
    """A text progress bar: redrawn with ``\\r`` on a terminal, else plain lines."""

    WIDTH = 24

    def __init__(self, out: TextIO | None, total: int):
        self.out = out
        self.total = total
        self.tty = _isatty(out)
        # How often the loop reads (jc.fetch) to redraw: rarely, on purpose.
        self.every = max(1, total // (50 if self.tty else 4))

    def update(self, done: int, t: float, drift: float) -> None:
        if self.out is None:
            return
        filled = self.WIDTH * done // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        width = len(str(self.total))
        text = (
            f"  [{bar}] {done:>{width}}/{self.total} steps  t = {t:5.2f}  "
            f"max |E - E0|/|E0| = {drift:.1e}"
        )
        if self.tty:
            self.out.write("\r" + text)
            self.out.flush()
        else:
            print(text, file=self.out)

    def close(self) -> None:
        if self.out is not None and self.tty:
            self.out.write("\n")
            self.out.flush()


def fetch_scalars(*xs: jax.Array) -> list[float]:
    """Read scalars with ``jc.fetch`` into Python floats, keeping no array.

    On CPU the numpy arrays ``jc.fetch`` returns can share the device buffers;
    one kept alive across the next call would pin a buffer that call donates.
    """
    return [float(x) for x in jc.fetch(xs)]


def simulate(steps: int, n: int, seed: int = 0, out: TextIO | None = None) -> DemoResult:
    """Compile both steps from specs, run the loop in a hot loop, fetch once.

    Progress (what is being compiled, the progress bar) goes to ``out``.
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
    write()

    p = initial_state(n, seed)
    first = p
    bar = ProgressBar(out, steps)
    reads = 0
    write(
        f"Running {steps} steps inside jc.hot_loop(): "
        f"p = {kick_drift.__name__}(p); p = {force_kick.__name__}(p)"
    )
    t0 = time.perf_counter()
    with jc.hot_loop() as loop:  # any implicit transfer or compile in here raises
        for i in range(1, steps + 1):
            p = kick_drift(p)
            p = force_kick(p)
            if i % bar.every == 0 or i == steps:
                done, t, drift = fetch_scalars(p.step, p.t, p.max_drift)  # deliberate
                reads += 1
                bar.update(int(done), t, drift)
        jax.block_until_ready(p)  # inside: the loop's timing counts the wait
    t1 = time.perf_counter()
    bar.close()

    # The bulk read of the run, after the loop.
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
        run_seconds=t1 - t0,
        reads=reads,
        first_state_consumed=consumed,
        checks=jc.get_checks(),
        steps_info=[step_info(kick_drift), step_info(force_kick)],
        hot_steps=(kick_drift, force_kick),
        loop_report=loop.report(),
    )


def check_result(r: DemoResult) -> list[str]:
    """What is wrong with a run (empty: all is well)."""
    problems = []
    counted = r.checks != "off"  # at level "off" a call is the bare executable
    for s in r.steps_info:
        st = s["stats"]
        if s["aliased"] is not None and not s["donated"] <= s["aliased"]:
            problems.append(f"{s['name']}: a donated leaf does not alias an output")
        if st.compiles != 1 or st.refused != 0 or (counted and st.calls != r.steps):
            problems.append(f"{s['name']}: unexpected stats {st}")
    if not all(r.first_state_consumed.values()):
        problems.append("the first state's buffers were not all consumed")
    if not r.finite:
        problems.append("non-finite results")
    if r.step != r.steps:
        problems.append(f"step = {r.step}, expected {r.steps}")
    return problems
