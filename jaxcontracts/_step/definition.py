"""A step's definition (:class:`StepDefinition`, made by ``_step.analyse``): the
parameters' roles, where returned states stand, the donated leaves (derived from
the state type: no rename can desync them); it binds calls to positions."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._errors import DefinitionError
from .._format import fmt_object, fmt_path
from .._hazards import field_of
from .._state.filter import Filtered, join, join_out, split, split_out
from .._state.spec import StaticArg, eq_answers_bool

__all__ = ["DONATE_WORDS", "StepDefinition", "check_donated_names", "positional_call"]

DONATE_WORDS = ("all", "none")


@dataclasses.dataclass(frozen=True)
class StepDefinition:
    """What ``@jc.hot_step`` learned from the function and its options."""

    fn: Callable[..., Any]
    name: str  # module.qualname
    state_type: Any
    param_names: tuple[str, ...]
    state_params: tuple[int, ...]
    # (state parameter, where the step returns its new value: () for the whole
    # output, (k,) for element k of a returned tuple) per carried state; the other
    # states are read-only. None: read from the output at the first compile.
    carried: tuple[tuple[int, tuple[int, ...]], ...] | None
    donate: str | tuple[str, ...]
    max_compiles: int
    python_signature: inspect.Signature
    positional: Callable[..., Any]  # fn called with every parameter positionally
    data_fields: tuple[str, ...] | None = None  # None: known only from instances
    is_method: bool = False  # param_names and signature leave `self` out; bind() closes over one
    static_params: tuple[int, ...] = ()  # passed by value, part of the signature (no leaves)
    donated_params: tuple[int, ...] = ()  # not states, every leaf donated
    host_params: tuple[int, ...] = ()  # host data (a loader's numpy batch), a declared transfer
    # Equinox Modules with non-array leaves, static (``_filter``): from their first call
    filtered_params: tuple[int, ...] = ()
    # State updated in place (NNX objects, ``_state.inplace``), known at the first
    # compile: returned at ``carried`` positions (1, k), the step's output at (0,).
    inplace_params: tuple[int, ...] = ()
    ref_params: tuple[int, ...] = ()  # pytrees of JAX refs: in-place state passed as arrays
    state_named: bool = False  # state=: each state must be returned or updated in place

    def with_inplace(self, params: tuple[int, ...]) -> StepDefinition:
        """With ``params`` updated in place: the output is (step output, objects)."""
        carried = tuple((i, (0, *pos)) for i, pos in self.carried or ())
        carried += tuple((i, (1, k)) for k, i in enumerate(params))
        return dataclasses.replace(self, carried=carried, inplace_params=params)

    def with_refs(self, params: tuple[int, ...]) -> StepDefinition:
        """With ``params`` pytrees of refs: state updated in place, never returned."""
        refs = tuple(sorted({*self.ref_params, *params}))
        state = tuple(sorted({*self.state_params, *refs}))
        return dataclasses.replace(self, ref_params=refs, state_params=state)

    @property
    def carried_params(self) -> frozenset[int]:
        """The parameters whose new value the compiled step returns."""
        return frozenset(i for i, _ in self.carried or ())

    @property
    def read_only_params(self) -> tuple[int, ...]:
        """State parameters the step does not return: never donated."""
        returned = self.carried_params
        return tuple(i for i in self.state_params if i not in returned)

    def resolve_carried(self, out: Any, spec_args: Sequence[Any]) -> StepDefinition:
        """With ``carried`` read from ``out`` (``jax.eval_shape`` of the step): a
        state is carried where the output, or a returned tuple's first free
        element, has its exact tree structure; the others are read-only."""
        if self.carried is not None:
            return self
        carried: list[tuple[int, tuple[int, ...]]] = []
        out = join_out(out)  # an equinox step's filtered elements, as the caller gets them
        whole = jax.tree_util.tree_structure(out)
        used: set[int] = set()
        for i in self.state_params:
            if i in self.ref_params:  # updated in place: its refs are not returned
                continue
            want = jax.tree_util.tree_structure(join(spec_args[i]))
            if not carried and want == whole:
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

    def bind(self, obj: Any, weak: bool = False) -> StepDefinition:
        """With ``self`` closed over; ``weak``: by weak reference (``__slots__``
        instances, whose bound step the method step keeps)."""
        fn = (
            functools.partial(_call_with, weakref.ref(obj), self.fn)
            if weak
            else functools.partial(self.fn, obj)
        )
        params = list(self.python_signature.parameters.values())
        return dataclasses.replace(
            self,
            fn=fn,
            positional=positional_call(fn, params, self.static_params, self.filtered_params),
            is_method=False,
        )

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    @functools.cached_property
    def bind_positional(
        self,
    ) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...] | None]:
        """``bind(args, kwargs)``: ``Signature.bind`` + ``apply_defaults`` without
        their cost; None where it does not bind (:meth:`normalize` explains)."""
        params = list(self.python_signature.parameters.values())
        empty = inspect.Parameter.empty
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        n_pos = sum(p.kind != p.KEYWORD_ONLY for p in params)  # what positional arguments may fill
        # per number of positional arguments: the rest, as (name, default, may be a keyword)
        host = self.host_params  # a declared host value's default stays one (passed or not)
        rests = {
            k: tuple(
                (p.name, p.default if i in host else left_out(p), p.kind in kinds)
                for i, p in enumerate(params[k:], k)
            )
            for k in range(n_pos + 1)
        }

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
            rest = rests.get(len(args))
            if rest is None:
                return None
            items, used = list(args), 0
            for name, default, keyword in rest:
                if keyword and name in kwargs:
                    items.append(kwargs[name])
                    used += 1
                elif default is not empty:
                    items.append(default)
                else:
                    return None
            return tuple(items) if used == len(kwargs) else None

        return bind

    def normalize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Every argument by position, defaults applied, static ones wrapped;
        a call that does not bind is refused with the step's parameters."""
        positional = (
            args
            if not kwargs and len(args) == len(self.param_names)
            else self.bind_positional(args, kwargs)
        )
        if positional is None:  # inspect binds what the binder does not, or explains
            positional = self._bind_or_explain(args, kwargs)
        if self.static_params or self.filtered_params:
            return self.wrap_static(positional)
        return positional

    def _bind_or_explain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        try:
            bound = self.python_signature.bind(*args, **kwargs).arguments
        except TypeError as e:
            params = ", ".join(self.param_names)
            given = ", ".join([*("<arg>" for _ in args), *(f"{k}=" for k in kwargs)])
            raise DefinitionError(
                f"{self.short_name}({given}) does not match the step's parameters: {e}.",
                [f"  parameters: {self.short_name}({params})"],
                fix=f"call it as {self.short_name}({params}).",
                contract="definition",
                step=self.name,
            ) from None
        host = self.host_params  # a declared host value's default stays one
        return tuple(
            bound[p.name] if p.name in bound else p.default if i in host else left_out(p)
            for i, p in enumerate(self.python_signature.parameters.values())
        )

    def with_filtered(self, params: tuple[int, ...]) -> StepDefinition:
        """This signature with the arguments of ``params`` filtered (``_filter``)."""
        filtered = tuple(sorted({*self.filtered_params, *params}))
        call = positional_call(
            self.fn, list(self.python_signature.parameters.values()), self.static_params, filtered
        )
        return dataclasses.replace(self, filtered_params=filtered, positional=call)

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
                what = f"{type(value).__name__}, which is not hashable ({e})."
                fix = (
                    "pass a hashable value: a frozen dataclass, a NamedTuple, a "
                    "tuple instead of a list, or a functools.partial/function; or close "
                    "over it instead of passing it."
                )
            else:
                eq = eq_answers_bool(value)
                if eq is None:
                    out[i] = StaticArg(value)
                    continue
                what = f"{fmt_object(value)}, whose __eq__ {eq}, not True or False."
                fix = (
                    f"make {type(value).__name__}.__eq__ return a bool (compare Python "
                    "values, not arrays), or pass the arrays it holds as arguments."
                )
            raise DefinitionError(
                f"{self.name}: static argument `{self.param_names[i]}` is {what}",
                [
                    "  a static argument is part of the compiled signature: it is "
                    "compared by hash and == to find its executable"
                ],
                fix=fix,
                contract="definition",
                step=self.name,
                leaves=[self.param_names[i]],
            )
        for i in self.filtered_params:
            if type(out[i]) is not Filtered:
                out[i] = split(out[i])
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
            arg = path[0].idx
            if arg in self.donated_params:
                donated.append(i)
            elif self.donate != "none" and arg in self.state_params and arg not in read_only:
                name = field_of(path[1]) if len(path) > 1 else None
                if name is not None:
                    fields_seen.add(name)
                if self.donate == "all" or name in self.donate:
                    donated.append(i)
        # a dict state: its fields are known now
        if self.data_fields is None and self.donate != "none":
            check_donated_names(self, tuple(sorted(fields_seen)), ())
        return tuple(donated)


