"""``@jc.hot_step``'s decoration: a function and the options -> ``StepDefinition``,
worked out once, each misuse a ``DefinitionError`` with the fix.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._errors import DefinitionError
from .._format import qualname
from .._state.fields import info_of, is_state
from .definition import DONATE_WORDS, StepDefinition, check_donated_names, positional_call

__all__ = ["analyse"]


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
        # no truth test: `localns or {}` would make a lazy namespace read the frame
        self.localns, self.globalns = {} if localns is None else localns, globalns

    def __missing__(self, name: str) -> Any:
        for ns in (self.localns, self.globalns, vars(builtins)):
            if name in ns:
                return ns[name]
        return Unresolved(name)


def _type_name(x: Any) -> str | None:
    name = x if isinstance(x, str) else getattr(x, "__name__", None)
    return name.rsplit(".", 1)[-1] if isinstance(name, str) else None


def state_type_matches(annotation: Any, signature: Any) -> bool:
    if annotation is signature:
        return True
    if isinstance(annotation, (str, Unresolved)):
        return _type_name(annotation) == _type_name(signature)
    origin = typing.get_origin(annotation)
    return origin is not None and origin is (typing.get_origin(signature) or signature)


def return_positions(annotation: Any, signature: Any) -> list[tuple[int, ...]]:
    """Where the state stands in the return annotation: [()], [(0,), ...] or []."""
    if state_type_matches(annotation, signature):
        return [()]
    if typing.get_origin(annotation) is not tuple:
        return []
    args = typing.get_args(annotation)
    return [(i,) for i, a in enumerate(args) if state_type_matches(a, signature)]


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
    return (
        first.annotation is first.empty
        and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
    )


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
) -> StepDefinition:
    """Read ``fn``'s signature and the decorator's options (see ``jc.hot_step``)."""
    if isinstance(fn, staticmethod):  # @jc.hot_step over @staticmethod: the function it holds
        fn = fn.__func__
    _refuse_non_step(fn, signature)
    name = qualname(fn.func) + "(partial)" if isinstance(fn, functools.partial) else qualname(fn)
    check_options(name, donate, max_compiles)
    explicit = signature is not None  # given by the user: never offered back as the fix
    sig, params, method = _parameters(fn, name)
    hints = _hints(fn, sig, params, localns)
    static_params = _param_indices(name, "static", static, params)
    donated_params = _param_indices(name, "donate_argnames", donate_argnames, params)
    host_params = _param_indices(name, "host", host, params)
    _refuse_contradictions(name, params, static_params, donated_params, signature, stateless, state)
    if stateless:  # its signature is its arguments' specs
        if isinstance(donate, (tuple, list)):
            raise DefinitionError(
                f"@jc.hot_step on {name}: donate={tuple(donate)!r} names state fields, "
                "but the step is stateless.",
                fix='donate whole arguments by name: donate_argnames=("rewards",).',
            )
        state_params, carried, signature = (), (), None
    elif state is not None:
        state_params = _named_state_params(name, params, state, static_params, donated_params)
        if signature is None:  # the type, where annotated, for its field names
            signature = hints.get(params[state_params[0]].name)
            signature = signature if isinstance(signature, type) else None
        carried = None  # read from the output at the first compile
    else:
        _refuse_static_state(name, params, hints, static_params, signature)
        if signature is None:
            signature = _first_annotation(name, params, hints, static_params)
        state_params = _state_params(name, params, hints, signature, static_params, explicit)
        carried = _returned_states(
            name, params, hints, signature, donate, state_params, donated_params
        )
    # a jc.state class's field names are known now; other types' only from instances
    state_class = isinstance(signature, type) and is_state(signature)
    data_fields = info_of(signature).data_names if state_class else None
    _check_host(name, params, host_params, state_params, static_params, donated_params)
    result = StepDefinition(
        fn=fn,
        name=name,
        state_type=signature,
        param_names=tuple(p.name for p in params),
        state_params=state_params,
        carried=carried,
        donate=tuple(donate) if isinstance(donate, list) else donate,
        max_compiles=max_compiles,
        python_signature=sig,
        positional=positional_call(fn, params, static_params),
        data_fields=data_fields,
        is_method=method,
        static_params=static_params,
        donated_params=donated_params,
        host_params=host_params,
        state_named=state is not None,
    )
    if data_fields is not None and (carried is None or carried):
        check_donated_names(result, data_fields, info_of(signature).static_names)
    return result


def _refuse_non_step(fn: Any, signature: Any) -> None:
    """What is not a step function (a class, an option given by position, a
    generator, a coroutine, a classmethod), and a ``signature=`` that is not a
    type: refused at decoration, with the form that works."""
    if isinstance(fn, classmethod):
        inner = qualname(fn.__func__)
        raise DefinitionError(
            f"@jc.hot_step on the classmethod {inner}: a step closes over what it does "
            "not take as arguments, and a class is no array.",
            fix="make it a @staticmethod (under @jc.hot_step) or a function taking the "
            "state, or a method (self is closed over per instance).",
        )
    if isinstance(fn, type):
        what = "the state class" if is_state(fn) else "the class"
        raise DefinitionError(
            f"@jc.hot_step decorates the step function, not {what} {fn.__qualname__}.",
            fix="decorate the function that takes the state and returns the new one: "
            f"@jc.hot_step def advance(s: {fn.__name__}) -> {fn.__name__}: ...",
        )
    if not callable(fn):
        shown = repr(fn) if isinstance(fn, (str, int, float, bool, tuple)) else type(fn).__name__
        raise DefinitionError(
            f"@jc.hot_step got {shown} where the step function goes: its options are "
            "keywords.",
            fix=f"@jc.hot_step(donate={fn!r})"
            if isinstance(fn, str)
            else "@jc.hot_step(signature=State, donate=\"all\")",
        )
    target = fn.func if isinstance(fn, functools.partial) else fn
    kind = (
        "an async generator function" if inspect.isasyncgenfunction(target)
        else "a generator function" if inspect.isgeneratorfunction(target)
        else "an async function" if inspect.iscoroutinefunction(target)
        else None
    )
    if kind is not None:
        raise DefinitionError(
            f"@jc.hot_step on {qualname(target)}, {kind}: a step is compiled to one "
            "executable that returns arrays, and a "
            f"{'generator' if 'generator' in kind else 'coroutine'} returns none until "
            "it is resumed.",
            fix="make the step a plain function that returns the new state, and loop, "
            "yield or await around its calls in your own code.",
        )
    if signature is not None and not (
        isinstance(signature, (type, str)) or typing.get_origin(signature) is not None
    ):
        cls = type(signature).__name__
        raise DefinitionError(
            f"@jc.hot_step: signature= takes the state's type, and got a {cls} instance.",
            fix=f"signature={cls}",
        )


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
        # keywords bound by functools.partial are configuration, not parameters
        params = [p for p in params if p.name not in fn.keywords]
    method = _is_method(fn, params)
    if method:
        params = params[1:]  # `self` is closed over when the method is bound
    # A `**kwargs` (optax's `**extra_args`) is dropped: a call filling it is refused.
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
    """The resolved annotations, else each on its own (:class:`Unresolved` names)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        return typing.get_type_hints(target, localns=localns)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: one by one
        pass
    hints = {p.name: p.annotation for p in params if p.annotation is not p.empty}
    if sig.return_annotation is not sig.empty:
        hints["return"] = sig.return_annotation
    globalns = getattr(inspect.unwrap(target), "__globals__", {})
    for key, ann in hints.items():
        if isinstance(ann, str):
            try:  # the annotation's text, as typing.get_type_hints evaluates it
                hints[key] = eval(ann, {}, _Names(localns, globalns))  # noqa: S307
            except Exception:  # noqa: BLE001 - not an expression we can read: keep the text
                pass
    return hints


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


