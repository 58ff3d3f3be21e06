"""One of the CPU processes of tests/test_distributed.py (not a test module).

Run as ``python _distributed_worker.py --process-id I --port P``. The process
joins a ``jax.distributed`` job on loopback (CPU collectives through gloo),
builds a mesh over every device of every process, and drives a hot step on a
state sharded across the processes inside ``jc.hot_loop``. It prints one line
``JC_RESULT {json}`` with what it saw; the test asserts on it.

Every process issues the same collectives in the same order: a violation is
planted (in ``--plant-in`` only) where it raises before anything is
dispatched, and the planting process then runs the steps it skipped, so the
other process never waits on a collective that will not come. A watchdog
(``faulthandler``) ends a stuck process with its stack on stderr; the test
kills both process groups past its own deadline.
"""

from __future__ import annotations

import argparse
import faulthandler
import inspect
import json
import os
import sys
import time
import traceback

N_PER_DEVICE = 4  # rows of the state per device
LOCAL_DEVICES = 2  # simulated CPU devices per process
DT = 0.25


def _setup_env() -> None:
    # Before jax is imported: this process's own device count and platform,
    # whatever the parent's (the suite's conftest asks for 8 devices).
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    flags.append(f"--xla_force_host_platform_device_count={LOCAL_DEVICES}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    os.environ["JAX_PLATFORMS"] = "cpu"


def _error(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--plant-steps", type=int, default=6, help="steps per planted loop")
    parser.add_argument("--plant-in", type=int, default=1, help="the process that plants violations")
    parser.add_argument("--watchdog", type=float, default=90.0, help="seconds before a stuck process dumps its stack and exits")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    _setup_env()

    out: dict = {"process_id": args.process_id, "phase": "start", "checks": {}, "errors": {}}
    try:
        run(args, out)
        out["phase"] = "done"
    except BaseException as e:  # noqa: BLE001 - reported to the test, with the traceback
        out["fatal"] = _error(e)
        out["traceback"] = traceback.format_exc()
    print("JC_RESULT " + json.dumps(out), flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0 if "fatal" not in out else 1


def _initialize(jax, args) -> dict:
    """``jax.distributed.initialize`` on loopback, with short timeouts."""
    config: dict = {}
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        config["jax_cpu_collectives_implementation"] = "gloo"
    except Exception as e:  # noqa: BLE001 - an older/newer jax: keep its default
        config["jax_cpu_collectives_implementation"] = f"default ({_error(e)['message'][:80]})"
    kwargs = dict(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60,
        heartbeat_timeout_seconds=30,
        shutdown_timeout_seconds=30,
    )
    accepted = inspect.signature(jax.distributed.initialize).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    jax.distributed.initialize(**kwargs)
    config["initialize"] = {k: v for k, v in kwargs.items() if k != "process_id"}
    return config


def run(args, out: dict) -> None:
    import jax

    out["jax"] = jax.__version__
    out["python"] = sys.version.split()[0]
    t0 = time.perf_counter()
    out["config"] = _initialize(jax, args)
    out["phase"] = "initialized"

    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from jaxtyping import Array, Float32

    import jaxcontracts as jc

    jc.set_checks("full")  # whatever JAXCONTRACTS_CHECKS says
    pid = args.process_id
    plant = pid == args.plant_in
    checks = out["checks"]
    errors = out["errors"]
    checks["process_index"] = jax.process_index() == pid
    checks["process_count"] = jax.process_count() == args.num_processes
    n_devices = args.num_processes * LOCAL_DEVICES
    checks["global_devices"] = len(jax.devices()) == n_devices
    checks["local_devices"] = len(jax.local_devices()) == LOCAL_DEVICES

    mesh = Mesh(np.array(jax.devices()), ("x",))
    rows = NamedSharding(mesh, P("x"))
    rep = NamedSharding(mesh, P())
    n = N_PER_DEVICE * n_devices

    @jc.state
    class Cloud:
        pos: Float32[Array, "n 3"]
        vel: Float32[Array, "n 3"]
        t: Float32[Array, ""]
        total: Float32[Array, ""]  # sum(pos): an all-reduce across the processes
        dt: float = jc.static(DT)

    @jc.hot_step(signature=Cloud)
    def advance(c: Cloud) -> Cloud:
        vel = c.vel + c.dt
        pos = c.pos + vel * c.dt
        return Cloud(pos=pos, vel=vel, t=c.t + c.dt, total=jnp.sum(pos), dt=c.dt)

    shard = {"pos": rows, "vel": rows, "t": rep, "total": rep}

    # -- the state: from a spec, zeros, and the constructor -----------------
    advance.compile(Cloud.spec(n=n, sharding=shard))
    checks["compiled_once"] = advance.stats.compiles == 1
    checks["compiled_sharding"] = (
        advance.signature[0].pos.sharding == rows and advance.signature[0].t.sharding == rep
    )
    zeros = Cloud.zeros(n=n, sharding=shard)  # jax.device_put of a global zeros array
    checks["zeros_sharded_across_processes"] = (
        zeros.pos.sharding == rows
        and not zeros.pos.is_fully_addressable
        and len(zeros.pos.addressable_shards) == LOCAL_DEVICES
    )
    del zeros
    start = np.arange(n * 3, dtype=np.float32).reshape(n, 3)

    def global_array(value: np.ndarray, sharding) -> jax.Array:
        return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])

    c = Cloud(
        pos=global_array(start, rows),
        vel=global_array(np.zeros_like(start), rows),
        t=global_array(np.zeros((), np.float32), rep),
        total=global_array(np.float32(start.sum()), rep),
    )
    checks["constructor_keeps_global_arrays"] = c.pos.sharding == rows and c.t.sharding == rep
    first = c
    out["phase"] = "state built"

    def shard_pointers(x: jax.Array) -> list[int]:
        return [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]

    # On CPU, make_array_from_callback may wrap a 64-byte aligned numpy slice
    # without copying; XLA cannot reuse such a buffer, so the first step may
    # copy it (the input is deleted all the same). Buffers are compared from
    # the first step's output on, and the first step is reported.
    pointers_before = shard_pointers(c.pos)

    # -- a clean loop: every process, same collectives ------------------------
    fetched = []
    pointers = None
    loop_error = None
    try:
        with jc.hot_loop():
            for i in range(args.steps):
                c = advance(c)
                if i == 0:
                    pointers = shard_pointers(c.pos)
                if i % 5 == 4:
                    fetched.append([float(v) for v in jc.fetch((c.t, c.total))])
    except Exception as e:  # noqa: BLE001
        loop_error = _error(e)
    errors["clean_loop"] = loop_error
    checks["clean_loop_did_not_raise"] = loop_error is None
    out["fetched"] = fetched

    # Expected values, computed on the host.
    exp_pos, exp_vel, expected = start.copy(), np.zeros_like(start), []
    for i in range(args.steps):
        exp_vel = exp_vel + np.float32(DT)
        exp_pos = exp_pos + exp_vel * np.float32(DT)
        if i % 5 == 4:
            expected.append([(i + 1) * DT, float(exp_pos.sum())])
    checks["fetched_replicated_scalars"] = len(fetched) == len(expected) and all(
        abs(a - b) <= 1e-6 * max(1.0, abs(b)) for f, e in zip(fetched, expected) for a, b in zip(f, e)
    )
    checks["donated_inputs_deleted"] = all(x.is_deleted() for x in jax.tree_util.tree_leaves(first))
    checks["buffers_reused"] = shard_pointers(c.pos) == pointers
    out["first_step_reused_buffers"] = [a == b for a, b in zip(pointers_before, pointers or [])]
    checks["still_sharded"] = c.pos.sharding == rows and c.t.sharding == rep
    checks["stats"] = (
        advance.stats.calls == args.steps
        and advance.stats.compiles == 1
        and advance.stats.refused == 0
        and advance.stats.not_consumed == 0
    )
    report = advance.report()
    checks["report_ok"] = report.ok
    out["report"] = str(report)

    # Process-local shards: jc.fetch of each addressable shard.
    local = jc.fetch([s.data for s in c.pos.addressable_shards])
    checks["local_shards_fetched"] = all(
        np.allclose(v, exp_pos[s.index]) for v, s in zip(local, c.pos.addressable_shards)
    )
    # A sharded (non-addressable) array cannot be fetched whole: it must fail
    # loudly, never return part of it.
    try:
        jc.fetch(c.pos)
        errors["global_fetch_of_sharded"] = None
    except Exception as e:  # noqa: BLE001
        errors["global_fetch_of_sharded"] = _error(e)

    # A state with another sharding is refused before dispatch, in every process.
    wrong = Cloud.zeros(n=n, sharding=rep)
    try:
        advance(wrong)
        errors["wrong_sharding"] = None
    except Exception as e:  # noqa: BLE001
        errors["wrong_sharding"] = _error(e)
    checks["wrong_sharding_intact"] = not any(x.is_deleted() for x in jax.tree_util.tree_leaves(wrong))
    del wrong

    # -- the fast paths at the other checks levels ---------------------------
    for level in ("fast", "off"):
        jc.set_checks(level)
        with jc.hot_loop():
            c = advance(c)
            c = advance(c)
    jc.set_checks("full")
    steps_done = args.steps + 4
    out["phase"] = "clean loop done"

    # -- planted violations, in one process only -----------------------------
    # Each raises before anything is dispatched; the planting process then
    # runs the steps the other process ran, so collectives stay paired.
    planted: dict = {}
    k = args.plant_steps
    for kind in ("transfer", "compile", "donation"):
        ran, error = 0, None
        try:
            with jc.hot_loop():
                for i in range(k):
                    c = advance(c)
                    ran += 1
                    if plant and i == k // 2:
                        if kind == "transfer":
                            float(c.t)  # an implicit device-to-host read
                        elif kind == "compile":
                            jax.jit(lambda x: x * 2)(c.t)  # a fresh jit: a compile
                        else:
                            float(first.t)  # a read of a donated state
        except Exception as e:  # noqa: BLE001
            error = _error(e)
        for _ in range(k - ran):  # catch up, outside the loop
            c = advance(c)
        planted[kind] = {"error": error, "steps_in_loop": ran}
    steps_done += 3 * k
    # A call with a donated state is refused before dispatch (no collective).
    try:
        with jc.hot_loop():
            if plant:
                advance(first)
    except Exception as e:  # noqa: BLE001
        planted["stale_call"] = {"error": _error(e)}
    else:
        planted["stale_call"] = {"error": None}
    out["planted"] = planted
    out["phase"] = "planted"

    # -- both processes agree at the end -------------------------------------
    t_final = float(jc.fetch(c.t))
    out["t_final"] = t_final
    checks["t_final"] = abs(t_final - steps_done * DT) < 1e-4
    checks["calls_after_plants"] = advance.stats.calls == steps_done - 2  # "off" does not count
    multihost_utils.sync_global_devices("jaxcontracts test: end")
    out["seconds"] = round(time.perf_counter() - t0, 2)
    jax.distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
