"""``jc.state`` and ``jc.State``: the decorator and the base class. Nothing is
checked inside a trace or in ``tree_unflatten``, so compiled steps pay nothing."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any, Self, TypeVar

import jax
import numpy as np

from .._compat.frames import caller_frame, caller_locals, namespace_of
from .._compat.tracing import Tracer as _Tracer
from .._errors import ContractError, DefinitionError
from .._format import fmt_aval
from .._marks import CONSUMED_BY, STATE_INFO, USER_POST_INIT, consumer_of, without_marks
from .._tracebacks import boundary, trim
from .construct import make, to_spec, to_zeros, undecorated_error
from .fields import (
    StateInfo,
    StaticField,
    classify,
    info_of,
    is_state,
    refuse_init_vars,
    register_pytree,
    static,
    tree_summary,
)
from .validate import validate

__all__ = ["State", "state"]

T = TypeVar("T")


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
    # Annotations may name classes local to the defining function: resolve there.
    localns = caller_locals(1)
    if cls is None:

        def decorate(cls: type[T]) -> type[T]:
            try:
                return _make_state(cls, eq, localns)
            except ContractError as err:  # the traceback ends at the user's line
                trim(err)
                raise

        return decorate
    try:  # here, not through decorate(): a frame re-raised through is kept in the traceback
        return _make_state(cls, eq, localns)
    except ContractError as err:
        trim(err)
        raise


def _make_state(cls: Any, eq: bool, localns: Mapping[str, Any]) -> Any:
    if not isinstance(cls, type):
        raise DefinitionError(
            f"@jc.state decorates a class, got {type(cls).__name__} {cls!r}."
        )
    if STATE_INFO in cls.__dict__:  # a jc.State subclass, or decorated twice
        if eq and not cls.__dataclass_params__.eq:  # type: ignore[attr-defined]
            raise DefinitionError(
                f"{cls.__qualname__} is already a jc.state without eq=True.",
                fix=f"write `class {cls.__name__}(jc.State, eq=True)`.",
            )
        return cls
    user_post_init = _user_post_init(cls)

    def __post_init__(self: Any) -> None:
        # Validate once, in the instance's own class (a base's wrapper reached
        # through super().__post_init__() runs only the base's own code).
        if STATE_INFO not in type(self).__dict__:  # a plain subclass of a state
            raise undecorated_error(type(self))
        if type(self).__post_init__ is __post_init__:
            validate(self)
        if user_post_init is not None:
            user_post_init(self)

    setattr(__post_init__, USER_POST_INIT, user_post_init)
    cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
    try:
        dc = dataclasses.dataclass(frozen=True, eq=eq, repr=False)(cls)
    except (TypeError, ValueError) as e:
        raise DefinitionError(
            f"@jc.state could not make {cls.__qualname__} a dataclass: {e}",
            fix="put fields with defaults (jc.static(...)) after fields "
            "without, or give them keyword-only defaults.",
        ) from None
    if "__init__" in dc.__dict__:  # a SpecError at construction ends at the user's line
        dc.__init__ = boundary(dc.__dict__["__init__"])
    try:
        hints = typing.get_type_hints(dc, localns=localns, include_extras=True)
    except NameError as e:
        raise DefinitionError(
            f"@jc.state: cannot resolve an annotation of {cls.__qualname__}: {e}.",
            fix="define (or import) that name before the class; state "
            "annotations are read when the decorator runs.",
        ) from None
    refuse_init_vars(dc, hints)
    _refuse_shadowing(dc)
    fields = tuple(classify(dc, f, hints[f.name]) for f in dataclasses.fields(dc))
    info = StateInfo(
        fields=fields,
        data_names=tuple(f.name for f in fields if not isinstance(f, StaticField)),
        static_names=tuple(f.name for f in fields if isinstance(f, StaticField)),
    )
    setattr(dc, STATE_INFO, info)
    register_pytree(dc, info)

    dc.__repr__ = _state_repr
    dc.__getstate__ = _getstate
    for name in _METHODS:
        setattr(dc, name, State.__dict__[name])
    return dc


#: The methods every state class has: a field of one of these names would hide it.
_METHODS = {
    "spec": "Cls.spec(n=...), the spec for compiling",
    "zeros": "Cls.zeros(n=...), a zero-filled instance",
    "replace": "s.replace(...), a copy with some fields changed",
}


def _refuse_shadowing(dc: type) -> None:
    """Refuse a field named ``spec``, ``zeros`` or ``replace``: it would hide the method."""
    for f in dataclasses.fields(dc):
        if f.name in _METHODS:
            raise DefinitionError(
                f"{dc.__qualname__}.{f.name}: a state field cannot be named {f.name!r}: "
                f"it would hide {_METHODS[f.name]}.",
                fix=f"rename the field ({f.name}_ or a more specific name).",
            )


def _user_post_init(cls: type) -> Callable[[Any], None] | None:
    """The user's ``__post_init__`` for ``cls``: its own, else the one it inherits
    (a base state's is our wrapper: the user's code is in it)."""
    for klass in cls.__mro__:
        method = klass.__dict__.get("__post_init__")
        if method is not None:
            return getattr(method, USER_POST_INIT, method)
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

    @boundary  # the traceback ends at the user's class statement
    def __init_subclass__(cls, *, eq: bool = False, **kwargs: Any) -> None:
        """Make the subclass a state, as ``@jc.state(eq=eq)`` does."""
        super().__init_subclass__(**kwargs)
        if CONSUMED_BY in cls.__dict__:  # consumed_class(): the base's own form
            return
        # Frame 2 (past cooperative __init_subclass__ frames) runs the class
        # statement: resolve annotations there, without changing its locals().
        frame = caller_frame(2)
        while (
            frame is not None
            and frame.f_code.co_name == "__init_subclass__"
            and frame.f_back is not None
        ):
            frame = frame.f_back
        _make_state(cls, eq, namespace_of(frame) if frame is not None else {})

    @classmethod
    @boundary
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
        return make(cls, dims_and_fields, sharding, to_spec, "spec")

    @classmethod
    @boundary
    def zeros(cls, *, sharding: Any = None, **dims_and_fields: Any) -> Self:
        """A concrete instance filled with zeros, exact dtypes, on the device.

        Takes the same arguments as ``spec()``. A typed PRNG key field
        (``Key[Array, ...]``) gets zero key data, JAX's own zeros for a key
        dtype (``jnp.zeros(shape, key_dtype)``): for the default threefry
        implementation every element is ``jax.random.key(0)``. Deterministic
        and cheap, but every element is the same key: seed real runs with
        ``jax.random.key(seed)`` (split it for arrays of keys).
        """
        return make(cls, dims_and_fields, sharding, to_zeros, "zeros")

    @boundary
    def replace(self, **changes: Any) -> Self:
        """Return a copy with some fields changed (validated like construction)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _getstate(self: Any) -> dict[str, Any]:
    return without_marks(self.__dict__)


def _state_repr(self: Any) -> str:
    # Never reads device memory: printing a state in a hot loop costs no transfer.
    parts = []
    for f in dataclasses.fields(self):
        v = self.__dict__.get(f.name)
        if isinstance(v, jax.ShapeDtypeStruct) or (
            isinstance(v, jax.Array) and not isinstance(v, _Tracer)
        ):
            text = fmt_aval(
                v.shape, v.dtype, v.aval.weak_type if isinstance(v, jax.Array) else v.weak_type
            )
            if isinstance(v, jax.Array) and v.is_deleted():  # a buffer state, no transfer
                by = consumer_of(self)
                text += f" (deleted: donated to {by})" if by else " (deleted)"
        elif isinstance(v, (np.ndarray, np.generic)) or is_state(v) or v is None:
            text = repr(v)
        elif f.name in info_of(type(self)).static_names:
            text = repr(v)
        else:
            text = tree_summary(v)
        parts.append(f"{f.name}={text}")
    return f"{type(self).__name__}({', '.join(parts)})"

