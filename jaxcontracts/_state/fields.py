"""A ``jc.state`` class's fields: ``jc.static``, the four field kinds (array,
nested state, ``PyTree[...]``, static), the class's field table
(:class:`StateInfo`) and its registration as a pytree with ``.name`` paths."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import jax

from .._compat.jaxtyping import is_pytree_annotation, pytree_leaf
from .._dtypes import array_nbytes
from .._errors import DefinitionError
from .._marks import CONSUMED_BY, STATE_INFO
from .annotations import STATIC, ArrayAnnotation, parse_array_annotation
from .spec import leaf_spec

__all__ = [
    "ArrayField",
    "PyTreeField",
    "StateField",
    "StateInfo",
    "StaticField",
    "build",
    "classify",
    "hint_name",
    "info_of",
    "is_sealed_state",
    "is_state",
    "refuse_init_vars",
    "register_pytree",
    "static",
    "tree_summary",
]

T = TypeVar("T")


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
                "tree structure: jax hashes and compares them on every call.",
                fix=f"use a tuple, jc.static({tuple(default)!r})."
                if isinstance(default, list)
                else "use a hashable value (a tuple, a frozen dataclass), "
                "or make it an array field if it is data.",
            ) from None
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        init=init,
        repr=repr,
        hash=hash,
        compare=compare,
        metadata={**(metadata or {}), STATIC: True},
        kw_only=kw_only,
    )


@dataclasses.dataclass(frozen=True)
class ArrayField:
    name: str
    ann: ArrayAnnotation


@dataclasses.dataclass(frozen=True)
class StateField:
    name: str
    cls: type


@dataclasses.dataclass(frozen=True)
class PyTreeField:
    name: str
    annotation: Any
    leaf: ArrayAnnotation | None  # a concrete leaf annotation, when there is one


@dataclasses.dataclass(frozen=True)
class StaticField:
    name: str
    annotation: Any


Field = ArrayField | StateField | PyTreeField | StaticField


@dataclasses.dataclass(frozen=True)
class StateInfo:
    fields: tuple[Field, ...]
    data_names: tuple[str, ...]
    static_names: tuple[str, ...]
    # Signatures (see _signature_key) whose validation passed with nothing to
    # convert: a construction with one of them is not validated again.
    valid: set[tuple[Any, ...]] = dataclasses.field(
        default_factory=set, compare=False, hash=False, repr=False
    )

    @functools.cached_property
    def kinds(self) -> tuple[tuple[str, type], ...]:
        """(name, kind) of each field, in order: what _signature_key walks."""
        return tuple((f.name, type(f)) for f in self.fields)

    def _names(self, own: str, nested: str) -> Iterator[str]:
        """Each array field's ``ann.<own>`` and each nested state's ``<nested>``, in order."""
        for f in self.fields:
            if isinstance(f, ArrayField):
                yield from getattr(f.ann, own)
            elif isinstance(f, StateField):
                yield from getattr(info_of(f.cls), nested)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self._names("dim_names", "dim_names")))

    @property
    def variadic_dim_names(self) -> frozenset[str]:
        return frozenset(self._names("variadic_names", "variadic_dim_names"))


def is_state(x: Any) -> bool:
    """Whether ``x`` is a ``jc.state`` class or instance (or the consumed form of
    one); a plain subclass of a state class is not (nor a registered pytree)."""
    cls = x if isinstance(x, type) else type(x)
    return STATE_INFO in cls.__dict__ or CONSUMED_BY in cls.__dict__


def info_of(cls: type) -> StateInfo:
    return getattr(cls, STATE_INFO)


def classify(cls: type, f: dataclasses.Field, hint: Any) -> Field:
    where = f"{cls.__qualname__}.{f.name}"
    if f.metadata.get(STATIC):
        return StaticField(f.name, hint)
    array = parse_array_annotation(hint, where)
    if array is not None:
        return ArrayField(f.name, array)
    if isinstance(hint, type) and is_state(hint):
        return StateField(f.name, hint)
    if is_pytree_annotation(hint):
        return PyTreeField(f.name, hint, parse_array_annotation(pytree_leaf(hint), where))
    raise DefinitionError(
        f"{where}: the annotation {hint_name(hint)} is not something a state "
        "field can hold.",
        [
            "A jc.state field is one of:",
            '  1. an array:        x: Float32[Array, "n 3"]   (a concrete dtype)',
            "  2. a nested state:  inner: OtherState          (a @jc.state class)",
            "  3. a pytree:        params: PyTree[Float32[Array, '...']]   "
            "(None too: an optional array)",
            "  4. a static value:  dt: float = jc.static(0.01)",
        ],
        fix=f"if {f.name} is configuration, write `{f.name}: {hint_name(hint)} = "
        "jc.static(...)`; if it is data, annotate it as an array.",
        leaves=[f".{f.name}"],
    )


def refuse_init_vars(cls: type, hints: Mapping[str, Any]) -> None:
    """A DefinitionError for ``InitVar`` pseudo-fields (they hold no value)."""
    names = [
        name
        for name in cls.__dataclass_fields__  # type: ignore[attr-defined]
        if isinstance(hints.get(name), dataclasses.InitVar)
        or hints.get(name) is dataclasses.InitVar
    ]
    if names:
        shown = ", ".join(f"{cls.__qualname__}.{n}" for n in names)
        inner = hint_name(getattr(hints[names[0]], "type", Any))
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


_UNIONS = (typing.Union, types.UnionType)


def hint_name(hint: Any) -> str:
    """An annotation as written (``Optional[Float32[Array, 'n']]``, not ``Optional``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in _UNIONS:  # Optional[X], X | None, Union[X, Y]
        rest = [a for a in args if a is not type(None)]
        inner = ", ".join(map(hint_name, rest))
        return (
            f"Optional[{inner}]"
            if len(rest) == 1 and len(args) == 2
            else f"Union[{inner}{', None' * (len(rest) < len(args))}]"
        )
    if args and isinstance(origin, type):  # list[int], dict[str, X]
        return f"{origin.__name__}[{', '.join(map(hint_name, args))}]"
    name = getattr(hint, "__name__", None) or repr(hint)
    # (as jaxtyping names them)
    return name.replace("jaxlib._jax.Array", "Array").replace("jaxtyping.", "")


def register_pytree(
    cls: type, info: StateInfo, *, via_dict: bool = False, rebuild: type | None = None
) -> None:
    data, static_ = info.data_names, info.static_names
    keys = tuple(jax.tree_util.GetAttrKey(n) for n in data)
    # A consumed state's fields are read from its __dict__ (its attributes raise).
    get_data = dict_getter(data) if via_dict else attr_getter(data)
    get_static = dict_getter(static_) if via_dict else attr_getter(static_)
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


def attr_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """Read these fields of an instance by attribute, as a tuple."""
    if not names:
        return lambda x: ()
    if len(names) == 1:
        (name,) = names
        return lambda x: (getattr(x, name),)
    return operator.attrgetter(*names)


def dict_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """Read these fields from an instance's ``__dict__`` (never its attributes:
    a consumed state's fields raise when read, and the call path must see
    its deleted buffers)."""
    if not names:
        return lambda x: ()
    get = operator.itemgetter(*names)
    if len(names) == 1:
        return lambda x: (get(x.__dict__),)
    return lambda x: get(x.__dict__)


def is_sealed_state(x: Any) -> bool:
    """Whether ``x`` is a jc.state whose leaves cannot change after construction:
    arrays, statics and sealed nested states only (a ``PyTree`` field's
    container can be edited in place)."""
    if not is_state(x):
        return False
    cls = x if isinstance(x, type) else type(x)
    return all(
        isinstance(f, (ArrayField, StaticField))
        or (isinstance(f, StateField) and is_sealed_state(f.cls))
        for f in info_of(cls).fields
    )


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance from exact values, without validation."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def tree_summary(tree: Any) -> str:
    """``<dict: 3 leaves, 48 bytes>``: a container described without its values."""
    leaves = jax.tree_util.tree_leaves(tree)
    specs = [leaf_spec(x) for x in leaves]
    nbytes = sum(array_nbytes(s.shape, s.dtype) for s in specs if s is not None)
    return f"<{type(tree).__name__}: {len(leaves)} leaves, {nbytes:,} bytes>"

