"""``python -m jaxcontracts demo``: a small N-particle simulation, end to end.

Three parts:

1. **The simulation.** Particles orbit in a softened central (Plummer)
   potential, integrated with velocity Verlet split into two hot steps driven
   by a plain Python loop inside ``jc.hot_loop()``:

   * ``kick_drift``: half kick with the stored acceleration, then drift;
   * ``force_kick``: new accelerations, second half kick, energy bookkeeping.

   Both steps are compiled ahead of time from ``Particles.spec(n=...)`` (no
   data), every state buffer is donated and verified to alias, and the only
   reads inside the loop are a periodic ``jc.fetch`` that drives the progress
   bar.
2. **The reports** of both steps, printed after the loop.
3. **Three planted regressions**, each run and shown caught with its message:
   ``print(p.t)`` inside the loop, an int32-initialised float field, and a
   donation that would have gone stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc
from jaxcontracts._format import fmt_aval

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
# Part 1: one run


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
    with jc.hot_loop():  # any implicit transfer or compile in here raises
        for i in range(1, steps + 1):
            p = kick_drift(p)
            p = force_kick(p)
            if i % bar.every == 0 or i == steps:
                done, t, drift = fetch_scalars(p.step, p.t, p.max_drift)  # deliberate
                reads += 1
                bar.update(int(done), t, drift)
    jax.block_until_ready(p)
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
        steps_info=[_step_info(kick_drift), _step_info(force_kick)],
        hot_steps=(kick_drift, force_kick),
    )


def _yes(flag: bool | None) -> str:
    return "n/a" if flag is None else ("yes" if flag else "NO")


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


# --------------------------------------------------------------------------
# Part 2: the reports


def _print_summary(out: TextIO, infos: Sequence[dict[str, Any]], checks: str) -> None:
    """A per-step summary from the compiled entries (until step.report() exists)."""

    def write(line: str = "") -> None:
        print(line, file=out)

    for s in infos:
        n_leaves = len(s["leaves"])
        if s["aliased"] is None:
            verified = "aliasing not verified (checks level 'off')"
        else:
            good = len(s["donated"] & s["aliased"])
            verified = f"{good}/{len(s['donated'])} verified to alias an output"
        write(
            f"  {s['name']:<10}  compiled in {s['compile_seconds']:.3f} s, "
            f"{len(s['donated'])}/{n_leaves} leaves donated, {verified}"
        )
    a = infos[0]
    width = max(len(path) for path, _ in a["leaves"])
    write(
        f"    {'leaf':<{width}}  {'spec':<12} "
        + " ".join(f"{s['name'] + ' donated/aliased':<28}" for s in infos).rstrip()
    )
    for i, (path, aval) in enumerate(a["leaves"]):
        cols = [
            f"{_yes(i in s['donated'])}/{_yes(None if s['aliased'] is None else i in s['aliased'])}"
            for s in infos
        ]
        write(f"    {path:<{width}}  {aval:<12} " + " ".join(f"{c:<28}" for c in cols).rstrip())
    counted = checks != "off"
    for s in infos:
        st = s["stats"]
        write(
            f"  {s['name']}.stats: calls={st.calls} compiles={st.compiles} "
            f"refused={st.refused} traced_calls={st.traced_calls}"
            + ("" if counted else "  (calls are not counted at checks level 'off')")
        )


def _print_reports(out: TextIO, *steps: jc.HotStep) -> bool:
    """Print each step's ``report()``; return whether every contract in them holds.

    Falls back on a summary of each compiled entry where ``report()`` is missing.
    """
    if steps and all(hasattr(s, "report") for s in steps):
        ok = True
        for i, s in enumerate(steps):
            if i:
                print(file=out)
            report = s.report()
            print(str(report), file=out)
            ok &= bool(getattr(report, "ok", True))
        return ok
    _print_summary(out, [_step_info(s) for s in steps], jc.get_checks())
    return True


# --------------------------------------------------------------------------
# Part 3: three planted regressions, each caught
#
# Each function below is the demo's loop (or its setup) with one mistake
# planted in it. Every one must raise the contract error named in its
# docstring; the demo fails if one does not.


def regression_print_in_loop(n: int) -> None:
    """``print(p.t)`` inside the loop -> TransferError (a read, a sync, per step)."""
    kick_drift, force_kick = compiled_steps(n)
    p = initial_state(n)
    with jc.hot_loop():
        for _ in range(3):
            p = kick_drift(p)
            p = force_kick(p)
            print(p.t)


def regression_int32_field(n: int) -> None:
    """``t=jnp.int32(0)`` for a ``Float32[Array, ""]`` field -> SpecError."""
    pos = jax.random.normal(jax.random.key(0), (n, 3), jnp.float32)
    Particles(
        pos=pos,
        vel=jnp.zeros_like(pos),
        acc=acceleration(pos),
        t=jnp.int32(0),
        step=0,
        energy0=0.0,
        max_drift=0.0,
    )


def drift(s: dict) -> dict:
    """A plain-dict state: no annotations per field, so no SpecError at construction."""
    return {"pos": s["pos"] + DT * s["vel"], "vel": s["vel"], "t": s["t"] + DT}


def regression_int32_dict(step: jc.HotStep, n: int) -> None:
    """The same int32 ``t`` in a plain-dict state -> RecompileError at compile."""
    state = {
        "pos": jnp.zeros((n, 3), jnp.float32),
        "vel": jnp.ones((n, 3), jnp.float32),
        "t": jnp.int32(0),
    }
    step.compile(state)


def scaled_kick_drift(scale: jax.Array, p: Particles) -> Particles:
    """kick_drift with a parameter inserted *before* the state (a thermostat)."""
    return kick_drift(p.replace(vel=scale * p.vel))


def inserted_parameter(n: int) -> dict[str, Any]:
    """``def scaled_kick_drift(scale, p)``: where does each way donate?

    ``jax.jit(..., donate_argnums=0)`` (written when ``p`` came first) now
    donates ``scale``; a hot step donates by the ``Particles`` annotation.
    """
    found: dict[str, Any] = {}
    plain = jax.jit(scaled_kick_drift, donate_argnums=0)
    scale, p = jnp.float32(1.0), initial_state(n)
    first = p
    p = plain(scale, p)
    jax.block_until_ready(p)
    leaves = jax.tree_util.tree_leaves(first)
    found["jit_scale_deleted"] = scale.is_deleted()
    found["jit_consumed"] = sum(x.is_deleted() for x in leaves)

    step = jc.hot_step(signature=Particles, donate="all")(scaled_kick_drift)
    scale, p = jnp.float32(1.0), initial_state(n)
    step.compile(scale, Particles.spec(n=n))
    first = p
    for _ in range(3):
        p = step(scale, p)
    jax.block_until_ready(p)
    found["jc_consumed"] = sum(x.is_deleted() for x in jax.tree_util.tree_leaves(first))
    found["jc_scale_alive"] = not scale.is_deleted()
    found["leaves"] = len(leaves)
    return found


def regression_stale_read(n: int) -> None:
    """The old state kept and read after the step donated it -> DonationError."""
    scaled = jc.hot_step(signature=Particles, donate="all")(scaled_kick_drift)
    _, force_kick = compiled_steps(n)
    scale, p = jnp.float32(1.0), initial_state(n)
    scaled.compile(scale, Particles.spec(n=n))
    with jc.hot_loop():
        for _ in range(3):
            before = p
            p = scaled(scale, p)
            p = force_kick(p)
            print(f"t went from {float(before.t)} to {jc.fetch(p.t)}")


def _error_lines(e: BaseException, indent: str, max_lines: int = 6) -> list[str]:
    """The first lines of an error (up to its first fix), wrapped, for the demo."""
    message = str(e).splitlines() or [""]
    keep = []
    for line in message:
        if line.lstrip().lower().startswith(("fix:", "likely cause:")):
            break
        keep.append(line)
    out: list[str] = []
    for i, line in enumerate(keep):
        text = f"{type(e).__name__}: {line}" if i == 0 else line
        body = text.lstrip()
        lead = indent + ("" if i == 0 else "  ") + text[: len(text) - len(body)]
        out += textwrap.wrap(
            body, width=120, initial_indent=lead, subsequent_indent=lead + "    "
        ) or [lead]
    if len(out) > max_lines:
        out = out[: max_lines - 1] + [out[max_lines - 1].rstrip() + " ..."]
    return out


def expect(
    out: TextIO,
    error: type[Exception],
    planted: Callable[[], object],
    caught: str,
    indent: str = "  ",
) -> bool:
    """Run ``planted``; it must raise ``error``. Print the message and where."""
    try:
        planted()
    except error as e:
        for line in _error_lines(e, indent):
            print(line, file=out)
        print(f"{indent}-> caught {caught}", file=out)
        return True
    except Exception as e:  # noqa: BLE001 - the wrong error is a failure, shown
        first = (str(e).splitlines() or [""])[0]
        print(f"{indent}FAILED: expected {error.__name__}, got {type(e).__name__}: {first}", file=out)
        return False
    print(f"{indent}FAILED: expected {error.__name__}, but nothing was raised", file=out)
    return False


def run_regressions(n: int, out: TextIO) -> bool:
    """Run the three planted regressions; each must be caught."""

    def write(line: str = "") -> None:
        print(line, file=out)

    ok = True
    write("Regression 1/3: print(p.t) inside the loop")
    ok &= expect(
        out,
        jc.TransferError,
        lambda: regression_print_in_loop(n),
        "at the first read, before it could slow the loop (a read is a sync per step)",
    )
    write()

    write('Regression 2/3: an int32-initialised float field (t=jnp.int32(0) for Float32[Array, ""])')
    write("  a) in the Particles state class:")
    ok &= expect(
        out,
        jc.SpecError,
        lambda: regression_int32_field(n),
        "at construction, before any step ran (no silent cast, no recompile later)",
        indent="    ",
    )
    write('  b) in a plain dict {"pos", "vel", "t": jnp.int32(0)} whose step does t + DT:')
    step = jc.hot_step(signature=dict, donate="all")(drift)
    caught = expect(
        out,
        jc.RecompileError,
        lambda: regression_int32_dict(step, n),
        "at drift.compile(), before any step ran (it would have recompiled on call 2)",
        indent="    ",
    )
    if caught and (step.stats.calls or step.stats.compiles):
        write("    FAILED: drift ran or compiled anyway")
        caught = False
    ok &= caught
    write()

    write("Regression 3/3: a donation that would have gone stale")
    write("  a) a parameter inserted before the state: def scaled_kick_drift(scale, p: Particles)")
    try:
        f = inserted_parameter(n)
    except Exception as e:  # noqa: BLE001 - shown as a failure
        write(f"    FAILED: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
        ok = False
    else:
        write(
            "    jax.jit(donate_argnums=0): donates `scale` (deleted: "
            f"{f['jit_scale_deleted']}), state {f['jit_consumed']}/{f['leaves']} consumed "
            "(copied every step)"
        )
        write(
            "    jc.hot_step (donates by the Particles annotation): state "
            f"{f['jc_consumed']}/{f['leaves']} consumed, `scale` alive: {f['jc_scale_alive']}"
        )
        if f["jc_consumed"] == f["leaves"] and f["jc_scale_alive"]:
            write("    -> prevented: the state is still donated, `scale` never goes stale")
        else:
            write("    FAILED: the hot step did not donate the state, or donated `scale`")
            ok = False
    write("  b) the old state kept and read after the step donated it (before = p; p = step(p)):")
    ok &= expect(
        out,
        jc.DonationError,
        lambda: regression_stale_read(n),
        "at the stale read, before it could read freed or reused memory",
        indent="    ",
    )
    return ok


# --------------------------------------------------------------------------
# The command


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
    if not _print_reports(out, *result.hot_steps):
        problems.append("a step's report has a failing contract")

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
   aliasing), its compile time and calls.
3. Three planted regressions, each run and shown caught with its message:
   print(p.t) inside the loop (TransferError); an int32-initialised float
   field (SpecError at construction; RecompileError at compile for a plain
   dict state); a donation that would have gone stale (a parameter inserted
   before the state still donates the state; reading the old state after
   the step donated it is a DonationError).

Exit code 0 when the simulation passes every check and all three
regressions are caught; 1 otherwise."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jaxcontracts",
        description="jaxcontracts command line.",
        epilog="Run `python -m jaxcontracts demo --help` for the demo's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="a particle simulation driven by two hot steps, its reports, and "
        "three planted regressions caught",
        description=DEMO_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--steps",
        type=_positive_int,
        default=200,
        help="number of Verlet steps in part 1 (default: %(default)s)",
    )
    demo.add_argument(
        "--n",
        type=_positive_int,
        default=4096,
        help="number of particles, in parts 1 and 3 (default: %(default)s)",
    )
    demo.add_argument(
        "--no-regressions",
        dest="regressions",
        action="store_false",
        help="skip part 3, the planted regressions",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(steps=args.steps, n=args.n, regressions=args.regressions)
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
