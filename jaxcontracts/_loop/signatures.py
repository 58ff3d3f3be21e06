"""Signatures of plain ``jax.jit`` calls, how two differ, and which
arguments an output could reuse: what ``jc.watch()`` and ``jc.hot_loop()``
say of code that is never decorated."""

from __future__ import annotations

import collections
import dataclasses
import inspect
import linecache
import os
import re
import sys
import weakref
from collections.abc import Sequence
from types import FrameType
from typing import Any

import jax

from .._compat import jitwatch
from .._format import flatten_with_path, fmt_aval, fmt_change, param_of
from .._leafdiff import diff_leaves
from .._state.spec import leaf_spec, spec_nbytes, value_kind
from .._steps import JitDonation, jit_donation
from .._userline import is_library, user_frame

__all__ = [
    "COMPILED_AGAIN", "COMPILED_AGAIN_FIX", "SAME_LEAVES",
    "Dropped", "enclosing",
    "Signature", "by_name", "by_param", "diff", "donated_params", "missed_donation_fix",
    "param_of", "paths", "reusable", "short", "signature", "wrong_donations", "donations", "drift",
    "drift_fix", "jit_site", "leave_out", "passed_again", "decorator_at",
]


@dataclasses.dataclass
class Signature:
    """What a call of a plain jitted function compiled for (equal: the same)."""

    treedef: Any
    specs: tuple[Any, ...]  # per dynamic leaf: its spec (_state.spec.leaf_spec)
    host: tuple[str, ...]  # per dynamic leaf: "" on the device, else what it is ("a Python float")
    statics: tuple[tuple[str, str], ...]  # (parameter, repr of its value)
    paths: tuple[str, ...]
    parts: tuple[tuple[str, Any], ...] = ()  # (parameter, its tree structure), the dynamic ones
    # per dynamic leaf: whether a jax array is committed to its device (None: not a jax
    # array); JAX compiles an uncommitted array and a committed one apart
    committed: tuple[bool | None, ...] = ()
    # (path, value) of the static fields of the dataclass nodes in the arguments
    # (jax-md's NeighborList.max_occupancy): what a changed tree structure names
    node_statics: tuple[tuple[str, Any], ...] = ()

    def aval(self, j: int) -> tuple[tuple[int, ...], str] | None:
        """Leaf ``j``'s shape and dtype, as outputs are matched by (None: no spec)."""
        spec = self.specs[j]
        return None if spec is None else (tuple(spec.shape), str(spec.dtype))

    def nbytes(self, j: int) -> int:
        return 0 if self.specs[j] is None else spec_nbytes(self.specs[j])

    def text(self, j: int) -> str:
        """Leaf ``j`` in a message: ``a Python float`` / ``a numpy array (f32[8])`` / ``f32[8]``."""
        aval = fmt_aval(self.specs[j].shape, self.specs[j].dtype, self.specs[j].weak_type)
        if self.host[j].startswith("a Python"):
            return self.host[j]
        return f"{self.host[j]} ({aval})" if self.host[j] else aval


def short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def by_param(sig: Signature, leaves: Sequence[int] | None = None) -> dict[str, list[int]]:
    """Parameter name -> the indices of its leaves (of ``leaves``: all of them)."""
    out: dict[str, list[int]] = {}
    for j in range(len(sig.paths)) if leaves is None else leaves:
        out.setdefault(param_of(sig.paths[j]), []).append(j)
    return out


def names(opts: jitwatch.JitOptions, n_args: int) -> list[str]:
    """The parameter names of the dynamic positional arguments of a call."""
    params = opts.signature.parameters.values() if opts.signature is not None else ()
    # (positional parameters come first in a signature)
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [
        named[i] if i < len(named) else f"args[{i}]"
        for i in range(n_args)
        if i not in opts.static_argnums
    ]


