"""``jc.watch()``: the three contracts, observed in plain ``jax.jit`` code.

While a watch is open, every function ``jax.jit`` makes (``eqx.filter_jit``'s
and ``nnx.jit``'s included) comes back wrapped (``_compat.jitwatch``); a call
is looked at before and after, never changed. Findings, each at the user's
line: ``recompile``, ``missed_donation``, ``wrong_donation``,
``host_transfer``, ``compile_in_loop`` (and ``host_sync``, from the reads
loop of ``session``). A function's first call (its warm-up) is not a loop
finding; functions jitted before the watch opened are not observed.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import inspect
import json
import linecache
import operator
import re
import textwrap
import threading
import time
import types
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from .. import _steps
from .._compat import capability, events, frames, jitwatch, liveorder
from .._compat.arrays import ArrayImpl
from .._compat.tracing import top_level_refs
from .._contracts.transfers import HOST_FIXES, host_fix, read_fix
from .._errors import ContractError, contract_of_finding
from .._format import fit_change, fmt_aval, fmt_bytes, fmt_listed
from .._loop import signatures as sigs
from .._report.render import findings_html
from .._runtime import local, static_is_exact
from .._state.spec import leaf_spec, spec_nbytes, value_kind
from .._tracebacks import is_library, trim_ours
from .._userline import user_frame, where

__all__ = ["Finding", "Watch", "WatchReport"]

#: Calls after each compile whose undonated arguments are followed with their
#: sharers: enough to see a loop's pattern, bounded so a long loop pays no more.
DONATION_WINDOW = 4
#: Output arrays remembered before the dead ones are dropped (then: twice the live).
MADE_KEPT = 4096
#: Records of one parameter left undecided at once (one per nested statement
#: holding the state); past it, one more is taken as kept.
UNDECIDED_KEPT = 4
#: A line that makes this many jitted functions that each compile is a jit made in a loop.
COMPILES_AT_ONE_LINE = 3
#: A finding's bytes are ranked with measured seconds at this rate (a host-to-device link's).
BYTES_PER_SECOND = 10e9
_WIDTH = 100


@dataclasses.dataclass
class Finding:
    """One thing to fix, at one line (see the module's docstring for the kinds)."""

    kind: str
    function: str
    file: str
    line: int
    count: int
    fix: str
    message: str
    param: str | None = None
    bytes_per_call: int | None = None
    diff: list[str] | None = None
    jit_line: str | None = None  # where jax.jit(...) set the donation (wrong_donation)
    seconds: float | None = None  # compiling (recompile), blocked (host_sync)

    @property
    def cost(self) -> float:
        """What it cost the run, in seconds (its bytes counted at ``BYTES_PER_SECOND``)."""
        if self.seconds is not None:
            return self.seconds
        return (self.bytes_per_call or 0) * self.count / BYTES_PER_SECOND

    def cost_text(self) -> str:
        if self.seconds is not None:
            s = self.seconds
            took = f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms"
            return f"{took} {'blocked' if self.kind == 'host_sync' else 'compiling'}"
        if self.bytes_per_call:
            per, total = fmt_bytes(self.bytes_per_call), fmt_bytes(self.bytes_per_call * self.count)
            return f"{per}/call, {total} {'copied' if self.kind == 'host_transfer' else 'in all'}"
        return ""

    @property
    def contract(self) -> str:
        """The contract it breaks, a key of ``_errors.CONTRACTS`` (host data: ``transfer``)."""
        return contract_of_finding(self.kind)

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in dataclasses.asdict(self).items() if v is not None},
            "contract": self.contract,
        }


