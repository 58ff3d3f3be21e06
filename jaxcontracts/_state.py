"""``jc.state`` and ``jc.static``: validated state dataclasses with exact specs.

A ``@jc.state`` class is a frozen dataclass registered as a pytree whose leaf
paths read as field names (``.pos``). Its fields are

* array fields, annotated ``Float32[Array, "n 3"]`` (a concrete dtype);
* nested ``jc.state`` classes;
* ``PyTree[...]`` fields (parameters, optimiser state), whose spec comes from
  the instance;
* ``jc.static(default)`` fields: hashable values that are part of the tree
  structure, not leaves.

Construction outside tracing validates every field against its annotation
(jaxtyping decides dtype and shape, beartype checks static fields and pytree
leaves), collects every failure and raises one :class:`SpecError`. Values are
put in their exact device form: numpy arrays of the right dtype are placed on
the device, Python scalars get the annotated dtype, weakly typed arrays become
strongly typed. A jax or numpy array of the wrong dtype is an error, never
cast. Inside a trace, and when jax rebuilds a state from its leaves
(``tree_unflatten``), nothing is checked, so compiled steps pay nothing.
"""

from __future__ import annotations

import builtins
import cmath
import dataclasses
import math
import operator
import typing
from collections.abc import Callable, Mapping
from typing import Any, Self, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from beartype import BeartypeConf
from beartype.door import is_bearable
from jaxtyping import jaxtyped

from ._annotations import (
    STATIC,
    X64_ON,
    ArrayAnnotation,
    parse_array_annotation,
    x64_field_fix,
    x64_loss,
)
from ._compat.arrays import ArrayImpl as _ArrayImpl
from ._compat.frames import caller_frame, caller_locals
from ._compat.jaxtyping import is_pytree_annotation, pytree_leaf
from ._compat.tracing import Tracer
from ._compat.tracing import trace_state_clean as _trace_state_clean
from ._donation import holds_deleted
from ._dtypes import is_key, itemsize, same_dtype
from ._errors import DefinitionError, DonationError, SpecError
from ._foreign import scalar_to_host
from ._format import fmt_aval, fmt_bindings, fmt_sharding
from ._runtime import CONSUMED_BY, consumer_of, local
from ._spec import fmt_value, leaf_spec

__all__ = ["State", "consumed_class", "is_state", "state", "static", "static_field_names"]

T = TypeVar("T")

_STATIC = STATIC
_INFO = "__jc_state__"
_Tracer = Tracer
_BEAR = BeartypeConf(is_pep484_tower=True)


# Type checkers read a field specifier's arguments by keyword only (PEP 681):
# `jc.static(0.1)` works at run time, but only `jc.static(default=0.1)` is
# seen as a default, so the typed signatures take `default` by keyword.
@typing.overload
def static(
    *,
    default: T,
    init: bool = True,
    repr: bool = True,
    hash: bool | None = None,
    compare: bool = True,
    metadata: Mapping[Any, Any] | None = None,
    kw_only: bool = ...,
) -> T: ...
@typing.overload
def static(
    *,
    default_factory: Callable[[], T],
    init: bool = True,
    repr: bool = True,
    hash: bool | None = None,
    compare: bool = True,
    metadata: Mapping[Any, Any] | None = None,
    kw_only: bool = ...,
) -> T: ...
@typing.overload
def static(
    *,
    init: bool = True,
    repr: bool = True,
    hash: bool | None = None,
    compare: bool = True,
    metadata: Mapping[Any, Any] | None = None,
    kw_only: bool = ...,
) -> Any: ...
def static(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    init: bool = True,
    repr: bool = True,
    hash: bool | None = None,
    compare: bool = True,
    metadata: Mapping[Any, Any] | None = None,
    kw_only: Any = dataclasses.MISSING,
) -> Any:
    """Mark a state field as static: hashable, part of the tree structure.

    A static field is not a leaf: changing its value changes the pytree
    structure, which a hot_step treats as a new signature.

    Args:
        default: the default value (optional). Type checkers see it only when
            passed by keyword: write ``jc.static(default=0.1)`` in typed code.
        default_factory: as for :func:`dataclasses.field`; so are ``init``,
            ``repr``, ``hash``, ``compare``, ``metadata`` and ``kw_only``.

    Examples:
        >>> import jaxcontracts as jc
        >>> from jaxtyping import Array, Float32
        >>> @jc.state
        ... class S:
        ...     x: Float32[Array, "n"]
        ...     dt: float = jc.static(default=0.1)
        >>> S.spec(n=2).dt
        0.1
    """
    if default is not dataclasses.MISSING:
        try:
            builtins.hash(default)  # `hash` is this function's parameter
        except TypeError:
            raise DefinitionError(
                f"jc.static({default!r}): a static field's default must be hashable "
                f"({type(default).__name__} is not). Static values are part of the "
                "tree structure: jax hashes and compares them on every call.\n"
                + (
                    f"Fix: use a tuple, jc.static({tuple(default)!r})."
                    if isinstance(default, list)
                    else "Fix: use a hashable value (a tuple, a frozen dataclass), "
                    "or make it an array field if it is data."
                )
            ) from None
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        init=init,
        repr=repr,
        hash=hash,
        compare=compare,
        metadata={**(metadata or {}), _STATIC: True},
        kw_only=kw_only,
    )


# --------------------------------------------------------------------------
# Field kinds


@dataclasses.dataclass(frozen=True)
class _ArrayField:
    name: str
    ann: ArrayAnnotation


@dataclasses.dataclass(frozen=True)
class _StateField:
    name: str
    cls: type


@dataclasses.dataclass(frozen=True)
class _PyTreeField:
    name: str
    annotation: Any
    leaf: ArrayAnnotation | None  # a concrete leaf annotation, when there is one


@dataclasses.dataclass(frozen=True)
class _StaticField:
    name: str
    annotation: Any


_Field = _ArrayField | _StateField | _PyTreeField | _StaticField


@dataclasses.dataclass(frozen=True)
class _StateInfo:
    fields: tuple[_Field, ...]
    data_names: tuple[str, ...]
    static_names: tuple[str, ...]
    # Signatures (see _signature_key) whose validation passed with nothing to
    # convert: a construction with one of them is not validated again.
    valid: set[tuple[Any, ...]] = dataclasses.field(
        default_factory=set, compare=False, hash=False, repr=False
    )
    plan: list[Any] = dataclasses.field(
        default_factory=list, compare=False, hash=False, repr=False
    )

    @property
    def dim_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for f in self.fields:
            if isinstance(f, _ArrayField):
                names.extend(f.ann.dim_names)
            elif isinstance(f, _StateField):
                names.extend(_info(f.cls).dim_names)
        return tuple(dict.fromkeys(names))

    @property
    def variadic_dim_names(self) -> frozenset[str]:
        names: set[str] = set()
        for f in self.fields:
            if isinstance(f, _ArrayField):
                names.update(f.ann.variadic_names)
            elif isinstance(f, _StateField):
                names.update(_info(f.cls).variadic_dim_names)
        return frozenset(names)


