"""Validation at construction, outside traces: jaxtyping decides dtype and shape,
beartype checks static fields; every failure goes into one :class:`SpecError`.
Values take their exact device form; a wrong dtype is an error, never cast."""

from __future__ import annotations

import cmath
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from beartype import BeartypeConf
from beartype.door import is_bearable
from jaxtyping import jaxtyped

from .._compat.arrays import ArrayImpl as _ArrayImpl
from .._compat.tracing import Tracer as _Tracer
from .._compat.tracing import trace_state_clean as _trace_state_clean
from .._dtypes import is_key, same_dtype
from .._errors import SpecError
from .._format import fmt_aval, fmt_bindings
from .annotations import ArrayAnnotation, x64_fix, x64_loss
from .fields import (
    ArrayField,
    PyTreeField,
    StateField,
    StateInfo,
    StaticField,
    hint_name,
    info_of,
    tree_summary,
)
from .foreign import scalar_to_host, to_device
from .spec import eq_answers_bool, fmt_value, leaf_spec

__all__ = [
    "check_static",
    "clear_validation_cache",
    "spec_error",
    "validate",
    "validation_cache_size",
]

_BEAR = BeartypeConf(is_pep484_tower=True)


@dataclasses.dataclass
class Problem:
    field: str
    expected: str
    got: str
    fix: str


# --------------------------------------------------------------------------
# The validation cache
#
# Validation depends only on what the key records, so a signature that passed
# with nothing to convert is not re-proven. Per field:
#
# * an array: its aval, for an exact ArrayImpl. An aval (interned) holds shape,
#   dtype, weak type and sharding: all that _convert_array, the dims and
#   jaxtyping read; only unconverted arrays pass, so a hit skips no conversion
#   (a deleted array keeps its aval: accepted by both paths alike).
# * a nested state: its exact class; a PyTree field: its treedef and the avals
#   of its leaves (each an exact ArrayImpl); a static field: (type, value) for
#   atoms only (a tuple may hold 1 or 1.0: equal, typed differently).
#
# Anything else has no key and is validated in full. One key covers every
# field (dims bound across fields). Failures are never cached.

_CACHE_LIMIT = 256  # signatures kept per class; the set is emptied when full

_ATOMS = frozenset({bool, int, float, complex, str, type(None)})

_MISS = object()  # a field not set (init=False, no default): no key, not an error here


def _signature_key(d: dict[str, Any], info: StateInfo) -> tuple[Any, ...] | None:
    """The validation signature of an instance's fields, or None when uncacheable."""
    array_impl = _ArrayImpl
    if array_impl is None:
        return None
    key: list[Any] = []
    append = key.append
    for name, kind in info.kinds:
        v = d.get(name, _MISS)
        t = type(v)
        if kind is ArrayField:
            if t is not array_impl:
                return None
            append(v.aval)
        elif kind is StaticField:
            if t not in _ATOMS:
                return None
            append((t, v))
        elif kind is StateField:
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


def _cached(self: Any, info: StateInfo) -> tuple[bool, tuple[Any, ...] | None]:
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
            if isinstance(f, PyTreeField):
                leaves, treedef = jax.tree_util.tree_flatten(self.__dict__[f.name])
                object.__setattr__(self, f.name, jax.tree_util.tree_unflatten(treedef, leaves))
    return hit, key


def _remember(info: StateInfo, key: tuple[Any, ...], self: Any, converted: dict[str, Any]) -> None:
    """Cache a signature that passed, if validation changed no value."""
    d = self.__dict__
    for f in info.fields:
        if isinstance(f, ArrayField) and converted.get(f.name) is not d[f.name]:
            return
        if isinstance(f, PyTreeField):
            new = jax.tree_util.tree_leaves(converted.get(f.name))
            old = jax.tree_util.tree_leaves(d[f.name])
            if len(new) != len(old) or any(a is not b for a, b in zip(new, old)):
                return
    if len(info.valid) >= _CACHE_LIMIT:
        info.valid.clear()
    info.valid.add(key)


