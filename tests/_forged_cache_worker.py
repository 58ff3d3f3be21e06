"""One process of tests/test_compile_cache.py's forged-entry test (not a test module).

Run as ``python _forged_cache_worker.py CACHE_DIR``. Writes the persistent
cache entry of a donating step, then overwrites it with the bytes of the same
function compiled without donation (a forged or stale entry), and compiles the
step again from the cache. Prints ``JC_RESULT {json}``: the error's class and
message.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
os.environ["XLA_FLAGS"] = " ".join(flags)

import jax  # noqa: E402
from jaxtyping import Array, Float32  # noqa: E402

cache = Path(sys.argv[1])
jax.config.update("jax_compilation_cache_dir", str(cache))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import jaxcontracts as jc  # noqa: E402


class S(jc.State):
    x: Float32[Array, "n"]


def body(s: S) -> S:
    return S(x=s.x * 3.0 + 1.0)


def entries() -> set[Path]:
    return {p for p in cache.rglob("*") if p.is_file()}


before = entries()
jc.hot_step(body).compile(S.spec(n=4096))  # the donating step's entry
donating = entries() - before
before = entries()
jax.jit(body).lower(S.spec(n=4096)).compile()  # the same program, nothing donated
plain = entries() - before
assert len(donating) == 1 and len(plain) == 1, (donating, plain)
(target,), (source,) = donating, plain
target.write_bytes(source.read_bytes())  # the forged entry
jax.clear_caches()

try:
    jc.hot_step(body).compile(S.spec(n=4096))
except jc.ContractError as e:
    result = {"error": type(e).__name__, "message": str(e), "contract": e.contract}
else:
    result = {"error": None, "message": "", "contract": None}
print("JC_RESULT " + json.dumps(result), flush=True)