def is_state(x: Any) -> bool:
    """Whether ``x`` is a ``jc.state`` class or instance.

    Only classes made states count (decorated, or ``jc.State`` subclasses),
    and the consumed form of one: a plain subclass of a state class inherits
    its fields but is not a dataclass of its own, nor a registered pytree.
    """
    cls = x if isinstance(x, type) else type(x)
    return _INFO in cls.__dict__ or CONSUMED_BY in cls.__dict__


def _info(cls: type) -> _StateInfo:
    return getattr(cls, _INFO)


def static_field_names(cls: type) -> tuple[str, ...]:
    return _info(cls).static_names


def data_field_names(cls: type) -> tuple[str, ...]:
    return _info(cls).data_names


def _classify(cls: type, f: dataclasses.Field, hint: Any) -> _Field:
    where = f"{cls.__qualname__}.{f.name}"
    if f.metadata.get(_STATIC):
        return _StaticField(f.name, hint)
    array = parse_array_annotation(hint, where)
    if array is not None:
        return _ArrayField(f.name, array)
    if isinstance(hint, type) and is_state(hint):
        return _StateField(f.name, hint)
    if is_pytree_annotation(hint):
        return _PyTreeField(f.name, hint, parse_array_annotation(pytree_leaf(hint), where))
    raise DefinitionError(
        f"{where}: the annotation {_hint_name(hint)} is not something a state "
        "field can hold.\nA jc.state field is one of:\n"
        '  1. an array:        x: Float32[Array, "n 3"]   (a concrete dtype)\n'
        "  2. a nested state:  inner: OtherState          (a @jc.state class)\n"
        "  3. a pytree:        params: PyTree[Float32[Array, '...']]\n"
        "  4. a static value:  dt: float = jc.static(0.01)\n"
        f"Fix: if {f.name} is configuration, write `{f.name}: {_hint_name(hint)} = "
        "jc.static(...)`; if it is data, annotate it as an array."
    )


def _refuse_init_vars(cls: type, hints: Mapping[str, Any]) -> None:
    """A DefinitionError for ``InitVar`` pseudo-fields (they hold no value)."""
    names = [
        name
        for name in cls.__dataclass_fields__  # type: ignore[attr-defined]
        if isinstance(hints.get(name), dataclasses.InitVar) or hints.get(name) is dataclasses.InitVar
    ]
    if names:
        shown = ", ".join(f"{cls.__qualname__}.{n}" for n in names)
        inner = _hint_name(getattr(hints[names[0]], "type", Any))
        raise DefinitionError(
            f"@jc.state: {shown} {'is an InitVar' if len(names) == 1 else 'are InitVars'}"
            ", which a state cannot hold.",
            [
                "  A state field is a leaf (an array, a nested state, a pytree) or a",
                "  static value: jax rebuilds a state from those alone (tree_unflatten),",
                "  spec() and zeros() never see an InitVar, and replace() would need it",
                "  passed again.",
            ],
            fix=f"keep it as a field: `{names[0]}: {inner} = jc.static(default=...)` for "
            "configuration, or an array field for data; to compute fields from an "
            "argument, write a classmethod that builds the state, e.g. "
            f"`def create(cls, ..., {names[0]}): return cls(...)`.",
        )


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or repr(hint)


# --------------------------------------------------------------------------
# The decorator


@typing.overload
def state(cls: type[T], /) -> type[T]: ...
@typing.overload
def state(*, eq: bool = ...) -> Callable[[type[T]], type[T]]: ...
@typing.dataclass_transform(frozen_default=True, eq_default=False, field_specifiers=(static,))
def state(cls: Any = None, /, *, eq: bool = False) -> Any:
    """Make a class a validated, frozen state dataclass registered as a pytree.

    Args:
        cls: the class, annotated with jaxtyping array types, nested states,
            ``PyTree[...]`` and ``jc.static`` fields.
        eq: generate ``__eq__`` (off by default: comparing device arrays
            would read them back to the host).

    Returns:
        The class, with ``spec(**dims)``, ``zeros(**dims)`` and ``replace()``.
        Type checkers see those methods on a subclass of :class:`State`
        (the same thing, as a base class), not on a decorated class.

    Raises:
        DefinitionError: for a field that is not an array, state, pytree or
            static field, or an array annotation with an abstract dtype.

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> from jaxtyping import Array, Float32, Int32
        >>> @jc.state
        ... class Counter:
        ...     x: Float32[Array, "n"]
        ...     step: Int32[Array, ""]
        >>> c = Counter(x=jnp.zeros(3, jnp.float32), step=0)
        >>> c
        Counter(x=f32[3], step=i32[])
    """
    # Annotations may name classes local to the defining function (and are
    # strings under `from __future__ import annotations`): resolve them there.
    localns = caller_locals(1)
    if cls is None:

        def decorate(cls: type[T]) -> type[T]:
            return _make_state(cls, eq, localns)

        return decorate
    return _make_state(cls, eq, localns)


def _make_state(cls: Any, eq: bool, localns: dict[str, Any]) -> Any:
    if not isinstance(cls, type):
        raise DefinitionError(
            f"@jc.state decorates a class, got {type(cls).__name__} {cls!r}."
        )
    if _INFO in cls.__dict__:  # a jc.State subclass, or decorated twice
        if eq and not cls.__dataclass_params__.eq:  # type: ignore[attr-defined]
            raise DefinitionError(
                f"{cls.__qualname__} is already a jc.state without eq=True.\n"
                f"Fix: write `class {cls.__name__}(jc.State, eq=True)`."
            )
        return cls
    user_post_init = _user_post_init(cls)

    def __post_init__(self: Any) -> None:
        # Validate once, in the instance's own class: a subclass's
        # __post_init__ calling super().__post_init__() reaches this wrapper
        # of a base class, which then runs only the base's own code.
        if _INFO not in type(self).__dict__:  # a plain subclass of a state
            raise _undecorated(type(self))
        if type(self).__post_init__ is __post_init__:
            _validate(self)
        if user_post_init is not None:
            user_post_init(self)

    __post_init__.__jc_user_post_init__ = user_post_init  # type: ignore[attr-defined]
    cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
    try:
        dc = dataclasses.dataclass(frozen=True, eq=eq, repr=False)(cls)
    except (TypeError, ValueError) as e:
        raise DefinitionError(
            f"@jc.state could not make {cls.__qualname__} a dataclass: {e}\n"
            "Fix: put fields with defaults (jc.static(...)) after fields "
            "without, or give them keyword-only defaults."
        ) from None
    try:
        hints = typing.get_type_hints(dc, localns=localns, include_extras=True)
    except NameError as e:
        raise DefinitionError(
            f"@jc.state: cannot resolve an annotation of {cls.__qualname__}: {e}.\n"
            "Fix: define (or import) that name before the class; state "
            "annotations are read when the decorator runs."
        ) from None
    _refuse_init_vars(dc, hints)
    fields = tuple(_classify(dc, f, hints[f.name]) for f in dataclasses.fields(dc))
    info = _StateInfo(
        fields=fields,
        data_names=tuple(f.name for f in fields if not isinstance(f, _StaticField)),
        static_names=tuple(f.name for f in fields if isinstance(f, _StaticField)),
    )
    setattr(dc, _INFO, info)
    _register_pytree(dc, info)

    dc.__repr__ = _state_repr
    dc.__getstate__ = _getstate
    dc.spec = State.__dict__["spec"]
    dc.zeros = State.__dict__["zeros"]
    dc.replace = State.__dict__["replace"]
    return dc


