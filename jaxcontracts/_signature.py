"""A step function's signature: state parameters, returned states, donation.

Worked out once, when ``@jc.hot_step`` decorates: which parameters are state
(annotated with the state type, wherever they stand), where the returned
states stand in the return annotation, and which leaves are donated (derived
from the state type, so no rename or reordering of parameters can desync it).
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ._donation import field_of
from ._errors import DefinitionError
from ._fields import data_field_names, is_state, static_field_names
from ._format import fmt_path, qualname
from ._spec import StaticArg

__all__ = ["DONATE_WORDS", "StaticArg", "StepSignature", "analyse"]

DONATE_WORDS = ("all", "none")


@dataclasses.dataclass(frozen=True)
class StepSignature:
    """What ``@jc.hot_step`` learned from the function and its options."""

    fn: Callable[..., Any]
    name: str  # module.qualname
    state_type: Any
    param_names: tuple[str, ...]
    state_params: tuple[int, ...]
    # (state parameter, where the step returns its new value: () for the
    # whole output, (k,) for element k of a returned tuple), one per carried
    # state; a state parameter not in it is read-only. None: not known yet,
    # read from the compiled output at the first compile (resolve_carried).
    carried: tuple[tuple[int, tuple[int, ...]], ...] | None
    donate: str | tuple[str, ...]
    max_compiles: int
    signature: inspect.Signature
    positional: Callable[..., Any]  # fn called with every parameter positionally
    static_fields: tuple[str, ...] = ()
    data_fields: tuple[str, ...] | None = None  # None: known only from instances
    # A method (first parameter `self`): param_names and signature leave `self`
    # out; bind() closes over an instance.
    is_method: bool = False
    # Parameters passed by value as part of the signature (hashable, no leaves).
    static_params: tuple[int, ...] = ()
    # Parameters other than states whose every leaf is donated.
    donated_params: tuple[int, ...] = ()
    # Parameters that take host data (a loader's numpy batch): the executable
    # call transfers them, a declared transfer inside loops.
    host_params: tuple[int, ...] = ()

    @property
    def read_only_params(self) -> tuple[int, ...]:
        """State parameters the step does not return: never donated."""
        returned = {i for i, _ in self.carried or ()}
        return tuple(i for i in self.state_params if i not in returned)

    def resolve_carried(self, out: Any, spec_args: Sequence[Any]) -> StepSignature:
        """This signature with ``carried`` read from an output's structure.

        ``out``: the step's output for ``spec_args`` (``jax.eval_shape``). A
        state parameter is carried when the output, or an element of a
        returned tuple, has its exact tree structure (the first such element,
        in parameter order); the others are read-only.
        """
        if self.carried is not None:
            return self
        carried: list[tuple[int, tuple[int, ...]]] = []
        whole = jax.tree_util.tree_structure(out)
        used: set[int] = set()
        for i in self.state_params:
            want = jax.tree_util.tree_structure(spec_args[i])
            if not carried and want == whole and len(self.state_params) >= 1:
                carried.append((i, ()))
                break
            if isinstance(out, (tuple, list)):
                for k, element in enumerate(out):
                    if k not in used and jax.tree_util.tree_structure(element) == want:
                        carried.append((i, (k,)))
                        used.add(k)
                        break
        if not carried and isinstance(self.donate, tuple):
            names = ", ".join(self.param_names[i] for i in self.state_params)
            raise DefinitionError(
                f"@jc.hot_step on {self.name}: donate={self.donate!r} names state fields, "
                f"but the step returns no new value of its state ({names}): nothing it "
                "returns has the state's structure, so the state is read-only.",
                fix="return the new state (alone, or first in a tuple) to carry and "
                "donate it, or drop donate=.",
                step=self.name,
            )
        return dataclasses.replace(self, carried=tuple(carried))

    def bind(self, obj: Any) -> StepSignature:
        """This method's signature with ``self`` closed over (configuration)."""
        fn = functools.partial(self.fn, obj)
        params = list(self.signature.parameters.values())
        return dataclasses.replace(
            self, fn=fn, positional=_positional(fn, params, self.static_params), is_method=False
        )

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    def normalize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Every argument by position, defaults applied, static ones wrapped."""
        if not kwargs and len(args) == len(self.param_names):
            return self.wrap_static(args) if self.static_params else args
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            params = ", ".join(self.param_names)
            raise TypeError(
                f"{self.name}() was called with {len(args)} positional and "
                f"{len(kwargs)} keyword argument(s): {e}.\n"
                f"  parameters: ({params})\n"
                f"Fix: call it as {self.short_name}({params})."
            ) from None
        bound.apply_defaults()
        positional = tuple(bound.arguments[n] for n in self.param_names)
        return self.wrap_static(positional) if self.static_params else positional

    def wrap_static(self, positional: tuple[Any, ...]) -> tuple[Any, ...]:
        """Static arguments as :class:`StaticArg` nodes (hashable, checked here)."""
        out = list(positional)
        for i in self.static_params:
            value = out[i]
            if isinstance(value, StaticArg):
                continue
            try:
                hash(value)
            except TypeError as e:
                raise DefinitionError(
                    f"{self.name}: static argument `{self.param_names[i]}` is "
                    f"{type(value).__name__}, which is not hashable ({e}).",
                    [
                        "  a static argument is part of the compiled signature: it is "
                        "compared by hash and == to find its executable"
                    ],
                    fix="pass a hashable value: a frozen dataclass, a NamedTuple, a "
                    "tuple instead of a list, or a functools.partial/function; or close "
                    "over it instead of passing it.",
                    contract="definition",
                    step=self.name,
                    leaves=[self.param_names[i]],
                ) from None
            out[i] = StaticArg(value)
        return tuple(out)

    def param_path(self, path: Sequence[Any]) -> str:
        """``s.pos`` for a flat path ``(SequenceKey(0), GetAttrKey('pos'))``."""
        return f"{self.param_names[path[0].idx]}{fmt_path(path[1:]) if len(path) > 1 else ''}"

    def donated_leaves(self, flat_paths: Sequence[Any]) -> tuple[int, ...]:
        """Indices of the flat leaves to donate, from their paths."""
        donated = []
        fields_seen: set[str] = set()
        read_only = self.read_only_params
        for i, path in enumerate(flat_paths):
            if path[0].idx in self.donated_params:
                donated.append(i)
                continue
            if self.donate == "none" or path[0].idx not in self.state_params or path[0].idx in read_only:
                continue
            if self.donate == "all":
                donated.append(i)
                continue
            name = field_of(path[1]) if len(path) > 1 else None
            if name is not None:
                fields_seen.add(name)
            if name in self.donate:
                donated.append(i)
        if self.data_fields is None and self.donate != "none":  # a dict state: its fields are known now
            check_donated_names(self, tuple(sorted(fields_seen)), ())
        return tuple(donated)


def check_options(name: str, donate: Any, max_compiles: Any) -> None:
    if isinstance(donate, str):
        if donate not in DONATE_WORDS:
            raise DefinitionError(
                f"@jc.hot_step on {name}: donate={donate!r} is not valid.\nValid values:\n"
                '  donate="all"            every leaf of every state parameter (default)\n'
                '  donate=("pos", "vel")   those state fields only\n'
                '  donate="none"           no donation (an explicit opt-out)'
            )
    elif not (isinstance(donate, (tuple, list)) and all(isinstance(n, str) for n in donate)):
        raise DefinitionError(
            f"@jc.hot_step on {name}: donate={donate!r} is not valid; "
            'use "all", "none" or a tuple of field names such as ("pos", "vel").'
        )
    if not isinstance(max_compiles, int) or isinstance(max_compiles, bool) or max_compiles < 1:
        raise DefinitionError(
            f"@jc.hot_step on {name}: max_compiles={max_compiles!r}; "
            "it must be an int >= 1 (1: exactly one signature, the default)."
        )


def check_donated_names(sig: StepSignature, valid: Sequence[str], static: Sequence[str]) -> None:
    if not isinstance(sig.donate, (tuple, list)):
        return
    bad = [n for n in sig.donate if n not in valid]
    if bad:
        type_name = getattr(sig.state_type, "__name__", repr(sig.state_type))
        raise DefinitionError(
            f"@jc.hot_step on {sig.name}: donate names unknown field(s) "
            f"{', '.join(map(repr, bad))} of {type_name}.",
            [f"  array fields: {', '.join(valid) or '(none)'}"]
            + ([f"  static fields (not donatable, not arrays): {', '.join(static)}"] if static else []),
            fix='use those names, or donate="all".',
        )


class Unresolved:
    """A name in an annotation that cannot be resolved (a ``TYPE_CHECKING``
    import under ``from __future__ import annotations``): kept by name."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __getattr__(self, attr: str) -> Unresolved:  # module.Type
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unresolved(f"{self.__name__}.{attr}")

    def __getitem__(self, item: Any) -> Unresolved:  # Generic[...]
        return self

    def __or__(self, other: Any) -> Any:  # X | None
        return typing.Union[self, other]  # noqa: UP007 - self is no type

    __ror__ = __or__

    def __repr__(self) -> str:
        return self.__name__