def paths(
    opts: jitwatch.JitOptions, args: tuple[Any, ...], dyn_args: tuple[Any, ...],
    dyn_kwargs: dict[str, Any],
) -> list[tuple[str, Any]]:
    """(path, leaf) of the dynamic leaves, in the order ``tree_leaves((dyn_args,
    dyn_kwargs))`` gives them, named by parameter."""
    named = names(opts, len(args))
    out = []
    for p, x in flatten_with_path((dyn_args, dyn_kwargs))[0]:
        head = named[p[1].idx] if p[0].idx == 0 else str(p[1].key)  # type: ignore[union-attr]
        out.append((head + jax.tree_util.keystr(tuple(p[2:])), x))
    return out


def signature(
    opts: jitwatch.JitOptions, args: tuple[Any, ...], kwargs: dict[str, Any],
    dyn_args: tuple[Any, ...], dyn_kwargs: dict[str, Any],
) -> Signature:
    found = paths(opts, args, dyn_args, dyn_kwargs)
    sig = opts.signature
    params = list(sig.parameters) if sig is not None else []
    statics = tuple(
        (params[i] if i < len(params) else f"args[{i}]", repr(args[i]))
        for i in opts.static_argnums
        if i < len(args)
    ) + tuple((k, repr(v)) for k, v in sorted(kwargs.items()) if k in opts.static_argnames)
    values = by_name(opts, dyn_args, dyn_kwargs)
    return Signature(
        jax.tree_util.tree_structure((dyn_args, dyn_kwargs)),
        tuple(leaf_spec(x) for _, x in found),  # None: not array-like (a JAX ref)
        tuple("" if isinstance(x, jax.Array) or leaf_spec(x) is None else f"a {value_kind(x)}"
              for _, x in found),
        statics,
        tuple(p for p, _ in found),
        tuple((k, jax.tree_util.tree_structure(v)) for k, v in values.items()),
        tuple(bool(x.committed) if isinstance(x, jax.Array) and hasattr(x, "committed") else None
              for _, x in found),
        tuple(item for k, v in values.items() for item in _node_statics(v, k)),
    )


def _node_statics(value: Any, path: str, depth: int = 0) -> list[tuple[str, Any]]:
    """(path, value) of the static fields (not among the node's children) of
    the dataclass nodes in ``value``, through tuples, lists and dicts; a
    function by its name and identity."""
    if depth > 8:
        return []
    if isinstance(value, (tuple, list)):
        return [x for i, v in enumerate(value) for x in _node_statics(v, f"{path}[{i}]", depth + 1)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _node_statics(v, f"{path}[{k!r}]", depth + 1)]
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return []
    try:
        children = jax.tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)[0]
    except Exception:  # noqa: BLE001 - not a pytree node here: nothing to name
        return []
    ids = {id(c) for c in children}
    out: list[tuple[str, Any]] = []
    for field in dataclasses.fields(value):
        v = getattr(value, field.name, None)
        here = f"{path}.{field.name}"
        if id(v) not in ids:
            out.append(
                (here, (getattr(v, "__qualname__", type(v).__name__), id(v)) if callable(v) else v)
            )
        else:
            out.extend(_node_statics(v, here, depth + 1))
    return out


def by_name(
    opts: jitwatch.JitOptions, dyn_args: tuple[Any, ...], dyn_kwargs: dict[str, Any]
) -> dict[str, Any]:
    values = dict(zip(names(opts, len(dyn_args) + len(opts.static_argnums)), dyn_args))
    values.update(dyn_kwargs)
    return values