def _undecorated(cls: type) -> DefinitionError:
    base = next(k for k in cls.__mro__ if _INFO in k.__dict__)
    return DefinitionError(
        f"{cls.__qualname__} subclasses the state class {base.__qualname__} but is "
        "not a jc.state itself: its own annotations are not fields, and jax does "
        f"not know it as a pytree, so a hot step would see a {cls.__name__} as an "
        "opaque leaf.\n"
        f"Fix: decorate it too (@jc.state class {cls.__name__}({base.__name__}): ...), "
        f"or define {base.__name__} as `class {base.__name__}(jc.State)`, which makes "
        "every subclass a state."
    )


def _user_post_init(cls: type) -> Callable[[Any], None] | None:
    """The user's ``__post_init__`` for ``cls``: its own, else the one it inherits.

    As for a dataclass: a class's own ``__post_init__`` is responsible for
    calling ``super().__post_init__()``; a class without one runs its base's.
    A base state's method is jaxcontracts' wrapper: the user's code is in it.
    """
    for klass in cls.__mro__:
        method = klass.__dict__.get("__post_init__")
        if method is not None:
            return getattr(method, "__jc_user_post_init__", method)
    return None


@typing.dataclass_transform(frozen_default=True, eq_default=False, field_specifiers=(static,))
class State:
    """Base class form of :func:`state`: ``class P(jc.State)`` is ``@jc.state class P``.

    A subclass is made a validated, frozen state dataclass registered as a
    pytree when it is defined, exactly as the decorator does; pass
    ``eq=True`` as a class keyword to generate ``__eq__``. Unlike the
    decorator, the base class lets type checkers see ``spec``, ``zeros`` and
    ``replace``, typed as returning the subclass.

    Raises:
        DefinitionError: as :func:`state`, when the subclass is defined.

    Examples:
        >>> import jaxcontracts as jc
        >>> from jaxtyping import Array, Float32
        >>> class Counter(jc.State):
        ...     x: Float32[Array, "n"]
        ...     dt: float = jc.static(default=0.1)
        >>> c = Counter.zeros(n=3)
        >>> c.replace(dt=0.2)
        Counter(x=f32[3], dt=0.2)
    """

    def __init_subclass__(cls, *, eq: bool = False, **kwargs: Any) -> None:
        """Make the subclass a state, as ``@jc.state(eq=eq)`` does."""
        super().__init_subclass__(**kwargs)
        if CONSUMED_BY in cls.__dict__:  # consumed_class(): the base's own form
            return
        # Frame 1 runs the class statement (below any cooperative
        # __init_subclass__ of a subclass): resolve annotations there.
        frame = caller_frame(1)
        while frame is not None and frame.f_code.co_name == "__init_subclass__" and frame.f_back is not None:
            frame = frame.f_back
        _make_state(cls, eq, dict(frame.f_locals) if frame is not None else {})

    @classmethod
    def spec(cls, *, sharding: Any = None, **dims_and_fields: Any) -> Self:
        """An instance whose leaves are ``jax.ShapeDtypeStruct`` s (no device memory).

        Args:
            sharding: one ``jax.sharding.Sharding`` for every leaf, or a mapping
                from field name to sharding.
            **dims_and_fields: named dims (``n=4096``), and a value or spec for
                each ``PyTree`` field.

        Raises:
            SpecError: a missing or unknown dim, or a PyTree field not given.
        """
        return _make(cls, dims_and_fields, sharding, _to_spec, "spec")

    @classmethod
    def zeros(cls, *, sharding: Any = None, **dims_and_fields: Any) -> Self:
        """A concrete instance filled with zeros, exact dtypes, on the device.

        Takes the same arguments as ``spec()``. A typed PRNG key field
        (``Key[Array, ...]``) gets zero key data, JAX's own zeros for a key
        dtype (``jnp.zeros(shape, key_dtype)``): for the default threefry
        implementation every element is ``jax.random.key(0)``. Deterministic
        and cheap, but every element is the same key: seed real runs with
        ``jax.random.key(seed)`` (split it for arrays of keys).
        """
        return _make(cls, dims_and_fields, sharding, _to_zeros, "zeros")

    def replace(self, **changes: Any) -> Self:
        """Return a copy with some fields changed (validated like construction)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


# --------------------------------------------------------------------------
# Consumed states: what a donating hot step leaves behind


_consumed: dict[tuple[type, str], type] = {}


def consumed_class(cls: type, step: str) -> type:
    """The class a ``cls`` instance takes once ``step`` donated its buffers.

    A subclass with the same name and layout (so ``obj.__class__ = ...`` is
    one store per call), registered as a pytree like ``cls`` (a tree_map over
    it rebuilds a plain ``cls``). Reading a field whose arrays were donated
    raises a DonationError naming the step and the field, instead of JAX's
    bare ``RuntimeError: Array has been deleted`` at first use; fields whose
    buffers survived (not donated, or donation not honoured) read as before.
    """
    key = (cls, step)
    made = _consumed.get(key)
    if made is None:
        made = _consumed[key] = _make_consumed(cls, step)
    return made


def _make_consumed(cls: type, step: str) -> type:
    info = _info(cls)
    data = frozenset(info.data_names)
    get = object.__getattribute__

    def __getattribute__(self: Any, name: str) -> Any:
        value = get(self, name)
        if name in data and holds_deleted(value):
            __tracebackhide__ = True
            summary, fix = _consumed_read(cls, step, name, value)
            loop = local.loop
            if loop is None or local.allow:
                raise DonationError(
                    summary, fix=fix, contract="no-donated-use", step=step, leaves=[f".{name}"]
                )
            # In a hot loop: its violation, at the user's line (recorded, in
            # record mode, and the deleted value returned as JAX would).
            loop.violation("donation", summary, fix, DonationError)
        return value

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        raise DonationError(
            f"this {cls.__name__} was donated to {step}: its arrays no longer exist, "
            "so it cannot be pickled or copied.",
            fix=f"save or copy the state {step} returned (s = {step}(s)).",
            contract="no-donated-use",
            step=step,
        )

    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        # type(s)(...) and replace() on a consumed state build a plain, validated
        # one (replace() reads, and so refuses, the fields it does not change).
        return cls(*args, **kwargs)

    made = type(cls)(
        cls.__name__,
        (cls,),
        {
            "__new__": __new__,
            "__slots__": (),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "__getattribute__": __getattribute__,
            "__reduce_ex__": __reduce_ex__,
            CONSUMED_BY: step,
        },
    )
    _register_pytree(made, info, via_dict=True, rebuild=cls)
    return made


def _consumed_read(cls: type, step: str, name: str, value: Any) -> tuple[str, str]:
    """(summary, fix) for reading a donated field of a consumed state."""
    what = fmt_aval(value.shape, value.dtype) if isinstance(value, jax.Array) else "its arrays"
    return (
        f"{cls.__name__}.{name}: {what} was donated to {step} and no longer exists "
        f"(this {cls.__name__} was passed to {step}, which reused its buffers).",
        f"read the state {step} returned (s = {step}(s); s.{name}). To keep the "
        f"old value as well, copy it before the call (old = jnp.copy(s.{name})), "
        "or leave the field out of donate=.",
    )


def _register_pytree(
    cls: type, info: _StateInfo, *, via_dict: bool = False, rebuild: type | None = None
) -> None:
    data, static_ = info.data_names, info.static_names
    keys = tuple(jax.tree_util.GetAttrKey(n) for n in data)
    # A consumed state's fields are read from its __dict__ (its attributes raise).
    get_data = _dict_getter(data) if via_dict else _getter(data)
    get_static = _dict_getter(static_) if via_dict else _getter(static_)
    new = object.__new__
    made = cls if rebuild is None else rebuild

    def flatten(x: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return get_data(x), get_static(x)

    def flatten_with_keys(x: Any) -> tuple[Any, tuple[Any, ...]]:
        return tuple(zip(keys, get_data(x))), get_static(x)

    def unflatten(aux: tuple[Any, ...], children: Any) -> Any:
        # Rebuild without __init__: no validation when jax reassembles a tree.
        obj = new(made)
        d = obj.__dict__
        d.update(zip(data, children))
        d.update(zip(static_, aux))
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda x: ()
    if len(names) == 1:
        (name,) = names
        return lambda x: (getattr(x, name),)
    return operator.attrgetter(*names)


def _dict_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda x: ()
    get = operator.itemgetter(*names)
    if len(names) == 1:
        return lambda x: (get(x.__dict__),)
    return lambda x: get(x.__dict__)


def flat_leaf_getter(cls: type) -> Callable[[Any], tuple[Any, ...]] | None:
    """Read the leaves of an instance by attribute, if every field is an array."""
    info = _info(cls)
    if not all(isinstance(f, (_ArrayField, _StaticField)) for f in info.fields):
        return None
    return _getter(info.data_names)


def is_sealed_state(x: Any) -> bool:
    """Whether ``x`` is a jc.state whose fields cannot change after construction.

    True when every field is an array, a static (hashable) value or a nested
    state of the same kind: the instance is frozen, so its leaves are the ones
    it was built with. A ``PyTree`` field holds a container (a dict, a list)
    that can be edited in place, so a state with one is never sealed.
    """
    if not is_state(x):
        return False
    cls = x if isinstance(x, type) else type(x)
    return all(
        isinstance(f, (_ArrayField, _StaticField)) or (isinstance(f, _StateField) and is_sealed_state(f.cls))
        for f in _info(cls).fields
    )


def _getstate(self: Any) -> dict[str, Any]:
    # Pickles and copies carry fields only: never a hot_step's provenance token.
    return {k: v for k, v in self.__dict__.items() if not k.startswith("__jaxcontracts")}


def _build(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance from exact values, without validation."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def _state_repr(self: Any) -> str:
    # Never reads device memory: jax arrays show their spec, not their values,
    # so printing a state inside a hot loop costs no transfer.
    parts = []
    for f in dataclasses.fields(self):
        v = self.__dict__.get(f.name)
        if isinstance(v, jax.ShapeDtypeStruct) or (
            isinstance(v, jax.Array) and not isinstance(v, _Tracer)
        ):
            text = fmt_aval(v.shape, v.dtype, v.aval.weak_type if isinstance(v, jax.Array) else v.weak_type)
            if isinstance(v, jax.Array) and v.is_deleted():  # a buffer state, no transfer
                by = consumer_of(self)
                text += f" (deleted: donated to {by})" if by else " (deleted)"
        elif isinstance(v, (np.ndarray, np.generic)) or is_state(v) or v is None:
            text = repr(v)
        elif f.name in _info(type(self)).static_names:
            text = repr(v)
        else:
            text = _tree_summary(v)
        parts.append(f"{f.name}={text}")
    return f"{type(self).__name__}({', '.join(parts)})"


def _tree_summary(tree: Any) -> str:
    leaves = jax.tree_util.tree_leaves(tree)
    specs = [leaf_spec(x) for x in leaves]
    nbytes = sum(
        int(np.prod(s.shape)) * itemsize(s.dtype) for s in specs if s is not None
    )
    return f"<{type(tree).__name__}: {len(leaves)} leaves, {nbytes:,} bytes>"


# --------------------------------------------------------------------------
# Validation at construction


@dataclasses.dataclass
class _Problem:
    field: str
    expected: str
    got: str
    fix: str


def _is_tracing(self: Any, info: _StateInfo) -> bool:
    if not _trace_state_clean():
        return True
    for name in info.data_names:
        v = self.__dict__[name]
        if isinstance(v, _Tracer):
            return True
    return False


# --------------------------------------------------------------------------
# The validation cache
#
# Validation of a field depends only on what the key below records, so a
# signature that passed before passes again, with the same (unconverted)
# values: it is not re-proven. What makes a key:
#
# * an array field: its aval, for an array whose type is exactly ArrayImpl
#   (concrete, not a tracer, a subclass or a numpy array). JAX interns avals
#   (equal avals are one object, compared by identity), and an aval holds the
#   shape, dtype, weak type and (abstract) sharding: everything _convert_array,
#   the dims and jaxtyping read. Only strongly typed arrays of the field's
#   dtype ever pass unconverted, so a hit never skips a conversion. A deleted
#   array keeps its aval and is accepted by both paths alike.
# * a nested state: its exact class (validation checks isinstance).
# * a PyTree field: its treedef and the avals of its leaves, each leaf exactly
#   an ArrayImpl; a hit rebuilds the container, as validation does.
# * a static field: (type, value) for bool, int, float, complex, str and None
#   only; any other static value (a tuple may hold 1 or 1.0, equal but typed
#   differently) takes the full path.
#
# Anything else (numpy arrays, Python scalars, specs, tracers) returns no key
# and is validated in full every time. Every field is in one key, so dims
# bound across fields are part of it. Failures are never cached: an error is
# always rebuilt by the full path, so messages are unchanged.

_CACHE_LIMIT = 256  # signatures kept per class; the set is emptied when full
_ATOMS = frozenset({bool, int, float, complex, str, type(None)})
_MISS = object()


def _key_plan(info: _StateInfo) -> tuple[tuple[str, int], ...]:
    """(field name, kind) for each field: 0 array, 1 static, 2 state, 3 pytree."""
    if not info.plan:
        kinds = {_ArrayField: 0, _StaticField: 1, _StateField: 2, _PyTreeField: 3}
        info.plan.append(tuple((f.name, kinds[type(f)]) for f in info.fields))
    return info.plan[0]  # type: ignore[no-any-return]


def _signature_key(d: dict[str, Any], info: _StateInfo) -> tuple[Any, ...] | None:
    """The validation signature of an instance's fields, or None when uncacheable."""
    array_impl = _ArrayImpl
    if array_impl is None:
        return None
    key: list[Any] = []
    append = key.append
    for name, kind in _key_plan(info):
        v = d.get(name, _MISS)
        t = type(v)
        if kind == 0:
            if t is not array_impl:
                return None
            append(v.aval)
        elif kind == 1:
            if t not in _ATOMS:
                return None
            append((t, v))
        elif kind == 2:
            append(t)
        else:
            leaves, treedef = jax.tree_util.tree_flatten(v)
            avals = []
            for leaf in leaves:
                if type(leaf) is not array_impl:
                    return None
                avals.append(leaf.aval)
            append((treedef, tuple(avals)))
    return tuple(key)