class _Names(dict):  # type: ignore[type-arg]
    """Locals for ``eval``: the caller's, the module's, builtins, else Unresolved."""

    def __init__(self, localns: dict[str, Any] | None, globalns: dict[str, Any]) -> None:
        super().__init__()
        self.localns, self.globalns = localns or {}, globalns

    def __missing__(self, name: str) -> Any:
        for ns in (self.localns, self.globalns, vars(builtins)):
            if name in ns:
                return ns[name]
        return Unresolved(name)


def resolve_each(fn: Any, annotations: dict[str, Any], localns: dict[str, Any] | None) -> dict[str, Any]:
    """Resolve each annotation string on its own; unresolvable names stay names."""
    globalns = getattr(inspect.unwrap(fn), "__globals__", {})
    out = {}
    for key, ann in annotations.items():
        if isinstance(ann, str):
            try:
                ann = eval(ann, {}, _Names(localns, globalns))  # noqa: S307 - annotation text
            except Exception:  # noqa: BLE001 - not an expression we can read: keep the text
                pass
        out[key] = ann
    return out


def _type_name(x: Any) -> str | None:
    if isinstance(x, str):
        return x.rsplit(".", 1)[-1]
    name = getattr(x, "__name__", None)
    return name.rsplit(".", 1)[-1] if isinstance(name, str) else None