def reusable(
    opts: jitwatch.JitOptions, sig: Signature, dyn_args: tuple[Any, ...],
    dyn_kwargs: dict[str, Any], out: Any, out_leaves: Sequence[Any], donated: set[str],
) -> tuple[int, ...]:
    """The undonated dynamic leaves whose buffers an output could take, each
    output taken once: first by the donated parameters, then by those whose
    structure an output (or a top-level part of it) has (``state = f(state)``),
    then by those with more leaves an output matches (an ``nnx.jit`` step's
    model before its batch ``y``, whose ``f32[32]`` is the bias's shape)."""
    free = collections.Counter((tuple(x.shape), str(x.dtype)) for x in out_leaves)
    parts = [
        out,
        *(out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()),
    ]
    shapes = {jax.tree_util.tree_structure(p) for p in parts}
    params = by_param(sig)
    values = by_name(opts, dyn_args, dyn_kwargs)

    # (a bare array's structure, `*`, tells nothing: any output has it)
    def carried(param: str) -> bool:
        tree = jax.tree_util.tree_structure(values[param]) if param in values else None
        return tree is not None and tree.num_nodes > 1 and tree in shapes

    # its leaves an output has the aval of: a state has many, a batch few
    def matched(param: str) -> int:
        return sum(1 for j in params[param] if not sig.host[j] and free[sig.aval(j)] > 0)

    order = sorted(params, key=lambda p: (p not in donated, not carried(p), -matched(p)))
    found = []
    for param in order:
        for j in params[param]:
            aval = sig.aval(j)
            if aval is not None and not sig.host[j] and free[aval] > 0:
                free[aval] -= 1
                if param not in donated:
                    found.append(j)
    return tuple(sorted(found))


SAME_LEAVES = "the same leaves (another device or trace context)"
_KEEP_FIXED = ("each new value compiles anew; keep it fixed (for a buffer that grows, allocate "
               "room to spare once)")


def diff(old: Signature, new: Signature) -> tuple[list[str], str]:
    """What changed between two signatures, one line per static value or leaf
    (the leaves as a hot step's RecompileError words them: ``_step.diffs``),
    and the fix for the first change."""
    out = [f"static {k}: {a} -> {b}" for (k, a), (_, b) in zip(old.statics, new.statics) if a != b]
    if out:
        return out, (
            "a static argument that changes value compiles anew each time: pass it traced, or keep "
            "it fixed"
        )
    if old.treedef != new.treedef:
        gone = sorted(set(old.paths) - set(new.paths))
        added = sorted(set(new.paths) - set(old.paths))
        if gone or added:
            out.append("the arguments' structure changed"
                       + (f": {len(gone)} leaves gone ({', '.join(gone[:3])})" if gone else "")
                       + (f"; {len(added)} new ({', '.join(added[:3])})" if added else ""))
            return out, "keep the arguments' structure fixed across calls"
        fields = _changed_fields(old.node_statics, new.node_statics)
        # the same leaves: a dataclass node's static field changed (a capacity, a flag)
        if fields:
            named = ", ".join(p for p, _ in fields)
            return [line for _, line in fields], (
                f"a static field of a pytree node ({named}) changed: {_KEEP_FIXED}")
        # the same leaves: a node's static data changed (a capacity, a flag)
        before = dict(old.parts)
        changed = [(k, before[k], t) for k, t in new.parts if k in before and before[k] != t]
        out += [f"{k}: its tree's static data: {fmt_change(str(a), str(b))}"
                for k, a, b in changed] or ["the arguments' structure changed (the same leaves)"]
        named = ", ".join(k for k, _, _ in changed) or "the arguments"
        return out, f"a pytree node's static data (aux data) in {named} changed: {_KEEP_FIXED}"
    diffs = diff_leaves(list(zip(old.paths, old.specs)), list(zip(new.paths, new.specs)))
    out = [f"{d.path}: {d.expected} -> {d.got}" for d in diffs]
    if not diffs:
        moved = [(p, a) for p, a, b in zip(new.paths, old.committed, new.committed)
                 if a is not None and b is not None and a != b]
        if moved:
            return [
                f"{p}: committed to its device -> uncommitted" if a
                else f"{p}: uncommitted -> committed to its device"
                for p, a in moved
            ], _COMMITTED_FIX
        return [SAME_LEAVES], "call it on the device and in the context it was compiled for"
    return out, diffs[0].cause