def validation_cache_size(cls: type) -> int:
    """How many validated signatures ``cls`` remembers (for tests and benchmarks)."""
    return len(info_of(cls).valid)


def clear_validation_cache(cls: type) -> None:
    """Forget every validated signature of ``cls`` (the next construction validates)."""
    info_of(cls).valid.clear()


def validate(self: Any) -> None:
    """Validate a state's fields at construction; put each in its exact device form.

    Raises:
        SpecError: listing every invalid field, with the dims bound so far.
    """
    __tracebackhide__ = True
    cls = type(self)
    info = info_of(cls)
    hit, key = _cached(self, info)
    if hit or not _trace_state_clean():
        return
    if any(isinstance(self.__dict__[name], _Tracer) for name in info.data_names):
        return
    run = _Validation()
    for f in info.fields:
        run.field(f, self.__dict__[f.name])
    if not run.problems and run.to_check:
        run.jaxtyping_shapes()
    if run.problems:
        raise spec_error(cls, run.problems, run.bindings, run.bound_by)
    if key is not None:
        _remember(info, key, self, run.converted)
    for name, v in run.converted.items():
        object.__setattr__(self, name, v)


class _Validation:
    """One construction's validation: problems, converted values, dim bindings."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.converted: dict[str, Any] = {}
        self.bindings: dict[str, Any] = {}
        self.bound_by: dict[str, str] = {}
        self.to_check: list[tuple[str, Any, Any]] = []  # (field, value, jaxtyping annotation)
        self.trees: set[str] = set()  # the PyTree fields among them

    def field(self, f: Any, value: Any) -> None:
        if isinstance(f, ArrayField):
            self.array(f, value)
        elif isinstance(f, StateField):
            if not isinstance(value, f.cls):
                self.problems.append(
                    Problem(
                        f.name,
                        f"a {f.cls.__name__} instance",
                        fmt_value(value),
                        f"build it with {f.cls.__name__}(...) or {f.cls.__name__}.zeros(...).",
                    )
                )
        elif isinstance(f, PyTreeField):
            new, leaf_problems = _convert_pytree(f, value)
            self.problems.extend(leaf_problems)
            if not leaf_problems:
                self.converted[f.name] = new
                if not _all_specs(new):
                    self.to_check.append((f.name, new, f.annotation))
                    self.trees.add(f.name)
        else:
            self.problems.extend(check_static(f, value))

    def array(self, f: ArrayField, value: Any) -> None:
        new, problem = _convert_array(f.name, value, f.ann)
        if problem is not None:
            self.problems.append(problem)
            return
        self.converted[f.name] = new
        why, found = f.ann.match(leaf_spec(new).shape, self.bindings)
        if why is not None:
            owners = ", ".join(
                f"{k}={self.bindings[k]} (from .{self.bound_by[k]})"
                for k in f.ann.dim_names
                if k in self.bindings
            )
            self.problems.append(
                Problem(
                    f.name,
                    f.ann.pretty() + (f" with {owners}" if owners else ""),
                    fmt_value(new),
                    f"{why}. Check how .{f.name} is created, or whether the "
                    "dims above are the intended ones.",
                )
            )
            return
        for k, v in found.items():
            self.bindings[k] = v
            self.bound_by[k] = f.name
        if not isinstance(new, jax.ShapeDtypeStruct):
            self.to_check.append((f.name, new, f.ann.annotation))

    def jaxtyping_shapes(self) -> None:
        """jaxtyping is the authority on shapes, with one dim memo for all fields."""
        items = self.to_check
        verdicts = _jaxtyping_check(items)  # in the fields' order: what is accepted
        if not all(verdicts) and self.trees:
            # which field to name: with the array fields first, jaxtyping's dims
            # bind as ``bindings`` says they did, and a tree that disagrees is named
            # (a symbolic dim a tree binds for an array, `n+1`, needs the order above)
            ordered = (
                [x for x in items if x[0] not in self.trees]
                + [x for x in items if x[0] in self.trees]
            )
            try:
                blamed = dict(zip([x[0] for x in ordered], _jaxtyping_check(ordered)))
            except Exception:  # noqa: BLE001 - jaxtyping cannot check them in that order
                blamed = {}
            if blamed and not all(blamed.values()):
                verdicts = [blamed[name] for name, _, _ in items]
        for (name, value, ann), ok in zip(items, verdicts):
            if not ok:
                self.problems.append(
                    Problem(
                        name,
                        hint_name(ann),
                        fmt_value(value)
                        if isinstance(value, (jax.Array, np.ndarray))
                        else _leaf_shapes(value),
                        "its leaves must match the annotation, with named dims "
                        "bound consistently across fields.",
                    )
                )


def _leaf_shapes(tree: Any, most: int = 4) -> str:
    """``{['a']: f32[3], ['b']: f32[3]}``: a tree's leaves by path, shapes only."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    parts = [
        f"{jax.tree_util.keystr(p)}: "
        f"{fmt_value(x) if (spec := leaf_spec(x)) is None else fmt_aval(spec.shape, spec.dtype)}"
        for p, x in leaves[:most]
    ]
    more = f", ... ({len(leaves) - most} more)" if len(leaves) > most else ""
    return f"{type(tree).__name__} {{{', '.join(parts)}{more}}}" if leaves else tree_summary(tree)


