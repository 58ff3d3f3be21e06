"""``jc.device_tree``: bring any pytree into contract (every leaf what a step
will see: no Python ``0`` step count, weak type, float64 or uncommitted array).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np

from .._compat.tracing import Tracer
from .._dtypes import is_key
from .._errors import DefinitionError, SpecError
from .._format import fmt_aval, fmt_object, fmt_path, n_leaves
from .._tracebacks import boundary
from .spec import movable

__all__ = [
    "Change", "Changes", "any_node", "device_tree", "holds_module", "host_leaves_on_device",
    "scalar_to_host", "to_device",
]

T = TypeVar("T")

_SCALARS = (bool, int, float, complex)


@dataclasses.dataclass(frozen=True)
class Change:
    """One leaf ``jc.device_tree`` changed.

    Attributes:
        path: the leaf path, as ``jax.tree_util.keystr`` prints it.
        before: what the leaf was (``Python int 0``, ``~f32[] jax array``).
        after: what it is now (``i32[]``).
        why: the reason, in a few words.
    """

    path: str
    before: str
    after: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.before} -> {self.after} ({self.why})"


class Changes(Sequence[Change]):
    """What ``jc.device_tree`` changed, leaf by leaf; ``str()`` lists it."""

    def __init__(self, changes: Sequence[Change] = ()) -> None:
        self._changes = tuple(changes)

    @overload
    def __getitem__(self, i: int) -> Change: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Change]: ...
    def __getitem__(self, i: int | slice) -> Change | Sequence[Change]:
        return self._changes[i]

    def __len__(self) -> int:
        return len(self._changes)

    def __iter__(self) -> Iterator[Change]:
        return iter(self._changes)

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths of the changed leaves."""
        return tuple(c.path for c in self._changes)

    def __str__(self) -> str:
        if not self._changes:
            return "jc.device_tree: nothing to change (every leaf already in contract)"
        lines = [f"jc.device_tree changed {n_leaves(len(self._changes))}:"]
        lines += [f"  {c}" for c in self._changes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Changes({list(self._changes)!r})"


def scalar_to_host(x: bool | int | float | complex) -> tuple[np.ndarray | None, str]:
    """A Python scalar as a strongly typed 0-d host array of JAX's default dtype
    for its kind (x64-aware). Returns ``(array, "")`` or ``(None, why)``."""
    dtype = np.dtype(jnp.result_type(x))  # canonical (x64-aware), weak type dropped
    if isinstance(x, int) and not isinstance(x, bool):
        info = np.iinfo(dtype)
        if not int(info.min) <= x <= int(info.max):
            return None, (
                f"{x} does not fit in {dtype.name}, JAX's integer type "
                + ("(jax_enable_x64 is off)" if dtype.itemsize < 8 else "")
            ).strip()
    return np.asarray(x, dtype=dtype), ""


def to_device(value: Any, where: Any = None) -> jax.Array:
    """One fresh device buffer that owns its memory (donatable).

    On CPU ``jax.device_put`` may borrow an aligned numpy buffer instead of
    copying it; XLA cannot donate a borrowed buffer, so the first step would
    silently copy the state. Such a buffer is copied on the device once here.
    """
    host = np.asarray(value)
    x = jax.device_put(host, where)
    try:
        borrowed = (
            host.size > 0 and x.unsafe_buffer_pointer() == host.__array_interface__["data"][0]
        )
    except Exception:  # noqa: BLE001 - no single buffer (sharded) or no pointer
        borrowed = False
    return jnp.copy(x) if borrowed else x


def host_leaves_on_device(tree: Any, dtypes: Sequence[Any] | None = None) -> Any:
    """``tree`` with its host leaves on the device, in ``dtypes`` where given."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    put = [
        x
        if isinstance(x, jax.Array)
        else jax.device_put(np.asarray(x, dtypes[i] if dtypes is not None else None))
        for i, x in enumerate(leaves)
    ]
    return jax.tree_util.tree_unflatten(treedef, put)


def _kind(x: Any) -> str:
    if isinstance(x, _SCALARS):
        return f"Python {type(x).__name__} {x!r}"[:60]
    if isinstance(x, np.generic):
        return f"numpy {np.dtype(x.dtype).name} scalar"
    if isinstance(x, np.ndarray):
        return f"{fmt_aval(x.shape, x.dtype)} numpy array"
    if isinstance(x, jax.Array):
        return f"{fmt_aval(x.shape, x.dtype, x.aval.weak_type)} jax array"
    return fmt_object(x)


def _is_module_class(kind: Any) -> bool:
    return isinstance(kind, type) and any(
        c.__name__ == "Module" and c.__module__.startswith("equinox") for c in kind.__mro__
    )


def holds_module(value: Any) -> bool:
    """Whether ``value``'s tree has an equinox Module node (a model, a layer)."""
    return any_node(jax.tree_util.tree_structure(value), _is_module_class)


def _module_leaves(tree: Any) -> set[int]:
    """The flat indices of ``tree``'s leaves that lie inside an equinox Module."""
    inside: set[int] = set()
    start = 0
    for item in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: _is_module_class(type(x))):
        n = len(jax.tree_util.tree_leaves(item)) if _is_module_class(type(item)) else 1
        if _is_module_class(type(item)):
            inside.update(range(start, start + n))
        start += n
    return inside