def _unwrapped(fun: Any) -> Any:
    """The function a ``functools.partial`` or a bound method calls."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    return getattr(fun, "__func__", fun)


def _name_of(fun: Any) -> str:
    """The name of the function a partial or bound method calls (never a repr: an address)."""
    fun = _unwrapped(fun)
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None)
    return str(name) if name else type(fun).__qualname__


@dataclasses.dataclass
class _HostLine:
    """The host data one user line gives a function: a claim needs that line
    to run again (a call made once after the loop claims nothing)."""

    at: Any  # (file, line), None where no user frame was found
    first_run: tuple[Any, ...]  # (line, run) of its first call: not looked at
    before: dict[int, Any] = dataclasses.field(default_factory=dict)  # leaf -> its last _marker
    # host leaf positions -> their host_transfer findings, and param -> the leaves of a
    # "the same value at each call" claim
    findings: dict[tuple[int, ...], tuple[list[Finding], dict[str, list[int]]]] = dataclasses.field(
        default_factory=dict)
    varied: set[str] = dataclasses.field(default_factory=set)  # taken for constants, then changed
    claimed: set[str] = dataclasses.field(default_factory=set)  # claimed "the same value"
    # param -> the calls a withdrawn claim had counted (counted by its next finding)
    carried: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Function:
    """What a watch knows of one jitted function."""

    name: str
    site: tuple[str, int]  # where jax.jit made it
    options: jitwatch.JitOptions
    calls: int = 0  # the calls that ran (one that raised held and copied nothing)
    last_call: int = -1  # Watch.calls at its last call that ran
    signatures: list[sigs.Signature] = dataclasses.field(default_factory=list)
    window: int = 0  # calls left in which the followed arrays' sharers are looked for
    groups: tuple[tuple[int, ...], ...] = ()  # the candidates by parameter
    candidates: tuple[int, ...] = ()  # dynamic leaf indices an output could reuse
    # (the parameter's candidates, their signatures.Dropped, their ids)
    pending: list[tuple[tuple[int, ...], Any, tuple[int, ...]]] = dataclasses.field(
        default_factory=list)
    follow_site: tuple[str, int] = ("<unknown>", 0)  # the user's line of the last followed call
    site_visit: int = 0  # which run of its jax.jit line made it (Watch._visit)
    run: tuple[Any, ...] = ()  # (line, run) of the user's statement making this call
    follow_run: tuple[Any, ...] = ()  # that of the last followed call
    equinox: bool = False  # made by eqx.filter_jit
    jit: str = "jax.jit"  # the transform the user wrote: nnx.jit's functions reach jax.jit wrapped
    written: str = ""  # what the user gave it where that is not the function's name (a partial)
    decorator: str = ""  # the decorator line that jitted it (@jax.jit), where one did
    library: bool = False  # defined in an installed package: its arguments are the package's to fix
    user_params: dict[int, str] = dataclasses.field(default_factory=dict)  # eqx: leaf -> name
    # eqx.filter_jit's donate="all" donates every array argument: the leaves no output
    # reuses, followed too; their names; whether a call's statement kept one of them
    rest: tuple[int, ...] = ()
    rest_pending: Any = None
    rest_params: set[str] = dataclasses.field(default_factory=set)
    rest_kept: bool = False
    # param -> weak references to arrays that held its followed buffers (None: not told)
    sharers: dict[str, list[Any] | None] = dataclasses.field(default_factory=dict)
    host_lines: dict[Any, _HostLine] = dataclasses.field(default_factory=dict)
    donated_leaves: tuple[int, ...] = ()  # the first dynamic leaf of each donated parameter
    # numpy arrays given at earlier calls (a dataset re-fed each epoch): _numpy_key -> (weak
    # reference, values)
    numpy_seen: dict[Any, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    numpy_kept: int = 0  # bytes of the copies numpy_seen holds
    numpy_limit: int = 64  # numpy_seen's size at which its dead entries go (_steps.prune_dead)
    user_statics: dict[str, Any] = dataclasses.field(default_factory=dict)  # eqx: _user_statics


class Watch:
    """An open ``jc.watch()``: its findings so far, and its report."""

    def __init__(self, reads: Any = None, loops: bool = True) -> None:
        self._make_reads = reads  # makes the recording loop whose reads give host_sync
        self._loops = loops  # a missed donation is also the user's jc.hot_loop's violation
        self._reads: Any = None
        # line -> per read: (self.calls, its run, (id, calls) of the function called last)
        self.read_stamps: dict[str, list[tuple[int, int, tuple[int, int] | None]]] = {}
        self.read_seconds: dict[str, float] = {}  # line -> seconds its reads blocked, in all
        # the calls' output arrays: id -> a weak reference (an id may be reused), and id ->
        # self.calls at their call (no object per array: the collector's work grows with them)
        self._made: dict[int, Any] = {}
        self._made_at: dict[int, int] = {}
        self._made_limit = MADE_KEPT
        self._last_ref: Any = None  # a weak reference to an output of the call self._last_call
        self._last_call = -1
        self._last_fn: _Function | None = None  # the function of that call
        self._waited = -1  # the call count when a read last waited for the device
        self._read_text: dict[str, tuple[str, str, str]] = {}  # line -> (what, fix, function)
        self._lock = threading.Lock()
        self._functions: list[_Function] = []
        self._findings: dict[tuple[Any, ...], Finding] = {}
        # id(array) -> the function and the record following it (its weak reference tells
        # a reused id apart)
        self._given_elsewhere: dict[int, tuple[_Function, sigs.Dropped, int]] = {}
        # per jax.jit line: the signatures its functions compiled, the runs of the line that
        # compiled one of them again (a new function), the seconds those took
        self._sites: dict[tuple[str, int], tuple[list[sigs.Signature], set[int], float]] = {}
        self._visits: dict[tuple[str, int], int] = {}  # line -> its runs so far (_visit)
        self._last_at: tuple[str, int] | None = None  # the line of the last event
        self._calling = threading.local()  # .depth: inside a watched call on this thread
        # .n: the compiles JAX lowered on this thread: a call whose C++ cache grew without
        # one took an executable JAX had (not a recompile)
        self._lowered = threading.local()
        self._counting = capability("compile-events").available
        # (jax.jit line, parameter) the user kept arrays of, at a call of any function made there
        self._kept_params: set[tuple[tuple[str, int], str]] = set()
        self._missed_from: dict[tuple[Any, ...], tuple[_Function, int]] = {}  # -> its first call
        self._closed: tuple[str, int] | None = None  # a line whose run a direct call ended
        self.calls = 0
        self.blind: list[str] = []  # findings this watch cannot make here, and why
        self.once: list[str] = []  # reads between calls whose line ran once
        self.active = False

    # -- the wrapper ---------------------------------------------------------

    def wrap(self, jitted: Any, fun: Any) -> Any:
        """``jitted`` wrapped for this watch (what the replaced ``jax.jit`` returns)."""
        if not callable(getattr(jitted, "_cache_size", None)):
            return jitted
        site = _user_line(("<unknown>", 0))
        state = _Function(_name_of(fun), site, jitwatch.options_of(jitted))
        frame = user_frame()
        state.site_visit = self._visit(_key(frame), False, False) if frame is not None else 0
        # eqx.filter_jit jits its own wrapper, whose parameters group the arguments
        module = str(getattr(fun, "__module__", "") or "")
        state.equinox = module.startswith("equinox")
        # what the user wrote: nnx.jit hands jax.jit a JitFn (its __module__ is the user's)
        state.jit = "nnx.jit" if type(fun).__module__.startswith("flax.nnx") else "jax.jit"
        state.decorator = sigs.decorator_at(*site)
        if isinstance(fun, functools.partial):  # its fix keeps the partial the user wrote
            state.written = f"partial({sigs.short(state.name)}, ...)"
        elif isinstance(fun, types.MethodType):  # `jax.jit(es.ask)`: as written at that line
            state.written = _method_written(site, sigs.short(state.name))
        # a library's own jitted helper (optax's), not a transform of the user's function
        # (jax.grad(f)), nor a library's function the user jits (jax.jit(env.step))
        code = getattr(inspect.unwrap(_unwrapped(fun)), "__code__", None)
        state.library = (code is not None and is_library(code.co_filename) and not state.equinox
                         and state.jit == "jax.jit" and _jitted_by_library(frames.caller_frame(1)))
        with self._lock:
            self._functions.append(state)
        return _Watched(jitted, fun, state, self)

    def observe(
        self, fn: _Function, jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """One call, looked at before and after; the watch's own failure never fails it."""
        self.calls += 1
        try:
            opts = fn.options
            dyn_args = (
                tuple(a for i, a in enumerate(args) if i not in opts.static_argnums)
                if opts.static_argnums else args
            )
            dyn_kwargs = (
                {k: v for k, v in kwargs.items() if k not in opts.static_argnames}
                if kwargs else kwargs
            )
            leaves = jax.tree_util.tree_leaves((dyn_args, dyn_kwargs))
            caller = frames.caller_frame(2)  # the frame that called the function
            frame = user_frame(caller)
            if frame is not None:
                at = _key(frame)
                chained = (  # (else moot)
                    at == self._last_at and self._closed != at and self._chained(fn, leaves)
                )
                fn.run = (at, self._visit(at, frame is caller, chained))
            note = self._before(fn, leaves)
            before = jitwatch.cache_size(jitted)
        except ContractError:  # the user's loop refusing a missed donation, before the call
            raise
        except Exception as err:  # noqa: BLE001 - said in the report, the call goes on
            self._trouble(fn, err)
            return jitted(*args, **kwargs)
        t0 = time.perf_counter()
        lowered = getattr(self._lowered, "n", 0)
        calling = self._calling
        calling.depth = getattr(calling, "depth", 0) + 1
        try:
            out = jitted(*args, **kwargs)
        except Exception as err:
            if note and not isinstance(err, ContractError):  # JAX refusing the drifted
                err.add_note(note)  # donation's deleted argument (a loop's error says it)
            raise
        finally:
            calling.depth -= 1
        fn.calls += 1
        try:
            if not _ONLY_ARRAYS >= set(map(type, leaves)):  # host data (after the call: one
                self._host(fn, args, dyn_args, dyn_kwargs, leaves)  # that raised copied nothing)
            self._made_by(out, fn)
            if jitwatch.cache_size(jitted) != before:
                compiled = not self._counting or getattr(self._lowered, "n", 0) != lowered
                self._compiled(
                    fn, args, kwargs, dyn_args, dyn_kwargs, leaves, out,
                    time.perf_counter() - t0, compiled,
                )
            elif not fn.signatures:  # a first call JAX had a program for (a cell run again)
                self._compiled(fn, args, kwargs, dyn_args, dyn_kwargs, leaves, out, 0.0, False)
            if fn.groups:  # at every call: a state kept later withdraws a claim
                self._follow(fn, leaves, first=fn.window > 0)
                fn.window = max(fn.window - 1, 0)
        except Exception as err:  # noqa: BLE001
            self._trouble(fn, err)
        return out

    def _before(self, fn: _Function, leaves: list[Any]) -> str:
        """Before a call: the note for JAX's error where it passes a deleted argument again."""
        given = self._given_elsewhere
        if given:  # a followed array given to another function: not dropped, used
            for x in leaves:
                hit = given.get(id(x))
                if hit is not None and hit[0] is not fn and hit[1].refs[hit[2]]() is x:
                    del given[id(x)]
                    hit[0].pending = [p for p in hit[0].pending if p[1] is not hit[1]]
        if fn.candidates and len(set(map(id, leaves))) != len(leaves):
            self._aliased(fn, leaves)
        note = ""
        n = len(leaves)  # passed again after this function's donation deleted it
        if any(
            j < n and isinstance(leaves[j], jax.Array) and leaves[j].is_deleted()
            for j in fn.donated_leaves
        ):
            drifted = sigs.passed_again(
                leaves, fn.signatures[-1].paths, fn.donated_leaves, sigs.short(fn.name)
            )
            if drifted is not None:
                note = self._passed_again(fn, *drifted)
        if fn.pending:
            self._settle(fn, at_call=True)
        return note

    def _host(
        self, fn: _Function, args: tuple[Any, ...], dyn_args: tuple[Any, ...],
        dyn_kwargs: dict[str, Any], leaves: list[Any],
    ) -> None:
        """The host data of a call that ran, compared with its line's call before (calls
        inside the line's first run, one setup statement, repeat nothing)."""
        where_host = tuple([
            i for i, x in enumerate(leaves)
            if type(x) is not ArrayImpl and not isinstance(x, jax.Array)
        ])
        if where_host:
            marks = {i: _marker(leaves[i]) for i in where_host}  # (each array's values copied once)
            at = fn.run[0] if fn.run else None
            line = fn.host_lines.get(at)
            if line is None:
                line = fn.host_lines[at] = _HostLine(at, fn.run)
            elif fn.run != line.first_run:
                seen = line.findings.get(where_host)
                if seen is not None and not self._still_constant(fn, line, seen[1], marks):
                    del line.findings[where_host]  # a value equal by chance: looked at afresh
                    seen = None
                if seen is None:  # these positions for the first time: name them (paths, the line)
                    found, fresh, constants = self._host_leaves(
                        fn, line, args, dyn_args, dyn_kwargs, leaves, where_host, marks)
                    if not fresh:  # (a fresh batch: looked at again at the next call)
                        line.findings[where_host] = (found, constants)
                else:
                    for found in seen[0]:
                        found.count += 1
            line.before = marks
            _remember_numpy(fn, [(leaves[i], marks[i]) for i in where_host])

    def _trouble(self, fn: _Function, err: Exception) -> None:
        """A call the watch could not look at: said once per function."""
        note = f"{sigs.short(fn.name)}: some calls were not looked at ({type(err).__name__}: {err})"
        if not any(b.startswith(f"{sigs.short(fn.name)}: ") for b in self.blind):
            self.blind.append(note)

    # -- donation ------------------------------------------------------------

    def _follow(self, fn: _Function, leaves: Sequence[Any], first: bool) -> None:
        """This call's undonated candidates followed (a ``signatures.Dropped`` per
        parameter, settled at the next call); ``first``: with their buffers' sharers."""
        fn.follow_site = _user_line(fn.follow_site)
        fn.follow_run = fn.run
        frame = user_frame()
        if frame is None:
            return
        if fn.equinox:
            rest = [leaves[i] for i in fn.rest if i < len(leaves) and type(leaves[i]) is ArrayImpl]
            fn.rest_pending = sigs.Dropped(rest, frame) if rest else None
            if first:  # the user's names of equinox's grouped leaves
                named = _user_names([leaves[i] for i in fn.candidates] + rest)
                fn.user_params = {i: sigs.param_of(n) for i, n in zip(fn.candidates, named) if n}
                fn.rest_params |= {sigs.param_of(n) for n in named[len(fn.candidates):] if n}
        groups = [[leaves[i] for i in group if type(leaves[i]) is ArrayImpl] for group in fn.groups]
        found: dict[int, list[Any]] | None = (
            sigs.sharers([x for arrays in groups for x in arrays]) if first else {}
        )
        given = self._given_elsewhere
        outer = sigs.enclosing(frame.f_back)  # the statements running the caller's function
        for group, arrays in zip(fn.groups, groups):
            if not arrays:
                continue
            held = None if found is None else [
                *(r for x in arrays for r in found.get(id(x), ())), *sigs.put_over(arrays)]
            followed = sigs.Dropped(arrays, frame, held, outer)
            ids = tuple(map(id, arrays))
            fn.pending.append((group, followed, ids))
            for k, xid in enumerate(ids):
                given[xid] = (fn, followed, k)

    def _aliased(self, fn: _Function, leaves: Sequence[Any]) -> None:
        """A candidate array passed twice in one call (``update(w, target_w)`` after
        ``target_w = w``): donating its parameter would fail the call, never claimed."""
        counts = collections.Counter(map(id, leaves))
        paths = fn.signatures[-1].paths
        for i in fn.candidates:
            if i < len(leaves) and counts[id(leaves[i])] > 1:
                self._never_claim(fn, sigs.param_of(paths[i]))

    def _never_claim(self, fn: _Function, param: str) -> None:
        """Donating ``param`` would delete what the user keeps: no claim for it by any
        function made at ``fn``'s ``jax.jit`` line (the line the fix edits), ever."""
        self._kept_params.add((fn.site, param))
        for other in self._functions:
            if other.site == fn.site:
                self._findings.pop(("missed_donation", id(other), param), None)

    def _settle(self, fn: _Function, at_call: bool = False) -> None:
        """At the function's next call (or the watch's end): a followed argument whose
        arrays all died at the call's statement (``state = f(state)``) was dropped.
        Every one must be: donating a parameter donates them all, so one the user
        keeps (``samples.append(state.position)``) would be deleted. Claimed only
        at a call: a function never called again (setup) repeats nothing."""
        dropped: dict[str, list[int]] = {}
        kept: set[str] = set()
        # held by a caller whose statement still runs (flax's epoch's first step): told later
        now = sigs.enclosing(user_frame()) if at_call else ()
        waiting: list[tuple[list[int], sigs.Dropped, tuple[int, ...]]] = []
        untold: collections.Counter[str] = collections.Counter()
        for group, d, xids in fn.pending:
            param = sigs.param_of(fn.signatures[-1].paths[group[0]])
            if at_call and d.undecided(now):
                if untold[param] < UNDECIDED_KEPT:
                    untold[param] += 1
                    waiting.append((group, d, xids))
                    continue
                kept.add(param)  # more than statements nest: a frame's id reused, alive meanwhile
            elif d.dropped:
                dropped[param] = list(group)  # the claim is the parameter's: all its candidates
                # arrays that held its buffers at that call, kept for the claims of later calls
                if d.sharers is None:
                    fn.sharers[param] = None
                elif d.sharers and fn.sharers.get(param, []) is not None:
                    alive = [r for r in fn.sharers.get(param, []) if r() is not None]
                    fn.sharers[param] = [*alive, *d.sharers]
            else:
                kept.add(param)
            for xid in xids:
                hit = self._given_elsewhere.get(xid)
                if hit is not None and hit[1] is d:  # (alive or not: the entry is this record's)
                    del self._given_elsewhere[xid]
        fn.pending = waiting
        if fn.rest_pending is not None and not fn.rest_pending.dropped:
            fn.rest_kept = True  # an array argument no output reuses outlived a call
        fn.rest_pending = None
        sig = fn.signatures[-1]
        for param in kept:  # kept at one call: never claimed
            self._never_claim(fn, param)
        for param, idx in dropped.items():
            nbytes = sum(sig.nbytes(i) for i in idx)
            key = ("missed_donation", id(fn), param)
            if (fn.site, param) in self._kept_params or not (at_call or key in self._findings):
                continue
            if key not in self._findings and fn.run == fn.follow_run:
                continue  # called again within one run of the user's line (a setup statement)
            shared = param in fn.sharers and sigs.still_shared(fn.sharers[param])
            if shared and key in self._findings:  # a copy over its buffers made after the claim
                self._never_claim(fn, param)
                continue
            found = self._findings.get(key)
            if found is not None:
                found.bytes_per_call = max(found.bytes_per_call or 0, nbytes)
                if fn.equinox:
                    found.fix = _equinox_fix(fn, idx)
                if at_call and param not in untold:
                    self._tell_loop(found)
                continue
            if shared:  # an array that held their buffers at a call is alive: donating deletes it
                continue
            self._missed_from[key] = (fn, fn.calls)  # each call after it holds them twice
            names = sorted({fn.user_params[i] for i in idx if i in fn.user_params})
            what = param if not fn.equinox else (
                f"{', '.join(names) if names else 'its arguments'} (eqx.filter_jit passes them as "
                "one group)")
            fix = (_equinox_fix(fn, idx) if fn.equinox else host_fix("library_call") if fn.library
                   else sigs.missed_donation_fix(fn.name, param, fn.jit, fn.written, fn.decorator))
            # a wrong donation of this function: the index drifted, now that the drop is proven
            wrong = [f for k, f in self._findings.items() if k[:2] == ("wrong_donation", id(fn))]
            keep = sigs.donated_params(fn.options) - {f.param for f in wrong}  # donated rightly
            for found in wrong:
                if found.fix == sigs.leave_out(found.param or ""):  # (not an array passed again)
                    found.fix = sigs.drift_fix(
                        fn.written or sigs.short(fn.name), param, fn.jit, keep, fn.decorator
                    )
            drifted = ", ".join(sorted({f.param or "" for f in wrong}))
            self._findings[key] = Finding(  # (equinox's group named by the user's parameters in it)
                "missed_donation", fn.name, *fn.follow_site, count=1,
                param=", ".join(names) if fn.equinox and names else param, bytes_per_call=nbytes,
                message=f"{what}: not donated, yet the statement of each call drops them; their "
                f"{len(idx)} array(s) could hold the outputs of the same shape and dtype; without "
                "donation each call holds them twice"
                + (f"; it donates {drifted} instead: the index likely drifted" if drifted else ""),
                fix=fix,
            )
            if at_call and param not in untold:
                self._tell_loop(self._findings[key])

    def _passed_again(self, fn: _Function, rec: _steps.JitDonation, what: str, fix: str) -> str:
        """A donated argument deleted by this function's own donation, passed again:
        the drifted index, named before JAX refuses the buffer; the note for JAX's error."""
        key = ("wrong_donation", id(fn), rec.param)
        if key not in self._findings:
            self._findings[key] = Finding(
                "wrong_donation", fn.name, *_user_line(fn.site), count=1, param=rec.param,
                message=what, jit_line=rec.jit_line, fix=fix,
            )
        self._violation("wrong_donation", what, fix)
        return f"(jaxcontracts audit) {what}\nFix: {fix}."

    def _tell_loop(self, found: Finding) -> None:
        """A missed donation proven inside the user's own hot loop: its violation."""
        self._violation(
            "missed_donation", f"`{sigs.short(found.function)}`: {found.message}", found.fix
        )

    def _violation(self, kind: str, what: str, fix: str) -> None:
        """A violation of the user's own hot loop running here, before the call (none:
        no loop, the audit's own, or ``loops=False``)."""
        loop = local.loop
        if not self._loops or loop is None or getattr(loop, "audit", False) or local.allow:
            return
        loop.violation(kind, what, fix, user_frame(), before_call=True)

    # -- compiles ------------------------------------------------------------

    def _compiled(
        self, fn: _Function, args: tuple[Any, ...], kwargs: dict[str, Any],
        dyn_args: tuple[Any, ...], dyn_kwargs: dict[str, Any], leaves: Sequence[Any], out: Any,
        seconds: float, compiled: bool = True,
    ) -> None:
        """A call that grew the function's C++ cache: a new signature, and a recompile
        where JAX lowered a program for it (``compiled``: not where the entry took an
        executable JAX had, a Python int become an array of the same weak type)."""
        sig = sigs.signature(fn.options, args, kwargs, dyn_args, dyn_kwargs)
        here = _user_line(fn.site)
        previous = fn.signatures[-1] if fn.signatures else None
        known = sig in fn.signatures
        fn.signatures.append(sig)
        statics = _user_statics() if fn.equinox else {}
        # (the arguments known: a recompile only where JAX's events show it lowered them)
        if previous is not None and compiled and (not known or self._counting):
            diff, fix = (
                sigs.diff(previous, sig) if not known
                else ([sigs.COMPILED_AGAIN], sigs.COMPILED_AGAIN_FIX)
            )
            changed = [(k, fn.user_statics[k], v) for k, v in statics.items()
                       if not known and k in fn.user_statics
                       and _static_changed(fn.user_statics[k], v)]
            if changed:  # eqx.filter_jit's statics, by the user's names (its own static part out)
                rest, rest_fix = sigs.diff(dataclasses.replace(previous, statics=sig.statics), sig)
                rest = [] if rest == [sigs.SAME_LEAVES] else rest
                if any(isinstance(a, _Traced) or isinstance(b, _Traced) for _, a, b in changed):
                    # (a leaf become static, or traced: equinox's grouped structure, explained)
                    rest = [line for line in rest
                            if not line.startswith("the arguments' structure changed")]
                diff = [_static_line(k, a, b) for k, a, b in changed] + rest
                fix = _static_fix(
                    [k for k, _, b in changed if _is_number(b)], rest_fix if rest else ""
                )
            if fn.equinox and not known:
                diff = _by_user_path(diff, sigs.paths(fn.options, args, dyn_args, dyn_kwargs))
            if fn.library:  # (jax-md's safe_mask given a new lambda each call)
                fix = host_fix("library_call")
            key: tuple[Any, ...] = ("recompile", fn.name, here)
            found = self._findings.get(key)
            if found is not None:
                found.count += 1
                found.seconds = (found.seconds or 0) + seconds
            else:
                self._findings[key] = Finding(
                    "recompile", fn.name, *here, count=1, diff=diff, seconds=seconds,
                    message=f"{sigs.short(fn.name)} compiled again, because:",
                    fix=fix,
                )
        elif previous is None and compiled:
            # a new function compiling a signature an earlier one made at this line compiled:
            # work a jax.jit made once would not redo (a sweep's new shapes are not)
            compiled_here, runs, spent = self._sites.get(fn.site, ([], set(), 0.0))
            if sig in compiled_here:
                runs.add(fn.site_visit)
                spent += seconds
            else:
                compiled_here.append(sig)
            self._sites[fn.site] = (compiled_here, runs, spent)
            made = len(runs) + 1  # the first, then the repeats
            if made >= COMPILES_AT_ONE_LINE:  # made by that many runs of the line, not by one
                key = ("compile_in_loop", fn.site)
                found = self._findings.get(key)
                if found is None:
                    self._findings[key] = found = Finding(
                        "compile_in_loop", fn.name, *fn.site, count=made,
                        message=f"jax.jit is called again and again at this line: each new "
                        f"function ({sigs.short(fn.name)}) compiles afresh",
                        fix="make the jax.jit once, outside the loop (at module level, or before "
                        "the loop)",
                    )
                found.count, found.seconds = made, spent
        fn.user_statics = statics
        out_leaves = [x for x in jax.tree_util.tree_leaves(out) if isinstance(x, jax.Array)]
        out_avals = {(tuple(x.shape), str(x.dtype)) for x in out_leaves}
        donated = sigs.donated_params(fn.options)
        site = f"{fn.site[0]}:{fn.site[1]}"
        # donated parameters JAX cannot donate, or whose buffers nothing reuses
        for param, why, wrong_fix in sigs.wrong_donations(
            sig, donated, out_avals, sigs.short(fn.name), offer=False
        ):
            self._findings.setdefault(("wrong_donation", id(fn), param), Finding(
                "wrong_donation", fn.name, *here, count=1, param=param, message=why,
                jit_line=site, fix=wrong_fix,
            ))
        fn.candidates = sigs.reusable(
            fn.options, sig, dyn_args, dyn_kwargs, out, out_leaves, donated
        )
        if len(set(map(id, leaves))) != len(leaves):  # (at the calls after: in _before)
            self._aliased(fn, leaves)
        # a claim of the last signature whose outputs another argument takes now (`avg = 0.0`,
        # then the array it became)
        if previous is not None and not known:
            now = {sigs.param_of(sig.paths[i]) for i in fn.candidates}
            for key in [
                k for k in self._findings
                if k[:2] == ("missed_donation", id(fn)) and k[2] not in now
            ]:
                del self._findings[key]
        # the donated arrays, named once deleted: passed again, the index drifted
        fn.donated_leaves = tuple(idx[0] for p, idx in sigs.by_param(sig).items() if p in donated)
        for arrays, rec in sigs.donations(
            fn.options, sig, leaves, donated, fn.candidates, fn.name, site
        ):
            _steps.keep(arrays, rec)
        fn.window = DONATION_WINDOW if fn.candidates else 0
        fn.groups = tuple(tuple(idx) for idx in sigs.by_param(sig, fn.candidates).values())
        if fn.equinox:
            fn.rest = tuple(i for i in range(len(leaves)) if i not in set(fn.candidates))

    # -- host data -----------------------------------------------------------

    def _still_constant(
        self, fn: _Function, line: _HostLine, constants: dict[str, list[int]],
        marks: dict[int, Any],
    ) -> bool:
        """Whether every value claimed "the same at each call" is the last call's
        again; a claim whose value changed (sparse rewards zero for a while) is withdrawn."""
        changed = False
        for param, where_ in constants.items():
            if not all(_same(line.before.get(i), marks[i]) for i in where_):
                self._withdraw_constant(fn, line, param)
                changed = True
        return not changed

    def _withdraw_constant(self, fn: _Function, line: _HostLine, param: str) -> None:
        """A "the same at each call" claim withdrawn, never made again for ``param``."""
        found = self._findings.pop(("host_transfer", id(fn), param, line.at), None)
        if found is not None:  # its calls each copied the value: counted by the next finding
            line.carried[param] = line.carried.get(param, 0) + found.count
        line.claimed.discard(param)
        line.varied.add(param)

    @staticmethod
    def _host_kind(fn: _Function, line: _HostLine, x: Any, i: int, mark: Any) -> str:
        """What the host value ``x`` at leaf ``i`` (its :func:`_marker` ``mark``) is."""
        if _same(line.before.get(i), mark):
            return "constant"  # the last call's value again: one copy before the loop does
        if not isinstance(x, np.ndarray):
            return "number"  # a number that changes: a copy, and a new value to trace in
        if _unchanged(fn.numpy_seen, x, mark):  # given at an earlier call: a dataset re-fed
            return "refed"
        return "fresh"  # a new batch: the call's own copy is the cheapest, nothing to fix

    def _host_leaves(
        self, fn: _Function, line: _HostLine, args: tuple[Any, ...], dyn_args: tuple[Any, ...],
        dyn_kwargs: dict[str, Any], given: list[Any], where_host: tuple[int, ...],
        marks: dict[int, Any],
    ) -> tuple[list[Finding], bool, dict[str, list[int]]]:
        """Numpy arrays and Python numbers given after the first call, counted: the
        findings they count for, whether a parameter held a fresh numpy batch (its
        own copy is the cheapest: nothing to fix), and the leaves of each "the same
        value at each call" claim."""
        kinds = {}
        for i in where_host:
            x = given[i]
            if isinstance(x, _HOST_TYPES):  # (a JAX ref is not host data)
                kinds[i] = self._host_kind(fn, line, x, i, marks[i])
        # a loader's batch: nothing to name (unless a claim is withdrawn: changed in place)
        if not line.claimed and all(what == "fresh" for what in kinds.values()):
            return [], bool(kinds), {}
        touched = []
        leaves = []  # (path, value, bytes, what it is, position)
        for i, (path, x) in enumerate(sigs.paths(fn.options, args, dyn_args, dyn_kwargs)):
            if i in kinds:
                leaves.append((path, x, spec_nbytes(leaf_spec(x)), kinds[i], i))
        if fn.equinox:  # equinox's grouped parameters: the user's names, where found
            named = _user_names([x for _, x, _, _, _ in leaves])
            paths = [n or "an argument" for n in named]
        else:
            paths = [path for path, _, _, _, _ in leaves]
        # param -> [paths to fix, first value, bytes, what, their kinds]
        host: dict[str, list[Any]] = {}
        constants: dict[str, list[int]] = {}
        for path, (_, x, nbytes, what, i) in zip(paths, leaves):
            param = sigs.param_of(path) if path != "an argument" else path
            if what == "constant" and param in line.varied:  # changed before: not a constant
                what = "fresh" if isinstance(x, np.ndarray) else "number"
            if what == "constant":
                constants.setdefault(param, []).append(i)
            entry = host.get(param)  # its first leaf to fix names it
            if entry is None or (entry[3] == "fresh" and what != "fresh"):
                host[param] = [[path], x, 0 if what == "fresh" else nbytes, what, [value_kind(x)]]
            elif what != "fresh":
                entry[0].append(path)
                entry[2] += nbytes
                entry[4].append(value_kind(x))
        fresh = False
        for param, (fixed, x, nbytes, what, kinds_of) in host.items():
            key = ("host_transfer", id(fn), param, line.at)
            if what != "constant" and param in line.claimed:  # (a call with a fresh batch too)
                self._withdraw_constant(fn, line, param)  # (an array changed in place: now "fresh")
            if what == "fresh":  # every leaf of it a new batch
                fresh = True
                continue
            found = self._findings.get(key)
            if found is not None:
                found.count += 1
                touched.append(found)
                continue
            kind = value_kind(x)
            path = f" ({fmt_listed(fixed)})" if fixed != [param] else ""
            if what == "constant":  # (gymnax's EnvParams: ints and floats; evosax's Params: floats)
                if fixed == [param]:
                    same = f"is the same {kind}"
                else:
                    value = sigs.by_name(fn.options, dyn_args, dyn_kwargs).get(param)
                    same = f"{_holding(value, kinds_of)}, the same"
                message = (f"{param} of {sigs.short(fn.name)} {same} at each call{path}: copied to "
                           "the device again every time")
                # static only for one hashable leaf whose results it keeps (not a float)
                static = not fn.equinox and fixed == [param] and static_is_exact(x)
                fix = (
                    host_fix("constant", "static", param=param) if static
                    else host_fix("constant")
                )
                line.claimed.add(param)
            elif what == "refed":
                message = (f"{param} of {sigs.short(fn.name)} is a {kind} given at an earlier "
                           f"call again{path}: copied to the device at every call it is given")
                fix = host_fix("refed")
            else:
                message = (f"{param} of {sigs.short(fn.name)} is a {kind} whose value changed "
                           f"between calls{path}: a host-to-device copy at every call")
                fix = host_fix("number")
            if fn.library:
                fix = host_fix("library")
            self._findings[key] = Finding(  # (with the calls a withdrawn claim of it counted)
                "host_transfer", fn.name, *_user_line(fn.site),
                count=1 + line.carried.pop(param, 0), param=param, bytes_per_call=nbytes,
                message=message, fix=fix,
            )
            touched.append(self._findings[key])
        return touched, fresh, constants

    def _host_syncs(self) -> None:
        """A line whose reads were followed by more jitted calls, at least twice: a sync
        inside a repeated section (a read after the last call is not)."""
        for at, stamps in self.read_stamps.items():
            followed = len({run for n, run, _ in stamps if n < self.calls})  # runs of the line
            what, fix, function = self._read_text[at]
            every, step = _steps_per_run(stamps)
            name = next((sigs.short(f.name) for f in self._functions if id(f) == step), "its step")
            fix = fix.replace(HOST_FIXES["read"], read_fix(every, name))
            if followed == 1:  # a setup read, or a loop the script left at its first pass
                self.once.append(f"{at}: {what}; fix: {fix}")
            if followed < 2:
                continue
            file, _, line = at.rpartition(":")
            self._findings[("host_sync", at)] = Finding(
                "host_sync", function, file, int(line) if line.isdigit() else 0, count=followed,
                seconds=self.read_seconds.get(at),
                message=f"{what}: the host waits for the device here, and the next call cannot be "
                "queued before it " + (
                    f"(the device's queue runs empty once every {every} calls of {name})"
                    if every > 1 else "(the loop runs at the device's pace, one step at a time)"
                ),
                fix=fix,
            )

    # -- the report ----------------------------------------------------------

    def findings(self) -> list[Finding]:
        """The findings so far: wrong donations first (a mistake, not a cost), then
        by what each cost the run (:attr:`Finding.cost`)."""
        for key, (fn, first) in self._missed_from.items():  # every call since the first proven
            missed = self._findings.get(key)
            if missed is not None:
                missed.count = max(missed.count, fn.calls - first)
        # one row per line and fix: a jax.jit made again each epoch is one function to the user
        rows: dict[tuple[Any, ...], Finding] = {}
        for f in self._findings.values():
            key = (f.kind, f.function, f.file, f.line, f.param, f.fix)
            row = rows.get(key)
            if row is None:
                rows[key] = dataclasses.replace(f)
            else:
                row.count += f.count
                row.bytes_per_call = max(row.bytes_per_call or 0, f.bytes_per_call or 0) or None
                if f.seconds is not None:
                    row.seconds = (row.seconds or 0.0) + f.seconds
        # a missed donation repeats: one seen at a single call is setup's
        found = [f for f in rows.values() if f.kind != "missed_donation" or f.count > 1]
        return sorted(found, key=lambda f: (f.kind != "wrong_donation", -f.cost, f.file, f.line))

    @property
    def function_count(self) -> int:
        """How many functions ``jax.jit`` made while the watch was open (called or not)."""
        return len(self._functions)

    def report(self) -> WatchReport:
        return WatchReport(
            self.findings(), self.calls, self.function_count, list(self.blind),
            once=list(self.once),
        )

    def __enter__(self) -> Watch:
        global _ACTIVE
        with _INSTALL_LOCK:
            if _ACTIVE is not None:
                raise RuntimeError("a jc.watch() is already open: one at a time")
            _ACTIVE = self
            if self._counting:
                events.listen(self._on_event)
            if jitwatch.available():
                jitwatch.install(self.wrap, sigs.note_device_put)
            else:  # said in the report: which findings cannot be made here
                self.blind = [
                    "recompile, missed_donation, wrong_donation, host_transfer and "
                    "compile_in_loop: jax.jit cannot be observed on this JAX (capability "
                    "jit-observation missing; see `python -m jaxcontracts info`)"
                ]
        self.active = True
        if self._make_reads is not None:
            self._reads = self._make_reads(self)
            try:
                self._reads.__enter__()
            except BaseException:  # Ctrl-C during the loop's entry: jax.jit restored, no watch open
                self._reads = None
                self.__exit__(None, None, None)
                raise
        return self

    def _on_event(self, event: str, value: float, **kwargs: Any) -> None:
        if event == events.LOWERING_EVENT:
            self._lowered.n = getattr(self._lowered, "n", 0) + 1

    def _chained(self, fn: _Function, leaves: Sequence[Any]) -> bool:
        """Whether a call of ``fn`` is given an output of its call before."""
        made, at, last = self._made, self._made_at, fn.last_call
        return any(at.get(id(x)) == last and made[id(x)]() is x for x in leaves)

    def _made_by(self, out: Any, fn: _Function) -> None:
        """Remember which call made each output array (the dead dropped as the table
        doubles: no callback runs at an array's death)."""
        made, at, n, ref = self._made, self._made_at, self.calls, None
        for x in jax.tree_util.tree_leaves(out):
            if type(x) is ArrayImpl:
                made[id(x)] = ref = weakref.ref(x)
                at[id(x)] = n
        fn.last_call = self._last_call = n
        self._last_fn = fn
        self._last_ref = ref
        if len(made) > self._made_limit:
            for i in [i for i, r in made.items() if r() is None]:
                del made[i], at[i]
            self._made_limit = max(MADE_KEPT, 2 * len(made))

    def stalls(self, x: Any, name: str) -> bool:
        """Whether a device-to-host read of ``x`` stalls the loop (the host waits with
        nothing queued after it): an output of the last call, or an array made after
        it, once per call (a second read finds the device done). An earlier call's
        output, or an eager result made before the last call, waits while the device
        runs the calls queued since; an asynchronous copy waits for nothing."""
        if name == "copy_to_host_async" or self._earlier_output(x):
            return False
        if self._waited == self.calls or self._made_before_last([x]):
            return False
        self._waited = self.calls
        return True

    def _made_before_last(self, xs: Sequence[Any]) -> bool:
        """Whether every one of ``xs`` (eager results) was made before the last call's
        outputs, by the order of the live arrays (``_compat.liveorder``). An output
        of a watched call is judged by its call alone."""
        made, at, n = self._made, self._made_at, self.calls
        if any(id(x) in at and made[id(x)]() is x for x in xs):
            return False
        last = self._last_ref() if self._last_ref is not None and self._last_call == n else None
        if last is None:  # (that output dropped: another of the call's, where one lives)
            last = next(
                (y for i, m in list(at.items()) if m == n and (y := made[i]()) is not None), None
            )
        return (
            last is not None
            and len(liveorder.made_before(xs, [last])) == len({id(x) for x in xs})
        )

    def _earlier_output(self, x: Any) -> bool:
        """Whether ``x`` is an output of a watched call before the last."""
        n = self._made_at.get(id(x))
        return n is not None and n != self.calls and self._made[id(x)]() is x

    def _visit(self, at: tuple[str, int], direct: bool, chained: bool) -> int:
        """Which run of the user's line ``at`` an event there (a call, a read, a jax.jit)
        belongs to. A new run begins where the event before was at another line, where
        a call made directly from this line ended the run before (``x = step(x)``), or
        at a call given an output of the function's call before (``chained``, through
        equinox's or flax's wrapper). A library's calls inside one statement are one
        run: repeated work is claimed only of a line that runs again and again."""
        if at != self._last_at or self._closed == at or chained:
            self._visits[at] = self._visits.get(at, 0) + 1
        self._last_at, self._closed = at, (at if direct else None)
        return self._visits[at]

    def read(self, where: str, what: str, fix: str, function: str, frame: Any) -> bool:
        """A device-to-host read at ``where`` (file:line) in the user's ``function``;
        False: not counted (inside a watched call: it traces and compiles once)."""
        if getattr(self._calling, "depth", 0):
            return False
        run = self._visit(_key(frame), False, False) if frame is not None else 0
        last = self._last_fn
        self.read_stamps.setdefault(where, []).append(
            (self.calls, run, None if last is None else (id(last), last.calls))
        )
        self._read_text[where] = (what, fix, function)
        return True

    def waited(self, line: str, seconds: float, value: Any, function: str, frame: Any) -> None:
        """A ``block_until_ready`` at ``line`` that took ``seconds``: a sync where it
        stalled the loop, as :meth:`stalls` tells of a read."""
        later = [
            x for x in jax.tree_util.tree_leaves(value)
            if isinstance(x, jax.Array) and not self._earlier_output(x)
        ]
        if not later or self._waited == self.calls or self._made_before_last(later):
            return
        if not self.read(line, "block_until_ready", WAIT_FIX, function, frame):
            return
        self._waited = self.calls
        self.read_seconds[line] = self.read_seconds.get(line, 0.0) + seconds

    def __exit__(self, *exc: Any) -> None:
        global _ACTIVE
        if self._reads is not None:
            self._reads.__exit__(*exc)
            self._host_syncs()
        with _INSTALL_LOCK:
            jitwatch.uninstall()
            if self._counting:
                events.unlisten(self._on_event)
            _ACTIVE = None
        self.active = False
        for fn in self._functions:  # what was still followed at the end: dropped?
            if fn.pending:
                self._settle(fn)