def _refuse_static_state(
    name: str,
    params: Sequence[inspect.Parameter],
    hints: dict[str, Any],
    static_params: tuple[int, ...],
    signature: Any,
) -> None:
    """Refuse a ``static=`` parameter annotated with the state type (without
    ``signature=``: a ``jc.state`` class, where no other parameter could be it)."""
    others = signature is None and any(
        _is_class_annotation(hints.get(p.name))
        for i, p in enumerate(params)
        if i not in static_params
    )
    for i in static_params:
        ann = hints.get(params[i].name)
        if (signature is not None and state_type_matches(ann, signature)) or (
            signature is None and not others and isinstance(ann, type) and is_state(ann)
        ):
            raise DefinitionError(
                f"@jc.hot_step on {name}: {params[i].name!r} is the state parameter "
                f"(annotated {getattr(ann, '__name__', ann)}) and is named in static=: a "
                "state is arrays, carried and donated, not a static value.",
                fix=f"drop {params[i].name!r} from static= (static= is for configuration "
                "such as a step count or a flag).",
            )


def _first_annotation(
    name: str, params: Sequence[inspect.Parameter], hints: dict[str, Any],
    static_params: tuple[int, ...],
) -> Any:
    """Without ``signature=``: the first non-static parameter's annotation."""
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
    other = next(
        (p for p in candidates[1:] if _is_class_annotation(hints.get(p.name))), None
    )
    if _is_array_annotation(signature) and other is not None:
        # es.ask(key: jax.Array, state: State, params: Params): the key is not the state
        raise DefinitionError(
            f"@jc.hot_step on {name}: no state= or signature= was given, and the first "
            f"parameter ({first.name}) is annotated as an array while {other.name} is "
            f"annotated {getattr(hints[other.name], '__name__', hints[other.name])}: which "
            "one is the state is ambiguous (taking the first would donate nothing of the other).",
            fix=f'name the state parameter(s): @jc.hot_step(state="{other.name}").',
        )
    if isinstance(signature, (str, Unresolved)):
        raise DefinitionError(
            f"@jc.hot_step on {name}: the state type {signature!r} of parameter "
            f"{first.name} cannot be resolved here (a TYPE_CHECKING import?).",
            fix=f'name the state parameter instead: @jc.hot_step(state="{first.name}"), '
            f"or import {signature!r} at run time.",
        )
    return signature