def _cached(self: Any, info: _StateInfo) -> tuple[bool, tuple[Any, ...] | None]:
    """(whether this signature passed before, its key)."""
    key = _signature_key(self.__dict__, info)
    if key is None:
        return False, None
    try:
        hit = key in info.valid
    except TypeError:  # an unhashable treedef (a pytree node's aux data)
        return False, None
    if hit:
        for f in info.fields:  # rebuild PyTree containers, as validation does
            if isinstance(f, _PyTreeField):
                leaves, treedef = jax.tree_util.tree_flatten(self.__dict__[f.name])
                object.__setattr__(self, f.name, jax.tree_util.tree_unflatten(treedef, leaves))
    return hit, key


def _remember(info: _StateInfo, key: tuple[Any, ...], self: Any, converted: dict[str, Any]) -> None:
    """Cache a signature that passed, if validation changed no value."""
    d = self.__dict__
    for f in info.fields:
        if isinstance(f, _ArrayField) and converted.get(f.name) is not d[f.name]:
            return
        if isinstance(f, _PyTreeField):
            new = jax.tree_util.tree_leaves(converted.get(f.name))
            old = jax.tree_util.tree_leaves(d[f.name])
            if len(new) != len(old) or any(a is not b for a, b in zip(new, old)):
                return
    if len(info.valid) >= _CACHE_LIMIT:
        info.valid.clear()
    info.valid.add(key)