def _call_with(ref: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(instance, ...)`` for a weakly bound method step (see ``StepDefinition.bind``)."""
    __tracebackhide__ = True
    obj = ref()
    if obj is None:  # a temporary: `T(cfg).step(s)`, the instance gone before the call
        name = getattr(fn, "__qualname__", repr(fn))
        raise DefinitionError(
            f"{name}: the instance this method step was bound to is gone before its call "
            "(a temporary, T(...).step(s), of a class with __slots__, whose bound step holds "
            "its instance weakly so that the instance can be freed).",
            fix="keep the instance in a variable (t = T(cfg); t.step(s)), or give the class "
            "a __dict__ (its bound step then holds the instance, as a bound method does).",
            contract="definition",
            step=name,
        )
    return fn(obj, *args, **kwargs)


def check_donated_names(
    definition: StepDefinition, valid: Sequence[str], static: Sequence[str]
) -> None:
    if not isinstance(definition.donate, (tuple, list)):
        return
    bad = [n for n in definition.donate if n not in valid]
    if bad and definition.state_type is None:  # state="s" on a dict or another pytree: no fields
        raise DefinitionError(
            f"@jc.hot_step on {definition.name}: donate names field(s) "
            f"{', '.join(map(repr, bad))}, but the step names no state type (state=...): "
            "its fields are not known.",
            fix='donate="all" (every state leaf) or "none"; to donate some fields only, name the '
            "state's type: signature=dict for a dict state (its keys), or a @jc.state class.",
            contract="definition",
            step=definition.name,
        )
    if bad:
        type_name = getattr(definition.state_type, "__name__", repr(definition.state_type))
        raise DefinitionError(
            f"@jc.hot_step on {definition.name}: donate names unknown field(s) "
            f"{', '.join(map(repr, bad))} of {type_name}.",
            [f"  array fields: {', '.join(valid) or '(none)'}"]
            + (
                [f"  static fields (not donatable, not arrays): {', '.join(static)}"]
                if static
                else []
            ),
            fix='use those names, or donate="all".',
        )


#: A Python constant default is static, as under ``jax.jit`` (not a host transfer).
_CONSTANT_DEFAULTS = (bool, int, float, complex, str, bytes, np.generic)


def left_out(param: inspect.Parameter) -> Any:
    """What a call that leaves ``param`` out passes (a constant as a :class:`StaticArg`)."""
    default = param.default
    return StaticArg(default) if isinstance(default, _CONSTANT_DEFAULTS) else default


def positional_call(
    fn: Callable[..., Any],
    params: Sequence[inspect.Parameter],
    static: tuple[int, ...] = (),
    filtered: tuple[int, ...] = (),
) -> Callable[..., Any]:
    """``fn`` called with every parameter by position, statics unwrapped, filtered
    ones rebuilt (and its output filtered: see ``_filter``)."""
    kwonly = tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY)
    n_pos = len(params) - len(kwonly)
    unwrap = bool(static) or any(isinstance(left_out(p), StaticArg) for p in params)
    if not kwonly and not unwrap and not filtered:
        return fn

    def positional(*a: Any) -> Any:
        if unwrap:
            a = tuple(x.value if isinstance(x, StaticArg) else x for x in a)
        if filtered:
            a = tuple(map(join, a))
            return split_out(fn(*a[:n_pos], **dict(zip(kwonly, a[n_pos:]))))
        return fn(*a[:n_pos], **dict(zip(kwonly, a[n_pos:])))

    return positional