def _is_array_annotation(t: Any) -> bool:
    """``jax.Array``, a jaxtyping array annotation (``Float[Array, "n"]``) or a key type."""
    if t is jax.Array or (isinstance(t, type) and issubclass(t, jax.Array)):
        return True
    return getattr(t, "__module__", "").startswith("jaxtyping")


def _is_class_annotation(t: Any) -> bool:
    """A pytree class annotation, not an array, a Python scalar or a string."""
    return (
        isinstance(t, type)
        and not _is_array_annotation(t)
        and t.__module__ != "builtins"
        and not issubclass(t, (int, float, complex, str, bytes))
    )


def _check_host(
    name: str,
    params: Sequence[inspect.Parameter],
    host: tuple[int, ...],
    state_params: tuple[int, ...],
    static_params: tuple[int, ...],
    donated_params: tuple[int, ...],
) -> None:
    """Host data is neither state, static nor donated (no device buffer to reuse)."""
    for option, taken in (
        ("state", state_params), ("static", static_params), ("donate_argnames", donated_params)
    ):
        both = [params[i].name for i in host if i in taken]
        if both:
            raise DefinitionError(
                f"@jc.hot_step on {name}: {', '.join(map(repr, both))} is named in both "
                f"host= and {option}=.",
                fix="host= is for data that arrives on the host each call (a loader's "
                "numpy batch): the executable's call transfers it. Name it in one option.",
            )


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
    """The parameters annotated with the state type (never a static one);
    ``explicit``: ``signature=`` was given, so the fix never offers it."""
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
    """Per carried state parameter, where the return annotation holds it (k-th
    for k-th); ``None`` without one: read from the compiled output."""
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
    positions = return_positions(ret, signature)
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