def validation_cache_size(cls: type) -> int:
    """How many validated signatures ``cls`` remembers (for tests and benchmarks)."""
    return len(_info(cls).valid)


def clear_validation_cache(cls: type) -> None:
    """Forget every validated signature of ``cls`` (the next construction validates)."""
    _info(cls).valid.clear()


def _validate(self: Any) -> None:
    __tracebackhide__ = True
    cls = type(self)
    info = _info(cls)
    hit, key = _cached(self, info)
    if hit:
        return
    if _is_tracing(self, info):
        return
    problems: list[_Problem] = []
    converted: dict[str, Any] = {}
    bindings: dict[str, Any] = {}
    bound_by: dict[str, str] = {}
    to_check: list[tuple[str, Any, Any]] = []  # (field, value, jaxtyping annotation)

    for f in info.fields:
        value = self.__dict__[f.name]
        if isinstance(f, _ArrayField):
            new, problem = _convert_array(f.name, value, f.ann)
            if problem is not None:
                problems.append(problem)
                continue
            converted[f.name] = new
            why, found = f.ann.match(leaf_spec(new).shape, bindings)
            if why is not None:
                owners = ", ".join(
                    f"{k}={bindings[k]} (from .{bound_by[k]})" for k in f.ann.dim_names if k in bindings
                )
                problems.append(
                    _Problem(
                        f.name,
                        f.ann.pretty() + (f" with {owners}" if owners else ""),
                        fmt_value(new),
                        f"{why}. Check how .{f.name} is created, or whether the "
                        "dims above are the intended ones.",
                    )
                )
                continue
            for k, v in found.items():
                bindings[k] = v
                bound_by[k] = f.name
            if not isinstance(new, jax.ShapeDtypeStruct):
                to_check.append((f.name, new, f.ann.annotation))
        elif isinstance(f, _StateField):
            if not isinstance(value, f.cls):
                problems.append(
                    _Problem(
                        f.name,
                        f"a {f.cls.__name__} instance",
                        _describe(value),
                        f"build it with {f.cls.__name__}(...) or {f.cls.__name__}.zeros(...).",
                    )
                )
        elif isinstance(f, _PyTreeField):
            new, leaf_problems = _convert_pytree(f, value)
            problems.extend(leaf_problems)
            if not leaf_problems:
                converted[f.name] = new
                if not _all_specs(new):
                    to_check.append((f.name, new, f.annotation))
        else:
            problems.extend(_check_static(f, value))

    if not problems and to_check:
        # jaxtyping is the authority on shapes, with one dim memo for all fields.
        for name, ok in zip((n for n, _, _ in to_check), _jaxtyping_check(to_check)):
            if not ok:
                ann = next(a for n, _, a in to_check if n == name)
                problems.append(
                    _Problem(
                        name,
                        _hint_name(ann),
                        fmt_value(converted[name])
                        if not isinstance(converted[name], (dict, list, tuple))
                        else _tree_summary(converted[name]),
                        "its leaves must match the annotation, with named dims "
                        "bound consistently across fields.",
                    )
                )
    if problems:
        raise SpecError(_spec_message(cls, problems, bindings, bound_by))
    if key is not None:
        _remember(info, key, self, converted)
    for name, v in converted.items():
        object.__setattr__(self, name, v)


