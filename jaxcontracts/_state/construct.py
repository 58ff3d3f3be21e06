"""``spec()`` and ``zeros()``: a state built from its dims (nested states from the
same dims; ``PyTree`` fields and statics by value), with no data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import DefinitionError, SpecError
from .._format import fmt_aval, fmt_object, fmt_sharding
from .._marks import CONSUMED_BY, STATE_INFO
from .annotations import x64_fix, x64_loss
from .fields import ArrayField, PyTreeField, StateField, StaticField, build, hint_name, info_of
from .spec import fmt_value, leaf_spec
from .validate import check_static, spec_error

__all__ = ["make", "to_spec", "to_zeros", "undecorated_error"]


def _shown(value: Any) -> str:
    """``-3 (int)``; an array or an object by its spec or type (no repr runs)."""
    plain = (str, bool, int, float, type(None))
    if (
        isinstance(value, plain)
        or (
            isinstance(value, (tuple, list))
            and len(value) < 10
            and all(isinstance(v, plain) for v in value)
        )
    ) and len(repr(value)) < 60:
        return f"{value!r} ({type(value).__name__})"
    return fmt_object(value)


def _check_dims(cls: type, dims: Mapping[str, Any], what: str) -> dict[str, Any]:
    """The dims, checked: known names, non-negative int sizes (tuples for ``*batch``)."""
    info = info_of(cls)
    valid = set(info.dim_names)
    unknown = sorted(set(dims) - valid)
    if unknown:
        raise SpecError(
            f"{cls.__qualname__}.{what}() got unknown dimension(s) {', '.join(unknown)}.",
            [f"Valid dims: {', '.join(sorted(valid)) or '(none)'}; you may also pass "
             "a value for any field, e.g. params=... for a PyTree field."],
            fix="spell each dimension as the annotations do "
            f"({', '.join(sorted(valid)) or 'none'}).",
            contract="dims",
        )
    variadic = info.variadic_dim_names
    checked: dict[str, Any] = {}
    bad: list[str] = []
    for name, value in dims.items():
        if _is_size(value):
            checked[name] = int(value)
        elif name not in variadic:
            bad.append(f"  {name}={_shown(value)}: expected a non-negative int")
        elif isinstance(value, (tuple, list)) and all(_is_size(v) for v in value):
            checked[name] = tuple(int(v) for v in value)
        else:
            bad.append(
                f"  {name}={_shown(value)}: *{name} takes a tuple of non-negative ints, e.g. (2, 3)"
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


def undecorated_error(cls: type) -> DefinitionError:
    """The error for a plain subclass of a state class (not a state itself)."""
    base = next(k for k in cls.__mro__ if STATE_INFO in k.__dict__)
    return DefinitionError(
        f"{cls.__qualname__} subclasses the state class {base.__qualname__} but is "
        "not a jc.state itself: its own annotations are not fields, and jax does "
        f"not know it as a pytree, so a hot step would see a {cls.__name__} as an "
        "opaque leaf.",
        fix=f"decorate it too (@jc.state class {cls.__name__}({base.__name__}): ...), "
        f"or define {base.__name__} as `class {base.__name__}(jc.State)`, which makes "
        "every subclass a state.",
    )


def make(cls: type, kwargs: dict[str, Any], sharding: Any, leaf_fn: Callable, what: str) -> Any:
    if CONSUMED_BY in cls.__dict__:  # type(s).zeros(...) on a donated state: its state class
        cls = cls.__mro__[1]
    if STATE_INFO not in cls.__dict__:  # Plain(Base) undecorated: Base's fields only, no pytree
        raise undecorated_error(cls)
    field_names = {f.name for f in info_of(cls).fields}
    # (given or not: the missing dim's fix names it)
    both = sorted(field_names & set(info_of(cls).dim_names))
    if both:
        raise SpecError(
            f"{cls.__qualname__}.{what}(): `{both[0]}` names both a field of "
            f"{cls.__qualname__} and a dimension of its annotations, so {both[0]}=... "
            "cannot say which it gives.",
            fix=f'rename the dimension in the annotations (Float32[Array, "{both[0]}_size"]) '
            'or the field.',
            contract="dims",
            leaves=[f".{both[0]}"],
        )
    given = {k: v for k, v in kwargs.items() if k in field_names}
    dims = _check_dims(cls, {k: v for k, v in kwargs.items() if k not in field_names}, what)
    per_field = isinstance(sharding, Mapping)
    if per_field:
        _check_sharding_names(cls, sharding, what)
    values: dict[str, Any] = {}
    for f in info_of(cls).fields:
        where = f"{cls.__qualname__}.{what}(): field .{f.name}"
        shard = sharding.get(f.name) if per_field else sharding
        if f.name in given and not isinstance(f, StaticField):
            values[f.name] = jax.tree_util.tree_map_with_path(
                lambda path, x, s=shard, w=where: leaf_fn(
                    _given_spec(w + jax.tree_util.keystr(path), x), s
                ),
                given[f.name],
            )
        elif isinstance(f, ArrayField):
            if f.ann.needs_x64:
                _refuse_x64_spec(where, f.ann.pretty(), f.ann.dtype, leaf=False)
            spec = jax.ShapeDtypeStruct(f.ann.shape(dims, where), f.ann.dtype)
            _check_sharding_fits(where, spec, shard)
            values[f.name] = leaf_fn(spec, shard)
        elif isinstance(f, StateField):
            sub_dims = {k: v for k, v in dims.items() if k in info_of(f.cls).dim_names}
            values[f.name] = make(f.cls, sub_dims, shard, leaf_fn, what)
        elif isinstance(f, PyTreeField):
            raise SpecError(
                f"{where} is a PyTree ({hint_name(f.annotation)}), so its spec "
                "comes from an instance.",
                fix=f"pass it, e.g. {cls.__qualname__}.{what}(..., {f.name}=params) or "
                f"{f.name}=jc.spec_of(params).",
                contract="dims",
                leaves=[f".{f.name}"],
            )
        elif f.name in given:  # a static field
            values[f.name] = given[f.name]
        else:
            default = _static_default(cls, f.name)
            if default is dataclasses.MISSING:
                raise SpecError(
                    f"{where} is static and has no default.",
                    fix=f"pass it, e.g. {cls.__qualname__}.{what}(..., {f.name}=...).",
                    contract="dims",
                    leaves=[f".{f.name}"],
                )
            values[f.name] = default
    problems = [p for f in info_of(cls).fields if isinstance(f, StaticField)
                for p in check_static(f, values[f.name])]
    if problems:
        raise spec_error(cls, problems, {}, {})
    return build(cls, values)


def _check_sharding_names(cls: type, sharding: Mapping[Any, Any], what: str) -> None:
    """A SpecError for a sharding mapping that names no data field of ``cls``."""
    valid = info_of(cls).data_names
    unknown = [k for k in sharding if k not in valid]
    if unknown:
        static = [k for k in unknown if k in info_of(cls).static_names]
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
    check = getattr(sharding, "check_compatible_aval", None)  # (None for no sharding)
    if check is None:
        return
    try:
        check(spec.shape)
    except ValueError as e:
        raise SpecError(
            f"{where}: the sharding {fmt_sharding(sharding)} does not fit "
            f"{fmt_aval(spec.shape, spec.dtype)}: {e}",
            fix="pass a mapping from field name to sharding, e.g. sharding={'pos': "
            "rows, 't': NamedSharding(mesh, P())} (scalars take P()).",
            contract="dims",
        ) from None


def _given_spec(where: str, x: Any) -> jax.ShapeDtypeStruct:
    spec = leaf_spec(x)
    if spec is None:
        raise SpecError(
            f"{where}: the leaf {fmt_value(x)} is not an array and has no spec.",
            fix="pass arrays (or jax.ShapeDtypeStruct specs) as this field's leaves.",
            contract="dims",
        )
    _refuse_x64_spec(where, fmt_value(x), spec.dtype, leaf=True)
    return spec


def _refuse_x64_spec(where: str, what: str, dtype: Any, *, leaf: bool) -> None:
    """A SpecError for a 64-bit spec JAX would not honour (jax_enable_x64 off)."""
    loss = x64_loss(dtype)
    if loss is not None:
        reason, short = loss
        raise SpecError(
            f"{where}: {what} is not what JAX would make: {reason}, and the "
            "spec would not describe the arrays.",
            fix=x64_fix(short, leaf=leaf),
        )


def _static_default(cls: type, name: str) -> Any:
    f = cls.__dataclass_fields__[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def to_spec(s: jax.ShapeDtypeStruct, sharding: Any) -> jax.ShapeDtypeStruct:
    sharding = sharding if sharding is not None else s.sharding  # a given leaf's own
    return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding)


def to_zeros(s: jax.ShapeDtypeStruct, sharding: Any) -> jax.Array:
    sharding = sharding if sharding is not None else s.sharding
    zeros = jnp.zeros(s.shape, s.dtype)
    return zeros if sharding is None else jax.device_put(zeros, sharding)
