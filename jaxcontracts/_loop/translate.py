"""JAX runtime errors that leave a hot loop, as the contract errors they are.

JAX's own guards raise bare ``JaxRuntimeError`` s (a disallowed transfer, a
deleted buffer); leaving a ``jc.hot_loop`` one becomes a
:class:`TransferError` or :class:`DonationError` naming the user's line, the
cause and the fix.
"""

from __future__ import annotations

from typing import Any

from .._compat import runtime_errors
from .._contracts.donation import donation_fix
from .._contracts.transfers import host_fix
from .._errors import VIOLATIONS, DonationError, TransferError
from .._format import fmt_aval
from .._runtime import arrays_named, donated
from .._steps import consumed_by, jit_donation
from .._userline import is_library, traceback_where
from . import rng as _rng
from . import signatures as sigs

__all__ = ["translate"]


# JAX's transfer-guard errors that leave a loop: their title and fix there.
_TRANSFERS: dict[str, tuple[str, str]] = {
    "host-to-device": (
        "implicit transfer inside jc.hot_loop: host-to-device",
        host_fix("constant", "eager") + ".",
    ),
    "device-to-host": (
        "implicit transfer inside jc.hot_loop: device-to-host (seen by JAX's own guard)",
        "read it deliberately and rarely with jc.fetch(x), or move the read after the loop.",
    ),
    "device-to-device": (
        "implicit transfer inside jc.hot_loop: device-to-device (an array committed "
        "to one device, passed to a computation placed on another; seen by JAX's own guard)",
        "move it on purpose before the loop (x = jax.device_put(x, device)), or make "
        "it on the device the computation runs on.",
    ),
}


# A weakly typed scalar crossing to the device is a Python constant in an
# eager op: `flag & 1`, `loss * 0.5`, or one JAX makes itself (`x[idx]`
# normalises negative indices with Python ints).
_CONSTANT_TITLE = (
    "implicit transfer inside jc.hot_loop: host-to-device, a Python constant "
    "in an eager op"
)


_CONSTANT_FIX = (
    host_fix("eager") + ". If these small copies are acceptable here: "
    'jc.hot_loop(transfers="allow_host_to_device") (device-to-host reads stay refused).'
)


def _jax_entry(tb: Any) -> tuple[str, str]:
    """The JAX function the user's failing line called: (its file, its name)."""
    entry = ("", "")
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_library(code.co_filename, False):
            entry = ("", "")
        elif not entry[0]:
            entry = (code.co_filename.replace("\\", "/"), code.co_name)
        tb = tb.tb_next
    return entry


# JAX's indexing entry points: an eager x[...] or x.at[...].get() makes device
# arrays of the index's Python ints (positions, sizes) on every call.
_INDEXING = {("/jax/_src/array.py", "__getitem__"), ("/jax/_src/numpy/array_methods.py", "get"),
             ("/jax/_src/numpy/array_methods.py", "__getitem__")}


def _host_cause(tb: Any, weak: bool) -> tuple[str, str] | None:
    """The title and fix for a host-to-device transfer made by a ``jax.random``
    function or, of weakly typed Python ints (a numpy index is the user's own),
    by JAX's eager indexing."""
    path, name = _jax_entry(tb)
    if weak and any(path.endswith(p) and name == n for p, n in _INDEXING):
        return (
            "implicit transfer inside jc.hot_loop: host-to-device, the index constants of an "
            "eager x[...] (Python ints JAX makes of the index, copied on every call)",
            "index with jnp.take(x, idx, axis=0) for an array or device-scalar index, or "
            "jax.lax.slice_in_dim(x, start, stop) / jax.lax.index_in_dim(x, i) for fixed "
            "positions (each compiles its constants in: clean once warm); or index inside "
            "the hot_step and return what you need.",
        )
    if "/jax/_src/random" not in path:
        return None
    if name in ("fold_in", "key", "PRNGKey"):
        return (
            f"implicit transfer inside jc.hot_loop: host-to-device, the Python int given to "
            f"jax.random.{name} (the loop's data: a new value each call)",
            f"fold the counter in inside the hot_step (jax.random.{name} there compiles it in; "
            "carry the counter in the state), or split the keys before the loop and "
            "iterate them (keys = jax.random.split(key, n); for k in keys: ...).",
        )
    if weak and name in _rng.SAMPLERS:
        return (
            f"implicit transfer inside jc.hot_loop: host-to-device, the Python-number "
            f"parameters of {name} (its bounds, probabilities or their defaults)",
            f"inside a loop jax.random.{name}(...) called through the module lets them through "
            f"(loop.sampler_calls counts them); this `{name}` was imported by name "
            f"(from jax.random import {name}), which jaxcontracts does not replace: "
            f"call jax.random.{name}, or sample inside the hot_step.",
        )
    return None


