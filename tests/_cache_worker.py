"""One process of tests/test_compile_cache.py (not a test module).

Run as ``python _cache_worker.py CACHE_DIR``. Turns JAX's persistent
compilation cache on (every executable qualifies: min compile time 0, min
entry size 0), compiles a donating hot step from specs, and prints one line
``JC_RESULT {json}``: where its executable came from, how long compiling
took, what was proven (carry, aliasing read from the executable's alias
table), the report's verdict and one call's result.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"
flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
os.environ["XLA_FLAGS"] = " ".join(flags)

import jax  # noqa: E402
from jaxtyping import Array, Float32, Int32  # noqa: E402

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import jaxcontracts as jc  # noqa: E402


class Particles(jc.State):
    pos: Float32[Array, "n 3"]
    vel: Float32[Array, "n 3"]
    t: Int32[Array, ""]


@jc.hot_step
def advance(s: Particles) -> Particles:
    return s.replace(pos=s.pos + 0.1 * s.vel, vel=s.vel * 0.99, t=s.t + 1)


t0 = time.perf_counter()
advance.compile(Particles.spec(n=64))
wall = time.perf_counter() - t0
desc = advance.describe()
cs = desc.current
report = advance.report()
s = advance(Particles.zeros(n=64))
s = advance(s)
print("JC_RESULT " + json.dumps({
    "cache": cs.cache,
    "compile_seconds": cs.compile_seconds,
    "wall_seconds": wall,
    "cache_hits": desc.stats.cache_hits,
    "aliased": sorted(cs.aliased) if cs.aliased is not None else None,
    "donated": list(cs.donated),
    "ok": report.ok,
    "contracts": [[c.name, c.ok] for c in report.contracts],
    "compiled_fact": dict(report.facts).get("compiled"),
    "t": int(jc.fetch(s.t)),
}), flush=True)