@jaxtyped(typechecker=None)
def _jaxtyping_check(items: list[tuple[str, Any, Any]]) -> list[bool]:
    # isinstance checks inside one jaxtyped call share their dim bindings.
    return [isinstance(value, ann) for _, value, ann in items]


def _convert_array(name: str, value: Any, ann: ArrayAnnotation) -> tuple[Any, Problem | None]:
    """The exact device form of one array field, or the problem with it."""
    want = ann.dtype
    if is_key(want):
        return _convert_key(name, value, ann)
    if isinstance(value, jax.Array):
        if not same_dtype(value.dtype, want):
            return None, _x64_problem(name, value, ann) or _wrong_dtype(
                name, ann, value, "jax array"
            )
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
        return to_device(value), None
    if isinstance(value, (bool, int, float, complex)):
        host, problem = _scalar_host_array(name, value, ann)
        if problem is not None:
            return None, problem
        return to_device(host), None
    return None, Problem(
        name, ann.pretty(), fmt_value(value), "pass a jax array (or a numpy array of that dtype)."
    )


def _convert_key(name: str, value: Any, ann: ArrayAnnotation) -> tuple[Any, Problem | None]:
    """A typed PRNG key field: a key array (or spec) of the annotated key dtype."""
    if isinstance(value, (jax.Array, jax.ShapeDtypeStruct)) and same_dtype(value.dtype, ann.dtype):
        return value, None
    typed_key = isinstance(value, jax.Array) and is_key(value.dtype)
    got = fmt_aval(value.shape, value.dtype) if typed_key else fmt_value(value)
    if typed_key:
        fix = (
            f"the key's PRNG implementation differs from the field's ({ann.pretty()}, the "
            "default implementation when the class was defined): make it with jax.random.key(seed)."
        )
    elif isinstance(value, (jax.Array, np.ndarray)) and value.shape[-1:] in ((2,), (4,)):
        fix = (
            "this looks like a raw uint32 key (jax.random.PRNGKey): make a typed key with "
            "jax.random.key(seed), or wrap this one with jax.random.wrap_key_data(k)."
        )
    else:
        fix = "pass a typed PRNG key: jax.random.key(seed) (split it for arrays of keys)."
    return None, Problem(name, ann.pretty(), got, fix)


def _x64_problem(name: str, value: Any, ann: ArrayAnnotation) -> Problem | None:
    loss = x64_loss(ann.dtype)
    if loss is None:
        return None
    reason, short = loss
    return Problem(name, ann.pretty(), fmt_value(value), f"{reason}: {x64_fix(short, leaf=False)}")