@jaxtyped(typechecker=None)
def _jaxtyping_check(items: list[tuple[str, Any, Any]]) -> list[bool]:
    # isinstance checks inside one jaxtyped call share their dim bindings.
    return [isinstance(value, ann) for _, value, ann in items]


def _convert_array(name: str, value: Any, ann: ArrayAnnotation) -> tuple[Any, _Problem | None]:
    """The exact device form of one array field, or the problem with it."""
    want = ann.dtype
    expected = ann.pretty()
    if is_key(want):
        return _convert_key(name, value, ann)
    if isinstance(value, jax.Array):
        if not same_dtype(value.dtype, want):
            return None, _x64_problem(name, value, ann) or _wrong_dtype(name, ann, value, "jax array")
        if value.aval.weak_type:
            return jax.lax.convert_element_type(value, want), None
        return value, None
    if ann.needs_x64 and isinstance(
        value, (jax.ShapeDtypeStruct, np.ndarray, np.generic, bool, int, float, complex)
    ):
        # Without jax_enable_x64 JAX would store (or compile) 32 bits.
        problem = _x64_problem(name, value, ann)
        if problem is not None:
            return None, problem
    if isinstance(value, jax.ShapeDtypeStruct):
        if not same_dtype(value.dtype, want):
            return None, _wrong_dtype(name, ann, value, "spec")
        return value, None
    if isinstance(value, (np.ndarray, np.generic)):
        if np.dtype(value.dtype) != want:
            return None, _wrong_dtype(name, ann, value, "numpy array")
        return _to_device(value), None
    if isinstance(value, (bool, int, float, complex)):
        host, problem = _scalar_to_host(name, value, ann)
        if problem is not None:
            return None, problem
        return _to_device(host), None
    return None, _Problem(
        name, expected, _describe(value), "pass a jax array (or a numpy array of that dtype)."
    )


def _convert_key(name: str, value: Any, ann: ArrayAnnotation) -> tuple[Any, _Problem | None]:
    """A typed PRNG key field: a key array (or spec) of the annotated key dtype."""
    if isinstance(value, (jax.Array, jax.ShapeDtypeStruct)) and same_dtype(value.dtype, ann.dtype):
        return value, None
    got = fmt_value(value) if not isinstance(value, jax.Array) or not is_key(value.dtype) else (
        fmt_aval(value.shape, value.dtype)
    )
    if isinstance(value, (jax.Array, np.ndarray)) and not is_key(value.dtype) and value.shape[-1:] in ((2,), (4,)):
        fix = (
            "this looks like a raw uint32 key (jax.random.PRNGKey): make a typed key with "
            "jax.random.key(seed), or wrap this one with jax.random.wrap_key_data(k)."
        )
    elif isinstance(value, jax.Array) and is_key(value.dtype):
        fix = (
            f"the key's PRNG implementation differs from the field's ({ann.pretty()}, the "
            "default implementation when the class was defined): make it with jax.random.key(seed)."
        )
    else:
        fix = "pass a typed PRNG key: jax.random.key(seed) (split it for arrays of keys)."
    return None, _Problem(name, ann.pretty(), got, fix)


def _x64_problem(name: str, value: Any, ann: ArrayAnnotation) -> _Problem | None:
    loss = x64_loss(ann.dtype)
    if loss is None:
        return None
    reason, short = loss
    return _Problem(name, ann.pretty(), _describe(value), f"{reason}: {x64_field_fix(short)}")


def _to_device(value: Any) -> jax.Array:
    """A device array that owns its buffer.

    On CPU ``jax.device_put`` may borrow an aligned numpy buffer instead of
    copying it; XLA cannot donate a borrowed buffer, so the first step would
    silently copy the state. Such a buffer is copied on the device once here.
    """
    host = np.asarray(value)
    x = jax.device_put(host)
    try:
        borrowed = host.size > 0 and x.unsafe_buffer_pointer() == host.ctypes.data
    except Exception:  # noqa: BLE001 - no single buffer (sharded) or no pointer
        borrowed = False
    return jnp.copy(x) if borrowed else x


def _wrong_dtype(name: str, ann: ArrayAnnotation, value: Any, kind: str) -> _Problem:
    expected = ann.pretty()
    if is_key(ann.dtype):
        return _Problem(name, expected, fmt_value(value), "pass a typed PRNG key: jax.random.key(seed).")
    np_name = np.dtype(ann.dtype).name  # e.g. "uint16": jnp.uint16 exists
    return _Problem(
        name,
        expected,
        fmt_value(value),
        f"a {kind} of the wrong dtype is never cast silently (a step would "
        f"return another dtype and recompile). Create it as {np_name}, e.g. "
        f"jnp.zeros(shape, jnp.{np_name}), or cast it yourself with "
        f".astype(jnp.{np_name}) if you mean it.",
    )


def _scalar_kind(dtype: np.dtype) -> str:
    """'b', 'i', 'u', 'f' or 'c' for a dtype, including ml_dtypes (bfloat16: kind 'V')."""
    for kind, family in (
        ("b", jnp.bool_),
        ("i", jnp.signedinteger),
        ("u", jnp.unsignedinteger),
        ("f", jnp.floating),
        ("c", jnp.complexfloating),
    ):
        if jnp.issubdtype(dtype, family):
            return kind
    return ""


def _scalar_to_host(name: str, value: Any, ann: ArrayAnnotation) -> tuple[Any, _Problem | None]:
    """A Python scalar as a host array of the field's dtype, or the problem with it."""
    expected = ann.pretty()
    got = f"Python {type(value).__name__} {value!r}"
    if any(d.kind not in ("variadic", "anonymous-variadic") for d in ann.dims):
        return None, _Problem(
            name, expected, got, "a Python scalar fits only a rank-0 field; pass an array."
        )
    want = ann.dtype
    kind = _scalar_kind(want)
    allowed = {
        "b": (bool,),
        "i": (int,),
        "u": (int,),
        "f": (int, float),
        "c": (int, float, complex),
    }.get(kind, ())
    ok = isinstance(value, allowed) and not (isinstance(value, bool) and kind != "b")
    if ok and kind in "iu":
        info = jnp.iinfo(want)
        ok = int(info.min) <= value <= int(info.max)
    if not ok:
        return None, _Problem(
            name,
            expected,
            got,
            f"it cannot be represented as {np.dtype(want).name} without loss; "
            "pass a value of the field's kind.",
        )
    try:
        with np.errstate(all="ignore"):
            host = np.asarray(value, dtype=want)
    except OverflowError:  # an int beyond float64's range
        host = None
    if kind in "fc" and (host is None or (_finite(value) and not np.isfinite(host))):
        dtype_name = np.dtype(want).name
        return None, _Problem(
            name,
            expected,
            got,
            f"it overflows {dtype_name} (largest finite value "
            f"{float(jnp.finfo(want).max):g}) and would be stored as "
            f"{'inf' if host is None or np.isinf(host) else 'nan'}; pass a smaller "
            f"value{_wider(want)}.",
        )
    return host, None


