"""jaxtyping annotations, read through public attributes where they exist.

An array annotation's dims are parsed here from its public ``dim_str``, so
jaxtyping's private dim classes are never touched; a ``PyTree[...]``'s leaf
type lives in the undocumented ``leaftype`` attribute (a capability).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jaxtyping

from .registry import capability, define

__all__ = ["Dim", "is_array_annotation", "is_pytree_annotation", "parse_dims", "pytree_leaf"]

DimKind = Literal["fixed", "named", "variadic", "symbolic", "anonymous", "anonymous-variadic"]


@dataclasses.dataclass(frozen=True)
class Dim:
    """One axis of a jaxtyping shape string."""

    kind: DimKind
    name: str = ""  # named / variadic: the name; symbolic: the expression
    size: int = 0  # fixed: the size
    broadcastable: bool = False

    def __str__(self) -> str:
        mark = "#" if self.broadcastable else ""
        if self.kind == "fixed":
            return f"{mark}{self.size}"
        if self.kind == "variadic":
            return f"*{self.name}"
        if self.kind == "anonymous":
            return "_"
        if self.kind == "anonymous-variadic":
            return "..."
        return f"{mark}{self.name}"


def is_array_annotation(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, jaxtyping.AbstractArray)


def parse_dims(dim_str: str) -> tuple[Dim, ...]:
    """``"*batch n 3 #m k+1 _ ..."``, read with jaxtyping's grammar."""
    dims = []
    for elem in dim_str.split():
        if elem == "...":
            dims.append(Dim("anonymous-variadic"))
            continue
        broadcastable = variadic = anonymous = False
        while elem:
            first = elem[0]
            if first == "#":
                broadcastable, elem = True, elem[1:]
            elif first == "*":
                variadic, elem = True, elem[1:]
            elif first == "_":
                anonymous, elem = True, elem[1:]
            elif first == "?":  # tree-path dependence: same axis for our purposes
                elem = elem[1:]
            elif elem.count("=") == 1:  # "rows=3": documentation before the "="
                elem = elem.split("=")[1]
            else:
                break
        if not elem or elem.isidentifier():
            if anonymous:
                dims.append(Dim("anonymous-variadic" if variadic else "anonymous"))
            else:
                dims.append(Dim("variadic" if variadic else "named", elem, 0, broadcastable))
        elif elem.isdigit():
            dims.append(Dim("fixed", "", int(elem), broadcastable))
        else:
            dims.append(Dim("symbolic", elem, 0, broadcastable))
    return tuple(dims)


_PyTreeMeta = type(jaxtyping.PyTree)


@define(
    "jaxtyping-pytree",
    "the leaftype attribute of jaxtyping.PyTree[...]",
    "the leaf dtype of a PyTree[Float32[Array, '...']] field (its leaves are then only required "
    "to be arrays)",
)
def _probe_pytree() -> str | None:
    from jaxtyping import Array, Float32

    hint = jaxtyping.PyTree[Float32[Array, "n"]]
    if not isinstance(hint, _PyTreeMeta):
        return "PyTree[...] is no longer an instance of type(PyTree)"
    return None if getattr(hint, "leaftype", None) is not None else "PyTree[...] has no leaftype"


def is_pytree_annotation(hint: Any) -> bool:
    return isinstance(hint, _PyTreeMeta)


def pytree_leaf(hint: Any) -> Any:
    """The leaf annotation of ``PyTree[leaf]``, or ``None`` where unknown."""
    return getattr(hint, "leaftype", None) if capability("jaxtyping-pytree").available else None