def _holding(value: Any, kinds: Sequence[str]) -> str:
    """``is a Params (a dataclass) holding 3 Python floats``; ``holds ...`` where the
    argument is not known (an equinox group)."""
    counts = collections.Counter(kinds)
    held = " and ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in counts.items())
    if value is None:
        return f"holds {held}"
    name = type(value).__name__
    what = f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
    if dataclasses.is_dataclass(value):
        what += " (a dataclass)"
    return f"is {what} holding {held}"


def _steps_per_run(stamps: Sequence[tuple[int, int, tuple[int, int] | None]]) -> tuple[int, int]:
    """How far apart a line's reads are: the median, between two runs of the line, of
    the calls of the function called last before each (the loop's step), and that
    function's id; (1, 0) where none was measured."""
    firsts = {}
    for _, run, last in stamps:
        firsts.setdefault(run, last)
    marks = list(firsts.values())
    gaps = sorted((b[1] - a[1], a[0]) for a, b in zip(marks, marks[1:]) if a and b and a[0] == b[0])
    return gaps[len(gaps) // 2] if gaps else (1, 0)


def _jitted_by_library(frame: Any) -> bool:
    """Whether the code that called ``jax.jit`` (the first frame above ``frame``
    outside JAX, this package, numpy and the standard library) is an installed
    package's: what it jits and gives is then the package's to change."""
    f = frame
    while f is not None and is_library(f.f_code.co_filename, False, f.f_code.co_name):
        f = f.f_back
    if f is None or not is_library(f.f_code.co_filename):
        return False
    # a package's code below the user's own: where every frame is installed code (a
    # program run from site-packages, `python -m` of an installed project), it is the user's
    while f is not None and is_library(f.f_code.co_filename, True, f.f_code.co_name):
        f = f.f_back
    return f is not None


def _method_written(site: tuple[str, int], name: str) -> str:
    """``es.ask`` in ``ask = jax.jit(es.ask)``: how the line at ``site`` names the
    bound method ``name`` ("" where it does not show it)."""
    found = re.search(rf"jit\(\s*([A-Za-z_][\w.]*\.{re.escape(name)})\b", linecache.getline(*site))
    return found.group(1) if found else ""


def _equinox_fix(fn: _Function, idx: Sequence[int]) -> str:
    """The fix of an eqx.filter_jit missed donation (leaves ``idx``): ``donate="all"``
    where every array argument died at each call's statement; else (one outlived a
    call) a hot step donating the user's parameters alone, as equinox cannot."""
    names = sorted({fn.user_params[i] for i in idx if i in fn.user_params})
    short = sigs.short(fn.name)
    state = (
        "..." if not names
        else f'"{names[0]}"' if len(names) == 1
        else f"({', '.join(map(repr, names))})"
    )
    hot_step = f'@jc.hot_step(state={state}, donate="all")'.replace("'", '"')
    if not fn.rest_kept:
        return f'@eqx.filter_jit(donate="all") on {short}; or {hot_step}'
    kept = sorted(fn.rest_params - set(names))
    return (f"{hot_step} on {short}, which donates {', '.join(names) or 'them'} alone; "
            f"eqx.filter_jit(donate=\"all\") would also delete "
            f"{', '.join(kept) or 'the other array arguments'}, which outlive the call")


def _equinox_leaves() -> list[tuple[str, Any]]:
    """(the user's path, leaf) of each leaf of the arguments of the eqx.filter_jit call
    running above (``model.layers[0].weight``, ``x``)."""
    out = []
    for name, value in (jitwatch.equinox_arguments(frames.caller_frame(1)) or {}).items():
        try:
            flat = jax.tree_util.tree_flatten_with_path(value)[0]
        except Exception:  # noqa: BLE001, S112 - an argument that does not flatten: unnamed
            continue
        out += [(name + jax.tree_util.keystr(p), leaf) for p, leaf in flat]
    return out


def _user_names(leaves: Sequence[Any]) -> list[str]:
    """Per leaf, its user's path (:func:`_equinox_leaves`), by identity; "" where not found."""
    where_: dict[int, str] = {}
    for path, leaf in _equinox_leaves():
        where_.setdefault(id(leaf), path)
    return [where_.get(id(x), "") for x in leaves]


def _by_user_path(diff: list[str], found: list[tuple[str, Any]]) -> list[str]:
    """A recompile's diff lines under eqx.filter_jit, led by the user's path of the
    leaf (``model.weight``) where equinox's grouped one led it."""
    names = _user_names([x for _, x in found])
    ours = sorted(((p, n) for (p, _), n in zip(found, names) if n), key=lambda pn: -len(pn[0]))
    out = []
    for line in diff:
        p, n = next(((p, n) for p, n in ours if line.startswith(p + ":")), ("", ""))
        out.append(n + line[len(p):] if p else line)
    return out


#: The fix of a block_until_ready in a loop (a host_sync).
WAIT_FIX = (
    "take it out of the loop: JAX dispatches asynchronously, and while the host waits nothing is "
    "queued after it; wait once after the loop, or only where you time the loop"
)
_ONLY_ARRAYS = frozenset({ArrayImpl})  # a call given these alone gives no host data
_HOST_TYPES = (np.ndarray, np.generic, bool, int, float, complex)  # host data: leaf_spec's kinds


# A numpy array is the same value again only where its values were compared (a loader
# may refill one buffer in place): a copy is kept of each array up to _COMPARED_BYTES,
# and of at most _KEPT_BYTES per function; a larger one is taken for a new batch (a
# miss, never a false claim).
_COMPARED_BYTES = 1 << 20
_KEPT_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class _Traced:
    """An array among the user's arguments of an eqx.filter_jit call (traced), by its aval."""

    aval: str


def _user_statics() -> dict[str, Any]:
    """The eqx.filter_jit call's leaves by the user's path: a Python number, bool or
    string as itself (equinox makes them static), an array as its :class:`_Traced`."""
    out: dict[str, Any] = {}
    for path, leaf in _equinox_leaves():
        if isinstance(leaf, (bool, int, float, complex, str)):
            out[path] = leaf
        elif isinstance(leaf, jax.Array):
            out[path] = _Traced(fmt_aval(leaf.shape, leaf.dtype, leaf.weak_type))
    return out


def _static_changed(a: Any, b: Any) -> bool:
    """Whether a static value changed, or became traced (two arrays: the leaf diff's)."""
    if isinstance(a, _Traced) and isinstance(b, _Traced):
        return False
    return type(a) is not type(b) or a != b


def _static_line(path: str, a: Any, b: Any) -> str:
    """The diff line of a leaf whose static value changed under eqx.filter_jit."""
    was, now = (f"{v.aval} (an array)" if isinstance(v, _Traced) else repr(v) for v in (a, b))
    tail = (f"a Python {type(b).__name__}: static under eqx.filter_jit"
            if not isinstance(b, _Traced) else "traced under eqx.filter_jit")
    return f"{path}: {was} -> {now} ({tail})"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, complex)) and not isinstance(value, bool)


