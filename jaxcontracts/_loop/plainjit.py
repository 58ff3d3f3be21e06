"""Plain ``jax.jit`` functions inside a hot loop: their cache misses, observed.

``_compat.jitwatch`` calls :func:`observe` on a cache miss, before JAX
traces. The loop keeps each function's compiled signatures (a second
compile's message names the leaf that changed) and refuses, before the call
runs, host arguments (named at the user's line, which JAX's log line lacks)
and donations that cannot happen. An undonated parameter whose buffers an
output could take is followed (``signatures.Dropped``); when all its arrays
died at the call's own statement (``state = f(state)``) the donation was
missed (:func:`settle`). JAX's own jits (behind eager ops) are left to the
compile listener.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax

from .. import _contracts, _steps
from .._compat import jitwatch
from .._compat.tracing import trace_state_clean
from .._contracts.transfers import host_fix
from .._format import fmt_bytes
from .._runtime import local, static_is_exact
from .._userline import user_frame, where
from . import signatures as sigs
from .intercept import plain_trace

__all__ = ["Followed", "observe", "settle"]


@dataclasses.dataclass
class Followed:
    """An undonated parameter of one call whose buffers an output could take."""

    name: str  # the function
    param: str
    nbytes: int
    dropped: sigs.Dropped
    at: str  # the call's line, file:line (no frame is kept: it would keep the arrays)
    line: tuple[str, int]  # that line: its file and number
    donated: tuple[str, ...] = ()  # what the function donates instead (a drifted index)
    jit_line: str = ""


def observe(fun: Any, ji: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Any) -> Any:
    """The cache-miss observer (``jitwatch.add_miss_observer``)."""
    __tracebackhide__ = True
    loop = local.loop
    if (
        (loop is None and not local.stack.entries)
        or local.allow
        or str(getattr(fun, "__module__", "") or "").startswith("jax")
        or not trace_state_clean()
    ):
        return run(fun, ji, args, kwargs)
    if loop is None:  # a loop at checks level off: compiles are not checked, nor what they read
        return _traced(None, run, fun, ji, args, kwargs)
    settle(loop)  # what the calls before this miss dropped
    try:  # what the loop has to say, worked out before the call; never fails the call itself
        opts = jitwatch.options_from_info(ji)
        dyn_args = tuple(a for i, a in enumerate(args) if i not in opts.static_argnums)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in opts.static_argnames}
        sig = sigs.signature(opts, args, kwargs, dyn_args, dyn_kwargs)
        name = sigs.short(
            getattr(fun, "__qualname__", None) or getattr(fun, "__name__", "") or "a function"
        )
        # the PjitInfo kept: its id stays its own
        _, seen = loop.plain_signatures.setdefault(id(ji), (ji, []))
        recompile = (name, *sigs.diff(seen[-1], sig)) if seen and sig not in seen else None
        # the first host leaf (record mode: one per function and line)
        host = [j for j, h in enumerate(sig.host) if h][:1] if loop.checks_transfers else []
        logged = [_logged_aval(sig.specs[j]) for j in host]
    except Exception:  # noqa: BLE001 - an argument we cannot describe: JAX's own path explains it
        return _traced(loop, run, fun, ji, args, kwargs)
    user = user_frame()
    leaves = jax.tree_util.tree_leaves((dyn_args, dyn_kwargs))
    drifted = sigs.passed_again(leaves, sig.paths, range(len(leaves)))
    # a deleted array a plain jax.jit's donation consumed: the index drifted
    if drifted is not None:
        loop.violation("wrong_donation", drifted[1], drifted[2], user, before_call=True)
    local.plain_recompile = recompile
    if sig not in seen:  # (a function with effects misses JAX's C++ cache at every call)
        seen.append(sig)
    for j in host:
        # JAX's guard logs this transfer too (record mode): the loop drops that line
        loop.named_transfers[logged[0]] += 1
        path = sig.paths[j]
        param = sigs.param_of(path)
        fixes = (
            ("constant", "static", "batch") if static_is_exact(leaves[j]) else ("constant", "batch")
        )
        loop.violation(
            "transfer",
            f"`{name}` is given {sig.text(j)} at `{path}`: an implicit host-to-device copy "
            "at every call",
            "a constant: " + host_fix(*fixes, param=param) + ".",
            user,
        )
    p, flat = _traced(loop, run, fun, ji, args, kwargs)
    # (a program with callback effects misses JAX's C++ cache each call)
    if _contracts.wanted(loop):
        try:
            found = _contracts.scan(name, jitwatch.jaxpr_of(p))
        except Exception:  # noqa: BLE001 - a program we cannot read: JAX's own path, unchecked
            found = {}
        if found:
            _contracts.refuse(loop, name, found)
    try:
        out_tree, out_avals = jitwatch.outputs_of(p)
        avals = {(tuple(a.shape), str(a.dtype)) for a in out_avals}
        donated = sigs.donated_params(opts)
        wrong = sigs.wrong_donations(sig, donated, avals, name)
        out = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals]
        candidates = sigs.reusable(
            opts, sig, dyn_args, dyn_kwargs, jax.tree_util.tree_unflatten(out_tree, out), out,
            donated,
        )
        site = sigs.jit_site(fun)
        followed = _follow(name, sig, leaves, candidates, user, (tuple(sorted(donated)), site))
        # what the call donates, named once it is deleted (passed again: the index drifted)
        consumed = sigs.donations(opts, sig, leaves, donated, candidates, name, site)
    except Exception:  # noqa: BLE001 - no outputs to read on this JAX: nothing more to say
        return p, flat
    for arrays, rec in consumed:
        _steps.keep(arrays, rec)
    for _param, why, fix in wrong:
        loop.violation("wrong_donation", f"`{name}`: {why}", fix, user, before_call=True)
    if not wrong and not jitwatch.installed():  # (an open jc.watch() follows every call itself)
        loop.plain_followed.extend(followed)
    return p, flat


def _traced(loop: Any, run: Any, fun: Any, ji: Any, args: Any, kwargs: Any) -> Any:
    """Trace the function (``run``), its concrete reads part of its compile: where
    the loop admits the compile (warm-up, ``compiles="allow"``, or ``loop`` None
    at checks level ``off``) JAX's device-to-host guard is lifted for the trace,
    as for a hot step's (``_runtime.compiling``); where it refuses it, the
    listener raised before the trace (or, recording, ``intercept.plain_trace``
    marks the trace's reads as part of the recorded compile)."""
    __tracebackhide__ = True
    lifted = loop is None or loop.compiles_admitted()
    with (
        plain_trace(),
        jax.transfer_guard_device_to_host("allow") if lifted else contextlib.nullcontext(),
    ):
        return run(fun, ji, args, kwargs)


def _follow(
    name: str, sig: Any, leaves: list[Any], candidates: tuple[int, ...], user: Any,
    donating: tuple[tuple[str, ...], str] = ((), ""),
) -> list[Followed]:
    """Each candidate parameter's arrays, followed (``signatures.Dropped``)."""
    if user is None:
        return []
    at = where(user)[0]  # file:line as every message names it
    groups = {
        param: idx for param, idx in sigs.by_param(sig, candidates).items()
        if all(isinstance(leaves[j], jax.Array) for j in idx)
    }
    # (at a compile: one scan of the live arrays for every parameter's)
    found = sigs.sharers([leaves[j] for idx in groups.values() for j in idx])
    out = []
    for param, idx in groups.items():
        arrays = [leaves[j] for j in idx]
        nbytes = sum(sig.nbytes(j) for j in idx)
        held = None if found is None else [r for x in arrays for r in found.get(id(x), ())]
        out.append(Followed(
            name, param, nbytes, sigs.Dropped(arrays, user, held), at,
            (user.f_code.co_filename, user.f_lineno), *donating,
        ))
    return out


def settle(loop: Any) -> None:
    """The followed parameters whose arrays all died at their call's
    statement: missed donations (raised in raise mode, recorded otherwise);
    the others are let go."""
    __tracebackhide__ = True
    followed, loop.plain_followed = loop.plain_followed, []
    for f in followed:
        if not f.dropped.dropped or sigs.still_shared(f.dropped.sharers):
            continue
        drifted = ""
        if f.donated:  # it donates another parameter instead: the index drifted
            at = f" (set at {f.jit_line})" if f.jit_line else ""
            drifted = (f"; it donates {', '.join(f'`{p}`' for p in f.donated)}{at} instead: "
                       "the index likely drifted when a parameter was inserted")
        loop.violation(
            "missed_donation",
            f"`{f.name}` (called at {f.at}): `{f.param}` is not donated, yet the call's "
            f"own statement dropped its {f.dropped.count} array(s) ({fmt_bytes(f.nbytes)}), "
            f"while an output could have taken their buffers: each call holds them twice{drifted}",
            sigs.missed_donation_fix(
                f.name, f.param, decorator=sigs.decorator_at(*f.jit_line.rsplit(":", 1))
                if f.jit_line else "",
            ),
            line=f.line,  # the call's line (the loop may end in a test runner's frames)
        )


def _logged_aval(spec: Any) -> str:
    """The aval text JAX's transfer-guard log gives a host leaf (``float32[], weak_type=True``):
    its dtype as JAX will make it (float64 is float32 without x64)."""
    dtype = jax.dtypes.canonicalize_dtype(spec.dtype)
    return (
        f"{dtype}[{','.join(map(str, spec.shape))}]"
        + (", weak_type=True" if spec.weak_type else "")
    )