def _changed_fields(
    old: Sequence[tuple[str, Any]], new: Sequence[tuple[str, Any]]
) -> list[tuple[str, str]]:
    """(path, diff line) of each static field whose value changed; a function
    by its name, never by its repr (an address)."""
    before = dict(old)
    out = []
    for path, b in new:
        if path not in before:
            continue
        a = before[path]
        try:
            same = a is b or bool(a == b)
        except Exception:  # noqa: BLE001 - an odd ==: compared by repr
            same = repr(a) == repr(b)
        if same:
            continue
        if (
            isinstance(a, tuple) and isinstance(b, tuple) and len(a) == 2 == len(b)
            and isinstance(a[1], int)
        ):
            line = (
                f"{path}: another function {b[0]}" if a[0] == b[0] else f"{path}: {a[0]} -> {b[0]}"
            )
        else:
            ra, rb = repr(a), repr(b)
            line = (
                f"{path}: {ra} -> {rb}" if len(ra) + len(rb) <= 60
                else f"{path}: {fmt_change(ra, rb)}"
            )
        out.append((path, line))
    return out


#: The fix of a recompile where only whether arrays are committed changed.
_COMMITTED_FIX = ("JAX compiles apart for an uncommitted array (made by jnp.array, jnp.zeros... on "
                 "the default device) and a committed one (jax.device_put to a device, or a jitted "
                 "call's output): commit it where it is made, jax.device_put(x, jax.devices()[0]), "
                 "so that every call gives the same")

#: A recompile of arguments an earlier call compiled for: JAX dropped the program.
COMPILED_AGAIN = ("arguments the audit cannot tell from an earlier call's (a static value compared "
                  "by its repr): JAX compiled them again, so its program was dropped "
                  "(jax.clear_caches(), a jax.config change) or a static value differs where its "
                  "repr does not show it")
COMPILED_AGAIN_FIX = ("keep the compiled programs between calls (call jax.clear_caches() or "
                      "change jax.config outside the loop), and keep each static value fixed")


def missed_donation_fix(
    name: str, param: str, jit: str = "jax.jit", written: str = "", decorator: str = ""
) -> str:
    """The fix of a missed donation of ``param`` to the jitted function ``name``
    (the watch's finding and the loop's violation say it alike); ``jit``: the
    transform the user wrote (``nnx.jit`` passes donation on to jax.jit);
    ``written``: what the user gave it, where not the function itself (a partial);
    ``decorator``: the decorator line that jitted it, where one did."""
    how = donate_by_name(jit, written or short(name), (param,), decorator)
    return (f"{how} (names do not drift when parameters move); or "
            f'@jc.hot_step(state={param!r}, donate="all")')


def donate_by_name(jit: str, written: str, names: tuple[str, ...], decorator: str = "") -> str:
    """How to donate ``names`` by name, in the form the user wrote the jit:
    ``jax.jit(f, donate_argnames=...)``, or the decorator line's own
    (``@jax.jit`` -> ``@jax.jit(donate_argnames=...)``; a decorator with
    arguments, ``@partial(jax.jit, static_argnums=1)``, keeps them)."""
    bare = re.fullmatch(r"@\s*([\w.]*jit)", decorator)
    if bare:
        return f"@{bare.group(1)}(donate_argnames={names!r}) in place of @{bare.group(1)}"
    if decorator:
        if "donate_argnums" in decorator:
            return (f"donate_argnames={names!r} in place of donate_argnums in "
                    f"{decorator} above def {written}")
        return f"add donate_argnames={names!r} to {decorator} above def {written}"
    return f"{jit}({written}, donate_argnames={names!r})"


def decorator_at(file: str, line_no: int | str) -> str:
    """The decorator at the user's line (where ``jax.jit`` was called), or ""."""
    line = linecache.getline(file, int(line_no)).split("#", 1)[0].strip()  # (its comment out)
    return line if line.startswith("@") and "jit" in line else ""


def donated_params(opts: jitwatch.JitOptions) -> set[str]:
    params = list(opts.signature.parameters) if opts.signature is not None else []
    return set(opts.donate_argnames) | {params[i] for i in opts.donate_argnums if i < len(params)}