def state_type_matches(annotation: Any, signature: Any) -> bool:
    if annotation is signature:
        return True
    if isinstance(annotation, (str, Unresolved)):
        return _type_name(annotation) == _type_name(signature)
    origin = typing.get_origin(annotation)
    return origin is not None and origin is (typing.get_origin(signature) or signature)


def return_positions(annotation: Any, signature: Any) -> list[tuple[int, ...]] | None:
    """Where the state stands in the return annotation: [()] or [(0,), ...]."""
    if state_type_matches(annotation, signature):
        return [()]
    if typing.get_origin(annotation) is tuple:
        out = [
            (i,)
            for i, a in enumerate(typing.get_args(annotation))
            if state_type_matches(a, signature)
        ]
        return out or None
    return None


def _positional(
    fn: Callable[..., Any], params: Sequence[inspect.Parameter], static: tuple[int, ...] = ()
) -> Callable[..., Any]:
    """``fn`` called with every parameter by position (keyword-only ones too),
    static arguments unwrapped from their :class:`StaticArg` nodes."""
    kwonly = tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY)
    n_pos = len(params) - len(kwonly)
    if not kwonly and not static:
        return fn

    def positional(*a: Any) -> Any:
        if static:
            a = tuple(x.value if isinstance(x, StaticArg) else x for x in a)
        return fn(*a[:n_pos], **dict(zip(kwonly, a[n_pos:])))

    return positional


def _param_indices(
    name: str, option: str, names: Any, params: Sequence[inspect.Parameter]
) -> tuple[int, ...]:
    """Parameter names given to an option, as indices (checked here)."""
    if isinstance(names, str):
        names = (names,)
    if not (isinstance(names, (tuple, list)) and all(isinstance(n, str) for n in names)):
        raise DefinitionError(
            f"@jc.hot_step on {name}: {option}={names!r} is not valid; "
            f'give parameter names, e.g. {option}=("config",).'
        )
    known = [p.name for p in params]
    bad = [n for n in names if n not in known]
    if bad:
        raise DefinitionError(
            f"@jc.hot_step on {name}: {option} names unknown parameter(s) "
            f"{', '.join(map(repr, bad))}.",
            [f"  parameters: {', '.join(known) or '(none)'}"],
            fix="use the step's parameter names.",
        )
    return tuple(sorted({known.index(n) for n in names}))


def _is_method(fn: Any, params: Sequence[inspect.Parameter]) -> bool:
    """A function defined in a class body, taking the instance as an unannotated ``self``."""
    if isinstance(fn, functools.partial) or not params or params[0].name != "self":
        return False
    first = params[0]
    return first.annotation is first.empty and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)