def _static_fix(numbers: list[str], rest: str) -> str:
    """The fix of a recompile over eqx.filter_jit's static values: numbers go in
    as arrays; a bool or a string compiles one program per value (kept)."""
    first = (
        f"pass {', '.join(numbers)} as {'arrays' if len(numbers) > 1 else 'an array'} "
        "(jnp.asarray(...)): eqx.filter_jit traces arrays and compiles anew for each new "
        "Python number" if numbers
        else "a bool or a string under eqx.filter_jit compiles one program per value: "
        "expected where it takes few values; keep it fixed where it changes often"
    )
    return f"{first}; {rest}" if rest else first


def _marker(x: Any) -> Any:
    """What tells a host value passed again from a new one (None: nothing): a number
    itself; a numpy array's dtype, shape and bytes (as the device gets it, a NaN included)."""
    if isinstance(x, np.ndarray):
        return (x.dtype, x.shape, x.tobytes()) if x.nbytes <= _COMPARED_BYTES else None
    return x if isinstance(x, (int, float, complex, np.generic)) else None


def _same(marker: Any, other: Any) -> bool:
    """Whether two :func:`_marker` values tell the same value."""
    try:
        return marker is not None and type(marker) is type(other) and bool(marker == other)
    except Exception:  # noqa: BLE001 - an odd ==: not the same
        return False