def wrong_donations(
    sig: Signature, donated: set[str], out_avals: set[tuple[Any, ...]], name: str,
    offer: bool = True,
) -> list[tuple[str, str, str]]:
    """(parameter, why, fix) for each donated parameter JAX cannot donate (a
    host value, skipped silently) or whose buffers no output can reuse while
    another's could (a drifted index). The fix leaves it out; with ``offer``
    (a loop, refusing before the call) it names another to donate, with a
    caution; a watch names it once each call's statement is proven to drop
    it (:func:`drift_fix`)."""
    params = by_param(sig)
    can = {
        p for p, js in params.items()
        if any(sig.aval(j) in out_avals and not sig.host[j] for j in js)
    }
    others = tuple(sorted(can - donated))
    out = []
    for param in sorted(donated):
        js = params.get(param, [])
        host = [j for j in js if sig.host[j]]
        if host and len(host) == len(js):  # only host values: nothing of it is donated
            # (a Python int among a state's arrays, flax's TrainState.step at its
            # first call, is skipped while the arrays are donated)
            why = (f"{param} is donated, but it is {sig.text(host[0])}: JAX does "
                   "not donate it (silently)")
            if others:
                why += (
                    f"; {', '.join(others)} could be donated instead (the index likely drifted)"
                )
        elif js and param not in can and others:
            why = (f"{param} is donated, but no output has the shape and dtype of its buffers, "
                   f"while {', '.join(others)} could be reused: the index likely drifted when a "
                   "parameter was inserted")
        else:
            continue
        fix = leave_out(param)
        if others and offer:
            fix += (f"; to donate {' or '.join(others)}, name it, which cannot drift: "
                    f"jax.jit({name}, donate_argnames={others!r}), only where nothing reads its "
                    "old value after the call")
        out.append((param, why, fix))
    return out


def leave_out(param: str) -> str:
    """The fix of a donation that cannot happen, where no other is proven."""
    return f"leave {param} out of donate_argnums/donate_argnames"


def drift_fix(
    name: str, param: str, jit: str = "jax.jit", keep: set[str] | frozenset[str] = frozenset(),
    decorator: str = "",
) -> str:
    """The fix of a wrong donation once each call's statement is proven to
    drop ``param``; ``keep``: the parameters it donates rightly."""
    names = tuple(sorted({param, *keep}))
    return (f"donate by name, which cannot drift: {donate_by_name(jit, name, names, decorator)} "
            f"(each call's statement drops {param}: see the missed donation)")


def jit_site(fun: Any) -> str:
    """``file:line`` of the ``jax.jit`` that made ``fun`` jitted, read from its
    source ("" where none is found)."""
    code = getattr(inspect.unwrap(fun), "__code__", None)
    if code is None:
        return ""
    file, first = code.co_filename, code.co_firstlineno
    lines = linecache.getlines(file)
    found = 0
    for n in range(first, min(first + 20, len(lines) + 1)):
        if re.match(r"\s*(async\s+)?def\s", lines[n - 1]):
            break
        if "jit" in lines[n - 1]:
            found = n
            break
    if not found:
        call = re.compile(rf"jit\(\s*{re.escape(getattr(fun, '__name__', '') or '?')}\b")
        found = next((n for n, text in enumerate(lines, 1) if call.search(text)), 0)
    if not found:
        return ""
    try:
        rel = os.path.relpath(file)
        file = rel if not rel.startswith(".." + os.sep + "..") else file
    except ValueError:  # another drive
        pass
    return f"{file}:{found}"


def donations(
    opts: jitwatch.JitOptions, sig: Signature, leaves: Sequence[Any], donated: set[str],
    candidates: Sequence[int], name: str, jit_line: str,
) -> list[tuple[list[Any], JitDonation]]:
    """The device arrays of each donated parameter of one call, and the
    consumer that names them once they are deleted (``_steps.keep``), with
    ``reusable``'s candidates as what to donate ``instead``."""
    params = list(opts.signature.parameters) if opts.signature is not None else []
    instead = tuple(by_param(sig, candidates))
    argnums = tuple(params.index(p) for p in instead if p in params)
    out = []
    for param, idx in by_param(sig).items():
        if param in donated:
            arrays = [leaves[j] for j in idx if isinstance(leaves[j], jax.Array)]
            out.append((arrays, JitDonation(short(name), param, jit_line, argnums, instead)))
    return out


