"""The demo's three planted regressions, each run and shown caught.

Each ``regression_*`` function below is the demo's loop (or its setup) with
one mistake planted in it. Every one must raise the contract error named in
its docstring; :func:`run_regressions` fails if one does not. The messages
point at the planted line in this file.

1. ``print(p.t)`` inside the loop: a read, a host sync per step.
2. An int32-initialised float field, in a ``jc.state`` class and in a plain
   dict state.
3. A donation that would have gone stale: a parameter inserted before the
   state, and the old state read after the step donated it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any, TextIO

import jax
import jax.numpy as jnp

import jaxcontracts as jc

from .simulation import (
    DT,
    Particles,
    acceleration,
    compiled_steps,
    initial_state,
    kick_drift,
    say,
    width,
)


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


# --------------------------------------------------------------------------
# Running them


def _error_lines(e: BaseException, indent: str, max_lines: int = 8) -> list[str]:
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
            body,
            width=width(),
            initial_indent=lead,
            subsequent_indent=lead + "    ",
            break_on_hyphens=False,
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
        say(out, f"{indent}-> caught {caught}")
        return True
    except Exception as e:  # noqa: BLE001 - the wrong error is a failure, shown
        first = (str(e).splitlines() or [""])[0]
        say(out, f"{indent}FAILED: expected {error.__name__}, got {type(e).__name__}: {first}")
        return False
    say(out, f"{indent}FAILED: expected {error.__name__}, but nothing was raised")
    return False


def run_regressions(n: int, out: TextIO) -> bool:
    """Run the three planted regressions; each must be caught."""

    def write(line: str = "") -> None:
        say(out, line)

    ok = True
    write("Regression 1/3: print(p.t) inside the loop")
    ok &= expect(
        out,
        jc.TransferError,
        lambda: regression_print_in_loop(n),
        "at the first read, before it could slow the loop (a read is a sync per step)",
    )
    write()

    write("Regression 2/3: an int32-initialised float field")
    write('  (t=jnp.int32(0) for a Float32[Array, ""] field)')
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
    write("  a) a parameter inserted before the state:")
    write("     def scaled_kick_drift(scale, p: Particles)")
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
    write("  b) the old state kept and read after the step donated it:")
    write("     before = p; p = step(p); float(before.t)")
    ok &= expect(
        out,
        jc.DonationError,
        lambda: regression_stale_read(n),
        "at the stale read, before it could read freed or reused memory",
        indent="    ",
    )
    return ok