def _numpy_key(x: np.ndarray) -> tuple[Any, np.ndarray]:
    """Where a numpy array's values live (for a view, ``X[i:i + 128]``, a new object at
    each epoch: the array it views and its place), and the object to follow weakly."""
    base = x
    while isinstance(base.base, np.ndarray):
        base = base.base
    if base is x:
        return id(x), x
    offset = x.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return (id(base), offset, x.shape, x.strides, x.dtype.str), base


def _unchanged(seen: dict[Any, tuple[Any, Any]], x: np.ndarray, mark: Any) -> bool:
    """Whether ``x`` (or the same place of the array it views) was given at an earlier
    call, with the same values."""
    key, anchor = _numpy_key(x)
    entry = seen.get(key)
    return entry is not None and entry[0]() is anchor and mark is not None and entry[1] == mark


def _remember_numpy(fn: _Function, values: Sequence[tuple[Any, Any]]) -> None:
    """Note the numpy arrays among ``values`` (with their :func:`_marker`) as given,
    weakly, with a copy of their values while the copies fit in ``_KEPT_BYTES``."""
    seen = fn.numpy_seen
    for x, mark in values:
        if not isinstance(x, np.ndarray):
            continue
        key, anchor = _numpy_key(x)
        entry = seen.get(key)
        if entry is not None and entry[0]() is anchor:
            continue
        if entry is not None and entry[1] is not None:  # a dead array's, its id reused
            fn.numpy_kept -= len(entry[1][2])
        keep = mark is not None and fn.numpy_kept + x.nbytes <= _KEPT_BYTES
        seen[key] = (weakref.ref(anchor), mark if keep else None)
        fn.numpy_kept += x.nbytes if keep else 0
        size = len(seen)
        fn.numpy_limit = _steps.prune_dead(seen, fn.numpy_limit)
        if len(seen) != size:  # the dead dropped: count the copies still held
            fn.numpy_kept = sum(len(values[2]) for _, values in seen.values() if values is not None)


