"""``jc.HotStep``: a compiled signature (``compile``) and its call path for the
checks level (``callpath``); the slow path here diagnoses what the call path does
not handle (``diagnose``) or compiles a new signature within ``max_compiles``."""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import typing
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar

import jax

from .. import _config, _steps
from .._compat.guarded import guarded_call
from .._compat.runtime_errors import debug_nans_kind, is_runtime_error
from .._compat.tracing import Tracer, flatten, jit_disabled, trace_state_clean
from .._contracts.transfers import debug_reads_on
from .._errors import (
    INPUTS_INTACT,
    ContractError,
    DefinitionError,
    DonationError,
    RecompileError,
    TransferError,
)
from .._format import flatten_with_path
from .._hazards import find_hazards
from .._marks import consumer_of
from .._records import CompiledSignature, StepDescription, StepStats
from .._report.render import Report, step_report
from .._runtime import observers, recording_loop
from .._state.filter import join_out
from .._state.foreign import host_leaves_on_device
from .._state.inplace import is_ref, ref_arrays, ref_params
from .._state.spec import fmt_value, hashed_by_value, leaf_spec, static_hash
from .._tracebacks import boundary, let_go, trim
from .callctx import HOST_TYPES, call_tree
from .callpath import make_dispatch
from .callwrap import in_place_call, inside_in_place_call, module_params
from .compile import compile_signature, jit_for, quiet_donation_warning, signature_diffs
from .definition import StepDefinition
from .diagnose import (
    api_misuse_error,
    hazard_error,
    host_leaves_error,
    invalid_values_error,
    new_signature_cause,
    not_consumed_error,
    run_failed_note,
    signature_error,
)
from .diffs import key_difference, same_structure

__all__ = ["HotStep", "StepStats"]

P = ParamSpec("P")
R = TypeVar("R")


# The call slot reads the instance's one call path, ``_call`` (no Python frame of its own).
_CALL = property(
    operator.attrgetter("_call"),
    doc="Call the step like the function it wraps (compiles on first use).",
)


