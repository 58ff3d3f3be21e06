"""``jc.hot_step``: an AOT-compiled step with derived, verified donation.

Flow, one way: annotations -> state parameters and donated leaves (at
decoration) -> specs -> ``jax.jit(...).trace().lower().compile()`` -> carry
invariance and alias verification (once per signature) -> a call path chosen
for the checks level.

The call path is a closure picked when the step compiles or the checks level
changes, so a call never reads configuration:

* ``off``:  the compiled executable's own C++ fast path, nothing else;
* ``fast``: flatten the arguments (C++), compare the tree structure, check
  that every leaf is a strongly typed device array (and, on a multi-device
  executable, its sharding), then call. Shape, dtype and committed shardings
  are checked by the executable itself before it runs;
* ``full``: ``fast`` plus, after dispatch, that every donated input was
  consumed. Nothing blocks on the device.

Anything unusual (a mismatch, an exception from the executable, tracers)
falls to one slow path that works out what happened, raises the right
``jc`` error before dispatch, or compiles a new signature when
``max_compiles`` allows it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import sys
import time
import typing
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

import jax
import numpy as np

from . import _config
from ._compat import ArrayImpl, cpp_call
from ._donation import aliased_parameters, field_of, find_hazards
from ._errors import DefinitionError, DonationError, RecompileError, TransferError
from ._format import fmt_aval, fmt_path, fmt_value, qualname
from ._guard import compiling, consumed_by, in_hot_loop, note_call, tracking
from ._spec import LeafDiff, diff_leaves, diff_specs, leaf_spec, spec_nbytes
from ._state import data_field_names, is_state, static_field_names

__all__ = ["HotStep", "StepStats", "hot_step"]

P = ParamSpec("P")
R = TypeVar("R")

_ArrayImpl = ArrayImpl
_Tracer = jax.core.Tracer
# The registry's bound method skips tree_flatten's Python wrapper (per call).
_flatten = getattr(jax.tree_util, "default_registry", None)
_flatten = _flatten.flatten if _flatten is not None else jax.tree_util.tree_flatten
_DONATE_WORDS = ("all", "none")


# --------------------------------------------------------------------------
# Public objects


@dataclasses.dataclass
class StepStats:
    """What a hot_step has done so far.

    At checks level ``off`` a call is the bare compiled call, so ``calls`` is
    not counted there. Compile-time checks run at every level.
    """

    calls: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0
    refused: int = 0  # calls refused with a RecompileError/TransferError/DonationError
    traced_calls: int = 0  # calls under an outer transformation (plain tracing)
    not_consumed: int = 0  # calls after which a donated input was still alive


@dataclasses.dataclass
class _Entry:
    """One compiled signature and everything checked about it."""

    spec_args: tuple[Any, ...]  # per parameter, a spec tree (with shardings)
    in_treedef: Any
    flat_specs: list[tuple[str, Any]]  # (path as text, spec) per flat leaf
    lowered: Any
    compiled: Any
    flat_style: bool  # called with flat leaves (per-leaf donation)
    donated: tuple[int, ...]  # flat leaf indices donated
    aliased: set[int] | None
    weak: tuple[bool, ...]
    multi_device: bool
    compile_seconds: float
    # Provenance tokens (see _token_for): per state parameter that is a
    # jc.state instance, the token its exact spec has; per returned jc.state,
    # the token to stamp on it.
    in_tokens: tuple[tuple[int, object], ...] = ()
    out_tokens: tuple[tuple[tuple[int, ...], object], ...] = ()

    def matches(self, leaves: Sequence[Any], treedef: Any) -> list[LeafDiff]:
        if treedef != self.in_treedef:
            return [LeafDiff("(structure)", "", "")]
        got = [(p, leaf_spec(x)) for (p, _), x in zip(self.flat_specs, leaves)]
        return diff_leaves(self.flat_specs, got)


# --------------------------------------------------------------------------
# The decorator


@overload
def hot_step(
    fn: Callable[P, R],
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
) -> HotStep[P, R]: ...
@overload
def hot_step(
    fn: None = None,
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
) -> Callable[[Callable[P, R]], HotStep[P, R]]: ...
def hot_step(
    fn: Any = None,
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
) -> Any:
    """Make ``fn`` an AOT-compiled step with derived, verified donation.

    Args:
        fn: the step. Its state parameters are those annotated with
            ``signature``; its return annotation must contain that type
            (alone, or in a tuple such as ``tuple[State, Metrics]``).
        signature: the state type. ``None``: the first parameter's annotation.
        donate: ``"all"`` donates every leaf of every state parameter; a tuple
            of field names donates those fields only; ``"none"`` opts out.
            Other parameters are never donated.
        max_compiles: how many distinct signatures may be compiled.

    Returns:
        A :class:`HotStep`, called like ``fn``.

    Raises:
        DefinitionError: no state parameter, a return annotation without the
            state, an unknown donated field, or an invalid option.

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> from jaxtyping import Array, Float32
        >>> @jc.state
        ... class S:
        ...     x: Float32[Array, "n"]
        >>> @jc.hot_step(signature=S)
        ... def step(s: S) -> S:
        ...     return S(x=s.x + 1)
        >>> s = step(S.zeros(n=3))
        >>> step.stats.compiles, step.stats.calls
        (1, 1)
    """
    # Annotations may name classes local to the caller's function: resolve there.
    localns = dict(sys._getframe(1).f_locals)
    if fn is None:
        return lambda f: HotStep(
            f, signature=signature, donate=donate, max_compiles=max_compiles, _localns=localns
        )
    return HotStep(
        fn, signature=signature, donate=donate, max_compiles=max_compiles, _localns=localns
    )


def _state_type_matches(annotation: Any, signature: Any) -> bool:
    if annotation is signature:
        return True
    if isinstance(annotation, str):
        return annotation == getattr(signature, "__name__", None)
    origin = typing.get_origin(annotation)
    return origin is not None and origin is (typing.get_origin(signature) or signature)


def _return_positions(annotation: Any, signature: Any) -> list[tuple[int, ...]] | None:
    """Where the state stands in the return annotation: [()] or [(0,), ...]."""
    if _state_type_matches(annotation, signature):
        return [()]
    if typing.get_origin(annotation) is tuple:
        out = [
            (i,)
            for i, a in enumerate(typing.get_args(annotation))
            if _state_type_matches(a, signature)
        ]
        return out or None
    return None


class HotStep(Generic[P, R]):
    """An AOT-compiled step whose contracts are checked on every call.

    Attributes:
        signature: the compiled signature (a tuple with one spec tree per
            parameter), or ``None`` before the first compile.
        compiled: the ``jax.stages.Compiled`` of that signature.
        lowered: its ``jax.stages.Lowered``.
        stats: a :class:`StepStats`.
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        signature: type | None,
        donate: str | tuple[str, ...],
        max_compiles: int,
        _localns: dict[str, Any] | None = None,
    ):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._name = qualname(fn)
        self._check_options(donate, max_compiles)
        self._donate = donate
        self._max_compiles = max_compiles
        self._analyse_signature(signature, _localns)
        self._entries: list[_Entry] = []
        self._entry: _Entry | None = None
        self.stats = StepStats()
        self._level = _config.get_checks()
        _config.add_listener(self)
        self._dispatch: Callable[..., Any] = self._slow

    # -- definition --------------------------------------------------------

    def _check_options(self, donate: Any, max_compiles: Any) -> None:
        if isinstance(donate, str):
            if donate not in _DONATE_WORDS:
                raise DefinitionError(
                    f"@jc.hot_step on {self._name}: donate={donate!r} is not valid.\n"
                    "Valid values:\n"
                    '  donate="all"            every leaf of every state parameter (default)\n'
                    '  donate=("pos", "vel")   those state fields only\n'
                    '  donate="none"           no donation (an explicit opt-out)'
                )
        elif not (
            isinstance(donate, (tuple, list)) and all(isinstance(n, str) for n in donate)
        ):
            raise DefinitionError(
                f"@jc.hot_step on {self._name}: donate={donate!r} is not valid; "
                'use "all", "none" or a tuple of field names such as ("pos", "vel").'
            )
        if not isinstance(max_compiles, int) or isinstance(max_compiles, bool) or max_compiles < 1:
            raise DefinitionError(
                f"@jc.hot_step on {self._name}: max_compiles={max_compiles!r}; "
                "it must be an int >= 1 (1: exactly one signature, the default)."
            )

    def _analyse_signature(self, signature: type | None, localns: dict[str, Any] | None) -> None:
        fn = self._fn
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as e:
            raise DefinitionError(f"@jc.hot_step: cannot read the signature of {self._name}: {e}") from None
        params = list(sig.parameters.values())
        variadic = [p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if variadic:
            raise DefinitionError(
                f"@jc.hot_step on {self._name}: *args/**kwargs ({', '.join(variadic)}) "
                "cannot be compiled ahead of time with a fixed signature.\n"
                "Fix: name every parameter."
            )
        try:
            hints = typing.get_type_hints(fn, localns=localns)
        except Exception:  # noqa: BLE001 - unresolvable forward refs: use raw annotations
            hints = {p.name: p.annotation for p in params}
            hints["return"] = sig.return_annotation
        if signature is None:
            if not params or params[0].name not in hints:
                raise DefinitionError(
                    f"@jc.hot_step on {self._name}: no signature= was given and the "
                    "first parameter is not annotated, so the state type is unknown.\n"
                    "Fix: annotate it (def step(s: State) -> State) or pass "
                    "@jc.hot_step(signature=State)."
                )
            signature = hints[params[0].name]
        self.state_type = signature
        self._param_names = tuple(p.name for p in params)
        self._state_params = tuple(
            i for i, p in enumerate(params) if _state_type_matches(hints.get(p.name), signature)
        )
        type_name = getattr(signature, "__name__", repr(signature))
        if not self._state_params:
            listing = ", ".join(
                f"{p.name}: {getattr(hints.get(p.name), '__name__', hints.get(p.name, '(none)'))}"
                for p in params
            )
            raise DefinitionError(
                f"@jc.hot_step on {self._name}: no parameter is annotated with the "
                f"state type {type_name}.\n  parameters: {listing or '(none)'}\n"
                f"Fix: annotate the state parameter (s: {type_name}), or pass the "
                "state type as signature=..."
            )
        ret = hints.get("return", inspect.Signature.empty)
        positions = _return_positions(ret, signature)
        if positions is None:
            raise DefinitionError(
                f"@jc.hot_step on {self._name}: the return annotation "
                f"({getattr(ret, '__name__', ret) if ret is not inspect.Signature.empty else 'missing'}) "
                f"does not contain the state type {type_name}.\nA hot step returns "
                f"its new state: annotate `-> {type_name}` or `-> tuple[{type_name}, Metrics]`."
            )
        if len(positions) > len(self._state_params):
            raise DefinitionError(
                f"@jc.hot_step on {self._name}: {len(self._state_params)} state "
                f"parameter(s) but {len(positions)} state(s) in the return annotation.\n"
                "The k-th returned state is the new value of the k-th state parameter.\n"
                "Fix: return one state per state parameter (state parameters not "
                "returned are read-only inputs)."
            )
        self._return_positions = positions
        if is_state(signature):
            self._check_donated_names(data_field_names(signature), static_field_names(signature))
        kwonly = tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY)
        n_pos = len(params) - len(kwonly)
        if kwonly:
            def positional(*a: Any) -> Any:
                return fn(*a[:n_pos], **dict(zip(kwonly, a[n_pos:])))  # type: ignore[call-arg]
        else:
            positional = fn
        self._positional = positional
        self._sig = sig

    # -- public API --------------------------------------------------------

    @property
    def signature(self) -> tuple[Any, ...] | None:
        return None if self._entry is None else self._entry.spec_args

    @property
    def compiled(self) -> Any:
        return None if self._entry is None else self._entry.compiled

    @property
    def lowered(self) -> Any:
        return None if self._entry is None else self._entry.lowered

    @property
    def signatures(self) -> list[tuple[Any, ...]]:
        """Every compiled signature, oldest first."""
        return [e.spec_args for e in self._entries]

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower for these arguments or specs, without compiling or checking."""
        positional = self._normalize(args, kwargs)
        jitted, spec_args, *_ = self._jit_for(positional)
        with _quiet_donation_warning():
            return jitted.trace(*spec_args).lower()

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        """Compile for these arguments or specs (no data needed) and check it.

        Returns:
            The ``jax.stages.Compiled``.

        Raises:
            RecompileError: the step does not return its state with the spec
                it takes, or ``max_compiles`` signatures exist already.
            DonationError: a donated leaf cannot alias any output.
        """
        __tracebackhide__ = True
        positional = self._normalize(args, kwargs)
        leaves, treedef = _flatten(positional)
        for e in self._entries:
            if not e.matches(leaves, treedef):
                self._use(e)
                return e.compiled
        return self._new_entry(positional).compiled

    if typing.TYPE_CHECKING:

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    else:
        # A call goes straight to the current call path, with no Python frame
        # of its own: the type's call slot finds this property and calls what
        # it returns (one C-level attribute read).
        __call__ = property(operator.attrgetter("_dispatch"))

    def report(self) -> Any:
        """A :class:`jc.Report` of the current signature: leaves, memory, contracts.

        ``str()`` of it is a text table; in a notebook it renders as HTML.
        """
        from ._report import step_report

        return step_report(self)

    def __repr__(self) -> str:
        state = "not compiled" if self._entry is None else f"{len(self._entries)} signature(s)"
        return f"<jc.hot_step {self._name} ({state}, donate={self._donate!r})>"

    # -- compile -----------------------------------------------------------

    def _normalize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if not kwargs and len(args) == len(self._param_names):
            return args
        try:
            bound = self._sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self._name}(): {e}") from None
        bound.apply_defaults()
        return tuple(bound.arguments[n] for n in self._param_names)

    def _donated_leaves(self, flat_paths: Sequence[Any]) -> tuple[int, ...]:
        if self._donate == "none":
            return ()
        donated = []
        fields_seen: set[str] = set()
        for i, path in enumerate(flat_paths):
            arg = path[0].idx
            if arg not in self._state_params:
                continue
            if self._donate == "all":
                donated.append(i)
                continue
            name = field_of(path[1]) if len(path) > 1 else None
            if name is not None:
                fields_seen.add(name)
            if name in self._donate:
                donated.append(i)
        if not is_state(self.state_type):  # a dict state: its fields are known now
            self._check_donated_names(tuple(sorted(fields_seen)), ())
        return tuple(donated)

    def _check_donated_names(self, valid: Sequence[str], static: Sequence[str]) -> None:
        if not isinstance(self._donate, (tuple, list)):
            return
        bad = [n for n in self._donate if n not in valid]
        if bad:
            type_name = getattr(self.state_type, "__name__", repr(self.state_type))
            raise DefinitionError(
                f"@jc.hot_step on {self._name}: donate names unknown field(s) "
                f"{', '.join(map(repr, bad))} of {type_name}.\n"
                f"  array fields: {', '.join(valid) or '(none)'}"
                + (f"\n  static fields (not donatable, not arrays): {', '.join(static)}" if static else "")
                + '\nFix: use those names, or donate="all".'
            )

    def _jit_for(
        self, positional: tuple[Any, ...]
    ) -> tuple[Any, tuple[Any, ...], Any, tuple[int, ...], bool]:
        """The jitted function, its spec arguments, treedef, donated leaves, style."""
        with_path, treedef = jax.tree_util.tree_flatten_with_path(positional)
        paths = [p for p, _ in with_path]
        specs = []
        for p, x in with_path:
            spec = leaf_spec(x)
            if spec is None:
                raise TransferError(
                    f"{self._name}: argument {self._param_names[p[0].idx]}"
                    f"{fmt_path(p[1:])} is {type(x).__name__} {x!r:.40}, not an array.\n"
                    "Fix: pass arrays (or specs); make configuration a jc.static field "
                    "or close over it."
                )
            specs.append(spec)
        donated = self._donated_leaves(paths)
        per_arg: dict[int, list[bool]] = {}
        for i, p in enumerate(paths):
            per_arg.setdefault(p[0].idx, []).append(i in donated)
        flat_style = any(any(v) and not all(v) for v in per_arg.values())
        positional_fn = self._positional
        if flat_style:
            def flat_fn(*leaves: Any) -> Any:
                return positional_fn(*jax.tree_util.tree_unflatten(treedef, leaves))

            flat_fn.__name__ = getattr(self._fn, "__name__", "step")
            jitted = jax.jit(flat_fn, donate_argnums=donated, keep_unused=True)
            spec_args: tuple[Any, ...] = tuple(specs)
        else:
            argnums = tuple(a for a, v in per_arg.items() if v and all(v))
            jitted = jax.jit(positional_fn, donate_argnums=argnums, keep_unused=True)
            spec_args = tuple(jax.tree_util.tree_unflatten(treedef, specs))
        return jitted, spec_args, treedef, donated, flat_style

    def _new_entry(self, positional: tuple[Any, ...]) -> _Entry:
        __tracebackhide__ = True
        if len(self._entries) >= self._max_compiles:
            raise self._refuse_signature(positional)
        jitted, spec_args, treedef, donated, flat_style = self._jit_for(positional)
        with compiling(self._name):  # inside a hot_loop, a compile is a violation
            t0 = time.perf_counter()
            with _quiet_donation_warning():
                traced = jitted.trace(*spec_args)
                lowered = traced.lower()
            compiled = lowered.compile()
            seconds = time.perf_counter() - t0

        in_leaves = jax.tree_util.tree_leaves(compiled.input_shardings[0])
        flat_paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(positional)[0]]
        flat_specs = []
        for path, spec, sharding in zip(flat_paths, jax.tree_util.tree_leaves(spec_args), in_leaves):
            flat_specs.append(
                (
                    f"{self._param_names[path[0].idx]}{fmt_path(path[1:]) if len(path) > 1 else ''}",
                    jax.ShapeDtypeStruct(spec.shape, spec.dtype, sharding=sharding, weak_type=spec.weak_type),
                )
            )
        exact = [s for _, s in flat_specs]
        per_param = tuple(jax.tree_util.tree_unflatten(treedef, exact))
        multi = any(len(x.sharding.device_set) > 1 for x in exact)
        entry = _Entry(
            spec_args=per_param,
            in_treedef=treedef,
            flat_specs=flat_specs,
            lowered=lowered,
            compiled=compiled,
            flat_style=flat_style,
            donated=donated,
            aliased=None,
            weak=tuple(bool(s.weak_type) for s in exact),
            multi_device=multi,
            compile_seconds=seconds,
        )
        # Compile-time contracts run at every checks level: once per signature.
        self._check_carry(entry, traced.out_info, compiled.output_shardings)
        entry.aliased = self._check_aliasing(entry, traced.out_info)
        self._assign_tokens(entry)
        self._entries.append(entry)
        self.stats.compiles += 1
        self.stats.compile_seconds += seconds
        self._use(entry)
        return entry

    def _assign_tokens(self, entry: _Entry) -> None:
        """Tokens for the fast path, once carry invariance has been verified."""
        if entry.flat_style:
            return
        pairs = list(zip(self._state_params, self._return_positions))
        ins, outs = [], []
        for arg, pos in pairs:
            spec = entry.spec_args[arg]
            if not is_state(spec):
                continue
            token = _token_for(spec)
            ins.append((arg, token))
            outs.append((pos, token))
        entry.in_tokens, entry.out_tokens = tuple(ins), tuple(outs)

    def _check_carry(self, entry: _Entry, out_info: Any, out_shardings: Any) -> None:
        __tracebackhide__ = True
        out_flat, out_tree = _flatten(out_info)
        shard_flat = jax.tree_util.tree_leaves(out_shardings)
        if len(shard_flat) == len(out_flat):
            out_flat = [
                jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=s, weak_type=o.weak_type)
                for o, s in zip(out_flat, shard_flat)
            ]
        out = jax.tree_util.tree_unflatten(out_tree, out_flat)
        blocks = []
        for arg, pos in zip(self._state_params, self._return_positions):
            returned = out
            try:
                for k in pos:
                    returned = returned[k]
            except (TypeError, IndexError, KeyError):
                blocks.append(
                    f"  parameter `{self._param_names[arg]}`: the step returns "
                    f"{type(out).__name__}, with no state at return value {list(pos)}"
                )
                continue
            if _token_for(entry.spec_args[arg]) is _token_for(returned):
                continue  # the same exact spec: nothing to explain
            diffs = diff_specs(entry.spec_args[arg], returned)
            if diffs:
                where = f"return value {list(pos)}" if pos else "the return value"
                blocks.append(
                    f"  parameter `{self._param_names[arg]}` -> {where}:\n"
                    + "\n".join(
                        f"    {d.path}: takes {d.expected}, returns {d.got}"
                        + (f"\n      ({d.cause})" if d.cause else "")
                        for d in diffs
                    )
                )
        if blocks:
            raise RecompileError(
                f"{self._name} does not return its state with the spec it takes, so "
                "its own output would not match the compiled signature on the next "
                "call (jax.jit would recompile there; a compiled step would reject it).\n"
                + "\n".join(blocks)
                + "\nFix: make every returned leaf keep its input's dtype, shape and "
                "weak type: either initialise the leaf with the dtype the step "
                "produces (e.g. jnp.float32(0) instead of 0 for a float counter), or "
                "cast in the step (t=(s.t + 1).astype(s.t.dtype)). Nothing has run yet."
            )

    def _check_aliasing(self, entry: _Entry, out_info: Any) -> set[int] | None:
        __tracebackhide__ = True
        if not entry.donated:
            return set()
        n_args = len(entry.flat_specs)
        aliased = aliased_parameters(entry.compiled, n_args)
        if aliased is None:  # HLO unreadable: fall back on the byte count
            analysis = _memory_analysis(entry.compiled)
            want = sum(spec_nbytes(entry.flat_specs[i][1]) for i in entry.donated)
            got = getattr(analysis, "alias_size_in_bytes", want) if analysis else want
            return set(entry.donated) if got >= want else set()
        missing = [i for i in entry.donated if i not in aliased]
        if missing:
            outs = [(o.shape, np.dtype(o.dtype)) for o in jax.tree_util.tree_leaves(out_info)]
            lines = []
            for i in missing:
                path, spec = entry.flat_specs[i]
                key = (spec.shape, np.dtype(spec.dtype))
                why = (
                    f"no output is {fmt_aval(spec.shape, spec.dtype)}"
                    if key not in outs
                    else "every output of this shape and dtype already reuses another buffer"
                )
                lines.append(f"    {path}: {fmt_aval(spec.shape, spec.dtype)}: {why}")
            raise DonationError(
                f"{self._name}: {len(missing)} donated leaf/leaves cannot be donated: "
                "XLA found no output to reuse the buffer for, so it would stay alive "
                "and the step would need more memory than its state.\n"
                + "\n".join(lines)
                + "\nFix: 1. return that leaf in the new state with the same spec (the "
                "carry contract); 2. if it is a read-only input, annotate it with "
                "another type than the state type (state parameters are donated); "
                "3. donate only the other fields, e.g. donate=(\"pos\", \"vel\"); or "
                '4. opt out with donate="none". Nothing has run yet.'
            )
        return aliased

    def _refuse_signature(self, positional: tuple[Any, ...]) -> RecompileError | TransferError:
        self.stats.refused += 1
        entry = self._entry
        assert entry is not None
        blocks = []
        all_diffs = []
        for i, name in enumerate(self._param_names):
            diffs = diff_specs(entry.spec_args[i], positional[i])
            all_diffs += diffs
            if diffs:
                blocks.append(
                    f"  parameter `{name}`:\n"
                    + "\n".join(
                        f"    {_join(name, d.path)}: compiled with {d.expected}, called with {d.got}"
                        + (f"\n      likely cause: {d.cause}" if d.cause else "")
                        for d in diffs
                    )
                )
        if all_diffs and all(d.kind == "sharding" for d in all_diffs) and in_hot_loop():
            # Inside a loop, an array on other devices is a device-to-device
            # transfer waiting to happen (jax.jit would move it every call).
            return TransferError(
                f"implicit device-to-device transfer inside jc.hot_loop: {self._name} "
                "was called with arrays placed differently from its compiled signature.\n"
                + "\n".join(blocks)
                + "\nFix: place them once, before the loop, with "
                "jax.device_put(x, sharding) using the compiled sharding (see "
                f"{self._name.rsplit('.', 1)[-1]}.signature). The call did not run; "
                "your inputs are intact."
            )
        return RecompileError(
            f"{self._name} was called with a signature it was not compiled for "
            f"(max_compiles={self._max_compiles}, {len(self._entries)} used).\n"
            + ("\n".join(blocks) or "  (the pytree structure differs)")
            + "\nFix: pass arguments with the compiled spec (see the likely cause "
            "above), or allow more signatures with "
            f"@jc.hot_step(max_compiles={self._max_compiles + 1}). "
            "The call did not run; your inputs are intact."
        )

    # -- call paths --------------------------------------------------------

    def _on_checks_changed(self, level: str) -> None:
        self._level = level
        if self._entry is not None:
            self._use(self._entry)

    def _use(self, entry: _Entry) -> None:
        self._entry = entry
        self._dispatch = _make_dispatch(self, entry, self._level)

    def _slow(self, *args: Any, **kwargs: Any) -> Any:
        """Everything the fast paths do not handle; raises before dispatch."""
        __tracebackhide__ = True
        return self._slow_call(args, kwargs, None)

    def _slow_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException | None) -> Any:
        __tracebackhide__ = True
        all_leaves = jax.tree_util.tree_leaves((args, kwargs))
        if any(isinstance(x, _Tracer) for x in all_leaves):
            self.stats.traced_calls += 1
            return self._fn(*args, **kwargs)  # under an outer transformation
        positional = self._normalize(args, kwargs)
        with_path, treedef = jax.tree_util.tree_flatten_with_path(positional)
        leaves = [x for _, x in with_path]
        paths = [f"{self._param_names[p[0].idx]}{fmt_path(p[1:]) if len(p) > 1 else ''}" for p, _ in with_path]

        host = [(p, x) for p, x in zip(paths, leaves) if not isinstance(x, jax.Array)]
        if host:
            self.stats.refused += 1
            raise TransferError(
                f"{self._name}: {len(host)} argument leaf/leaves are on the host, so "
                "every call would copy them to the device (an implicit host-to-device "
                "transfer, and a sync):\n"
                + "\n".join(f"  {p}: {fmt_value(x)}" for p, x in host)
                + "\nFix: put them on the device once, before the loop: "
                "x = jax.device_put(x) (or build the state with its class, which does). "
                "Configuration belongs in a jc.static field or a closure. "
                "The call did not run; your inputs are intact."
            )
        entry = self._entry
        donated = entry.donated if entry is not None else self._donated_leaves([p for p, _ in with_path])
        deleted, duplicates = find_hazards(leaves, donated)
        if deleted or duplicates:
            self.stats.refused += 1
            raise DonationError(self._hazard_message(paths, leaves, deleted, duplicates, donated))

        for e in self._entries:
            if not e.matches(leaves, treedef):
                if exc is not None and e is entry:
                    raise exc  # the signature is right: a genuine runtime error
                self._use(e)
                return self._dispatch(*positional)
        if entry is not None and len(self._entries) >= self._max_compiles:
            raise self._refuse_signature(positional)
        self._new_entry(positional)
        return self._dispatch(*positional)

    def _hazard_message(
        self,
        paths: list[str],
        leaves: list[Any],
        deleted: list[int],
        duplicates: list[tuple[int, int]],
        donated: Sequence[int],
    ) -> str:
        lines = []
        for i in deleted:
            by = consumed_by(leaves[i])
            lines.append(
                f"  {paths[i]}: {fmt_aval(leaves[i].shape, leaves[i].dtype)} was already "
                + (f"donated to {by}" if by else "deleted (donated to an earlier call?)")
            )
        for a, b in duplicates:
            lines.append(
                f"  {paths[a]} and {paths[b]} are the same buffer, and "
                f"{paths[a] if a in donated else paths[b]} is donated"
            )
        return (
            f"{self._name}: the call would donate a buffer that cannot be donated:\n"
            + "\n".join(lines)
            + "\nFix: use the state the previous call returned (s = step(s)), not the "
            "one you passed to it; pass a copy (jnp.copy(x)) where one array must "
            "appear twice. The call did not run; your other inputs are intact."
        )

    def _not_consumed(self, entry: _Entry, leaves: Sequence[Any], out: Any) -> DonationError:
        self.stats.not_consumed += 1
        missing = [i for i in entry.donated if not leaves[i].is_deleted()]
        return DonationError(
            f"{self._name}: {len(missing)} donated input buffer(s) were not consumed: "
            "XLA copied instead of reusing them, so this step held its state twice.\n"
            + "\n".join(
                f"  {entry.flat_specs[i][0]}: {fmt_aval(leaves[i].shape, leaves[i].dtype)}"
                for i in missing
            )
            + "\nLikely cause: on CPU, a numpy view of the array is alive "
            "(np.asarray(x) shares its buffer, so XLA must copy); elsewhere another "
            "live reference pins the buffer.\nFix: drop the view (del it), or take a "
            "copy with np.array(x) or jc.fetch(x) (which copies). The call's outputs are in this "
            "error's .result: nothing was lost."
        , result=out)


def _join(param: str, path: str) -> str:
    return param if path.startswith("(") else f"{param}{path}"


def _make_dispatch(step: HotStep[Any, Any], entry: _Entry, level: str) -> Callable[..., Any]:
    """Build the per-call closure for one compiled signature and checks level."""
    compiled = cpp_call(entry.compiled)  # skips Compiled.__call__'s Python frame
    slow_call = step._slow_call
    stats = step.stats
    in_treedef = entry.in_treedef
    flatten = _flatten
    array_impl = _ArrayImpl

    if level == "off":
        if entry.flat_style:
            def off_flat(*args: Any, **kwargs: Any) -> Any:
                leaves, treedef = flatten(args)
                if kwargs or treedef != in_treedef:
                    return slow_call(args, kwargs, None)
                try:
                    return compiled(*leaves)
                except Exception as e:  # noqa: BLE001
                    return slow_call(args, kwargs, e)

            return off_flat

        def off(*args: Any, **kwargs: Any) -> Any:
            try:
                return compiled(*args, **kwargs)
            except Exception as e:  # noqa: BLE001
                return slow_call(args, kwargs, e)

        return off

    full = level == "full"
    donated = entry.donated
    any_weak = any(entry.weak)
    weak = entry.weak
    shardings = [s.sharding for _, s in entry.flat_specs] if entry.multi_device else None
    flat_style = entry.flat_style
    not_consumed = step._not_consumed
    # One is_deleted() per call catches the usual stale state (all of it was
    # donated) before XLA refuses it with an error line on stderr.
    first_donated = donated[0] if donated else None

    def checked(*args: Any, **kwargs: Any) -> Any:
        leaves, treedef = flatten(args)
        if kwargs or treedef != in_treedef:
            return slow_call(args, kwargs, None)
        if any_weak:
            for x, w in zip(leaves, weak):
                if type(x) is not array_impl or x.aval.weak_type is not w:
                    return slow_call(args, kwargs, None)
        else:
            for x in leaves:
                if type(x) is not array_impl or x.aval.weak_type:
                    return slow_call(args, kwargs, None)
        if shardings is not None:
            for x, s in zip(leaves, shardings):
                if x.sharding != s:
                    return slow_call(args, kwargs, None)
        if first_donated is not None and leaves[first_donated].is_deleted():
            return slow_call(args, kwargs, None)  # a stale state: explain, quietly
        try:
            out = compiled(*leaves) if flat_style else compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        stamp(out)
        if full:
            for i in donated:
                if not leaves[i].is_deleted():
                    raise not_consumed(entry, leaves, out)
        stats.calls += 1
        if tracking.count:  # a hot_loop is active somewhere: remember for messages
            note_call(step, args, out)
        return out

    out_tokens = entry.out_tokens
    key = _TOKEN_KEY

    def stamp(out: Any) -> None:
        for pos, token in out_tokens:
            obj = out
            for k in pos:
                obj = obj[k]
            obj.__dict__[key] = token

    if not entry.in_tokens or len(entry.in_tokens) != len(step._state_params):
        return checked

    # The provenance fast path. A jc.state returned by a hot_step carries the
    # token of its exact spec (structure with static values, shapes, dtypes,
    # weak types, shardings): the executable made every leaf, and carry
    # invariance proved the spec when the step compiled. The instance is
    # frozen and the token is dropped by replace(), tree_map and pickling, so
    # an argument carrying this entry's token needs no per-leaf checks; the
    # executable itself still refuses deleted buffers (-> the slow path).
    in_tokens = entry.in_tokens
    n_params = len(step._param_names)
    others = tuple(i for i in range(n_params) if i not in dict(in_tokens))
    state_getters = tuple(
        (arg, _leaf_getter(type(entry.spec_args[arg]))) for arg, _ in in_tokens
    )
    other_specs, other_treedef = jax.tree_util.tree_flatten(tuple(entry.spec_args[i] for i in others))
    other_weak = tuple(bool(s.weak_type) for s in other_specs)
    other_any_weak = any(other_weak)
    donated_params = tuple(arg for arg, _ in in_tokens) if donated else ()
    first_state_leaf = None
    if donated_params and jax.tree_util.tree_leaves(entry.spec_args[state_getters[0][0]]):
        arg0 = state_getters[0][0]
        get_first = _first_leaf_getter(type(entry.spec_args[arg0]))  # O(1), not all leaves

        def first_state_leaf(args: tuple[Any, ...]) -> Any:
            return get_first(args[arg0])

    is_deleted = array_impl.is_deleted  # unbound: map() runs it in C
    donated_getters = tuple((arg, get) for arg, get in state_getters if arg in donated_params)

    def provenance(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != n_params:
            return checked(*args, **kwargs)
        for i, token in in_tokens:
            d = getattr(args[i], "__dict__", None)
            if d is None or d.get(key) is not token:
                return checked(*args)
        if first_state_leaf is not None and first_state_leaf(args).is_deleted():
            return slow_call(args, kwargs, None)
        if others:
            leaves, treedef = flatten(tuple(args[i] for i in others))
            if treedef != other_treedef:
                return checked(*args)
            for x, w in zip(leaves, other_weak):
                if type(x) is not array_impl or (x.aval.weak_type is not w if other_any_weak else x.aval.weak_type):
                    return checked(*args)
            if shardings is not None:
                return checked(*args)
        try:
            out = compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        stamp(out)
        if full:
            for arg, get in donated_getters:
                if not all(map(is_deleted, get(args[arg]))):
                    raise not_consumed(entry, flatten(args)[0], out)
        stats.calls += 1
        if tracking.count:
            note_call(step, args, out)
        return out

    if n_params != 1 or len(out_tokens) != 1 or out_tokens[0][0] != ():
        return provenance
    # The common `s = step(s)`: one parameter, the state, returned alone.
    token0 = in_tokens[0][1]
    out_token = out_tokens[0][1]
    get_all = donated_getters[0][1] if donated_getters else None
    first_leaf = first_state_leaf

    def provenance_one(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != 1:
            return checked(*args, **kwargs)
        d = getattr(args[0], "__dict__", None)
        if d is None or d.get(key) is not token0:
            return checked(*args)
        if first_leaf is not None and first_leaf(args).is_deleted():
            return slow_call(args, kwargs, None)
        try:
            out = compiled(*args)
        except Exception as e:  # noqa: BLE001 - diagnosed, or re-raised, by the slow path
            return slow_call(args, kwargs, e)
        out.__dict__[key] = out_token
        if full and get_all is not None and not all(map(is_deleted, get_all(args[0]))):
            raise not_consumed(entry, flatten(args)[0], out)
        stats.calls += 1
        if tracking.count:
            note_call(step, args, out)
        return out

    return provenance_one


_TOKEN_KEY = "__jaxcontracts_token__"
_tokens: dict[Any, object] = {}


def _token_for(spec: Any) -> object:
    """One object per exact spec: equal specs, the same token."""
    leaves, treedef = jax.tree_util.tree_flatten(spec)
    key = (
        treedef,
        tuple((tuple(x.shape), np.dtype(x.dtype), bool(x.weak_type), x.sharding) for x in leaves),
    )
    token = _tokens.get(key)
    if token is None:
        token = _tokens[key] = object()
    return token


def _first_leaf_getter(cls: type) -> Callable[[Any], Any]:
    """The first leaf of a state instance: one attribute read for a flat class."""
    from ._state import data_field_names, flat_leaf_getter

    if flat_leaf_getter(cls) is not None:
        return operator.attrgetter(data_field_names(cls)[0])
    return lambda x: _flatten(x)[0][0]


def _leaf_getter(cls: type) -> Callable[[Any], Sequence[Any]]:
    """The leaves of a state instance: attribute reads for a flat class."""
    from ._state import flat_leaf_getter

    getter = flat_leaf_getter(cls)
    if getter is not None:
        return getter
    return lambda x: _flatten(x)[0]


class _quiet_donation_warning(warnings.catch_warnings):
    """Silence JAX's lowering-time donation warning: we verify and report it."""

    def __enter__(self) -> Any:
        out = super().__enter__()
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return out


def _memory_analysis(compiled: Any) -> Any:
    try:
        return compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend has one
        return None


