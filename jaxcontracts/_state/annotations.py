"""jaxtyping array annotations reduced to a concrete dtype and dims, which give a
shape for dim bindings and explain a mismatch (jaxtyping itself stays the
authority on pass/fail at construction)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .._compat.jaxtyping import Dim, is_array_annotation, parse_dims
from .._dtypes import default_key_dtype, is_key
from .._errors import DefinitionError, SpecError
from .._format import fmt_aval

__all__ = [
    "STATIC",
    "ArrayAnnotation",
    "parse_array_annotation",
    "x64_fix",
    "x64_loss",
]

#: The dataclass field metadata key that marks a ``jc.static`` field.
STATIC = "jaxcontracts.static"

#: The dtypes JAX replaces by 32-bit ones while ``jax_enable_x64`` is off.
X64_DTYPES = frozenset(np.dtype(d) for d in ("int64", "uint64", "float64", "complex128"))


def x64_loss(dtype: Any) -> tuple[str, str] | None:
    """Why JAX cannot hold ``dtype`` now (64-bit with ``jax_enable_x64`` off),
    and what it would make instead; ``None`` when it can. Asked when arrays or
    specs are made: the flag can change after a class is defined."""
    if is_key(dtype):
        return None
    dtype = np.dtype(dtype)
    if dtype not in X64_DTYPES:
        return None
    canonical = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if canonical == dtype:
        return None
    return (
        f"{dtype.name} needs JAX's 64-bit mode, which is off (jax_enable_x64 is "
        f"False), so JAX would make it {canonical.name}",
        canonical.name,
    )


#: How to turn on JAX's 64-bit mode (the first half of an x64 fix).
X64_ON = (
    'turn it on before creating any array: jax.config.update("jax_enable_x64", '
    "True), or JAX_ENABLE_X64=1 in the environment"
)


def x64_fix(short: str, *, leaf: bool) -> str:
    """The fix for a field annotated with a 64-bit dtype (``leaf``: a 64-bit leaf
    of a PyTree field or a spec) while x64 is off."""
    if leaf:
        return f"{X64_ON}; or pass {short} leaves (x.astype(np.{short}))."
    annotation = {"uint32": "UInt32"}.get(short, short.capitalize())
    return f"{X64_ON}; or annotate the field {annotation} and pass {short}."


@dataclasses.dataclass(frozen=True)
class ArrayAnnotation:
    """A jaxtyping array annotation reduced to what a spec needs."""

    annotation: Any
    dtype: Any  # a numpy dtype, or a typed PRNG key dtype (key<fry>)
    dims: tuple[Dim, ...]
    index_variadic: int | None

    @property
    def dim_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for d in self.dims:
            if d.kind in ("named", "variadic"):
                names.append(d.name)
            elif d.kind == "symbolic":
                names.extend(_symbol_names(d.name))
        return tuple(dict.fromkeys(names))

    @property
    def needs_x64(self) -> bool:
        """Whether the dtype exists in JAX only with ``jax_enable_x64`` on."""
        return self.dtype in X64_DTYPES

    @property
    def variadic_names(self) -> tuple[str, ...]:
        """The names of ``*batch`` dims, whose value is a tuple of sizes."""
        return tuple(d.name for d in self.dims if d.kind == "variadic")

    def pretty(self) -> str:
        """``f32[n,3]``."""
        return fmt_aval([str(d) for d in self.dims], self.dtype)

    def shape(self, bindings: Mapping[str, Any], where: str) -> tuple[int, ...]:
        """The concrete shape for these dim bindings (SpecError if one is missing)."""
        out: list[int] = []
        for d in self.dims:
            if d.kind == "fixed":
                out.append(d.size)
            elif d.kind == "named":
                out.append(_need(bindings, d.name, where, self))
            elif d.kind == "variadic":
                value = _need(bindings, d.name, where, self)
                out.extend((value,) if isinstance(value, int) else tuple(value))
            elif d.kind == "symbolic":
                for name in _symbol_names(d.name):
                    _need(bindings, name, where, self)
                size = eval(d.name, {}, dict(bindings))  # noqa: S307
                if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
                    given = ", ".join(f"{k}={bindings[k]!r}" for k in _symbol_names(d.name))
                    raise SpecError(
                        f"{where}: dimension {d.name!r} of {self.pretty()} is {size!r} "
                        f"for {given}, not a non-negative int.",
                        fix=f"pass dims for which {d.name} is a size (an int >= 0).",
                        contract="dims",
                    )
                out.append(int(size))
            else:
                raise SpecError(
                    f"{where}: the annotation {self.annotation.__name__} has an "
                    f"anonymous dimension ({str(d)!r}), so no spec can be built from dims alone.",
                    fix="give that dimension a name (e.g. 'n' instead of '_' or "
                    "'*batch' instead of '...'), or build the spec from an instance "
                    "with jc.spec_of(x).",
                    contract="dims",
                )
        return tuple(out)

    def match(
        self, shape: Sequence[int], bindings: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        """Match a concrete shape; return (why it fails or None, new bindings).

        Used to explain a failure and to report bindings; jaxtyping's own
        ``isinstance`` stays the authority on pass/fail.
        """
        new: dict[str, Any] = {}
        dims = list(self.dims)
        shape = list(shape)
        if self.index_variadic is None:
            if len(shape) != len(dims):
                return f"rank {len(shape)} where rank {len(dims)} is expected", new
            pairs = list(zip(dims, shape))
        else:
            fixed = len(dims) - 1
            if len(shape) < fixed:
                return f"rank {len(shape)} where at least rank {fixed} is expected", new
            k = self.index_variadic
            tail = len(dims) - k - 1
            middle = tuple(shape[k : len(shape) - tail])
            var = dims[k]
            if var.kind == "variadic":
                known = bindings.get(var.name)
                if known is not None and tuple(known) != middle:
                    return f"*{var.name} is {middle}, but {var.name}={tuple(known)}", new
                new[var.name] = middle
            pairs = list(zip(dims[:k], shape[:k])) + list(
                zip(dims[k + 1 :], shape[len(shape) - tail :])
            )
        for d, size in pairs:
            if d.kind == "fixed":
                if size != d.size and not (d.broadcastable and size == 1):
                    return f"dimension of size {size} where {d.size} is fixed", new
            elif d.kind == "named":
                known = bindings.get(d.name, new.get(d.name))
                if known is None:
                    if not (d.broadcastable and size == 1):
                        new[d.name] = size
                elif known != size and not (d.broadcastable and size == 1):
                    return f"{d.name} is {size} here, but {d.name}={known}", new
            elif d.kind == "symbolic":
                try:
                    want = eval(d.name, {}, {**bindings, **new})  # noqa: S307
                except NameError:
                    continue
                if want != size:
                    return f"{d.name} should be {want}, got {size}", new
        return None, new


def parse_array_annotation(annotation: Any, where: str) -> ArrayAnnotation | None:
    """Reduce a jaxtyping array annotation; ``None`` if it is not one.

    Raises:
        DefinitionError: for an abstract dtype (``Float``, ``Shaped``, ...) or
            a non-jax array type, listing what to write instead.
    """
    if not is_array_annotation(annotation):
        return None
    name = getattr(annotation, "__name__", repr(annotation))
    dtypes = getattr(annotation, "dtypes", None)
    concrete = _concrete_dtype(dtypes)
    dim_str = getattr(annotation, "dim_str", "")
    if concrete is None:
        raise DefinitionError(
            f"{where}: {name} has an abstract dtype ({_dtype_family(annotation)}), "
            "so the state's exact spec is unknown.",
            fix="use a concrete dtype such as Float32, Float16, BFloat16, Float64, "
            "Int32, Int8, UInt32, UInt8, Bool or Complex64, e.g. "
            f"Float32[Array, {dim_str!r}].",
        )
    array_type = getattr(annotation, "array_type", None)
    if array_type is not None and not (
        isinstance(array_type, type) and issubclass(array_type, jax.Array)
    ):
        raise DefinitionError(
            f"{where}: {name} annotates a {getattr(array_type, '__name__', array_type)}"
            ", but state fields hold device arrays.",
            fix=f"use jaxtyping's Array (jax.Array), e.g. Float32[Array, {dim_str!r}].",
        )
    dims = parse_dims(dim_str)
    variadic = [i for i, d in enumerate(dims) if d.kind in ("variadic", "anonymous-variadic")]
    return ArrayAnnotation(
        annotation=annotation,
        dtype=concrete,
        dims=dims,
        index_variadic=variadic[0] if variadic else None,
    )


def _concrete_dtype(dtypes: Any) -> Any:
    if not isinstance(dtypes, (tuple, list)) or not dtypes:
        return None
    if tuple(dtypes) == ("prng_key",):
        # jaxtyping's Key[Array, ...]: a typed key of the default PRNG
        # implementation (jax.random.key(seed)), fixed when the class is defined.
        return default_key_dtype()
    found: set[Any] = set()
    for d in dtypes:
        try:
            found.add(np.dtype(jax.numpy.dtype(d)))
        except TypeError:
            return None
    return found.pop() if len(found) == 1 else None


def _dtype_family(annotation: Any) -> str:
    dtypes = getattr(annotation, "dtypes", None)
    if isinstance(dtypes, (tuple, list)):
        return "any of " + ", ".join(str(d) for d in dtypes[:6]) + (
            ", ..." if len(dtypes) > 6 else ""
        )
    return "any dtype"


def _symbol_names(expr: str) -> list[str]:
    return [n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)]


def _need(bindings: Mapping[str, Any], name: str, where: str, ann: ArrayAnnotation) -> Any:
    if name not in bindings:
        raise SpecError(
            f"{where}: dimension {name!r} of {ann.pretty()} is not given.",
            fix=f"pass it, e.g. .spec({name}=...) or .zeros({name}=...).",
            contract="dims",
        )
    return bindings[name]
