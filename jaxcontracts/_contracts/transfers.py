"""No implicit transfers between host and device: a step's arguments are
device arrays (its signature fixes them, ``host=`` aside), and inside
``jc.hot_loop(transfers=...)`` no read or copy the user did not ask for
(``jc.fetch``). Checked by the call path's signature and by the loop's guard
(``_loop/guard.py``, ``_loop/intercept.py``); the fixes for host data are
worded here once, for the loop, the audit and the translated JAX refusals.
"""

from __future__ import annotations

from typing import Any

from .._errors import Contract, TransferError, declare

__all__ = ["HOST_FIXES", "debug_reads_fix", "debug_reads_on", "host_fix", "read_fix"]

declare(Contract("device-arguments", "arguments are device arrays", TransferError))
declare(
    Contract(
        "no-transfer", "no implicit transfers", TransferError,
        violations=(("transfer", "implicit transfer inside jc.hot_loop"),),
        option="transfers", choices=("disallow", "allow_host_to_device", "allow"),
        findings=("host_sync", "host_transfer"),
    )
)  # fmt: skip


# Every fix for host data given to a compiled function or read from one, in one table
# (the loop's, the audit's and the translated JAX refusals'); {param}: the parameter's name.
HOST_FIXES = {
    # the same value at each call (a constant)
    "constant": "put it on the device once, before the loop (jax.device_put)",
    "static": "or make it static (jax.jit(..., static_argnames=({param!r},)))",
    # a new numpy array at each call (a batch): jaxlib's own copy is the cheapest
    "batch": "data fed each step (a batch): keep it numpy, the call copies it on jaxlib's C++ "
    "path, the cheapest copy (a jax.device_put per step costs more); inside a jc.hot_loop, "
    "move the function into a hot step that declares it (@jc.hot_step(host={param!r}))",
    # numpy arrays given at an earlier call again (a dataset re-fed each epoch)
    "refed": "put the dataset on the device once, before the loop "
    "(batches = jax.device_put(batches)), where it fits in device memory; a loader that makes "
    "new arrays each step is the cheapest copy",
    # a new Python number at each call
    "number": "carry it on the device in the state (jnp arrays), updated by the step itself",
    # host data given by a library's own jitted helper, called outside any jax.jit
    "library": "it is passed by a library's own jitted function, which your line calls outside "
    "any jax.jit (an optimizer's update run eagerly): jit the whole step that calls it, where "
    "such values are compiled in",
    # a library's own jitted helper's recompile or missed donation (jax-md's safe_mask): the
    # same cause
    "library_call": "it is a library's own jitted function, which your line calls outside any "
    "jax.jit, compiled and called on its own: jit the whole step that calls it, where it is "
    "traced once into one program, its static values compiled in and its buffers reused",
    # a device-to-host read in a loop (a line that reads at each step)
    "read": "read it deliberately and rarely with jc.fetch(x) (e.g. every 1000 steps), or move the "
    "read after the loop; an `if` on an array belongs in the step (jnp.where / lax.cond).",
    # the same, where the line reads only once every {every} calls of the {step} it reads
    # already: fewer reads is no fix, each one still waits for the call just dispatched
    "read_late": "this line reads only once every {every} calls of {step} already, yet each read "
    "waits for the call just dispatched: read one step late (dispatch the next step first, then "
    "read the value the step before returned, so the host never waits): "
    "pending = jc.fetch_async(x) here, pending.result() after the next step's call; or move the "
    "read after the loop.",
    # a Python scalar in an eager op
    "eager": "a Python number in an eager op (x * 2 outside a step) is copied to the device at "
    "every call: do the op inside the hot_step (return what you need) or in a jax.jit helper "
    "warmed before the loop (constants are compiled in), or make the constant a device array "
    "once, before the loop (one = jnp.int32(1); flag & one)",
}


def debug_reads_on() -> list[str]:
    """The options that make JAX copy every output to the host after a call."""
    import jax

    return [
        name for name in ("jax_debug_nans", "jax_debug_infs") if getattr(jax.config, name, False)
    ]


def debug_reads_fix(fix: str) -> str:
    """``fix``, the fix of a device-to-host read in a loop, led by what makes
    JAX read every output where ``jax_debug_nans`` / ``jax_debug_infs`` is on
    (a read the user's line never wrote: JAX's look for nans after a call)."""
    on = debug_reads_on()
    if not on:
        return fix
    return (f"{' and '.join(on)} is on: after each call JAX copies every output to the host to "
            f"look for nans or infs, which a loop refuses; where this line reads nothing itself, "
            f'that is the read: turn it off for hot loops (jax.config.update("{on[0]}", False)), '
            f"or look for them outside jc.hot_loop. Otherwise: {fix}")


def host_fix(*kinds: str, param: str = "x", **fields: Any) -> str:
    """The fixes of :data:`HOST_FIXES` for ``kinds``, joined, naming ``param``
    (and ``fields``: ``every`` and ``step``, how often a line reads)."""
    return (
        "; ".join(HOST_FIXES[k] for k in kinds)
        .replace("; or ", ", or ")
        .format(param=param, **fields)
    )


def read_fix(every: int, step: str = "its step") -> str:
    """The fix of a line's device-to-host read that waits for the device,
    from how often it ran: once every ``every`` calls of ``step``, the
    function called last before each read."""
    return host_fix("read_late", every=every, step=step) if every > 1 else HOST_FIXES["read"]