def _key(frame: Any) -> tuple[str, int]:
    return (frame.f_code.co_filename, frame.f_lineno)


def _user_line(default: tuple[str, int]) -> tuple[str, int]:
    """(file, line) of the user's code calling now (``default`` where none is found)."""
    frame = user_frame()
    return (where(frame)[0].rsplit(":", 1)[0], frame.f_lineno) if frame is not None else default


_ACTIVE: Watch | None = None
_INSTALL_LOCK = threading.Lock()


class _Watched:
    """A jitted function made while a watch is open: every attribute is the
    jitted function's; a call outside traces goes through :meth:`Watch.observe`."""

    def __init__(self, jitted: Any, fun: Any, state: _Function, owner: Watch) -> None:
        functools.update_wrapper(self, fun)  # type: ignore[arg-type]
        # (after it: the __dict__ it copies is a watched function's own where fun is one, bound)
        self._jitted, self._state, self._owner = jitted, state, owner
        # (jax.jit's own: "" for a function without one)
        self.__doc__ = getattr(jitted, "__doc__", None)
        self._trace = top_level_refs()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tref, ev, aref, top = self._trace
        if not self._owner.active or tref.value is not ev or aref.value is not top:
            return self._jitted(*args, **kwargs)
        try:
            return self._owner.observe(self._state, self._jitted, args, kwargs)
        except BaseException as err:  # the user's error, or JAX's, as without the watch
            trim_ours(err)
            raise

    # jax.stages.Wrapped's members, defined on the class: isinstance() of a runtime
    # protocol looks them up statically from 3.12 on (jax.export.export asks it)
    def trace(self, *args: Any, **kwargs: Any) -> Any:
        return self._jitted.trace(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self._jitted.lower(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)  # (bound as jax.jit binds)

    def __repr__(self) -> str:  # the script prints what it prints without the audit
        return repr(self._jitted)

    # A copy is a copy of the jitted function, watched as this one is (never the
    # watch itself: `copy.deepcopy(model)` of an object holding a step); a pickle
    # is the jitted function's own.
    def __copy__(self) -> _Watched:
        return _Watched(copy.copy(self._jitted), self.__wrapped__, self._state, self._owner)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Watched:
        return _Watched(
            copy.deepcopy(self._jitted, memo), self.__wrapped__, self._state, self._owner
        )

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled as itself: the jitted function
        return operator.itemgetter(0), ((self._jitted,),)


@dataclasses.dataclass
class WatchReport:
    """The findings of a ``jc.watch()`` or an audit: text (``str()``), HTML in a notebook, JSON."""

    findings: list[Finding]
    calls: int
    functions: int
    blind: list[str] = dataclasses.field(default_factory=list)  # findings not made here, and why
    stopped: str | None = None  # what the audited script raised (its traceback printed above)
    once: list[str] = dataclasses.field(default_factory=list)  # reads whose line ran once

    @property
    def ok(self) -> bool:
        """No finding, and every kind of finding could be looked for."""
        return not self.findings and not self.blind

    def to_json(self) -> str:
        return json.dumps([f.as_dict() for f in self.findings], indent=2)

    def lines(self) -> Iterator[str]:
        yield (f"jaxcontracts audit: {len(self.findings)} finding(s) in {self.functions} jitted "
               f"function(s), {self.calls} call(s) observed")
        for why in self.blind:
            yield from _wrap("NOT CHECKED: " + why, "  ", "    ")
        if self.stopped:
            yield (f"  the script stopped with {self.stopped} (its traceback is above): what it "
                   "did up to there")
        if not self.findings and not self.blind:
            yield (
                "  nothing seen before it stopped" if self.stopped
                else "  nothing to fix: no recompile, no missed or wrong donation, no host "
                "transfer seen"
            )
        for n, f in enumerate(self.findings, 1):
            tail = f"  {f.file}:{f.line}  x{f.count}"
            name = sigs.short(f.function)
            room = _WIDTH - len(f"{n:>2}. {f.kind:<16} ") - len(tail)
            if len(name) > max(room, 12):  # the name gives way to the place
                name = name[: max(room, 12) - 3] + "..."
            yield f"{n:>2}. {f.kind:<16} {name}{tail}"
            cost = f.cost_text()
            if cost:
                yield f"    cost: {cost}"
            yield from _wrap(f.message, "    ", "    ")
            for d in (f.diff or [])[:8]:  # a change trimmed to what differs; a sentence wrapped
                if " -> " in d:
                    yield "      " + fit_change(d, _WIDTH - 6)
                else:
                    yield from _wrap(d, "      ", "        ")
            if f.jit_line:
                yield f"    donation set at {f.jit_line}"
            yield from _wrap("fix: " + f.fix, "    ", "      ")
        # the loop may have been left at its first pass: say what it did once
        if self.stopped and self.once:
            yield (
                "  seen once before the script stopped (repeated work if the line is in its loop):"
            )
            for text in self.once:
                yield from _wrap(text, "  - ", "      ")

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        rows = [
            (f.kind, sigs.short(f.function), f"{f.file}:{f.line}", f.count, f.message, f.fix)
            for f in self.findings
        ]
        return findings_html(next(iter(self.lines())), self.ok, rows, self.blind)



def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=first, subsequent_indent=rest)