def any_node(treedef: Any, test: Callable[[type], bool]) -> bool:
    """Whether any node of ``treedef`` (a leaf is none) is of a type ``test`` accepts."""
    pending = [treedef]
    while pending:
        node = pending.pop()
        data = node.node_data()
        if data is not None and test(data[0]):
            return True
        pending.extend(node.children())
    return False


@overload
def device_tree(tree: T, *, sharding: Any = ..., changes: Literal[False] = ...) -> T: ...
@overload
def device_tree(tree: T, *, sharding: Any = ..., changes: Literal[True]) -> tuple[T, Changes]: ...
@boundary
def device_tree(tree: Any, *, sharding: Any = None, changes: bool = False) -> Any:
    """Return ``tree`` with every leaf the exact device array a step will see.

    Brings state made by other libraries (flax ``TrainState`` and
    ``flax.struct`` classes, equinox Modules, NamedTuples, optax states,
    dicts, ``jc.state`` instances) into contract in one call, so a hot step
    compiled for it neither recompiles nor transfers on the next call. For
    each leaf:

    * a Python ``bool``/``int``/``float``/``complex`` becomes a strongly
      typed 0-d array of JAX's default dtype for its kind (``int32``,
      ``float32``; ``int64``/``float64`` with ``jax_enable_x64``), as
      ``TrainState.create(step=0)`` or a config constant needs;
    * a weakly typed jax array (``jnp.asarray(0.1)``, a scalar made under
      ``jit`` from a Python number) becomes strongly typed, same dtype;
    * a numpy array or scalar is copied to the device once, in the dtype JAX
      gives it (float64 becomes float32 while x64 is off);
    * an uncommitted jax array is committed to its device (hot-step outputs
      are committed, so an uncommitted input would not match them); like
      ``jax.device_put`` this shares the buffer, so donating the result
      consumes the original array too (use the returned tree from then on);
    * a strongly typed, committed jax array (typed PRNG keys included) is
      returned as is: no copy.

    Anything else as a leaf (a string, a function, an arbitrary object) is
    refused: a hot step cannot take it as an argument.

    Args:
        tree: any pytree.
        sharding: optional ``jax.sharding.Sharding`` or ``jax.Device`` to put
            every leaf on (a committed array elsewhere is moved). ``None``
            keeps committed arrays where they are and commits the rest to
            the default device. For per-leaf shardings ``jax.device_put`` the
            tree with them first.
        changes: also return a :class:`Changes` record of what was changed
            (leaf path, before, after, why); ``str()`` of it lists them.

    Returns:
        The converted tree (same structure), or ``(tree, changes)`` when
        ``changes=True``.

    Raises:
        SpecError: listing every leaf that cannot be a device array, with
            its path (a string, an object, an int too large for JAX's
            integer type).

    Examples:
        >>> import jaxcontracts as jc
        >>> state, what = jc.device_tree({"step": 0, "lr": 0.1}, changes=True)
        >>> state["step"].dtype, state["step"].weak_type
        (dtype('int32'), False)
        >>> what.paths
        ("['lr']", "['step']")
    """
    __tracebackhide__ = True
    if sharding is not None and not isinstance(sharding, (jax.sharding.Sharding, jax.Device)):
        example = (
            f'jax.devices("{sharding}")[0]' if isinstance(sharding, str) else "jax.devices()[0]"
        )
        raise DefinitionError(
            f"jc.device_tree(sharding={fmt_object(sharding)}): sharding= takes a "
            "jax.sharding.Sharding or a jax.Device.",
            fix=f"sharding={example}, or a NamedSharding(mesh, P(...)); None (the "
            "default) keeps committed arrays where they are.",
        )
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    where = sharding if sharding is not None else jax.devices()[0]
    out: list[Any] = []
    done: list[Change] = []
    bad: list[str] = []
    # equinox: a Module's own non-array leaves are static, left as they are
    static = _module_leaves(tree) if holds_module(tree) else ()
    for i, (path, x) in enumerate(leaves):
        if isinstance(x, Tracer) or (
            i in static and not isinstance(x, (jax.Array, np.ndarray, np.generic))
        ):
            out.append(x)  # under a trace (the step's own business), or a Module's static leaf
            continue
        p = fmt_path(path)
        y, why, problem = _device_leaf(x, sharding, where)
        if problem is not None:
            bad.append(f"  {p}: {_kind(x)}{problem}")
        elif why:
            done.append(Change(p, _kind(x), fmt_aval(y.shape, y.dtype, y.aval.weak_type), why))
        out.append(y)
    if bad:
        raise SpecError(
            f"jc.device_tree(): {n_leaves(len(bad))} cannot become device arrays:",
            bad,
            fix="make such a field part of the tree structure, not a leaf: "
            "jc.static(...) in a jc.state, flax.struct.field(pytree_node=False), "
            "eqx.field(static=True); or split the arrays out first "
            "(params, rest = eqx.partition(model, eqx.is_array)) and pass those."
            + (" A value past JAX's 32-bit types: jax.config.update(\"jax_enable_x64\", True) "
               "at the start of the program, or scale it to fit."
               if any("jax_enable_x64 is off" in b for b in bad)
               else ""),
            leaves=[b.split(":", 1)[0].strip() for b in bad],
        )
    result = jax.tree_util.tree_unflatten(treedef, out)
    return (result, Changes(done)) if changes else result