def analyse(
    fn: Callable[..., Any],
    *,
    signature: Any,
    donate: Any,
    max_compiles: Any,
    localns: dict[str, Any] | None,
    static: Any = (),
    donate_argnames: Any = (),
    stateless: bool = False,
    state: Any = None,
    host: Any = (),
) -> StepSignature:
    """Read ``fn``'s signature and the decorator's options.

    ``state``: names of the state parameters (no annotation needed); what the
    step returns is then read from its output at the first compile.

    Raises:
        DefinitionError: an invalid option, *args/**kwargs, no state
            parameter, a return annotation without the state, or an unknown
            donated field.
    """
    partial = fn if isinstance(fn, functools.partial) else None
    name = qualname(partial.func) + "(partial)" if partial is not None else qualname(fn)
    check_options(name, donate, max_compiles)
    explicit = signature is not None  # given by the user: never offered back as the fix
    sig, params, method = _parameters(fn, name)
    hints = _hints(fn, sig, params, localns)
    static_params = _param_indices(name, "static", static, params)
    donated_params = _param_indices(name, "donate_argnames", donate_argnames, params)
    host_params = _param_indices(name, "host", host, params)
    _refuse_contradictions(name, params, static_params, donated_params, signature, stateless, state)
    if stateless:
        return dataclasses.replace(
            _stateless(fn, name, sig, params, donate, max_compiles, method, static_params, donated_params),
            host_params=_host_params(name, params, host_params, (), static_params, donated_params),
        )
    if state is not None:
        state_params = _named_state_params(name, params, state, static_params, donated_params)
        if signature is None:  # the type, where annotated, for its field names
            signature = hints.get(params[state_params[0]].name)
            signature = signature if isinstance(signature, type) else None
        carried = None  # read from the output at the first compile
    else:
        if signature is None:
            signature = _first_annotation(name, params, hints, static_params)
        state_params = _state_params(name, params, hints, signature, static_params, explicit)
        carried = _returned_states(name, params, hints, signature, donate, state_params, donated_params)
    fields = _state_fields(signature)
    host_params = _host_params(name, params, host_params, state_params, static_params, donated_params)
    result = StepSignature(
        fn=fn,
        name=name,
        state_type=signature,
        param_names=tuple(p.name for p in params),
        state_params=state_params,
        carried=carried,
        donate=tuple(donate) if isinstance(donate, list) else donate,
        max_compiles=max_compiles,
        signature=sig,
        positional=_positional(fn, params, static_params),
        static_fields=fields[1] if fields else (),
        data_fields=fields[0] if fields else None,
        is_method=method,
        static_params=static_params,
        donated_params=donated_params,
        host_params=host_params,
    )
    if fields is not None and (carried is None or carried):
        check_donated_names(result, fields[0], fields[1])
    return result


