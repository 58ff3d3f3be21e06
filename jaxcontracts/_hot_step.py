"""``jc.hot_step``: an AOT-compiled step with derived, verified donation.

Flow, one way: the function's signature (``_signature``: state parameters,
donated leaves) -> specs -> a compiled signature with its contracts proven
(``_compile``) -> a call path chosen for the checks level (``_callpath``).
:class:`HotStep` ties them together and keeps the slow path, which diagnoses
anything the call path does not handle (``_diagnose``) or compiles a new
signature when ``max_compiles`` allows it.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import typing
import weakref
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

import jax
import numpy as np

from . import _config, _timing
from ._callpath import make_dispatch
from ._compat.frames import caller_locals
from ._compat.runtime_errors import is_runtime_error
from ._compat.tracing import Tracer, flatten, trace_state_clean
from ._compile import compile_signature, jit_for, quiet_donation_warning, signature_diffs
from ._diagnose import (
    api_misuse_error,
    hazard_error,
    host_leaves_error,
    not_consumed_error,
    run_failed_note,
    signature_error,
)
from ._donation import find_hazards
from ._errors import (
    INPUTS_INTACT,
    ContractError,
    DefinitionError,
    DonationError,
    RecompileError,
    TransferError,
)
from ._records import CompiledSignature, StepDescription, StepStats
from ._report import Report, step_report
from ._runtime import call_hooks, consumer_of, forget_step, new_step, observers, recording_loop
from ._signature import StepSignature, analyse
from ._spec import fmt_value
from ._state import (
    consumed_class,
    data_field_names,
    flat_leaf_getter,
    is_sealed_state,
    is_state,
    static_field_names,
)

__all__ = ["HotStep", "StepStats", "hot_step"]

P = ParamSpec("P")
R = TypeVar("R")


def _state_fields(state_type: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    if isinstance(state_type, type) and is_state(state_type):
        return data_field_names(state_type), static_field_names(state_type)
    return None


def _flat_fields(cls: type) -> tuple[str, ...] | None:
    if is_state(cls) and flat_leaf_getter(cls) is not None:
        return data_field_names(cls)
    return None


@overload
def hot_step(
    fn: Callable[P, R],
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
    static: str | tuple[str, ...] = (),
    donate_argnames: str | tuple[str, ...] = (),
    stateless: bool = False,
) -> HotStep[P, R]: ...
@overload
def hot_step(
    fn: None = None,
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
    static: str | tuple[str, ...] = (),
    donate_argnames: str | tuple[str, ...] = (),
    stateless: bool = False,
) -> Callable[[Callable[P, R]], HotStep[P, R]]: ...
def hot_step(
    fn: Any = None,
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
    static: str | tuple[str, ...] = (),
    donate_argnames: str | tuple[str, ...] = (),
    stateless: bool = False,
) -> Any:
    """Make ``fn`` an AOT-compiled step with derived, verified donation.

    Args:
        fn: the step. Its state parameters are those annotated with
            ``signature``; its return annotation must contain that type
            (alone, or in a tuple such as ``tuple[State, Metrics]``).
        signature: the state type. ``None``: the first parameter's annotation.
            A state parameter the step does not return (the return annotation
            holds fewer states than there are state parameters, or none) is
            read-only: never donated, never copied, still part of the
            compiled signature.
        donate: ``"all"`` donates every leaf of every returned state
            parameter; a tuple of field names donates those fields only;
            ``"none"`` opts out. Other parameters are donated only when named
            in ``donate_argnames``.
        max_compiles: how many distinct signatures may be compiled.
        static: names of parameters passed by value (hashable: a frozen
            dataclass, a NamedTuple, a function, a string...). A static value
            is part of the signature: a new value is a new compile, counted
            against ``max_compiles`` and named in the refusal's diff. An
            unhashable value is refused.
        donate_argnames: names of other (non-state, non-static) parameters
            whose every leaf is donated, e.g. the batch. Aliasing is proven
            at compile like the state's: a donated leaf no output can reuse
            is a :class:`DonationError`.
        stateless: the step has no state (``compute_gae(rewards, values)``):
            its signature is its arguments' specs, taken from the first call
            or from specs passed to ``.compile(...)``. Nothing is donated
            unless named in ``donate_argnames``.

    Methods and partials: on a method (first parameter ``self``),
    ``obj.step(s)`` runs the step with ``obj`` closed over as configuration,
    not a traced argument: each instance compiles its own step, reading its
    attributes at that compile (later changes are not seen); the bound step is
    kept on the instance. ``Class.step(obj, s)`` works too. On a
    ``functools.partial``, the keyword values it binds are configuration too:
    they are closed over and are not parameters of the step (passing them at a
    call is a ``TypeError``); positionally bound values are closed over as well.

    Returns:
        A :class:`HotStep`, called like ``fn``.

    Raises:
        DefinitionError: no state parameter (and not ``stateless``), a
            missing return annotation, an unknown donated field or parameter
            name, or an invalid option; at a call, an unhashable static value.

    Examples:
        >>> import jax, jax.numpy as jnp, jaxcontracts as jc
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

        A read-only step (the state is not returned: not donated), and a
        stateless one with a static argument:

        >>> @jc.hot_step(signature=S)
        ... def total(s: S) -> jax.Array:
        ...     return s.x.sum()
        >>> float(jc.fetch(total(s)))
        3.0
        >>> @jc.hot_step(stateless=True, static=("power",))
        ... def pow_(x: jax.Array, power: int) -> jax.Array:
        ...     return x**power
        >>> pow_(s.x, 2).tolist()
        [1.0, 1.0, 1.0]
    """
    # Annotations may name classes local to the caller's function: resolve there.
    localns = caller_locals(1)

    def make(f: Callable[P, R]) -> HotStep[P, R]:
        return HotStep(
            analyse(
                f,
                signature=signature,
                donate=donate,
                max_compiles=max_compiles,
                localns=localns,
                state_fields=_state_fields,
                static=static,
                donate_argnames=donate_argnames,
                stateless=stateless,
            )
        )

    return make if fn is None else make(fn)




def _with_static(sig: StepSignature, dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """The call path behind a wrapper that turns static values into tree nodes.

    Static values travel as :class:`StaticArg` nodes of the tree structure
    (hashability is checked when one is made). The node made for the last
    value of each static parameter is reused while the same object comes
    back, so the usual call (one config object) neither hashes nor compares.
    """
    normalize, n_params, static = sig.normalize, len(sig.param_names), sig.static_params
    last: dict[int, tuple[Any, Any]] = {}

    def with_static(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != n_params:
            return dispatch(*normalize(args, kwargs))
        items = list(args)
        for i in static:
            value = items[i]
            seen = last.get(i)
            if seen is not None and seen[0] is value:
                items[i] = seen[1]
            else:
                items = list(normalize(tuple(items), {}))
                last.update((j, (args[j], items[j])) for j in static)
                break
        return dispatch(*items)

    return with_static


class HotStep(Generic[P, R]):
    """An AOT-compiled step whose contracts are checked on every call.

    Made by :func:`jc.hot_step`; call it like the function it wraps.

    Attributes:
        signature: the compiled signature (a tuple with one spec tree per
            parameter), or ``None`` before the first compile.
        compiled: the ``jax.stages.Compiled`` of that signature.
        lowered: its ``jax.stages.Lowered``.
        stats: a :class:`StepStats`.
    """

    def __init__(self, signature: StepSignature) -> None:
        functools.update_wrapper(self, signature.fn)
        self._sig = signature
        self._signatures: list[CompiledSignature] = []
        self._current: CompiledSignature | None = None
        self.stats = StepStats()
        self._level = _config.get_checks()
        _config.add_listener(self)
        # Inside timing loops: seconds timed, calls timed; the same for the first phase.
        self._timing_acc = [0.0, 0, 0.0, 0]
        self._dispatch = self._call_unbound if signature.is_method else self._slow
        _timing.register(self)  # timed while a hot_loop is active
        new_step(id(self), signature.short_name)  # its last-call record, while loops run
        weakref.finalize(self, forget_step, id(self))  # dropped with the step
        self._attr: str | None = None  # the class attribute of a method step
        self._bound_to: tuple[HotStep[Any, Any], Any] | None = None  # (method step, instance)
        # Held by the slow path while it decides on (and makes) a compile, so
        # that threads meeting new signatures at once respect max_compiles.
        # The call paths never take it.
        self._compile_lock = threading.RLock()
        # Set while the slow path re-dispatches a call, per thread.
        self._redispatch = threading.local()
        observers.step_made(self)  # for contract snapshots (jc.snapshot)

    # -- public API --------------------------------------------------------

    @property
    def signature(self) -> tuple[Any, ...] | None:
        """The current compiled signature (one spec tree per parameter), or None."""
        return None if self._current is None else self._current.spec_args

    @property
    def compiled(self) -> Any:
        """The current signature's ``jax.stages.Compiled``, or None."""
        return None if self._current is None else self._current.compiled

    @property
    def lowered(self) -> Any:
        """The current signature's ``jax.stages.Lowered``, or None."""
        return None if self._current is None else self._current.lowered

    @property
    def signatures(self) -> list[tuple[Any, ...]]:
        """Every compiled signature, oldest first."""
        return [cs.spec_args for cs in self._signatures]

    @property
    def state_type(self) -> Any:
        """The state type (the ``signature=`` option, or the first annotation)."""
        return self._sig.state_type

    def describe(self) -> StepDescription:
        """A frozen record of the step: options, compiled signatures, counters.

        Each compiled signature lists its leaves (path, spec, donated,
        aliased, bytes), the memory analysis and compile time: what was
        compiled and proven. ``stats`` is a copy.
        """
        sig = self._sig
        return StepDescription(
            name=sig.name,
            donate=sig.donate,
            max_compiles=sig.max_compiles,
            params=sig.param_names,
            state_params=tuple(sig.param_names[i] for i in sig.state_params),
            signatures=tuple(self._signatures),
            current=self._current,
            stats=dataclasses.replace(self.stats),
        )

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower for these arguments or specs, without compiling or checking."""
        self._unbound_misuse("lower")
        positional = self._sig.normalize(args, kwargs)
        misuse = api_misuse_error(self._sig, positional, compiling=True)
        if misuse is not None:
            raise misuse
        jitted, spec_args, *_ = jit_for(self._sig, positional)
        with quiet_donation_warning():
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
        self._unbound_misuse("compile")
        positional = self._sig.normalize(args, kwargs)
        misuse = api_misuse_error(self._sig, positional, compiling=True)
        if misuse is not None:
            raise misuse
        leaves, treedef = flatten(positional)
        with self._compile_lock:
            for cs in self._signatures:
                if not signature_diffs(cs, leaves, treedef):
                    self._use(cs)
                    return cs.compiled
            return self._new_signature(positional).compiled

    # -- methods -------------------------------------------------------------

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """``obj.step``: this method's step with ``obj`` closed over.

        ``self`` is configuration, not a traced argument: the step compiles
        once per instance, reading the instance's attributes at that compile
        (later changes to them are not seen). The bound step is kept in the
        instance's ``__dict__``, so ``obj.step`` stays one attribute read.
        """
        if obj is None or not self._sig.is_method:
            return self
        bound: HotStep[Any, Any] = HotStep(self._sig.bind(obj))
        bound._bound_to = (self, obj)
        if self._attr is not None and isinstance(getattr(obj, "__dict__", None), dict):
            obj.__dict__[self._attr] = bound
        return bound

    def __copy__(self) -> HotStep[P, R]:
        return self  # like a function: one step, one compiled executable

    def __deepcopy__(self, memo: dict[int, Any]) -> HotStep[P, R]:
        """A step is copied like a function, by reference; a method step
        bound to an instance being copied is bound anew to the copy."""
        if self._bound_to is not None:
            method, obj = self._bound_to
            copy = memo.get(id(obj))
            if copy is not None and copy is not obj:
                return method.__get__(copy, type(copy))  # type: ignore[no-any-return]
        return self

    def __reduce__(self) -> str:
        """Pickled by reference (module and qualified name), like a function."""
        return str(getattr(self, "__qualname__", type(self).__qualname__))

    def _call_unbound(self, *args: Any, **kwargs: Any) -> Any:
        """``Class.step(obj, s)``: bind ``obj``, then call."""
        __tracebackhide__ = True
        if not args:
            raise TypeError(
                f"{self._sig.name}() is a method: call it on an instance (obj.{self._sig.short_name}(...))."
            )
        return self.__get__(args[0], type(args[0]))(*args[1:], **kwargs)

    def _unbound_misuse(self, what: str) -> None:
        if self._sig.is_method:
            raise DefinitionError(
                f"{self._sig.name} is a method: {what} it through an instance, "
                f"whose attributes the step closes over.",
                fix=f"obj.{self._sig.short_name}.{what}(...)",
                contract="definition",
                step=self._sig.name,
            )

    if typing.TYPE_CHECKING:

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    else:
        # A call goes straight to the current call path, with no Python frame
        # of its own: the type's call slot finds this property and calls what
        # it returns (one C-level attribute read).
        __call__ = property(
            operator.attrgetter("_call"),
            doc="Call the step like the function it wraps (compiles on first use).",
        )

    def report(self) -> Report:
        """A :class:`jc.Report` of the current signature: leaves, memory, contracts.

        ``str()`` of it is a text table; in a notebook it renders as HTML.
        Its ``compiled`` fact says where the executable came from and how
        long compiling took (``describe().current.cache`` and
        ``.compile_seconds``).

        Restarting without recompiling: turn on JAX's persistent compilation
        cache before the first compile, and a later process compiling the
        same step from the same spec loads the executable from disk::

            jax.config.update("jax_compilation_cache_dir", "/path/to/cache")
            # small steps compile fast and are small: let every one qualify
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

        (or the environment variables ``JAX_COMPILATION_CACHE_DIR`` etc.).
        A cache hit is verified like a fresh compile: carry invariance comes
        from the trace, aliasing from the loaded executable's alias table.
        The report then reads ``compiled: from the persistent compilation
        cache (N ms, contracts verified)``.
        """
        return step_report(self.describe())

    def __repr__(self) -> str:
        state = "not compiled" if self._current is None else f"{len(self._signatures)} signature(s)"
        return f"<jc.hot_step {self._sig.name} ({state}, donate={self._sig.donate!r})>"

    # -- compiling and choosing the call path ------------------------------

    def _new_signature(self, positional: tuple[Any, ...]) -> CompiledSignature:
        __tracebackhide__ = True
        if len(self._signatures) >= self._sig.max_compiles:
            raise self._refuse(positional)
        cs = compile_signature(self._sig, positional, sealed=is_sealed_state)
        self._signatures.append(cs)
        self.stats.compiles += 1
        self.stats.compile_seconds += cs.compile_seconds
        self.stats.cache_hits += cs.cache == "hit"
        self._use(cs)
        if observers.recorders:
            observers.compiled(self)
        return cs

    @property
    def _dispatch(self) -> Callable[..., Any]:
        """The current call path (what ``__call__`` runs, untimed)."""
        return self._raw_dispatch

    @_dispatch.setter
    def _dispatch(self, fn: Callable[..., Any]) -> None:
        self._raw_dispatch = fn
        self._call = self._timed(fn) if _timing.active() else fn

    def _timing_changed(self, on: bool) -> None:
        """A timing loop became active (or the last one ended): wrap or unwrap."""
        fn = self._raw_dispatch
        if on:
            self._call = self._timed(fn)
        else:
            call_hooks.pop(id(self), None)
            self._call = fn

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        call, rearm = _timing.timed(fn, self._timing_acc, self._install_call)
        call_hooks[id(self)] = rearm
        return call

    def _install_call(self, fn: Callable[..., Any]) -> None:
        self._call = fn

    def _on_checks_changed(self, level: str) -> None:
        self._level = level
        if self._current is not None:
            self._use(self._current)

    def _use(self, cs: CompiledSignature) -> None:
        self._current = cs
        dispatch = make_dispatch(
            cs,
            self._level,
            step_id=id(self),
            name=self._sig.short_name,
            n_params=len(self._sig.param_names),
            n_state_params=len(self._sig.state_params),
            slow_call=self._slow_call,
            stats=self.stats,
            not_consumed=self._not_consumed,
            flat_fields=_flat_fields,
            marks=self._marks(cs),
            normalize=self._sig.normalize,
        )
        self._dispatch = _with_static(self._sig, dispatch) if self._sig.static_params else dispatch

    def _marks(self, cs: CompiledSignature) -> tuple[tuple[int, type, type], ...]:
        """The jc.state parameters with donated leaves: (index, class, consumed class)."""
        if not cs.donated:
            return ()
        ends, n = [], 0
        for spec in cs.spec_args:
            n += len(jax.tree_util.tree_leaves(spec))
            ends.append(n)
        marks = []
        for i in self._sig.state_params:
            start = ends[i - 1] if i else 0
            if is_state(cs.spec_args[i]) and any(start <= d < ends[i] for d in cs.donated):
                cls = type(cs.spec_args[i])
                marks.append((i, cls, consumed_class(cls, self._sig.short_name)))
        return tuple(marks)

    def _put_host_leaves(self, positional: tuple[Any, ...]) -> tuple[Any, ...]:
        """Host leaves put on the device, in the compiled signature's dtypes when it fits."""
        leaves, treedef = jax.tree_util.tree_flatten(positional)
        current = self._current
        fits = current is not None and treedef == current.in_treedef
        with jax.transfer_guard_host_to_device("allow"):  # recorded already, as the call's
            put = [
                x
            if isinstance(x, jax.Array)
                else jax.device_put(np.asarray(x, current.leaves[i].spec.dtype if fits else None))  # type: ignore[union-attr]
                for i, x in enumerate(leaves)
            ]
        return tuple(jax.tree_util.tree_unflatten(treedef, put))

    def _refuse(self, positional: tuple[Any, ...]) -> Exception:
        self.stats.refused += 1
        assert self._current is not None
        return signature_error(self._sig, self._current, len(self._signatures), positional)

    def _not_consumed(self, cs: CompiledSignature, leaves: Any, out: Any) -> DonationError | None:
        """The error for donated buffers XLA copied; ``None`` once a recording loop took it."""
        self.stats.not_consumed += 1
        err = not_consumed_error(self._sig, cs, leaves, out)
        loop = recording_loop()
        if loop is None:
            return err
        loop.violation(
            "donation",
            f"{self._sig.name}: donated input buffer(s) not consumed (XLA copied "
            f"them): {', '.join(err.leaves)}",
            err.fix or "",
            DonationError,
        )
        return None

    # -- the slow path -----------------------------------------------------

    def _slow(self, *args: Any, **kwargs: Any) -> Any:
        """Everything the fast paths do not handle; raises before dispatch."""
        __tracebackhide__ = True
        return self._slow_call(args, kwargs, None)

    def _slow_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException | None) -> Any:
        __tracebackhide__ = True
        if exc is None:
            return self._decide(args, kwargs, None)
        # Called from the closure's `except`: our own diagnosis replaces the
        # executable's error (its text adds nothing), so it is not chained.
        try:
            return self._decide(args, kwargs, exc)
        except ContractError as err:
            if err.__context__ is exc:
                raise err.with_traceback(err.__traceback__) from None
            raise

    def _decide(self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException | None) -> Any:
        __tracebackhide__ = True
        sig = self._sig
        all_leaves = jax.tree_util.tree_leaves((args, kwargs))
        if not trace_state_clean() or any(isinstance(x, Tracer) for x in all_leaves):
            # Under an outer transformation (jit, vmap, grad, cond...), even on
            # concrete arrays it closed over: trace the function, donate nothing.
            self.stats.traced_calls += 1
            if sig.static_params:
                return sig.positional(*sig.normalize(args, kwargs))
            return sig.fn(*args, **kwargs)
        positional = sig.normalize(args, kwargs)
        with_path, treedef = jax.tree_util.tree_flatten_with_path(positional)
        leaves = [x for _, x in with_path]
        paths = [sig.param_path(p) for p, _ in with_path]

        host = [(p, x) for p, x in zip(paths, leaves) if not isinstance(x, jax.Array)]
        if host:
            misuse = api_misuse_error(sig, positional, compiling=False)
            loop = None if misuse else recording_loop()
            if loop is None or not loop.checks_transfers:
                self.stats.refused += 1
                raise misuse or host_leaves_error(sig, host)
            # Record mode: the violation, then the call JAX would have made
            # (the host leaves copied to the device), so the run goes on.
            loop.violation(
                "transfer",
                f"{sig.name}: host argument leaf/leaves copied to the device on every "
                f"call: {', '.join(f'{p} ({fmt_value(x)})' for p, x in host)}",
                host_leaves_error(sig, host).fix or "",
                TransferError,
            )
            return self._decide(self._put_host_leaves(positional), {}, exc)
        current = self._current
        donated = current.donated if current is not None else sig.donated_leaves([p for p, _ in with_path])
        ran = exc is not None and is_runtime_error(exc)
        if ran and any(leaves[i].is_deleted() for i in donated):
            # The executable failed while running (a callback raised, out of
            # memory...) after XLA took the donated buffers: JAX's error is the
            # real one; say what it cost instead of diagnosing the deleted inputs.
            assert exc is not None
            exc.add_note(run_failed_note(sig, paths, leaves, donated))
            raise exc
        deleted, duplicates = find_hazards(leaves, donated)
        if deleted or duplicates:
            self.stats.refused += 1
            consumers = [consumer_of(positional[p[0].idx]) for p, _ in with_path]
            raise hazard_error(sig, paths, leaves, deleted, duplicates, donated, consumers)

        with self._compile_lock:  # another thread may be compiling a signature
            for cs in self._signatures:
                if not signature_diffs(cs, leaves, treedef):
                    if exc is not None and cs is current:
                        if ran and donated:
                            exc.add_note(run_failed_note(sig, paths, leaves, donated))
                        raise exc  # the signature is right: a genuine runtime error
                    self._use(cs)
                    break
            else:
                if self._current is not None and len(self._signatures) >= sig.max_compiles:
                    raise self._refuse(positional)
                self._new_signature(positional)
            dispatch = self._dispatch
        redispatch = self._redispatch
        if getattr(redispatch, "active", False):
            # The call path sent back arguments this path found matching: a
            # disagreement between the two would recurse without end.
            raise RecompileError(
                f"{sig.name}: the call path refused arguments that match its compiled "
                "signature (an internal disagreement; please report it).",
                [f"  {p}: {fmt_value(x)}" for p, x in zip(paths, leaves)],
                fix="as a workaround, set jc.set_checks(\"off\") around this call.",
                note=INPUTS_INTACT,
                contract="signature",
                step=sig.name,
            )
        redispatch.active = True
        try:
            return dispatch(*positional)
        finally:
            redispatch.active = False
