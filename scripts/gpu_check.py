#!/usr/bin/env python
"""The accelerator-only checks of jaxcontracts (GPU or TPU), in one script.

    python scripts/gpu_check.py               # on a GPU or TPU machine; "skipped" elsewhere
    python scripts/gpu_check.py --force-cpu   # the same checks on CPU, small state (a dry run)

Checks:

1. ``jc.hot_loop`` on the device: JAX's native device-to-host transfer guard
   is engaged inside the loop (GPU only: "n/a on CPU"), every implicit read
   (float, int, bool, repr, str, print, f-string, np.asarray, np.array, a
   numpy ufunc, .item(), .tolist(), iteration, use as an index, pickling)
   raises ``jc.TransferError`` inside the loop and works outside it, and the
   deliberate paths (``jc.fetch``, ``jax.device_get``, ``jax.device_put``,
   ``jax.debug.print`` in a step) stay allowed.
2. Donation on device memory: a hot step on a large state (2 GiB on GPU),
   20 steps in a hot loop; the peak device memory above the baseline, as a
   ratio to the state size, against an undonated ``jax.jit`` of the same
   step (``memory_stats()["peak_bytes_in_use"]``; on CPU, where there are no
   memory stats, the compiled executables' memory analysis).
3. Sharding on one device: a state with a 1-device-mesh ``NamedSharding``
   compiles from its spec, donates in place, and a state on another device
   or in another memory kind is refused.
4. This round's loops under JAX's native guard: ``jc.fetch_async`` past a
   donation, ``jc.to_host`` copies read in the loop, an orbax save every N
   steps (if orbax is installed), a read swallowed by ``logging``, an NNX
   step updating its objects in place (if flax is installed).
5. Plain ``jax.jit`` in a raising loop (a Python float named by function and
   parameter, a drifted ``donate_argnums`` refused before the call), a kept
   container of a state refused before its donation, and ``jc.watch()``'s
   missed donation (with its bytes) and host batch on the device.

Prints one line per check and a summary; exits 1 if any check fails, 0 when
all pass or when there is no GPU (without --force-cpu). Imports jax, numpy,
jaxcontracts and jaxtyping (a dependency of jaxcontracts) only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RULE = "=" * 78
ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--force-cpu",
        action="store_true",
        help="run every check on CPU with a small state (the native guard check is n/a)",
    )
    parser.add_argument(
        "--state-gib",
        type=float,
        default=None,
        help="state size for the donation check (default: 2 on GPU, 1/16 with --force-cpu)",
    )
    parser.add_argument("--steps", type=int, default=20, help="steps of the donation loop")
    return parser.parse_args()


# --------------------------------------------------------------------------
# Results


class Results:
    def __init__(self) -> None:
        self.counts = {"PASS": 0, "FAIL": 0, "N/A": 0}

    def section(self, title: str) -> None:
        print(f"\n{title}", flush=True)

    def line(self, status: str, name: str, detail: str = "") -> None:
        if status in self.counts:
            self.counts[status] += 1
        tag = {"PASS": "pass", "FAIL": "FAIL", "N/A": "n/a ", "INFO": "info"}[status]
        text = f"  [{tag}] {name}"
        if detail:
            text += f": {detail}"
        print(text, flush=True)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.line("PASS" if ok else "FAIL", name, detail)
        return ok

    def crashed(self, name: str, e: BaseException) -> None:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        excerpt = "".join(tb[-3:]).rstrip().replace("\n", "\n         ")
        self.line("FAIL", name, f"unexpected {type(e).__name__}\n         {excerpt}")


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


def gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# --------------------------------------------------------------------------
# 1. hot_loop on the device


def check_hot_loop(r: Results, jax: Any, np: Any, jc: Any, on_gpu: bool) -> None:
    import jax.numpy as jnp
    from jaxtyping import Array, Float32

    r.section("[1] jc.hot_loop on the device: JAX's native guard, the access paths")
    try:
        from jax._src import config as jax_config

        d2h_state = jax_config.transfer_guard_device_to_host
    except (ImportError, AttributeError):  # a future jax: behaviour is checked below
        d2h_state = None

    x = jnp.float32(1.5)
    xi = jnp.int32(2)
    xb = jnp.bool_(True)
    v = jnp.arange(3, dtype=jnp.float32)
    r.line("INFO", "arrays live on", str(next(iter(v.devices()))))

    # (a) the native device-to-host guard
    if not on_gpu:
        r.line("N/A", "JAX's native device-to-host guard engaged inside the loop", "n/a on CPU "
               "(JAX's device-to-host guard never fires on CPU; jaxcontracts intercepts reads itself)")
        r.line("N/A", "a read only JAX's guard sees is refused inside the loop", "n/a on CPU")
    else:
        try:
            outside = d2h_state.value if d2h_state is not None else "(unreadable)"
            with jc.hot_loop():
                inside = d2h_state.value if d2h_state is not None else "(unreadable)"
            after = d2h_state.value if d2h_state is not None else "(unreadable)"
            if d2h_state is None:
                r.line("INFO", "transfer guard value", "jax._src.config.transfer_guard_device_to_host not found")
            else:
                r.check(
                    "JAX's native device-to-host guard engaged inside the loop",
                    inside == "disallow" and after == outside,
                    f"outside {outside!r}, inside {inside!r}, after the loop {after!r}",
                )
        except Exception as e:  # noqa: BLE001
            r.crashed("JAX's native device-to-host guard engaged inside the loop", e)
        try:
            error = native_guard_read(jc, np, jnp.full(3, 2.0, jnp.float32))
            # JAX's own refusal, raw or as the jc.TransferError it becomes when
            # it leaves a hot loop; a read jaxcontracts caught itself says
            # "device-to-host read" instead, and would not prove anything here.
            text = str(error).lower() if error is not None else ""
            ok = "disallowed device-to-host" in text or "seen by jax's own guard" in text
            r.check(
                "a read only JAX's guard sees is refused inside the loop",
                ok,
                first_line(error) if error is not None else "np.asarray succeeded: the native guard is off",
            )
            if error is not None:
                r.line(
                    "INFO",
                    "that refusal reaches the user as",
                    f"{type(error).__module__}.{type(error).__name__}"
                    + ("" if isinstance(error, jc.TransferError) else " (not a jc.TransferError)"),
                )
        except Exception as e:  # noqa: BLE001
            r.crashed("a read only JAX's guard sees is refused inside the loop", e)

    # (b) the access-path matrix: raises inside, works outside
    lst = [10, 11, 12]
    paths: list[tuple[str, Callable[[], Any], Callable[[Any], bool]]] = [
        ("float(x)", lambda: float(x), lambda o: o == 1.5),
        ("int(x)", lambda: int(xi), lambda o: o == 2),
        ("bool(x) (an `if` on x)", lambda: bool(xb), lambda o: o is True),
        ("repr(x)", lambda: repr(v), lambda o: "Array(" in o),
        ("str(x)", lambda: str(v), lambda o: o.startswith("[")),
        ("print(x)", lambda: _printed(v), lambda o: o.startswith("[")),
        ("f-string", lambda: f"{x}", lambda o: o == "1.5"),
        ("np.asarray(x)", lambda: np.asarray(v), lambda o: o.tolist() == [0.0, 1.0, 2.0]),
        ("np.array(x)", lambda: np.array(v), lambda o: o.tolist() == [0.0, 1.0, 2.0]),
        ("np.add(x, 1) (ufunc)", lambda: np.add(v, 1), lambda o: np.asarray(o).tolist() == [1.0, 2.0, 3.0]),
        ("x.item()", lambda: x.item(), lambda o: o == 1.5),
        ("x.tolist()", lambda: v.tolist(), lambda o: o == [0.0, 1.0, 2.0]),
        ("iteration (list(x))", lambda: list(v), lambda o: len(o) == 3),
        ("use as an index", lambda: lst[xi], lambda o: o == 12),
        ("pickle.dumps(x)", lambda: pickle.dumps(v), lambda o: np.asarray(pickle.loads(o)).tolist() == [0.0, 1.0, 2.0]),
    ]
    for name, read, good in paths:
        try:
            with contextlib.suppress(Exception):
                read()  # warm: an eager op it runs compiles here, not in the loop
            try:
                with jc.hot_loop():
                    read()
                inside = "no error"
            except jc.TransferError:
                inside = "TransferError"
            except Exception as e:  # noqa: BLE001
                inside = first_line(e)
            try:
                value = read()
                outside = "works" if good(value) else f"wrong value {value!r:.40}"
            except Exception as e:  # noqa: BLE001
                outside = first_line(e)
            # iterating a one-device array slices it on the device: no read
            expected = "no error" if name.startswith("iteration") and len(v.devices()) == 1 else "TransferError"
            r.check(name, inside == expected and outside == "works",
                    f"inside the loop: {inside}; outside: {outside}")
        except Exception as e:  # noqa: BLE001
            r.crashed(name, e)

    # (c) implicit host-to-device, and the deliberate transfers that stay allowed
    host = np.ones(3, np.float32)
    _ = v + jnp.asarray(host)  # warm the add, so only the transfer can fail
    try:
        with jc.hot_loop():
            _ = v + host
        r.check("numpy array into an eager op (host-to-device) inside the loop", False, "no error")
    except jc.TransferError:
        r.check("numpy array into an eager op (host-to-device) inside the loop", True, "TransferError")
    except Exception as e:  # noqa: BLE001
        r.check("numpy array into an eager op (host-to-device) inside the loop", False, first_line(e))

    @jc.state
    class Probe:
        x: Float32[Array, "n"]  # noqa: F821 - a jaxtyping dim, not a name

    @jc.hot_step(signature=Probe)
    def probe_step(p: Probe) -> Probe:
        jax.debug.print("jc-gpu-check {}", p.x[0])
        return Probe(x=p.x + 1)

    with contextlib.redirect_stdout(io.StringIO()):
        p = probe_step(Probe.zeros(n=4))  # compiled (and the callback warmed) outside
        jax.effects_barrier()
    allowed: list[tuple[str, Callable[[], Any], Callable[[Any], bool]]] = [
        ("jc.fetch(x)", lambda: jc.fetch(v), lambda o: o.tolist() == [0.0, 1.0, 2.0]),
        ("jax.device_get(x)", lambda: jax.device_get(v), lambda o: np.asarray(o).tolist() == [0.0, 1.0, 2.0]),
        ("jax.device_put(numpy)", lambda: jax.device_put(host), lambda o: isinstance(o, jax.Array)),
    ]
    for name, call, good in allowed:
        try:
            with jc.hot_loop():
                out = call()
            r.check(f"{name} inside the loop is allowed", bool(good(out)))
        except Exception as e:  # noqa: BLE001
            r.check(f"{name} inside the loop is allowed", False, first_line(e))
    try:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), jc.hot_loop():
            p = probe_step(p)
            jax.effects_barrier()
        printed = "jc-gpu-check 1" in buf.getvalue()
        r.check("jax.debug.print in a hot step inside the loop is allowed", printed,
                "printed" if printed else f"output {buf.getvalue()!r:.60}")
    except Exception as e:  # noqa: BLE001
        r.check("jax.debug.print in a hot step inside the loop is allowed", False, first_line(e))


def native_guard_read(jc: Any, np: Any, x: Any) -> BaseException | None:
    """Read ``x`` (never read before) where only JAX's native guard can see it.

    The ``jc.hot_loop()`` engages JAX's device-to-host guard (on GPU/TPU).
    jaxcontracts' own read interceptors are told to stand aside (as they do
    for its own deliberate reads), so the loop's native guard is all that is
    left to refuse ``np.asarray(x)``. Returns the error (None: the read went
    through). (A nested ``transfers="allow"`` loop lifts the native guard too:
    it cannot serve here.)
    """
    from jaxcontracts._runtime import local

    error = None
    with jc.hot_loop():
        local.allow += 1
        try:
            np.asarray(x)
        except Exception as e:  # noqa: BLE001 - which error it is is the result
            error = e
        finally:
            local.allow -= 1
    return error


def _printed(v: Any) -> str:
    buf = io.StringIO()
    print(v, file=buf)
    return buf.getvalue()


# --------------------------------------------------------------------------
# 2. donation on device memory


def check_donation(r: Results, jax: Any, np: Any, jc: Any, on_gpu: bool, state_bytes: int, steps: int) -> None:
    from jaxtyping import Array, Float32

    n = max(1, state_bytes // 8)  # two f32 leaves of n elements
    size = 2 * n * 4 + 4
    r.section(f"[2] donation on device memory: a {gib(size)} state, {steps} steps")
    dev = jax.devices()[0]

    @jc.state
    class Big:
        a: Float32[Array, "n"]
        b: Float32[Array, "n"]
        t: Float32[Array, ""]

    def step_fn(s: Big) -> Big:
        return Big(a=s.a * 0.5 + 1.0, b=s.b + 1.0, t=s.t + 1.0)

    def coupled_fn(s: Big) -> Big:  # b is read for a and overwritten
        return Big(a=s.a * 0.5 + s.b, b=s.b + 1.0, t=s.t + 1.0)

    def stats() -> dict | None:
        try:
            return dev.memory_stats()
        except Exception:  # noqa: BLE001 - not every backend has them
            return None

    measured = stats() is not None and "peak_bytes_in_use" in (stats() or {})
    r.line("INFO", "measured with", "memory_stats()['peak_bytes_in_use']" if measured
           else "the compiled executables' memory analysis (no memory stats on this backend)")

    # Donated first: peak_bytes_in_use only ever grows.
    donated = jc.hot_step(step_fn, signature=Big)
    undonated = None
    ratios: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        compiled = donated.compile(Big.spec(n=n))
        r.line("INFO", "hot step compiled", f"{(time.perf_counter() - t0) * 1e3:.0f} ms")
        before = stats()
        s = Big.zeros(n=n)
        first = s
        ptr = s.a.unsafe_buffer_pointer()
        ptr_after_first = None
        with jc.hot_loop():
            for i in range(steps):
                s = donated(s)
                if i == 0:
                    ptr_after_first = s.a.unsafe_buffer_pointer()
        jax.block_until_ready(s)
        after = stats()
        r.check("donated inputs deleted", all(x.is_deleted() for x in jax.tree_util.tree_leaves(first)))
        r.check("buffers reused in place for every step",
                s.a.unsafe_buffer_pointer() == ptr_after_first == ptr,
                "" if ptr_after_first == ptr else "the first step moved the buffer")
        st = donated.stats
        r.check("hot step stats", st.calls == steps and st.compiles == 1 and st.refused == 0 and st.not_consumed == 0,
                f"calls {st.calls}, compiles {st.compiles}, refused {st.refused}, not consumed {st.not_consumed}")
        report = donated.report()
        r.check("step.report().ok", report.ok,
                "; ".join(c.name for c in report.contracts if not c.ok) or "every contract holds")
        t_final = float(jc.fetch(s.t))
        r.check("state advanced", t_final == steps, f"t = {t_final:g}")
        if measured:
            peak = after["peak_bytes_in_use"] - before["bytes_in_use"]
            ratios["donated"] = peak / size
        else:
            ratios["donated"] = _static_ratio(compiled, size, donated=True)
        del s, first

        # Undonated jax.jit of the same step. It blocks on every step (so at
        # most two states are alive); with async dispatch it would hold more.
        undonated = jax.jit(step_fn).lower(Big.spec(n=n)).compile()
        before = stats()
        s = Big.zeros(n=n)
        for _ in range(steps):
            s = jax.block_until_ready(undonated(s))
        after = stats()
        if measured:
            peak = after["peak_bytes_in_use"] - before["bytes_in_use"]
            ratios["undonated"] = peak / size
        else:
            ratios["undonated"] = _static_ratio(undonated, size, donated=False)
        del s
    except Exception as e:  # noqa: BLE001
        r.crashed("donation loop", e)
        return
    what = "peak above baseline" if measured else "arguments + outputs + temporaries - aliased"
    r.check("donated hot_step: peak memory ~ 1x the state", ratios["donated"] <= 1.25,
            f"{ratios['donated']:.2f}x the state ({what})")
    r.check("undonated jax.jit: peak memory ~ 2x the state (the measurement sees the copy)",
            ratios["undonated"] >= 1.75, f"{ratios['undonated']:.2f}x the state ({what})")
    r.line("INFO", "ratios", f"donated {ratios['donated']:.2f}x, undonated {ratios['undonated']:.2f}x, "
           f"saved {gib(max(0.0, (ratios['undonated'] - ratios['donated']) * size))}")
    # A step whose leaves depend on each other: XLA may copy a donated leaf
    # (a temporary) to update it in place. Static figure, nothing runs.
    try:
        coupled = jc.hot_step(coupled_fn, signature=Big)
        m = coupled.compile(Big.spec(n=n)).memory_analysis()
        r.line("INFO", "coupled step (a = a*0.5 + b; b = b + 1)",
               f"temporaries {gib(m.temp_size_in_bytes)} = {m.temp_size_in_bytes / size:.2f}x the state, "
               f"aliased {gib(m.alias_size_in_bytes)}, report ok: {coupled.report().ok}")
    except Exception as e:  # noqa: BLE001
        r.line("INFO", "coupled step", first_line(e))


def _static_ratio(compiled: Any, size: int, donated: bool) -> float:
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    if donated:
        total -= m.alias_size_in_bytes
    return total / size


# --------------------------------------------------------------------------
# 3. sharding on one device


def check_sharding(r: Results, jax: Any, np: Any, jc: Any, on_gpu: bool) -> None:
    from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
    from jax.sharding import PartitionSpec as P
    from jaxtyping import Array, Float32

    r.section("[3] sharding on one device: a 1-device mesh")
    dev = jax.devices()[0]
    mesh = Mesh(np.array([dev]), ("x",))
    rows, rep = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    shard = {"pos": rows, "t": rep}
    n = 1024

    @jc.state
    class Cloud:
        pos: Float32[Array, "n 3"]
        t: Float32[Array, ""]

    @jc.hot_step(signature=Cloud)
    def advance(c: Cloud) -> Cloud:
        return Cloud(pos=c.pos * 0.5 + 1.0, t=c.t + 1.0)

    try:
        advance.compile(Cloud.spec(n=n, sharding=shard))
        sig = advance.signature[0]
        r.check("compiles from Cloud.spec(n, sharding=...)", advance.stats.compiles == 1,
                f"compiled for pos {sig.pos.sharding}")
        c = Cloud.zeros(n=n, sharding=shard)
        first = c
        ptr = c.pos.unsafe_buffer_pointer()
        with jc.hot_loop():
            for _ in range(5):
                c = advance(c)
        r.check("donates in place",
                all(x.is_deleted() for x in jax.tree_util.tree_leaves(first))
                and c.pos.unsafe_buffer_pointer() == ptr)
        r.check("keeps the compiled sharding", c.pos.sharding == rows and c.t.sharding == rep,
                f"pos {c.pos.sharding}")
        r.check("step.report().ok", advance.report().ok)
    except Exception as e:  # noqa: BLE001
        r.crashed("sharded hot step", e)
        return

    def refused(name: str, make: Callable[[], Any]) -> None:
        try:
            wrong = make()
        except Exception as e:  # noqa: BLE001
            r.line("N/A", name, f"cannot build such a state here: {first_line(e)}")
            return
        try:
            advance(wrong)
            r.check(name, False, "accepted")
        except jc.RecompileError as e:
            intact = not any(x.is_deleted() for x in jax.tree_util.tree_leaves(wrong))
            r.check(name, intact and "c.pos" in str(e),
                    "RecompileError, inputs intact" if intact else "RecompileError, but inputs deleted")
            line = next((ln.strip() for ln in str(e).splitlines() if "c.pos:" in ln), "")
            if line:
                r.line("INFO", "  message", line)
        except Exception as e:  # noqa: BLE001
            r.check(name, False, first_line(e))

    # Another device: the CPU next to the GPU, or a second simulated CPU device.
    others = [d for d in _all_devices(jax) if d != dev]
    if others:
        other = others[0]
        m2 = Mesh(np.array([other]), ("x",))
        refused(f"a state on another device ({other}) is refused",
                lambda: Cloud.zeros(n=n, sharding=SingleDeviceSharding(other)))
        refused(f"a state on a 1-device mesh of another device ({other}) is refused",
                lambda: Cloud.zeros(n=n, sharding={"pos": NamedSharding(m2, P("x")), "t": NamedSharding(m2, P())}))
    else:
        r.line("N/A", "a state on another device is refused", "only one device visible")
    kinds = _other_memory_kinds(dev)
    if kinds:
        kind = kinds[0]
        refused(f"a state in memory kind {kind!r} is refused",
                lambda: Cloud.zeros(n=n, sharding={"pos": NamedSharding(mesh, P("x"), memory_kind=kind),
                                                   "t": NamedSharding(mesh, P(), memory_kind=kind)}))
    else:
        r.line("N/A", "a state in another memory kind is refused", "the device has one memory kind")
    # Equivalent placements on the same device: no transfer, no recompile.
    for name, make in [
        ("P() on the same 1-device mesh", lambda: Cloud.zeros(n=n, sharding=rep)),
        ("SingleDeviceSharding(same device)", lambda: Cloud.zeros(n=n, sharding=SingleDeviceSharding(dev))),
        ("uncommitted (default device)", lambda: Cloud.zeros(n=n)),
    ]:
        try:
            out = advance(make())
            r.line("INFO", f"equivalent placement {name}",
                   f"accepted, compiles {advance.stats.compiles}, output pos {out.pos.sharding.spec if hasattr(out.pos.sharding, 'spec') else out.pos.sharding}")
        except Exception as e:  # noqa: BLE001
            r.line("INFO", f"equivalent placement {name}", f"refused: {first_line(e)}")
    r.check("still one compiled signature", advance.stats.compiles == 1, f"compiles {advance.stats.compiles}")


def _all_devices(jax: Any) -> list[Any]:
    out = list(jax.devices())
    for backend in ("cpu",):
        try:
            out += [d for d in jax.devices(backend) if d not in out]
        except RuntimeError:
            pass
    return out


def _other_memory_kinds(dev: Any) -> list[str]:
    try:
        default = dev.default_memory().kind
        kinds = [m.kind for m in dev.addressable_memories()]
    except Exception:  # noqa: BLE001 - an older jax or a backend without memories
        return []
    ordered = [k for k in ("pinned_host", "unpinned_host") if k in kinds and k != default]
    return ordered + [k for k in kinds if k != default and k not in ordered]


# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# 4. This round: lagged reads, host-memory copies, orbax, NNX in place


def check_round(r: Results, jax: Any, np: Any, jc: Any) -> None:
    import logging
    import tempfile

    import jax.numpy as jnp

    r.section("[4] lagged reads, host-memory copies, an orbax save and an NNX step in place, in a raising loop")

    @jc.hot_step(state="s")
    def step(s):
        return {"w": s["w"] * 1.0001 + 1, "n": s["n"] + 1}, {"loss": s["w"].sum()}

    s = {"w": jnp.zeros((512, 512)), "n": jnp.int32(0)}
    pending, seen, kept = None, [], []
    try:
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(6)):
                s, metrics = step(s)
                if pending is not None:
                    seen.append(int(pending.result()["n"]))
                pending = jc.fetch_async({"loss": metrics["loss"], "n": s["n"]})  # s["n"] is donated next
                kept.append(jc.to_host(s["w"]))
                _ = np.asarray(kept[-1])  # host memory: no transfer
        seen.append(int(pending.result()["n"]))
        r.check("jc.fetch_async: each step's values after the state was donated", seen == [1, 2, 3, 4, 5, 6], str(seen))
        kinds = {x.sharding.memory_kind for x in kept}
        r.check("jc.to_host: copies in host memory, read in the loop without a transfer",
                float(np.asarray(kept[0])[0, 0]) == 1.0, f"memory kinds {sorted(map(str, kinds))}")
    except Exception as e:  # noqa: BLE001
        r.crashed("lagged reads and host copies", e)

    logger = logging.getLogger("jc-accel-check")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(io.StringIO()))  # formats the message: the read
    try:
        with jc.hot_loop():
            logger.warning("loss %s", metrics["loss"])  # logging catches the refusal...
        r.check("a read swallowed by logging fails the loop at its exit", False, "the loop ended clean")
    except jc.TransferError as e:  # ...and the loop raises it as it ends
        r.check("a read swallowed by logging fails the loop at its exit", "caught it" in "".join(e.__notes__))

    try:
        import orbax.checkpoint as ocp
    except ImportError:
        r.line("N/A", "an orbax save every N steps inside the loop", "orbax-checkpoint not installed")
    else:
        try:
            manager = ocp.CheckpointManager(tempfile.mkdtemp())
            with jc.hot_loop(compiles="warmup") as loop:
                for i in loop.iterate(range(1, 5)):
                    s, _ = step(s)
                    if i % 2 == 0:
                        manager.save(i, args=ocp.args.StandardSave(jc.to_host(s)))
            manager.wait_until_finished()
            target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), s)
            restored = manager.restore(4, args=ocp.args.StandardRestore(target))
            r.check("an orbax save every N steps inside a raising loop, asynchronous",
                    int(restored["n"]) == int(jc.fetch(s["n"])) and list(manager.all_steps()) == [2, 4],
                    f"steps {list(manager.all_steps())}, restored on {restored['w'].sharding.memory_kind}")
            manager.close()
        except Exception as e:  # noqa: BLE001
            r.crashed("orbax", e)

    try:
        import optax
        from flax import nnx
    except ImportError:
        r.line("N/A", "an NNX step updating its objects in place", "flax/optax not installed")
        return
    try:
        class MLP(nnx.Module):
            def __init__(self, rngs):
                self.l1 = nnx.Linear(256, 1024, rngs=rngs)
                self.bn = nnx.BatchNorm(1024, rngs=rngs)
                self.l2 = nnx.Linear(1024, 1, rngs=rngs)

            def __call__(self, x):
                return self.l2(jax.nn.relu(self.bn(self.l1(x))))

        model = MLP(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

        @jc.hot_step(state=("model", "optimizer"))
        def train_step(model, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
            optimizer.update(model, grads)

        x, y = jax.random.normal(jax.random.key(0), (64, 256)), jnp.zeros((64, 1))
        w0 = jc.fetch(model.l1.kernel[...])
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(5)):
                train_step(model, optimizer, x, y)
        d = train_step.describe().current
        r.check("an NNX step updating its objects in place trains them, donated and proven",
                int(jc.fetch(optimizer.step[...])) == 5 and not np.allclose(w0, jc.fetch(model.l1.kernel[...]))
                and len(d.donated) > 0 and set(d.aliased) == set(d.donated),
                f"{len(d.donated)} leaves donated, {sum(leaf.nbytes for leaf in d.leaves if leaf.donated) / 2**20:.1f} MiB")
    except Exception as e:  # noqa: BLE001
        r.crashed("NNX in place", e)


def check_plain_jit(r: Results, jax: Any, np: Any, jc: Any) -> None:
    import functools

    import jax.numpy as jnp

    r.section("[5] plain jax.jit in a raising loop, a kept container, and jc.watch() on the device")
    state = {"w": jnp.ones((1024, 1024)), "t": jnp.int32(0)}

    @functools.partial(jax.jit, donate_argnums=(0,))  # the request's drifted index
    def fn1(lr, state):
        return {"w": state["w"] - lr * state["w"], "t": state["t"] + 1}

    try:
        with jc.hot_loop(compiles="warmup"):
            state = fn1(0.5, state)
        r.check("a Python float to a plain jax.jit in a loop is named", False, "nothing raised")
    except jc.TransferError as e:
        r.check("a Python float to a plain jax.jit in a loop is named (before JAX's native guard)",
                "`fn1` is given a Python float at `lr`" in str(e), first_line(e))
    except Exception as e:  # noqa: BLE001
        r.check("a Python float to a plain jax.jit in a loop is named", False, first_line(e))
    lr = jax.device_put(jnp.float32(0.5))
    try:
        with jc.hot_loop(compiles="warmup"):
            state = fn1(lr, state)
        r.check("a drifted donate_argnums is refused before the call", False, "nothing raised")
    except jc.DonationError as e:
        r.check("a drifted donate_argnums is refused before the call, inputs intact",
                "lr is donated, but no output" in str(e) and not state["w"].is_deleted() and not lr.is_deleted(),
                first_line(e))

    class RW(tuple):  # a NamedTuple-like state: (position dict, logdensity)
        pass

    kernel = jc.hot_step(lambda s: ({k: v * 0.5 for k, v in s[0].items()}, s[1] + 1), state="s")
    s = kernel(({"mu": jnp.ones((256, 256))}, jnp.float32(0)))
    samples = [s[0]]  # BlackJAX's samples.append(state.position)
    try:
        kernel(s)
        r.check("a kept container of the state is refused before the donation", False, "nothing raised")
    except jc.DonationError as e:
        r.check("a kept container of the state is refused before the donation, nothing lost",
                "a container of 1 donated array" in str(e) and not samples[0]["mu"].is_deleted(), first_line(e))
    del samples

    with jc.watch() as w:
        step = jax.jit(lambda st, b: {"w": st["w"] + b.sum(), "t": st["t"] + 1})
        st = {"w": jnp.ones((1024, 1024)), "t": jnp.int32(0)}
        for _ in range(6):
            st = step(st, np.ones(8, np.float32))
    kinds = sorted(f.kind for f in w.findings())
    missed = [f for f in w.findings() if f.kind == "missed_donation"]
    r.check("jc.watch() on the device: the missed donation (with its bytes) and the host batch",
            kinds == ["host_transfer", "missed_donation"] and missed[0].bytes_per_call == 4 * 2**20 + 4,
            f"{kinds}, {missed[0].bytes_per_call if missed else 0} B/call")


def check_refs(r: Results, jax: Any, np: Any, jc: Any) -> None:
    import jax.numpy as jnp

    r.section("[6] JAX refs as a hot step's state on the device, and an NNX step's second signature")
    if not hasattr(jax, "new_ref"):
        r.line("N/A", "refs", f"jax {jax.__version__} has no jax.new_ref")
        return
    n = 8 * 2**20  # 32 MiB per leaf

    def train_step(state, x):
        state["w"][...] = state["w"][...] * 0.5 + x
        state["n"][...] += 1
        return state["w"][...].sum()

    state = jax.tree.map(jax.new_ref, {"w": jnp.ones(n), "n": jnp.int32(0)})
    twin = jax.tree.map(jax.new_ref, {"w": jnp.ones(n), "n": jnp.int32(0)})
    x = jnp.full(n, 0.25)
    step, plain = jc.hot_step(train_step, state="state"), jax.jit(train_step)
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(5)):
            before = jc._compat.refs.buffer(state["w"])
            loss = step(state, x)
            plain(twin, x)
    got, want = jc.fetch(state), jc.fetch(twin)
    cs = step.describe().current
    r.check("a hot step on refs updates them as jax.jit does, its donation proven, nothing refused",
            np.array_equal(got["w"], want["w"]) and int(got["n"]) == 5 and len(cs.aliased) == 2
            and step.stats.compiles == 1 and step.stats.refused == 0 and before.is_deleted(),
            f"n={int(got['n'])}, aliased {len(cs.aliased)}/2, old buffer deleted: {before.is_deleted()}, "
            f"loss {float(jc.fetch(loss)):.4g}")
    w = state["w"]
    try:
        step({"w": w, "n": w}, x)
        r.check("the same ref passed twice is refused", False, "nothing raised")
    except jc.DefinitionError as e:
        r.check("the same ref passed twice is refused, the ref intact",
                "the same JAX ref is passed twice" in str(e) and float(jc.fetch(w[...])[0]) == float(got["w"][0]),
                first_line(e))
    try:
        import optax
        from flax import nnx
    except ImportError as e:
        r.line("N/A", "an NNX step's second signature", f"not installed: {e.name}")
        return
    model = nnx.Linear(16, 4, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    def nnx_step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    hot = jc.hot_step(nnx_step, state=("model", "optimizer"), max_compiles=2)
    try:
        hot(model, opt, jnp.ones((8, 16)))
        hot(model, opt, jnp.ones((4, 16)))  # a smaller last batch: a second signature
        r.check("an NNX step in place compiles a second signature and keeps writing back",
                int(jc.fetch(opt.step[...])) == 2 and hot.stats.compiles == 2, f"optimizer.step = {int(jc.fetch(opt.step[...]))}")
    except Exception as e:  # noqa: BLE001
        r.check("an NNX step in place compiles a second signature", False, first_line(e))


def check_partials(r: Results, jax: Any, np: Any, jc: Any) -> None:
    """Two model instances, each holding its own functools.partial: one executable."""
    import functools

    import jax.numpy as jnp

    r.section("[7] functools.partial statics compared by value: model instances share an executable")
    try:
        import optax
        from flax import nnx
    except ImportError as e:
        r.line("N/A", "two NNX instances with their own partial", f"not installed: {e.name}")
        return

    class Pooled(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.lin = nnx.Linear(8, 8, rngs=rngs)
            self.pool = functools.partial(nnx.avg_pool, window_shape=(2,), strides=(2,))

        def __call__(self, x: Any) -> Any:
            return self.pool(self.lin(x)[..., None])[..., 0]

    def train(model: Any, optimizer: Any, x: Any) -> Any:
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    hot = jc.hot_step(train, state=("model", "optimizer"))
    tx = optax.sgd(0.1)
    models = [Pooled(nnx.Rngs(i)) for i in range(3)]
    optimizers = [nnx.Optimizer(m, tx, wrt=nnx.Param) for m in models]
    x = jnp.ones((4, 8))
    try:
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(3)):
                for m, o in zip(models, optimizers):
                    hot(m, o, x)
        steps = [int(jc.fetch(o.step[...])) for o in optimizers]
        r.check("three instances, each with its own partial, train on one executable",
                steps == [3, 3, 3] and hot.stats.compiles == 1 and hot.stats.not_consumed == 0,
                f"steps {steps}, compiles {hot.stats.compiles}")
    except Exception as e:  # noqa: BLE001
        r.check("three instances, each with its own partial, train on one executable", False, first_line(e))


def main() -> int:
    args = parse_args()
    if args.force_cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
        os.environ["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=2"])
    if (ROOT / "jaxcontracts" / "__init__.py").exists():
        sys.path.insert(0, str(ROOT))  # check this checkout's jaxcontracts

    print(RULE)
    print("jaxcontracts GPU checks" + ("  (--force-cpu dry run: CPU, small state)" if args.force_cpu else ""))
    import jax
    import numpy as np

    try:
        import jaxcontracts as jc

        jc.state  # noqa: B018 - imports the state module (jaxtyping, beartype)
    except ImportError as e:
        print(f"  cannot import jaxcontracts or its dependencies: {e}")
        print("  install them (pip install jaxtyping beartype) and run again")
        print(RULE)
        return 2
    print(f"  python {sys.version.split()[0]} | jax {jax.__version__} | jaxcontracts {jc.__version__} "
          f"({Path(jc.__file__).parent})")
    gpus = [d for d in jax.devices() if d.platform in ("gpu", "tpu")]  # an accelerator: GPU or TPU
    on_gpu = bool(gpus) and not args.force_cpu
    if not on_gpu and not args.force_cpu:
        print(f"  devices: {', '.join(str(d) for d in jax.devices())}")
        print("no GPU or TPU: skipped")
        print(RULE)
        return 0
    devices = jax.devices()
    print(f"  backend {jax.default_backend()} | devices: {', '.join(str(d) for d in devices)}")
    if on_gpu:
        print(f"  device kind: {devices[0].device_kind}")
    print(RULE)
    jc.set_checks("full")
    state_gib = args.state_gib if args.state_gib is not None else (2.0 if on_gpu else 1 / 16)
    r = Results()
    t0 = time.perf_counter()
    for name, run in [
        ("hot_loop", lambda: check_hot_loop(r, jax, np, jc, on_gpu)),
        ("donation", lambda: check_donation(r, jax, np, jc, on_gpu, int(state_gib * 2**30), args.steps)),
        ("sharding", lambda: check_sharding(r, jax, np, jc, on_gpu)),
        ("this round", lambda: check_round(r, jax, np, jc)),
        ("plain jit", lambda: check_plain_jit(r, jax, np, jc)),
        ("refs", lambda: check_refs(r, jax, np, jc)),
        ("partials", lambda: check_partials(r, jax, np, jc)),
    ]:
        try:
            run()
        except Exception as e:  # noqa: BLE001 - one section's crash must not hide the others
            r.crashed(f"section {name}", e)
    c = r.counts
    print("\n" + "-" * 78)
    verdict = "OK" if c["FAIL"] == 0 else "FAILED"
    print(f"summary: {c['PASS']} passed, {c['FAIL']} failed, {c['N/A']} n/a "
          f"in {time.perf_counter() - t0:.1f} s -> {verdict}")
    print(RULE)
    return 0 if c["FAIL"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