def _device_leaf(x: Any, sharding: Any, where: Any) -> tuple[Any, str, str | None]:
    """(the leaf as a device array, why it changed, None), or (``x``, "", the
    problem: ``": why"``, or "" for an object that is no array at all)."""
    if isinstance(x, jax.Array):
        return (*_jax_leaf(x, sharding), None)
    if isinstance(x, (np.ndarray, np.generic)):
        if not _jax_can_hold(x.dtype):
            return x, "", f": JAX has no {np.dtype(x.dtype).name} arrays"
        problem = _narrowing_problem(x)
        if problem:
            return x, "", f": {problem}"
        want = np.dtype(jax.dtypes.canonicalize_dtype(x.dtype))
        why = "a numpy array: copied to the device once"
        if want != np.dtype(x.dtype):
            why += f" as {want.name} ({np.dtype(x.dtype).name} needs jax_enable_x64, which is off)"
        return to_device(np.asarray(x, dtype=want), where), why, None
    if isinstance(x, _SCALARS):
        host, problem = scalar_to_host(x)
        if host is None:
            return x, "", f": {problem}"
        return to_device(host, where), "a Python scalar: JAX's default dtype, strongly typed", None
    return x, "", ""


def _jax_leaf(x: jax.Array, sharding: Any) -> tuple[jax.Array, str]:
    whys = []
    y = x
    if x.aval.weak_type and not is_key(x.dtype):
        y = jax.lax.convert_element_type(y, y.dtype)  # same dtype, strong
        whys.append("weakly typed: made strongly typed")
    if sharding is not None and not _same_place(y, sharding):
        y = jax.device_put(y, sharding)
        whys.append("moved to the requested sharding")
    elif movable(y):
        if sharding is None:  # its own device (or sharding), committed
            devices = y.devices()
            sharding = next(iter(devices)) if len(devices) == 1 else y.sharding
        y = jax.device_put(y, sharding)
        whys.append("uncommitted: committed to its device")
    return y, "; ".join(whys)


def _same_place(x: jax.Array, sharding: Any) -> bool:
    if isinstance(sharding, jax.Device):
        return x.devices() == {sharding}
    try:
        return bool(x.sharding.is_equivalent_to(sharding, x.ndim))
    except Exception:  # noqa: BLE001 - other sharding kinds
        return x.sharding == sharding


def _jax_can_hold(dtype: Any) -> bool:
    # numbers and bools, ml_dtypes included; not strings, objects, datetimes, records
    try:
        return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))
    except TypeError:
        return False


def _narrowing_problem(x: np.ndarray | np.generic) -> str:
    """Why a numpy value would silently wrap or become inf in JAX's narrower
    dtype (jax_enable_x64 off); "" where it fits."""
    have, want = np.dtype(x.dtype), np.dtype(jax.dtypes.canonicalize_dtype(x.dtype))
    if want == have or np.size(x) == 0:
        return ""
    off = "(jax_enable_x64 is off)"
    if np.issubdtype(have, np.integer) and np.issubdtype(want, np.integer):
        info, lo, hi = np.iinfo(want), np.min(x), np.max(x)
        if lo < info.min or hi > info.max:
            return (
                f"values up to {hi if hi > info.max else lo} do not fit in {want.name}, "
                f"JAX's integer type {off}"
            )
    elif np.issubdtype(have, np.floating) or np.issubdtype(have, np.complexfloating):
        limit = np.finfo(want).max
        for part in (np.real(x), np.imag(x)) if np.iscomplexobj(x) else (x,):
            part = np.asarray(part)
            hi = np.fmax.reduce(part, axis=None, initial=-np.inf)  # (NaN ignored, no temporary)
            lo = np.fmin.reduce(part, axis=None, initial=np.inf)
            if not max(hi, -lo) > limit:  # every value fits: the common case, read twice
                continue
            big = part[np.isfinite(part) & (np.abs(part) > limit)]
            with np.errstate(over="ignore"):
                # (past it by less than rounding: fits)
                if np.isinf(big.astype(np.finfo(want).dtype)).any():
                    return f"finite values past {want.name}'s range would become inf {off}"
    return ""