def passed_again(
    leaves: Sequence[Any], paths: Sequence[str], positions: Sequence[int],
    function: str | None = None,
) -> tuple[JitDonation, str, str] | None:
    """The first array at ``positions`` of a call's leaves that a plain
    ``jax.jit``'s drifted donation (of ``function``, where given) deleted:
    its record, and what and fix (:func:`drift`)."""
    for j in positions:
        x = leaves[j] if j < len(leaves) else None
        if isinstance(x, jax.Array) and x.is_deleted():
            rec = jit_donation(x)
            if rec is not None and rec.instead and (function is None or rec.function == function):
                return (rec, *drift(rec, paths[j]))
    return None


def drift(rec: JitDonation, path: str) -> tuple[str, str]:
    """(what, fix) for ``path``, an array of the donated parameter ``rec.param``,
    passed again after the donation deleted it: the index that drifted."""
    at = f" (set at {rec.jit_line})" if rec.jit_line else ""
    what = (
        f"`{path}` is passed to `{rec.function}` again, but `{rec.function}` donates its parameter "
        f"`{rec.param}`{at}, so its first call deleted it"
    )
    if rec.instead:
        names = ", ".join(rec.instead)
        what += (f", while {names}, whose buffers its outputs could reuse, is not donated: "
                 "the index likely drifted when a parameter was inserted")
        fix = (f"donate by name, which cannot drift: jax.jit({rec.function}, "
               f"donate_argnames={rec.instead!r})"
               + (f" (or donate_argnums={rec.argnums!r})" if rec.argnums else ""))
    else:
        fix = leave_out(rec.param) + ", or pass a fresh array each call"
    return what, fix