def _wider(dtype: np.dtype) -> str:
    """``, or annotate the field ...`` with a wider dtype, when there is one."""
    if np.dtype(dtype).itemsize < 4 and _scalar_kind(dtype) == "f":
        return ", or annotate the field with a wider dtype (Float32)"
    wider = {"float32": "Float64", "complex64": "Complex128"}.get(np.dtype(dtype).name)
    if wider is None:
        return ""
    return f", or annotate the field {wider} (with jax_enable_x64 on)"


def _finite(value: int | float | complex) -> bool:
    if isinstance(value, int):
        return True
    if isinstance(value, complex):
        return cmath.isfinite(value)
    return math.isfinite(value)


def _convert_pytree(f: _PyTreeField, value: Any) -> tuple[Any, list[_Problem]]:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(value)
    out, problems = [], []
    for path, leaf in leaves:
        where = f"{f.name}{jax.tree_util.keystr(path)}"
        if isinstance(leaf, _Tracer):
            out.append(leaf)
        elif f.leaf is not None:
            new, problem = _convert_array(where, leaf, f.leaf)
            if problem is not None:
                problems.append(problem)
            out.append(new)
        elif isinstance(leaf, (np.ndarray, np.generic, jax.ShapeDtypeStruct)) and (
            loss := x64_loss(leaf.dtype)
        ):
            problems.append(
                _Problem(
                    where,
                    "an array leaf JAX can hold",
                    _describe(leaf),
                    f"{loss[0]}: {_x64_leaf_fix(loss[1])}",
                )
            )
            out.append(leaf)
        elif isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
            weak = isinstance(leaf, jax.Array) and leaf.aval.weak_type
            out.append(jax.lax.convert_element_type(leaf, leaf.dtype) if weak else leaf)
        elif isinstance(leaf, (np.ndarray, np.generic)):
            out.append(_to_device(leaf))
        elif isinstance(leaf, (bool, int, float, complex)):
            host, why = scalar_to_host(leaf)
            if host is None:
                problems.append(_Problem(where, "an array leaf", _describe(leaf), f"{why}; pass an array."))
                out.append(leaf)
            else:  # what jc.device_tree makes of it: JAX's default dtype, strongly typed
                out.append(_to_device(host))
        else:
            problems.append(
                _Problem(
                    where,
                    "an array leaf",
                    _describe(leaf),
                    "pytree fields hold arrays (Python scalars become JAX's default "
                    "dtype); this leaf is neither: make it part of the tree structure "
                    "(a jc.static field of its own) or leave it out of the state.",
                )
            )
            out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out), problems


def _all_specs(tree: Any) -> bool:
    return all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(tree))


def _check_static(f: _StaticField, value: Any) -> list[_Problem]:
    problems = []
    try:
        hash(value)
    except TypeError:
        problems.append(
            _Problem(
                f.name,
                f"a hashable {_hint_name(f.annotation)}",
                _describe(value),
                "static fields are part of the tree structure and must be hashable; "
                "use a tuple instead of a list, or make it an array field.",
            )
        )
        return problems
    if isinstance(value, (jax.Array, np.ndarray)):
        problems.append(
            _Problem(
                f.name,
                f"a hashable {_hint_name(f.annotation)}",
                fmt_value(value),
                "an array in a static field would be compared by identity and "
                "recompile every time; make it an array field instead.",
            )
        )
    elif not is_bearable(value, f.annotation, conf=_BEAR):
        problems.append(
            _Problem(
                f.name,
                _hint_name(f.annotation),
                _describe(value),
                f"pass a {_hint_name(f.annotation)}.",
            )
        )
    return problems


def _describe(value: Any) -> str:
    if leaf_spec(value) is not None:
        return fmt_value(value)
    text = repr(value)
    return f"{type(value).__name__} {text[:50]}{'...' if len(text) > 50 else ''}"


def _spec_message(
    cls: type, problems: list[_Problem], bindings: dict[str, Any], bound_by: dict[str, str]
) -> str:
    n = len(problems)
    lines = [
        f"{cls.__module__}.{cls.__qualname__}(...) got {n} invalid field"
        f"{'s' if n != 1 else ''}:"
    ]
    for p in problems:
        lines.append(f"  .{p.field}: expected {p.expected}, got {p.got}")
        lines.append(f"      fix: {p.fix}")
    if bindings:
        lines.append(
            "  dims bound: "
            + fmt_bindings(bindings)
            + "  ("
            + ", ".join(f"{k} from .{bound_by[k]}" for k in sorted(bindings))
            + ")"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------
# spec() and zeros()


def _split_kwargs(cls: type, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    info = _info(cls)
    field_names = {f.name for f in info.fields}
    values = {k: v for k, v in kwargs.items() if k in field_names}
    dims = {k: v for k, v in kwargs.items() if k not in field_names}
    return dims, values


def _check_dims(cls: type, dims: Mapping[str, Any], what: str) -> dict[str, Any]:
    """The dims, checked: known names, non-negative int sizes (tuples for ``*batch``)."""
    info = _info(cls)
    valid = set(info.dim_names)
    unknown = sorted(set(dims) - valid)
    if unknown:
        raise SpecError(
            f"{cls.__qualname__}.{what}() got unknown dimension(s) {', '.join(unknown)}."
            f"\nValid dims: {', '.join(sorted(valid)) or '(none)'}; you may also pass "
            "a value for any field, e.g. params=... for a PyTree field."
        )
    variadic = info.variadic_dim_names
    checked: dict[str, Any] = {}
    bad: list[str] = []
    for name, value in dims.items():
        if name in variadic:
            if _is_size(value):
                checked[name] = int(value)
            elif isinstance(value, (tuple, list)) and all(_is_size(v) for v in value):
                checked[name] = tuple(int(v) for v in value)
            else:
                bad.append(
                    f"  {name}={value!r} ({type(value).__name__}): *{name} takes a "
                    "tuple of non-negative ints, e.g. (2, 3)"
                )
        elif _is_size(value):
            checked[name] = int(value)
        else:
            bad.append(
                f"  {name}={value!r} ({type(value).__name__}): expected a non-negative int"
            )
    if bad:
        first = next((n for n in dims if n not in checked and n not in variadic), "n")
        raise SpecError(
            f"{cls.__qualname__}.{what}() got {len(bad)} invalid dimension size"
            f"{'s' if len(bad) != 1 else ''}:",
            bad,
            fix="pass each dimension as a non-negative Python int, e.g. "
            f"{cls.__name__}.{what}({first}=4)"
            + (
                f", and a *{min(variadic)} dimension as a tuple of them, e.g. "
                f"{min(variadic)}=(2, 3)."
                if variadic
                else "."
            ),
            contract="dims",
        )
    return checked


def _is_size(value: Any) -> bool:
    """A non-negative int (numpy ints too), never a bool, float or string."""
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, bool)
        and value >= 0
    )