class HotStep(Generic[P, R]):
    """An AOT-compiled step whose contracts are checked on every call.

    Made by :func:`jc.hot_step`; call it like the function it wraps.

    Attributes:
        signature: the compiled signature (a tuple with one spec tree per
            parameter), or ``None`` before the first compile.
        compiled: the ``jax.stages.Compiled`` of that signature.
        lowered: its ``jax.stages.Lowered``.
        stats: a :class:`StepStats`.

    Its other public attributes are the protocol the library's own modules
    read (``_steps.LiveStep``, ``_step.callctx.DispatchingStep``), not user API.
    """

    def __init__(self, signature: StepDefinition) -> None:
        functools.update_wrapper(self, signature.fn)
        self._definition = signature
        self._signatures: list[CompiledSignature] = []
        self._aliases: list[CompiledSignature] = []  # see _alias_for
        self._current: CompiledSignature | None = None
        self._paths: dict[tuple[int, str], tuple[StepDefinition, Callable[..., Any]]] = {}  # _use
        self.stats = StepStats()
        self._level = _config.get_checks()
        self.timing_counters = [0.0, 0, 0.0, 0]  # see _steps.LiveStep
        self.timing_due = [True]
        self.last_output: list[Any] = [None]
        self.last_consumed: list[Any] = [None]  # see _steps.LiveStep
        self._call = self._call_unbound if signature.is_method else self._slow
        self._bound_to: tuple[HotStep[Any, Any], Any] | None = None  # (method step, instance)
        self._bound_hash: Any = None  # the instance's hash at the bind (_value_hash)
        # A method step's bound steps for __slots__ instances: (ref, bound, binds)
        self._bound_steps: dict[int, tuple[weakref.ref[Any], HotStep[Any, Any], int]] = {}
        # The slow path's: held while it decides on (and makes) a compile, so
        # threads meeting new signatures at once respect max_compiles; and,
        # per thread, set while it re-dispatches a call.
        self._compile_lock = threading.RLock()
        self._redispatch = threading.local()
        _steps.register(self)  # the checks level, loop timing, messages, snapshots

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
        """The current signature's ``jax.stages.Lowered``, or None.

        Lowered again at each read (no compile): keeping it would hold about
        six times the executable's memory.
        """
        if self._current is None:
            return None
        return self._lower(self._current.spec_args)

    @property
    def signatures(self) -> list[tuple[Any, ...]]:
        """Every compiled signature, oldest first."""
        return [cs.spec_args for cs in self._signatures]

    @property
    def state_type(self) -> Any:
        """The state type (the ``signature=`` option, or the first annotation)."""
        return self._definition.state_type

    def describe(self) -> StepDescription:
        """A frozen record of the step: options, compiled signatures (what was
        compiled and proven: leaves, memory, compile time), counters (a copy)."""
        definition = self._definition
        return StepDescription(
            name=definition.name,
            donate=definition.donate,
            max_compiles=definition.max_compiles,
            params=definition.param_names,
            state_params=tuple(definition.param_names[i] for i in definition.state_params),
            signatures=tuple(self._signatures),
            current=self._current,
            stats=dataclasses.replace(self.stats),
        )

    @boundary
    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower for these arguments or specs, without compiling or checking."""
        return self._lower(self._to_compile("lower", args, kwargs))

    def _lower(self, positional: tuple[Any, ...]) -> Any:
        plan = jit_for(self._definition, positional)
        self._learn(plan.definition)
        with quiet_donation_warning():
            return plan.jitted.trace(*plan.spec_args).lower()

    @boundary
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
        positional = self._to_compile("compile", args, kwargs)
        leaves, treedef = flatten(positional)
        with self._compile_lock:
            cs = _matching(self, leaves, treedef)
            if cs is not None:
                self._use(cs)
                return cs.compiled
            return self._new_signature(positional).compiled

    def report(self) -> Report:
        """A :class:`jc.Report` of the current signature: leaves, memory, contracts.

        ``str()`` of it is a text table; in a notebook it renders as HTML. Its
        ``compiled`` fact says where the executable came from (JAX's persistent
        compilation cache: see the performance guide) and how long it took.
        """
        return step_report(self.describe())

    def __repr__(self) -> str:
        state = "not compiled" if self._current is None else f"{len(self._signatures)} signature(s)"
        return (
            f"<jc.hot_step {self._definition.name} ({state}, donate={self._definition.donate!r})>"
        )

    if typing.TYPE_CHECKING:

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    else:  # no Python frame of ours: the call slot reads `_call` (in C) and calls it
        __call__ = _CALL

    # -- methods -------------------------------------------------------------

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """``obj.step``: this method's step with ``obj`` closed over as configuration.

        One compile per instance (per hash, where it hashes by value). The
        bound step is kept in ``obj.__dict__`` under a private key (a subclass's
        override still runs; a ``copy.copy`` is checked and bound anew), or
        here by weak reference for ``__slots__`` instances.
        """
        if obj is None or not self._definition.is_method:
            return self
        try:
            return self._bind(obj)
        except ContractError as err:  # the traceback ends at the user's line
            trim(err)
            raise

    def _bind(self, obj: Any) -> HotStep[Any, Any]:
        namespace = getattr(obj, "__dict__", None)
        if type(namespace) is dict:
            key = self._key
            kept = namespace.get(key)
            # bound by identity (a class hashed so, an instance that cannot change): no hash asked
            if self._bound_here(kept, obj) and kept._bound_hash is None:
                return kept
            try:
                value_hash = self._instance_key(obj)
            except ContractError as err:
                return self._refusing(obj, err)
            by_hash = kept if type(kept) is _ByHash and kept.owned_by(self, obj) else None
            # one bound step per key, as jax.jit keys a static self
            if value_hash is not None and by_hash is not None:
                kept = by_hash.get(value_hash)
                if self._bound_here(kept, obj):
                    return kept
                refused = self._past_max_compiles(obj, by_hash.binds, by_hash.last, value_hash)
                if refused is not None:
                    return self._refusing(obj, refused)
            # obj -> bound -> obj: a cycle gc collects
            bound: HotStep[Any, Any] = HotStep(self._definition.bind(obj))
            bound._bound_to, bound._bound_hash = (self, obj), value_hash
            if value_hash is None:
                namespace[key] = bound
                return bound
            if by_hash is None:  # (a copy's entries are the original's: its own table)
                by_hash = namespace[key] = _ByHash()
            by_hash[value_hash] = bound  # in place: a hash over vars(obj) sees one object
            by_hash.binds, by_hash.last = by_hash.binds + 1, value_hash
            while len(by_hash) > _BOUND_PER_INSTANCE:
                del by_hash[next(iter(by_hash))]
            return bound
        kept = self._bound_steps.get(id(obj))
        try:
            value_hash = self._instance_key(obj)
        except ContractError as err:
            return self._refusing(obj, err)
        binds = 0
        if kept is not None and kept[0]() is obj:
            if kept[1]._bound_hash == value_hash:
                return kept[1]
            binds = kept[2]
            refused = self._past_max_compiles(obj, binds, kept[1]._bound_hash, value_hash)
            if refused is not None:
                return self._refusing(obj, refused)
        try:
            ref = weakref.ref(obj, functools.partial(_forget_bound, self._bound_steps, id(obj)))
        except TypeError:  # neither a __dict__ nor a __weakref__ slot
            raise DefinitionError(
                f"{self._definition.name} is a method step of a {type(obj).__name__}, "
                "whose instances have neither a __dict__ nor weak references (__slots__): "
                "its bound step cannot be kept, so every access would make "
                "(and compile) a new one.",
                fix=f'add "__weakref__" to {type(obj).__name__}.__slots__ (or drop __slots__).',
                contract="definition",
                step=self._definition.name,
            ) from None
        bound = HotStep(self._definition.bind(obj, weak=True))
        bound._bound_to, bound._bound_hash = (self, ref), value_hash
        self._bound_steps[id(obj)] = (ref, bound, binds + 1)
        return bound

    def _refusing(self, obj: Any, error: ContractError) -> HotStep[Any, Any]:
        """A bound step whose every call raises ``error``: refused at the call, as
        ``jax.jit`` does, so ``hasattr(obj, "step")`` still works."""
        bound: HotStep[Any, Any] = HotStep(self._definition.bind(obj))
        bound._bound_to = (self, obj)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            try:
                raise error.with_traceback(None)
            except ContractError as err:  # the traceback ends at the user's line
                trim(err)
                raise

        bound._call = refuse
        return bound

    def _instance_key(self, obj: Any) -> Any:
        """What a bound step is keyed by: None (bound once) for identity hashing,
        an equinox Module or a frozen dataclass whose hash fails; else its hash
        and ``==``, as ``jax.jit`` (0.11 on) keys a static ``self``. Refused
        where any other hash fails: no program could be told from a stale one."""
        cls = type(obj)
        if cls.__hash__ is object.__hash__ or _equinox_module(cls):
            return None
        hashed = static_hash(obj) if cls.__hash__ is not None else -1
        if hashed != -1:
            return hashed_by_value(obj, hashed)
        if getattr(getattr(cls, "__dataclass_params__", None), "frozen", False):
            return None
        try:
            hash(obj)
            cause = "it has no __hash__"
        except Exception as err:  # noqa: BLE001 - a field that hashes by nothing (a list, an array)
            cause = f"{type(err).__name__}: {err}"
        raise DefinitionError(
            f"{self._definition.name} is a method step of a {cls.__name__}, and hash() of this one "
            f"fails ({cause}): a program compiled for its values could not tell when they change, "
            "and would run stale. jax.jit refuses an unhashable static argument too.",
            fix=f"bind it once per instance: @dataclasses.dataclass(eq=False) (or no __eq__) on "
            f"{cls.__name__}; or make it hashable by value "
            "(frozen=True or unsafe_hash=True, a tuple instead of a list), so that each new value "
            "compiles; or pass what changes as an argument.",
            contract="definition",
            step=self._definition.name,
        )

    def _past_max_compiles(
        self, obj: Any, binds: int, last: Any, key: Any
    ) -> RecompileError | None:
        """The refusal where ``obj`` was bound for ``max_compiles`` values already."""
        limit = self._definition.max_compiles
        if binds < limit:
            return None
        where_, was, now = key_difference(last, key)
        at = f" at self{where_}" if where_ else ""
        return RecompileError(
            f"{self._definition.name} is a method step of a {type(obj).__name__}, compiled for "
            f"{binds} value(s) of this instance (max_compiles={limit}); the instance has changed "
            f"since{at}: {was} -> {now}. Each value of `self` is a compile of its own, as each "
            "value of a static argument is.",
            fix=f"allow more with @jc.hot_step(max_compiles={binds + 1}), where it takes a "
            "few values; where it changes at every step, pass that value to the step as an "
            "argument (an array), so that one program serves every value.",
            contract="signature",
            step=self._definition.name,
        )

    def _bound_here(self, kept: Any, obj: Any) -> bool:
        """Whether ``kept`` (an entry of ``obj.__dict__``) is this method step bound to ``obj``."""
        return (
            type(kept) is HotStep
            and kept._bound_to is not None
            and kept._bound_to[0] is self
            and kept._bound_to[1] is obj
        )

    @functools.cached_property
    def _key(self) -> str:
        """The key of the bound step in an instance's ``__dict__`` (one per method step)."""
        return f"_jc_step_{self._definition.short_name}_{id(self):x}"

    def __copy__(self) -> HotStep[P, R]:
        return self  # like a function: one step, one compiled executable

    def __deepcopy__(self, memo: dict[int, Any]) -> HotStep[P, R]:
        """A step is copied like a function, by reference; a method step
        bound to an instance being copied is bound anew to the copy."""
        if self._bound_to is not None:
            method, obj = self._bound_to
            if isinstance(obj, weakref.ref):  # bound to an instance with __slots__
                obj = obj()
            copy = memo.get(id(obj))
            if copy is not None and copy is not obj:
                if (
                    getattr(copy, "__dict__", None) is not None
                    and memo.get(id(obj.__dict__)) is not None
                ):
                    # the entry of the copy's __dict__, copied while the copy is half-built:
                    # the method step, which binds to the copy at its first access
                    return method
                return method.__get__(copy, type(copy))  # type: ignore[no-any-return]
        return self

    def __reduce__(self) -> Any:
        """Pickled by reference, like a function; a bound step as its method step."""
        if self._bound_to is not None:
            return _method_step, (self._bound_to[0],)
        return str(getattr(self, "__qualname__", type(self).__qualname__))

    def _call_unbound(self, *args: Any, **kwargs: Any) -> Any:
        """``Class.step(obj, s)``: bind ``obj``, then call."""
        __tracebackhide__ = True
        if not args:
            raise TypeError(
                f"{self._definition.name}() is a method: call it on an instance "
                f"(obj.{self._definition.short_name}(...))."
            )
        obj, args = args[0], args[1:]
        try:
            return self.__get__(obj, type(obj))(*args, **kwargs)
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    def _to_compile(
        self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, ...]:
        """The arguments of ``lower``/``compile`` by position, refused on misuse."""
        if self._definition.is_method:
            raise DefinitionError(
                f"{self._definition.name} is a method: {what} it through an instance, "
                f"whose attributes the step closes over.",
                fix=f"obj.{self._definition.short_name}.{what}(...)",
                contract="definition",
                step=self._definition.name,
            )
        positional = self._definition.normalize(args, kwargs)
        misuse = api_misuse_error(self._definition, positional, compiling=True)
        if misuse is not None:
            raise misuse
        # As at a call: the non-array leaves of equinox Modules are static (_filter).
        with_path = jax.tree_util.tree_flatten_with_path(positional)[0]
        odd = [
            (self._definition.param_path(p), x)
            for p, x in with_path
            if leaf_spec(x) is None and p[0].idx not in self._definition.host_params
        ]
        if odd and _learn_modules(self, positional, with_path, odd):
            positional = self._definition.normalize(args, kwargs)
        # Host values every call would refuse: refused here too, with the same fix.
        host = [
            (self._definition.param_names[i], x)
            for i, x in enumerate(positional)
            if isinstance(x, HOST_TYPES)
            and i not in self._definition.host_params
            and i not in self._definition.static_params
        ]
        if host:
            err = host_leaves_error(self._definition, host)
            raise TransferError(
                f"{self._definition.short_name}.{what}() was given {len(host)} host value(s) where "
                "every call would refuse them (an implicit host-to-device transfer at each call):",
                [f"  {p}: {fmt_value(x)}" for p, x in host],
                fix=f"{what} with what the calls will pass: {err.fix}",
                contract="device-arguments",
                step=self._definition.name,
                leaves=[p for p, _ in host],
            )
        refs = self._definition.ref_params  # compiled for the arrays the refs hold
        return tuple(ref_arrays(x)[0] if i in refs else x for i, x in enumerate(positional))

    # -- the protocol the library's modules read (_steps, callctx) --------

    @property
    def name(self) -> str:
        """``module.qualname`` of the step's function."""
        return self._definition.name

    @property
    def short_name(self) -> str:
        """The step's own name, as messages write it (``advance``)."""
        return self._definition.short_name

    @property
    def donates(self) -> bool:
        """Whether one of its compiled signatures donates buffers (see ``_steps.LiveStep``)."""
        return any(cs.donated for cs in self._signatures)

    @property
    def definition(self) -> StepDefinition:
        """What the decorator learnt of the function: parameters, state, donation."""
        return self._definition

    def checks_changed(self, level: str) -> None:
        """The checks level changed: rebuild the call path for it."""
        self._level = level
        if self._current is not None:
            self._use(self._current)
        elif not self._definition.is_method:
            self._call = self._slow

    def slow_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException | None
    ) -> Any:
        """Everything the call path does not handle. ``exc``: the executable's
        error (our diagnosis replaces it, unchained), or the call path's refusal."""
        __tracebackhide__ = True
        try:
            return _decide(self, args, kwargs, exc)
        except BaseException as err:
            let_go(err.__traceback__)  # a kept traceback holds none of the call's arrays
            if isinstance(err, ContractError) and exc is not None and err.__context__ is exc:
                raise err from None
            raise

    def not_consumed(
        self, cs: CompiledSignature, leaves: Sequence[Any], out: Any
    ) -> DonationError | None:
        """The error for donated buffers XLA copied; ``None`` once a recording loop took it."""
        self.stats.not_consumed += 1
        err = not_consumed_error(self._definition, cs, leaves, out)
        loop = recording_loop()
        if loop is None:
            return err
        loop.violation(
            "donation",
            f"{self._definition.name}: donated input buffer(s) not consumed (XLA copied "
            f"them): {', '.join(err.leaves)}",
            err.fix or "",
        )
        return None

    # -- compiling and choosing the call path ------------------------------

    def _learn(self, definition: StepDefinition) -> None:
        """The one place the step's definition changes after the decorator: a new
        frozen definition with what a compile or call found (returns, in-place
        objects, refs, filtered Modules)."""
        self._definition = definition

    def _new_signature(self, positional: tuple[Any, ...]) -> CompiledSignature:
        __tracebackhide__ = True
        if len(self._signatures) >= self._definition.max_compiles:
            raise self._refuse(positional)
        current = self._current
        why = (
            new_signature_cause(self._definition, current, positional)
            if current is not None
            else ""
        )
        cs, definition = compile_signature(self._definition, positional, why)
        self._learn(definition)
        self._signatures.append(cs)
        self.stats.compiles += 1
        self.stats.compile_seconds += cs.compile_seconds
        self.stats.cache_hits += cs.cache == "hit"
        self._use(cs)
        if observers.recorders:
            observers.compiled(self)
        return cs

    def _use(self, cs: CompiledSignature) -> None:
        """Make ``cs``'s call path at the current level the step's, kept per
        definition: a level set back reuses its closure and its C++ call's cache."""
        self._current = cs
        # cs lives in _signatures (or _aliases, its paths dropped with it): no id reused
        key = (id(cs), self._level)
        kept = self._paths.get(key)
        self._call = (
            self._build_at_call(cs, key)
            if kept is None or kept[0] is not self._definition
            else kept[1]
        )

    def _build_at_call(self, cs: CompiledSignature, key: tuple[int, str]) -> Callable[..., Any]:
        """A call path that builds ``cs``'s closure at its first call (as
        ``jax.stages.Compiled`` does its C++ call): none built unused."""
        definition, level = self._definition, self._level

        def first_call(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            kept = self._paths.get(key)
            if kept is None or kept[0] is not definition:
                kept = (definition, make_dispatch(cs, level, self))
                # not an alias evicted meanwhile
                if any(c is cs for c in (*self._signatures, *self._aliases)):
                    self._paths[key] = kept
            if self._current is cs and self._level == level and self._definition is definition:
                self._call = kept[1]
            try:
                return kept[1](*args, **kwargs)
            except Exception as err:  # the traceback ends at the user's line
                trim(err)
                raise

        return first_call

    def _refuse(self, positional: tuple[Any, ...]) -> Exception:
        self.stats.refused += 1
        assert self._current is not None
        return signature_error(self._definition, self._current, len(self._signatures), positional)

    def _slow(self, *args: Any, **kwargs: Any) -> Any:
        """The call path before the first compile."""
        __tracebackhide__ = True
        try:
            return self.slow_call(args, kwargs, None)
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise


#: The bound steps kept per instance hashed by value: its latest hashes'.
_BOUND_PER_INSTANCE = 8


class _ByHash(dict):  # type: ignore[type-arg]
    """An instance's bound steps by its hash (hashed by identity itself: a class's
    hash may read ``vars()``); ``binds``: values bound so far; ``last``: the latest."""

    __hash__ = object.__hash__  # type: ignore[assignment]
    binds = 0
    last: Any = None

    def owned_by(self, method: HotStep[Any, Any], obj: Any) -> bool:
        return all(method._bound_here(b, obj) for b in self.values())


def _equinox_module(cls: type) -> bool:
    """Whether ``cls`` is an equinox Module: immutable after init (its array
    fields fail its hash)."""
    return any(
        c.__module__.split(".")[0] == "equinox" and c.__name__ == "Module" for c in cls.__mro__
    )


def _method_step(step: HotStep[Any, Any]) -> HotStep[Any, Any]:
    """An unpickled bound step: its method step (the instance binds anew)."""
    return step


def _forget_bound(bound: dict[int, Any], key: int, ref: Any) -> None:
    """An instance bound to is gone: forget its bound step (if the id is still its)."""
    entry = bound.get(key)
    if entry is not None and entry[0] is ref:
        del bound[key]


# --------------------------------------------------------------------------
# The slow path: diagnose a call the call path refused, or compile for it


def _decide(
    step: HotStep[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: BaseException | None,
) -> Any:
    __tracebackhide__ = True
    definition = step._definition
    given = inside_in_place_call(step)  # the caller's refs and objects, as given
    if (
        not trace_state_clean()
        or jit_disabled()
        or any(isinstance(x, Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))
    ):
        # Under a transformation (even over closed-over concrete arrays): trace,
        # donate nothing; under jax.disable_jit(): run op by op, as jax.jit does.
        step.stats.traced_calls += 1
        # (the function takes each argument by kind; in its own in-place call
        # the step updates its refs and objects itself)
        bound = given if given is not None else definition.normalize(args, kwargs)
        out = definition.positional(*bound)
        out = join_out(out) if definition.filtered_params else out
        return out if given is None else (out, tuple(given[i] for i in definition.inplace_params))
    if given is None and (definition.inplace_params or definition.ref_params):
        # Called directly (a first call, jc.check): around the call, what the
        # in-place call path does (refs passed as their arrays, written back)
        return in_place_call(
            definition,
            step,
            lambda *items: _decide(step, items, {}, exc),
            definition.normalize(args, kwargs),
        )
    positional = definition.normalize(args, kwargs)
    with_path, treedef = flatten_with_path(positional)
    leaves = [x for _, x in with_path]
    paths = [definition.param_path(p) for p, _ in with_path]
    declared = definition.host_params
    host = [
        (p, x)
        for (path, x), p in zip(with_path, paths)
        if not isinstance(x, jax.Array) and path[0].idx not in declared
    ]
    if host:
        try:
            filtered = _learn_modules(step, positional, with_path, host)
        except DefinitionError:  # refs: a refused call
            step.stats.refused += 1
            raise
        if filtered:  # equinox Modules: their non-array leaves are static (_filter)
            del with_path, leaves, host, positional  # the kept-leaf check counts references
            return _decide(step, args, kwargs, exc)
        # the kept-leaf check of the call made on the device counts references
        del leaves, with_path
        return _host_arguments(step, positional, host, exc)
    current = step._current
    donated = current.donated if current is not None else definition.donated_leaves(
        [p for p, _ in with_path]
    )
    if exc is not None:
        nans = debug_nans_kind(exc)
        if nans is not None:  # jax_debug_nans / jax_debug_infs: the output held a nan
            raise invalid_values_error(
                definition, step._current, positional, leaves, paths, nans
            ) from None
    # JAX's runtime error, or a loop's refusal of jax_debug_nans' read of the
    # outputs after the program ran (before it runs, such a read is a DonationError)
    debug = (
        debug_reads_on() if isinstance(exc, TransferError) and exc.__traceback__ is not None else []
    )
    ran = exc is not None and (is_runtime_error(exc) or bool(debug))
    if ran and any(leaves[i].is_deleted() for i in donated):
        # It failed while or after running, the donated buffers taken: that error
        # is the real one; say what it cost rather than diagnose deleted inputs.
        assert exc is not None
        exc.add_note(run_failed_note(definition, paths, leaves, donated))
        _steps.keep([leaves[i] for i in donated if leaves[i].is_deleted()], step.short_name)
        raise exc
    if debug:  # JAX's look at the outputs (its fix says so), the inputs intact: nothing to diagnose
        assert exc is not None
        raise exc
    deleted, duplicates = find_hazards(leaves, donated)
    if deleted or duplicates:
        step.stats.refused += 1
        gone = set(deleted)
        consumers = [
            consumer_of(positional[p[0].idx]) or _steps.consumed_by(x) if i in gone else None
            for i, (p, x) in enumerate(with_path)
        ]
        raise hazard_error(definition, paths, leaves, deleted, duplicates, donated, consumers)
    dispatch = _signature_for(step, positional, leaves, treedef, exc, ran, paths, donated)
    # Hold no leaf while the call path runs (its kept-leaf check counts references),
    # nor an unraised exception's traceback (JAX's frames hold the leaves).
    del leaves, with_path, host
    if exc is not None:
        exc.__traceback__ = None
    return _redispatch(step, dispatch, positional, paths)


def _learn_modules(
    step: HotStep[Any, Any], positional: tuple[Any, ...], with_path: list[Any],
    odd: list[tuple[str, Any]],
) -> bool:
    """Non-array leaves (``odd``: path, leaf): pytrees of refs become in-place state;
    equinox Modules' are filtered (``_state.filter``). True: bind the arguments again."""
    __tracebackhide__ = True
    refs = [p for p, x in odd if is_ref(x)]
    if refs:  # pytrees of refs: state updated in place from now on
        definition = step._definition
        params = ref_params(definition.name, definition.param_names, positional, refs)
        with step._compile_lock:
            step._learn(step._definition.with_refs(params))
        return True
    # device arrays, compiled
    compiled = {leaf.path for cs in step._signatures for leaf in cs.leaves}
    modules = module_params(step._definition, positional, with_path, odd, compiled)
    if modules:
        with step._compile_lock:
            step._learn(step._definition.with_filtered(modules))
    return bool(modules)


def _host_arguments(
    step: HotStep[Any, Any], positional: tuple[Any, ...], host: list[tuple[str, Any]],
    exc: BaseException | None,
) -> Any:
    """Host leaves: refused, or (a recording loop) recorded and put on the device."""
    __tracebackhide__ = True
    definition = step._definition
    misuse = api_misuse_error(definition, positional, compiling=False)
    loop = None if misuse else recording_loop()
    if loop is None or not loop.checks_transfers:
        step.stats.refused += 1
        raise misuse or host_leaves_error(definition, host)
    # Record mode: the violation, then the call with the host leaves copied over.
    loop.violation(
        "transfer",
        f"{definition.name}: host argument {'leaf' if len(host) == 1 else 'leaves'} copied to "
        f"the device on every call: {', '.join(f'{p} ({fmt_value(x)})' for p, x in host)}",
        host_leaves_error(definition, host).fix or "",
    )
    current = step._current
    fits = current is not None and jax.tree_util.tree_structure(positional) == current.in_treedef
    dtypes = (
        [leaf.spec.dtype for leaf in current.leaves] if fits else None  # type: ignore[union-attr]
    )
    # Only arguments holding host leaves are rebuilt (the kept-leaf check counts containers).
    moved, start, leaves = [], 0, []
    with jax.transfer_guard_host_to_device("allow"):  # recorded already, as the call's
        for arg in positional:
            leaves = jax.tree_util.tree_leaves(arg)
            n = len(leaves)
            if any(not isinstance(x, jax.Array) for x in leaves):
                arg = host_leaves_on_device(
                    arg, dtypes[start : start + n] if dtypes is not None else None
                )
            moved.append(arg)
            start += n
        del leaves  # the call on the device counts references to the donated leaves
        return _decide(step, tuple(moved), {}, exc)


def _signature_for(
    step: HotStep[Any, Any],
    positional: tuple[Any, ...],
    leaves: list[Any],
    treedef: Any,
    exc: BaseException | None,
    ran: bool,
    paths: list[str],
    donated: tuple[int, ...],
) -> Callable[..., Any]:
    """The call path for arguments that match a compiled signature (compiled now if
    ``max_compiles`` allows); re-raises ``exc`` when they match the current one."""
    __tracebackhide__ = True
    definition, current = step._definition, step._current
    with step._compile_lock:  # another thread may be compiling a signature
        cs = _matching(step, leaves, treedef)
        if cs is not None:
            if exc is not None and cs is current:
                if isinstance(exc, ContractError):  # the call path's own refusal
                    step.stats.refused += 1
                elif ran and donated:
                    exc.add_note(run_failed_note(definition, paths, leaves, donated))
                raise exc  # the signature is right: a genuine runtime error
            step._use(cs)
        else:  # compiled now, or refused past max_compiles
            step._new_signature(positional)
        return step._call


def _matching(
    step: HotStep[Any, Any], leaves: Sequence[Any], treedef: Any
) -> CompiledSignature | None:
    """The compiled signature (or alias of one, :func:`_alias_for`) these flat arguments match."""
    for cs in (*step._signatures, *step._aliases):
        if not signature_diffs(cs, leaves, treedef):
            return cs
    return _alias_for(step, leaves, treedef)


_MAX_ALIASES = 8


def _alias_for(
    step: HotStep[Any, Any], leaves: Sequence[Any], treedef: Any
) -> CompiledSignature | None:
    """A compiled signature's executable with a C++ call for a structure that
    differs only by ``functools.partial`` statics equal by value
    (``diffs.same_structure``). Not a compile; the last few kept. None: no such
    signature, or no C++ call can take another structure here."""
    for cs in step._signatures:
        if cs.in_treedef == treedef or not same_structure(cs.in_treedef, treedef):
            continue  # the same structure (its leaves differ: _matching said so), or another one
        if signature_diffs(cs, leaves, cs.in_treedef):
            continue
        specs = jax.tree_util.tree_unflatten(treedef, [leaf.spec for leaf in cs.leaves])
        alias = dataclasses.replace(cs, spec_args=tuple(specs), in_treedef=treedef, alias=True)
        if guarded_call(cs.compiled, lambda args: False, call_tree(alias)) is None:
            return None
        step._aliases.append(alias)
        step.stats.shared += 1
        if len(step._aliases) > _MAX_ALIASES:  # the oldest goes, with its call paths
            gone = id(step._aliases.pop(0))
            for key in [k for k in step._paths if k[0] == gone]:
                del step._paths[key]
        return alias
    return None


def _redispatch(
    step: HotStep[Any, Any], dispatch: Callable[..., Any], positional: tuple[Any, ...],
    paths: list[str],
) -> Any:
    """Call the chosen call path, once: a refusal of matching arguments is a bug."""
    __tracebackhide__ = True
    definition, redispatch = step._definition, step._redispatch
    if getattr(redispatch, "active", False):
        # the call path sent back arguments found matching: would recurse forever
        raise RecompileError(
            f"{definition.name}: the call path refused arguments that match its compiled "
            "signature (an internal disagreement; please report it).",
            [
                f"  {p}: {fmt_value(x)}"
                for p, x in zip(paths, jax.tree_util.tree_leaves(positional))
            ],
            fix="as a workaround, set jc.set_checks(\"off\") around this call.",
            note=INPUTS_INTACT,
            contract="signature",
            step=definition.name,
        )
    redispatch.active = True
    try:
        return dispatch(*positional)
    finally:
        redispatch.active = False