def _in_device_get(tb: Any) -> bool:
    """Whether the traceback passes through jax.device_get (a key rebuilt on the device)."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in ("device_get", "_device_get") and is_library(code.co_filename, False):
            return True
        tb = tb.tb_next
    return False


def _donated_names(tb: Any) -> tuple[str, str | None, tuple[str, str] | None]:
    """Which arrays the user's failing frame refers to were donated (JAX names
    only an argument number; the frame still holds them: ``arrays_named``),
    and, where one was donated by a plain jax.jit that it is passed to again,
    what and fix of that drifted donation (``signatures.drift``)."""
    frame, lineno = None, 0
    while tb is not None:
        if not is_library(tb.tb_frame.f_code.co_filename):
            frame, lineno = tb.tb_frame, tb.tb_lineno  # the line that failed, not where it is now
        tb = tb.tb_next
    if frame is None:
        return "", None, None
    named, consumers, drifted = [], [], None
    for path, x in arrays_named(frame, lineno):
        consumers.append(consumed_by(x))
        named.append(f"`{path}` ({fmt_aval(x.shape, x.dtype)}) {donated(consumers[-1])}")
        rec = jit_donation(x)
        if drifted is None and rec is not None and rec.instead:
            drifted = sigs.drift(rec, path)
    return "; ".join(named), next((c for c in consumers if c), None), drifted


def translate(exc: BaseException, tb: Any) -> Exception | None:
    """A JAX runtime error leaving the loop, as the contract error it is."""
    found = runtime_errors.classify(exc)
    if found is None:
        return None
    kind, detail = found
    weak = "weak_type=True" in detail  # a Python number made a device array
    error: type[Exception] = TransferError
    contract = "no-transfer"
    if kind == "deleted":
        error, contract = DonationError, "no-donated-use"
        named, by, drifted = _donated_names(tb)
        title = (
            "use of a donated array inside jc.hot_loop: "
            f"{named or 'an array that ' + donated(None)}"
        )
        fix = donation_fix("use", by)
        if drifted is not None:
            contract = VIOLATIONS["wrong_donation"].contract
            title = f"{VIOLATIONS['wrong_donation'].title}: {drifted[0]}"
            fix = drifted[1]
    else:
        title, fix = _TRANSFERS[kind]
    if kind == "host-to-device":
        cause = _host_cause(tb, weak)
        if cause is not None:
            title, fix = cause
        elif weak:
            title, fix = _CONSTANT_TITLE, _CONSTANT_FIX
        elif _in_device_get(tb):
            title = "implicit transfer inside jc.hot_loop: jax.device_get of a typed PRNG key"
            fix = (
                "jax.device_get rebuilds a typed key on the device (a host-to-device "
                "copy of its data); read it with jc.fetch(key), which returns the key "
                "data (jax.random.wrap_key_data(data) makes it a key again)."
            )
    where, source = traceback_where(tb)
    return error(
        f"{title}{f' ({detail})' if detail else ''}\n  at {where}"
        + (f":  {source}" if source else ""),
        fix=fix,
        contract=contract,
    )