class Dropped:
    """Whether the statement that made a call dropped its arguments: a weak
    reference to each array notes whether it died while the user's frame was
    still on the call's line (``state = f(state, x)``: donating it would have
    been safe). An array dying later is not counted: after
    ``jax.jit(norm)(s.params)``, ``s = step(s)`` drops the params, and
    donating them to ``norm`` would have deleted what the step needed. No
    frame is kept (only its id and line).

    ``outer`` (:func:`enclosing`): the user's statements running the call's
    function, as (frame id, line); an array dying as one of them ends was
    used by nothing after the call either (flax MNIST's ``train_epoch``)."""

    __slots__ = ("_frame", "_line", "_outer", "at_call", "refs", "sharers", "__weakref__")

    def __init__(
        self, arrays: Sequence[Any], frame: FrameType, sharers: Sequence[Any] | None = (),
        outer: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self._frame, self._line, self._outer = id(frame), frame.f_lineno, outer
        self.at_call = 0
        self.refs = [weakref.ref(a, self._died) for a in arrays]
        # weak references to the other arrays that held their buffers at the call
        # (:func:`sharers`); None: the buffers could not be told
        self.sharers = None if sharers is None else list(sharers)

    def _died(self, _ref: Any, _finalizing: Any = sys.is_finalizing) -> None:
        if _finalizing():  # (at exit the module's globals are gone: nothing left to count)
            return
        f = user_frame()
        if f is not None and (
            (id(f) == self._frame and f.f_lineno == self._line)
            or (id(f), f.f_lineno) in self._outer
        ):
            self.at_call += 1

    @property
    def count(self) -> int:
        return len(self.refs)

    @property
    def dropped(self) -> bool:
        """Whether every array died at the call's own statement (or one enclosing it)."""
        return self.at_call == len(self.refs)

    def undecided(self, now: tuple[tuple[int, int], ...]) -> bool:
        """Whether it is too soon to tell, at a later call whose user frames
        are ``now`` (:func:`enclosing`): every array that died so far died at
        the call's statement or one enclosing it, some are alive, and the
        frame that made the call still runs under the same statement of its
        caller, whose end may drop them. (A frame id reused by a new frame is
        told at the watch's end, as kept.)"""
        if not self._outer or self.at_call != sum(r() is None for r in self.refs) or self.dropped:
            return False
        ids = [i for i, _ in now]
        if self._frame not in ids:
            return False
        at = ids.index(self._frame) + 1
        return at < len(now) and now[at] == self._outer[0]


def enclosing(frame: FrameType | None) -> tuple[tuple[int, int], ...]:
    """(id, line) of ``frame`` and of each user frame above it, innermost
    first (:class:`Dropped`'s ``outer``)."""
    out = []
    while frame is not None:
        code = frame.f_code
        if not is_library(code.co_filename, True, code.co_name):
            out.append((id(frame), frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def still_shared(sharers: list[Any] | None) -> bool:
    """Whether an array that held the same buffers as a followed one is still
    alive (donating the followed one would have deleted it); True where the
    buffers could not be told."""
    return sharers is None or any(ref() is not None for ref in sharers)


def sharers(arrays: Sequence[Any]) -> dict[int, list[Any]] | None:
    """For each of ``arrays`` (by id) whose buffers another live array holds too
    (``jax.device_put`` onto their own device makes new arrays over the same
    buffers: donating one deletes the other), weak references to those; None
    where a buffer cannot be told (a miss, never a fix that deletes what the
    user keeps). Asked while the arrays live (the allocator reuses addresses);
    one scan of ``jax.live_arrays()``, so never at every call."""
    ids = {id(x) for x in arrays}
    mine: dict[int, set[int]] = {}
    for x in arrays:
        held = buffers(x)
        if held is None:
            return None
        for address in held:
            mine.setdefault(address, set()).add(id(x))
    found: dict[int, list[Any]] = {}
    for y in jax.live_arrays():
        if id(y) in ids or y.is_deleted():
            continue
        for address in (buffers(y) or frozenset()) & mine.keys():
            for xid in mine[address]:
                found.setdefault(xid, []).append(weakref.ref(y))
    return found


#: id of an array -> (a weak reference to it, weak references to the arrays
#: ``jax.device_put`` made over its buffers while a watch was open)
_put_over: dict[int, tuple[Any, list[Any]]] = {}


def note_device_put(given: Any, made: Any) -> None:
    """After ``made = jax.device_put(given, ...)`` while a watch is open: each
    array of ``made`` that is a new object over its source's buffers noted as
    sharing them (:func:`put_over`); where buffers cannot be told, as sharing."""
    leaves_given, leaves_made = jax.tree_util.tree_leaves(given), jax.tree_util.tree_leaves(made)
    if len(leaves_given) != len(leaves_made):
        return
    for a, r in zip(leaves_given, leaves_made):
        if a is r or not isinstance(a, jax.Array) or not isinstance(r, jax.Array):
            continue
        held = buffers(a)
        if held is not None and not held & (buffers(r) or held):
            continue  # copied: nothing shared
        key = id(a)
        entry = _put_over.get(key)
        if entry is None or entry[0]() is not a:

            def gone(ref: Any, key: int = key) -> None:
                if _put_over.get(key, (None,))[0] is ref:
                    del _put_over[key]

            entry = _put_over[key] = (weakref.ref(a, gone), [])
        entry[1][:] = [w for w in entry[1] if w() is not None]
        entry[1].append(weakref.ref(r))


def put_over(arrays: Sequence[Any]) -> list[Any]:
    """Weak references to the arrays ``jax.device_put`` made over the buffers
    of ``arrays`` (:func:`note_device_put`), alive or not."""
    if not _put_over:
        return []
    return [r for x in arrays for r in _put_over.get(id(x), (None, ()))[1]]


def buffers(x: Any) -> frozenset[int] | None:
    """The device buffers of ``x`` (each shard's), by address; None where they
    cannot be told."""
    try:
        if len(x.sharding.device_set) == 1:
            return frozenset((x.unsafe_buffer_pointer(),))
        return frozenset(shard.data.unsafe_buffer_pointer() for shard in x.addressable_shards)
    except Exception:  # noqa: BLE001 - a backend without buffer addresses, a deleted array
        return None