def _wrong_dtype(name: str, ann: ArrayAnnotation, value: Any, kind: str) -> Problem:
    np_name = np.dtype(ann.dtype).name  # e.g. "uint16": jnp.uint16 exists
    return Problem(
        name,
        ann.pretty(),
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


def _scalar_host_array(name: str, value: Any, ann: ArrayAnnotation) -> tuple[Any, Problem | None]:
    """A Python scalar as a host array of the field's dtype, or the problem with it."""
    expected = ann.pretty()
    got = f"Python {type(value).__name__} {value!r}"
    if any(d.kind not in ("variadic", "anonymous-variadic") for d in ann.dims):
        return None, Problem(
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
        return None, Problem(
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
        return None, Problem(
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
    # An int is finite (cmath would raise OverflowError beyond float's range).
    return isinstance(value, int) or cmath.isfinite(value)


def _convert_pytree(f: PyTreeField, value: Any) -> tuple[Any, list[Problem]]:
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
                Problem(
                    where,
                    "an array leaf JAX can hold",
                    fmt_value(leaf),
                    f"{loss[0]}: {x64_fix(loss[1], leaf=True)}",
                )
            )
            out.append(leaf)
        elif isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
            weak = isinstance(leaf, jax.Array) and leaf.aval.weak_type
            out.append(jax.lax.convert_element_type(leaf, leaf.dtype) if weak else leaf)
        elif isinstance(leaf, (np.ndarray, np.generic)):
            out.append(to_device(leaf))
        elif isinstance(leaf, (bool, int, float, complex)):
            host, why = scalar_to_host(leaf)
            if host is None:
                problems.append(
                    Problem(where, "an array leaf", fmt_value(leaf), f"{why}; pass an array.")
                )
                out.append(leaf)
            else:  # what jc.device_tree makes of it: JAX's default dtype, strongly typed
                out.append(to_device(host))
        else:
            problems.append(
                Problem(
                    where,
                    "an array leaf",
                    fmt_value(leaf),
                    "pytree fields hold arrays (Python scalars become JAX's default "
                    "dtype); this leaf is neither: make it part of the tree structure "
                    "(a jc.static field of its own) or leave it out of the state.",
                )
            )
            out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out), problems


def _all_specs(tree: Any) -> bool:
    return all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(tree))


def check_static(f: StaticField, value: Any) -> list[Problem]:
    expected, got = f"a hashable {hint_name(f.annotation)}", None
    try:
        hash(value)
    except TypeError:
        fix = (
            "static fields are part of the tree structure and must be hashable; "
            "use a tuple instead of a list, or make it an array field."
        )
    else:
        if isinstance(value, (jax.Array, np.ndarray)):
            fix = (
                "an array in a static field would be compared by identity and "
                "recompile every time; make it an array field instead."
            )
        elif (eq := eq_answers_bool(value)) is not None:
            expected = "a static value whose == answers True or False"
            got = f"{fmt_value(value)}, whose __eq__ {eq}"
            fix = (
                "JAX compares static values with == to pick the compiled signature; make "
                f"{type(value).__name__}.__eq__ return a bool (compare Python values, not "
                "arrays), or make the arrays it holds fields of the state."
            )
        elif not is_bearable(value, f.annotation, conf=_BEAR):
            expected = hint_name(f.annotation)
            fix = f"pass a {expected}."
        else:
            return []
    return [Problem(f.name, expected, got or fmt_value(value), fix)]


def spec_error(
    cls: type, problems: list[Problem], bindings: dict[str, Any], bound_by: dict[str, str]
) -> SpecError:
    """One SpecError listing every invalid field, each with its fix."""
    n = len(problems)
    details = []
    for p in problems:
        details.append(f"  .{p.field}: expected {p.expected}, got {p.got}")
        details.append(f"      fix: {p.fix}")
    if bindings:
        details.append(
            "  dims bound: "
            + fmt_bindings(bindings)
            + "  ("
            + ", ".join(f"{k} from .{bound_by[k]}" for k in sorted(bindings))
            + ")"
        )
    return SpecError(
        f"{cls.__module__}.{cls.__qualname__}(...) got {n} invalid field{'s' if n != 1 else ''}:",
        details,
        fix=problems[0].fix if n == 1 else "\n".join(f".{p.field}: {p.fix}" for p in problems),
        leaves=[f".{p.field}" for p in problems],
        contract="state-fields",
        fix_in_details=True,
    )

