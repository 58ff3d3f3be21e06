"""Two CPU processes, one jax.distributed job: contracts hold in each process.

The test launches ``_distributed_worker.py`` twice on loopback. Each process
joins the job (CPU collectives through gloo), builds a mesh over the devices
of both processes, and runs a hot step on a state sharded across them inside
``jc.hot_loop``: the step's sum is an all-reduce across the processes. One
process plants violations (an implicit read, a fresh jit, a read of a donated
state, a call with a donated state); they raise there and only there, and the
other process runs on undisturbed.

The test cannot hang: both workers run in their own process groups with a
hard deadline, after which both groups are killed; each worker also has a
watchdog that dumps its stack and exits.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jaxcontracts

WORKER = Path(__file__).with_name("_distributed_worker.py")
ROOT = Path(__file__).resolve().parent.parent
# The workers import the jaxcontracts this process imported (a source tree or
# an installed copy), whatever their own sys.path would find first.
PACKAGE_PARENT = Path(jaxcontracts.__file__).resolve().parent.parent
DEADLINE = 120.0  # seconds for both workers, start to exit; then both are killed
WATCHDOG = 100.0  # seconds after which a stuck worker dumps its stack and exits
STEPS = 20
PLANT_IN = 1
K = 6  # steps per planted loop

def _loopback_refused() -> bool:
    """Whether this machine refuses sockets, loopback included (a sandboxed
    accelerator host): jax.distributed's coordinator cannot listen there."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
    except OSError:
        return True
    return False


pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="process groups and loopback collectives: POSIX only"),
    pytest.mark.skipif(_loopback_refused(), reason="this machine refuses loopback sockets, which jax.distributed needs"),
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _tail(path: Path, n: int = 4000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [ln for ln in text.splitlines() if not ln.startswith(("JC_RESULT", "[Gloo]"))]
    return "\n".join(lines)[-n:]


def _launch(tmp: Path, attempt: int) -> tuple[list[dict | None], list[int | None], str]:
    """Run both workers; (results, return codes, their output for messages)."""
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("JAXCONTRACTS_CHECKS", None)
    procs, logs = [], []
    try:
        for pid in range(2):
            log = tmp / f"worker{pid}-{attempt}.txt"
            logs.append(log)
            with open(log, "wb") as f:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(WORKER),
                            f"--process-id={pid}",
                            f"--port={port}",
                            f"--steps={STEPS}",
                            f"--plant-in={PLANT_IN}",
                            f"--plant-steps={K}",
                            f"--watchdog={WATCHDOG}",
                        ],
                        cwd=str(ROOT),
                        env=env,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # its own process group, killed as one
                    )
                )
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
    finally:
        for p in procs:
            _kill_group(p)  # only those still running: past the deadline, or on an error here
    codes = [p.returncode for p in procs]
    results: list[dict | None] = []
    for log in logs:
        found = None
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("JC_RESULT "):
                found = json.loads(line[len("JC_RESULT ") :])
        results.append(found)
    output = "\n".join(f"--- worker {i} (exit {c}) ---\n{_tail(log)}" for i, (c, log) in enumerate(zip(codes, logs)))
    return results, codes, output


def _initialize_failed(results: list[dict | None]) -> bool:
    return any(r is not None and r.get("phase") == "start" and "fatal" in r for r in results)


_UNSUPPORTED = ("gloo", "collective", "not supported", "unsupported", "not implemented", "unimplemented")


def test_hot_loop_on_a_state_sharded_across_two_processes(tmp_path):
    results, codes, output = _launch(tmp_path, 0)
    if _initialize_failed(results):  # a port taken between pick and bind: once more
        results, codes, output = _launch(tmp_path, 1)
    if _initialize_failed(results):
        fatal = next(r["fatal"] for r in results if r and "fatal" in r)
        text = f"{fatal['type']}: {fatal['message']}"
        if any(word in text.lower() for word in _UNSUPPORTED):
            pytest.skip(f"jax.distributed with CPU collectives is unavailable here: {text}")
        pytest.fail(f"jax.distributed.initialize failed: {text}\n{output}")

    assert None not in codes, f"a worker was killed at the {DEADLINE:.0f} s deadline\n{output}"
    for pid, r in enumerate(results):
        assert r is not None, f"worker {pid} printed no result\n{output}"
        assert "fatal" not in r, f"worker {pid} failed in phase {r['phase']!r}:\n{r.get('traceback')}\n{output}"
        assert r["phase"] == "done"
        assert codes[pid] == 0, output
        failed = sorted(name for name, ok in r["checks"].items() if not ok)
        assert not failed, f"worker {pid}: failed checks {failed}\n{json.dumps(r, indent=1)}"

        errors = r["errors"]
        assert errors["clean_loop"] is None
        # A state with another sharding is refused by the step, in each process.
        assert errors["wrong_sharding"]["type"] == "RecompileError"
        assert "sharding changed" in errors["wrong_sharding"]["message"]
        # A sharded array spans the other process's devices: fetching it whole
        # fails loudly (its addressable shards are fetched instead).
        assert errors["global_fetch_of_sharded"] is not None

    r0, r1 = results
    # Both processes ran the same steps and read the same replicated values.
    assert r0["fetched"] == r1["fetched"] and len(r0["fetched"]) == STEPS // 5
    assert r0["t_final"] == r1["t_final"]

    # Planted violations raise in the planting process, at the planted line ...
    planted, clean = (r1, r0) if PLANT_IN == 1 else (r0, r1)
    p = planted["planted"]
    assert p["transfer"]["error"]["type"] == "TransferError"
    assert "float() of f32[] (advance -> .t)" in p["transfer"]["error"]["message"]
    assert "float(c.t)" in p["transfer"]["error"]["message"]
    assert p["compile"]["error"]["type"] == "RecompileError"
    assert "jax.jit(lambda x: x * 2)(c.t)" in p["compile"]["error"]["message"]
    assert p["donation"]["error"]["type"] == "DonationError"
    assert "float(first.t)" in p["donation"]["error"]["message"]
    assert p["stale_call"]["error"]["type"] == "DonationError"
    assert "c.pos: f32[16,3] was already" in p["stale_call"]["error"]["message"]
    for kind in ("transfer", "compile", "donation"):
        assert p[kind]["steps_in_loop"] == K // 2 + 1
    # ... and nowhere else: the other process ran every loop to the end.
    for kind in ("transfer", "compile", "donation", "stale_call"):
        assert clean["planted"][kind]["error"] is None, clean["planted"][kind]
    for kind in ("transfer", "compile", "donation"):
        assert clean["planted"][kind]["steps_in_loop"] == K