def _state_fields(state_type: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """A ``jc.state`` type's (data, static) field names; ``None`` for any other
    type, whose fields are known only from instances."""
    if isinstance(state_type, type) and is_state(state_type):
        return data_field_names(state_type), static_field_names(state_type)
    return None


def _parameters(
    fn: Callable[..., Any], name: str
) -> tuple[inspect.Signature, list[inspect.Parameter], bool]:
    """(the step's signature, its parameters, whether it is a method)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise DefinitionError(f"@jc.hot_step: cannot read the signature of {name}: {e}") from None
    params = list(sig.parameters.values())
    if isinstance(fn, functools.partial):
        # Keyword values bound by functools.partial are configuration, closed
        # over like any other constant: not parameters of the step.
        params = [p for p in params if p.name not in fn.keywords]
    method = _is_method(fn, params)
    if method:
        params = params[1:]  # `self` is closed over when the method is bound
    # A `**kwargs` (optax's `update(updates, state, params=None, **extra_args)`)
    # is not part of the step: nothing is passed to it, and a call that fills
    # it is refused as any unknown keyword is.
    params = [p for p in params if p.kind != p.VAR_KEYWORD]
    variadic = [p.name for p in params if p.kind == p.VAR_POSITIONAL]
    if variadic:
        raise DefinitionError(
            f"@jc.hot_step on {name}: *{variadic[0]} takes any number of arguments, "
            "which cannot be compiled ahead of time with a fixed signature.",
            fix="name every parameter (def step(state, batch)), or wrap the function "
            "in one that does.",
        )
    return sig.replace(parameters=params), params, method


def _hints(
    fn: Callable[..., Any],
    sig: inspect.Signature,
    params: Sequence[inspect.Parameter],
    localns: dict[str, Any] | None,
) -> dict[str, Any]:
    """The resolved annotations (those that cannot be resolved, one by one)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        return typing.get_type_hints(target, localns=localns)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: one by one
        raw = {p.name: p.annotation for p in params if p.annotation is not p.empty}
        if sig.return_annotation is not sig.empty:
            raw["return"] = sig.return_annotation
        return resolve_each(target, raw, localns)


def _refuse_contradictions(
    name: str,
    params: Sequence[inspect.Parameter],
    static_params: tuple[int, ...],
    donated_params: tuple[int, ...],
    signature: Any,
    stateless: bool,
    state: Any = None,
) -> None:
    if stateless and state is not None:
        raise DefinitionError(
            f"@jc.hot_step on {name}: state={state!r} and stateless=True contradict each other.",
            fix="drop stateless=True to carry those parameters, or drop state= for a "
            "step with no state.",
        )
    both = [params[i].name for i in static_params if i in donated_params]
    if both:
        raise DefinitionError(
            f"@jc.hot_step on {name}: {', '.join(map(repr, both))} is both static and "
            "donated; a static argument is a value, not arrays.",
            fix="name it in one of static= and donate_argnames=.",
        )
    if stateless and signature is not None:
        raise DefinitionError(
            f"@jc.hot_step on {name}: signature={getattr(signature, '__name__', signature)} "
            "and stateless=True contradict each other.",
            fix="drop stateless=True to carry that state, or drop signature= for a "
            "step with no state.",
        )


def _first_annotation(
    name: str, params: Sequence[inspect.Parameter], hints: dict[str, Any], static_params: tuple[int, ...]
) -> Any:
    """The state type when no ``signature=`` is given: the annotation of the
    first parameter that is not static (a ``config`` is never the state)."""
    candidates = [p for i, p in enumerate(params) if i not in static_params]
    first = candidates[0] if candidates else None
    if first is None or first.name not in hints:
        shown = first.name if first is not None else "s"
        raise DefinitionError(
            f"@jc.hot_step on {name}: no state= or signature= was given and the "
            f"first parameter{f' ({shown})' if first is not None else ''} is not annotated, "
            "so the state is unknown.",
            fix=f'name the state parameter(s): @jc.hot_step(state="{shown}") (no '
            f"annotation needed), or annotate it (def step({shown}: State) -> State); a "
            "step with no state (only array arguments) is @jc.hot_step(stateless=True).",
        )
    signature = hints[first.name]
    if isinstance(signature, (str, Unresolved)):
        raise DefinitionError(
            f"@jc.hot_step on {name}: the state type {signature!r} of parameter "
            f"{first.name} cannot be resolved here (a TYPE_CHECKING import?).",
            fix=f'name the state parameter instead: @jc.hot_step(state="{first.name}"), '
            f"or import {signature!r} at run time.",
        )
    return signature


def _host_params(
    name: str,
    params: Sequence[inspect.Parameter],
    host: tuple[int, ...],
    state_params: tuple[int, ...],
    static_params: tuple[int, ...],
    donated_params: tuple[int, ...],
) -> tuple[int, ...]:
    """The parameters ``host=`` names, checked: host data is neither state,
    static nor donated (a transferred batch has no device buffer to reuse)."""
    for option, taken in (("state", state_params), ("static", static_params), ("donate_argnames", donated_params)):
        both = [params[i].name for i in host if i in taken]
        if both:
            raise DefinitionError(
                f"@jc.hot_step on {name}: {', '.join(map(repr, both))} is named in both "
                f"host= and {option}=.",
                fix="host= is for data that arrives on the host each call (a loader's "
                "numpy batch): the executable's call transfers it. Name it in one option.",
            )
    return host


def _named_state_params(
    name: str,
    params: Sequence[inspect.Parameter],
    state: Any,
    static_params: tuple[int, ...],
    donated_params: tuple[int, ...],
) -> tuple[int, ...]:
    """The parameters ``state=`` names, checked (never static, never in donate_argnames)."""
    indices = _param_indices(name, "state", state, params)
    if not indices:
        raise DefinitionError(
            f"@jc.hot_step on {name}: state=() names no parameter.",
            fix='name the state parameter(s), e.g. state="state"; a step with no state '
            "is @jc.hot_step(stateless=True).",
        )
    for option, taken in (("static", static_params), ("donate_argnames", donated_params)):
        both = [params[i].name for i in indices if i in taken]
        if both:
            raise DefinitionError(
                f"@jc.hot_step on {name}: {', '.join(map(repr, both))} is named in both "
                f"state= and {option}=.",
                fix="a state parameter is carried (and donated per donate=); name it in "
                f"state= only{', and make configuration static' if option == 'static' else ''}.",
            )
    return indices


def _state_params(
    name: str,
    params: Sequence[inspect.Parameter],
    hints: dict[str, Any],
    signature: Any,
    static_params: tuple[int, ...],
    explicit: bool = False,
) -> tuple[int, ...]:
    """The parameters annotated with the state type (never a static one).

    ``explicit``: ``signature=`` was given (so the fix never offers it).
    """
    state_params = tuple(
        i
        for i, p in enumerate(params)
        if state_type_matches(hints.get(p.name), signature) and i not in static_params
    )
    if not state_params:
        type_name = getattr(signature, "__name__", repr(signature))
        listing = ", ".join(
            f"{p.name}: {getattr(hints.get(p.name), '__name__', hints.get(p.name, '(none)'))}"
            for p in params
        )
        first = next((p.name for i, p in enumerate(params) if i not in static_params), "state")
        raise DefinitionError(
            f"@jc.hot_step on {name}: no parameter is annotated with the state type {type_name}.",
            [f"  parameters: {listing or '(none)'}"],
            fix=f'name the state parameter(s): @jc.hot_step(state="{first}") (no annotation '
            f"needed), or annotate it ({first}: {type_name})"
            + ("" if explicit else ", or pass the state type as signature=...")
            + "; a step with no state is @jc.hot_step(stateless=True).",
        )
    return state_params


def _returned_states(
    name: str,
    params: Sequence[inspect.Parameter],
    hints: dict[str, Any],
    signature: Any,
    donate: Any,
    state_params: tuple[int, ...],
    donated_params: tuple[int, ...],
) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """Where the return annotation holds the state, per carried state parameter
    (the k-th returned state is the new value of the k-th state parameter);
    ``None`` without a return annotation: read from the compiled output."""
    type_name = getattr(signature, "__name__", repr(signature))
    conflict = [params[i].name for i in donated_params if i in state_params]
    if conflict:
        raise DefinitionError(
            f"@jc.hot_step on {name}: donate_argnames names state parameter(s) "
            f"{', '.join(map(repr, conflict))}; their donation follows donate= "
            "(and a state the step does not return is read-only, never donated).",
            fix="leave state parameters out of donate_argnames.",
        )
    ret = hints.get("return", inspect.Signature.empty)
    if ret is inspect.Signature.empty:
        return None
    positions = return_positions(ret, signature) or []
    if not positions and isinstance(donate, (tuple, list)):
        raise DefinitionError(
            f"@jc.hot_step on {name}: donate={tuple(donate)!r} names fields of "
            f"{type_name}, but the step does not return a {type_name}: its state is "
            "read-only and nothing of it is donated.",
            fix=f"return the new state (-> {type_name} or -> tuple[{type_name}, ...]) "
            "to carry and donate it, or drop donate=.",
        )
    if len(positions) > len(state_params):
        raise DefinitionError(
            f"@jc.hot_step on {name}: {len(state_params)} state "
            f"parameter(s) but {len(positions)} state(s) in the return annotation.",
            ["The k-th returned state is the new value of the k-th state parameter."],
            fix="return one state per state parameter (state parameters not "
            "returned are read-only inputs).",
        )
    return tuple(zip(state_params, positions))


def _stateless(
    fn: Callable[..., Any],
    name: str,
    sig: inspect.Signature,
    params: Sequence[inspect.Parameter],
    donate: Any,
    max_compiles: int,
    method: bool,
    static_params: tuple[int, ...],
    donated_params: tuple[int, ...],
) -> StepSignature:
    """A step with no state: its signature is its arguments' specs."""
    if isinstance(donate, (tuple, list)):
        raise DefinitionError(
            f"@jc.hot_step on {name}: donate={tuple(donate)!r} names state fields, "
            "but the step is stateless.",
            fix='donate whole arguments by name: donate_argnames=("rewards",).',
        )
    return StepSignature(
        fn=fn,
        name=name,
        state_type=None,
        param_names=tuple(p.name for p in params),
        state_params=(),
        carried=(),
        donate=donate,
        max_compiles=max_compiles,
        signature=sig,
        positional=_positional(fn, params, static_params),
        is_method=method,
        static_params=static_params,
        donated_params=donated_params,
    )