def _field_sharding(sharding: Any, name: str) -> Any:
    if isinstance(sharding, Mapping):
        return sharding.get(name)
    return sharding


def _make(cls: type, kwargs: dict[str, Any], sharding: Any, leaf_fn: Callable, what: str) -> Any:
    dims, given = _split_kwargs(cls, kwargs)
    dims = _check_dims(cls, dims, what)
    if isinstance(sharding, Mapping):
        _check_sharding_names(cls, sharding, what)
    values: dict[str, Any] = {}
    for f in _info(cls).fields:
        where = f"{cls.__qualname__}.{what}(): field .{f.name}"
        shard = _field_sharding(sharding, f.name)
        if f.name in given and not isinstance(f, _StaticField):
            values[f.name] = jax.tree_util.tree_map_with_path(
                lambda path, x, s=shard, w=where: leaf_fn(
                    _given_spec(w + jax.tree_util.keystr(path), x), s
                ),
                given[f.name],
            )
        elif isinstance(f, _ArrayField):
            if f.ann.needs_x64:
                _refuse_x64_spec(where, f.ann.pretty(), f.ann.dtype, leaf=False)
            spec = jax.ShapeDtypeStruct(f.ann.shape(dims, where), f.ann.dtype)
            _check_sharding_fits(where, spec, shard)
            values[f.name] = leaf_fn(spec, shard)
        elif isinstance(f, _StateField):
            sub_dims = {k: v for k, v in dims.items() if k in _info(f.cls).dim_names}
            inner = _make(f.cls, sub_dims, shard, leaf_fn, what)
            values[f.name] = inner
        elif isinstance(f, _PyTreeField):
            raise SpecError(
                f"{where} is a PyTree ({_hint_name(f.annotation)}), so its spec "
                "comes from an instance.\nFix: pass it, e.g. "
                f"{cls.__qualname__}.{what}(..., {f.name}=params) or "
                f"{f.name}=jc.spec_of(params)."
            )
        else:
            if f.name in given:
                values[f.name] = given[f.name]
            else:
                default = _static_default(cls, f.name)
                if default is dataclasses.MISSING:
                    raise SpecError(
                        f"{where} is static and has no default.\nFix: pass it, e.g. "
                        f"{cls.__qualname__}.{what}(..., {f.name}=...)."
                    )
                values[f.name] = default
    problems = [p for f in _info(cls).fields if isinstance(f, _StaticField)
                for p in _check_static(f, values[f.name])]
    if problems:
        raise SpecError(_spec_message(cls, problems, {}, {}))
    return _build(cls, values)


def _check_sharding_names(cls: type, sharding: Mapping[Any, Any], what: str) -> None:
    """A SpecError for a sharding mapping that names no data field of ``cls``."""
    valid = _info(cls).data_names
    unknown = [k for k in sharding if k not in valid]
    if unknown:
        static = [k for k in unknown if k in _info(cls).static_names]
        raise SpecError(
            f"{cls.__qualname__}.{what}(sharding=...) names "
            f"{', '.join(repr(k) for k in unknown)}, which "
            f"{'is not a data field' if len(unknown) == 1 else 'are not data fields'}"
            f" of {cls.__qualname__}"
            + (f" ({', '.join(static)}: static, no array to shard)" if static else "")
            + ".",
            [f"  valid field names: {', '.join(valid) or '(none)'}"],
            fix="fix the spelling, or drop the entry; a field left out of the "
            "mapping gets no sharding (a nested state takes a mapping of its own "
            "fields).",
            contract="dims",
        )


def _check_sharding_fits(where: str, spec: jax.ShapeDtypeStruct, sharding: Any) -> None:
    """A SpecError naming the field when a sharding cannot apply to its shape."""
    if sharding is None:
        return
    check = getattr(sharding, "check_compatible_aval", None)
    if check is None:
        return
    try:
        check(spec.shape)
    except ValueError as e:
        raise SpecError(
            f"{where}: the sharding {fmt_sharding(sharding)} does not fit "
            f"{fmt_aval(spec.shape, spec.dtype)}: {e}\nFix: pass a mapping "
            "from field name to sharding, e.g. sharding={'pos': rows, 't': "
            "NamedSharding(mesh, P())} (scalars take P())."
        ) from None


def _given_spec(where: str, x: Any) -> jax.ShapeDtypeStruct:
    spec = leaf_spec(x)
    if spec is None:
        raise SpecError(f"{where}: the leaf {_describe(x)} is not an array and has no spec.")
    _refuse_x64_spec(where, _describe(x), spec.dtype, leaf=True)
    return spec


def _refuse_x64_spec(where: str, what: str, dtype: Any, *, leaf: bool) -> None:
    """A SpecError for a 64-bit spec JAX would not honour (jax_enable_x64 off)."""
    loss = x64_loss(dtype)
    if loss is not None:
        reason, short = loss
        raise SpecError(
            f"{where}: {what} is not what JAX would make: {reason}, and the "
            "spec would not describe the arrays.",
            fix=_x64_leaf_fix(short) if leaf else x64_field_fix(short),
        )


def _x64_leaf_fix(short: str) -> str:
    return f"{X64_ON}; or pass {short} leaves (x.astype(np.{short}))."


def _static_default(cls: type, name: str) -> Any:
    f = cls.__dataclass_fields__[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _to_spec(s: jax.ShapeDtypeStruct, sharding: Any) -> jax.ShapeDtypeStruct:
    sharding = sharding if sharding is not None else getattr(s, "sharding", None)
    return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding)


def _to_zeros(s: jax.ShapeDtypeStruct, sharding: Any) -> jax.Array:
    sharding = sharding if sharding is not None else getattr(s, "sharding", None)
    if sharding is None:
        return jnp.zeros(s.shape, s.dtype)
    return jax.device_put(jnp.zeros(s.shape, s.dtype), sharding)
