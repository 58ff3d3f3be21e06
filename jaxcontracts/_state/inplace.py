"""States updated in place: flax NNX objects and JAX refs (``jax.new_ref``).

A compiled function cannot change objects outside it, so a hot step carries
them: it returns each object (or the arrays a pytree of refs holds) after the
step ran, and the new arrays are written back into the user's Variables or
refs, as after ``nnx.jit``. flax is never imported here.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._compat import refs as _refs
from .._errors import DefinitionError
from .._format import fmt_aval, param_of

__all__ = [
    "closed_over_refs",
    "closed_over_refs_error",
    "is_inplace_object",
    "is_ref",
    "mutated",
    "new_refs",
    "ref_arrays",
    "ref_params",
    "ref_values",
    "repeated_refs_error",
    "replace_all",
    "static_attributes",
    "write_back",
]


def _nnx() -> Any:
    return sys.modules.get("flax.nnx")


def is_inplace_object(x: Any) -> bool:
    """Whether ``x`` is an NNX object a step may update in place: a pytree
    (flax >= 0.11) whose arrays live in Variables."""
    nnx = _nnx()
    base = getattr(nnx, "Pytree", None) or getattr(nnx, "Object", None)
    return base is not None and isinstance(x, base)


def write_back(obj: Any, new: Any) -> None:
    """Put the arrays of ``new`` (what the compiled step returned for ``obj``:
    the same structure) into ``obj``'s own Variables (refs: :func:`replace_all`)."""
    if not is_inplace_object(obj):  # a pytree of refs the step wrote itself (under a trace)
        return
    variable = _nnx().Variable
    is_variable = lambda v: isinstance(v, variable)  # noqa: E731
    old_vars = [v for v in jax.tree_util.tree_leaves(obj, is_leaf=is_variable) if is_variable(v)]
    new_vars = [v for v in jax.tree_util.tree_leaves(new, is_leaf=is_variable) if is_variable(v)]
    for old, fresh in zip(old_vars, new_vars, strict=True):
        old.set_raw_value(fresh.get_raw_value())


def mutated(before: Sequence[Any], after: Sequence[Any]) -> bool:
    """Whether an argument's leaves, read again after the traced step ran,
    are not the ones it was given (an in-place update)."""
    return len(before) != len(after) or any(a is not b for a, b in zip(before, after))


def static_attributes(kind: type, aux: Any) -> dict[str, Any] | None:
    """An NNX object's static attributes by name, from its pytree aux data
    (node names, static names, static values), so that a message names
    ``use_running_average``, not a tuple index; None for any other node."""
    nnx = _nnx()
    base = getattr(nnx, "Pytree", None)
    if base is None or not isinstance(kind, type) or not issubclass(kind, base):
        return None
    if not (
        isinstance(aux, tuple)
        and len(aux) == 3
        and isinstance(aux[1], tuple)
        and isinstance(aux[2], tuple)
    ):
        return None
    names, values = aux[1], aux[2]
    if len(names) != len(values) or not all(isinstance(n, str) for n in names):
        return None
    return {n: v for n, v in zip(names, values) if not n.startswith("_pytree__")}


def is_ref(x: Any) -> bool:
    """Whether ``x`` is a JAX ref (``jax.new_ref``), which a step updates in place."""
    return isinstance(x, jax.Ref)


def ref_params(
    name: str, param_names: Sequence[str], positional: Sequence[Any], paths: Sequence[str]
) -> tuple[int, ...]:
    """The parameters whose arguments are pytrees of refs (``paths``: where
    refs were found), each carried as a state updated in place; refused
    where a parameter mixes refs with other leaves, or where the installed
    JAX's refs cannot be carried."""
    params = tuple(
        i
        for i, n in enumerate(param_names)
        if any(p == n or p.startswith((f"{n}[", f"{n}.")) for p in paths)
    )
    if not _refs.usable():
        raise _refs_error(name, paths, "on the installed JAX a hot step cannot read the array a "
                          "ref holds (capability 'ref-buffers' is missing)")
    for i in params:
        leaves = jax.tree_util.tree_leaves(positional[i])
        mixed = [x for x in leaves if not is_ref(x)]
        if mixed:
            raise _refs_error(name, paths, f"`{param_names[i]}` mixes refs with {len(mixed)} "
                              "other leaves (a hot step carries a parameter of refs, or of arrays, "
                              "not both)")
        if any(_refs.buffer(x) is None for x in leaves):
            raise _refs_error(
                name, paths, f"`{param_names[i]}` holds a ref of a pytree (not of one array)"
            )
    return params


def ref_arrays(tree: Any) -> tuple[Any, list[Any], list[Any]]:
    """``tree`` (a pytree of refs) with each ref replaced by the array it
    holds, those arrays, and the refs (flat); ``tree`` itself and ``[]``
    where a ref is traced (the step then runs on the refs under the outer
    trace)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [_refs.buffer(r) for r in leaves]
    if any(a is None for a in arrays):
        return tree, [], leaves
    return jax.tree_util.tree_unflatten(treedef, arrays), arrays, leaves


def replace_all(refs: Sequence[Any], arrays: Sequence[Any]) -> None:
    """Put each array the executable returned into its ref (a ref that came
    back itself was written by the step, run op by op under disable_jit)."""
    for ref, new in zip(refs, arrays, strict=True):
        if new is not ref:
            _refs.replace(ref, new)


def new_refs(tree: Any) -> Any:
    """Inside the traced step: fresh refs of a ref parameter's arrays."""
    return jax.tree_util.tree_map(jax.new_ref, tree)


def ref_values(tree: Any) -> Any:
    """Inside the traced step: what its refs hold after it ran."""
    return jax.tree_util.tree_map(lambda r: r[...], tree)


def repeated_refs_error(name: str, named: Sequence[tuple[str, Any]]) -> DefinitionError:
    """``named``: (path, ref) of every ref passed, one ref twice."""
    seen: dict[int, str] = {}
    pairs = []
    for where, ref in named:
        if id(ref) in seen:
            pairs.append(f"{seen[id(ref)]} and {where}")
        seen.setdefault(id(ref), where)
    return DefinitionError(
        f"{name}: the same JAX ref is passed twice ({'; '.join(pairs[:3])}): a compiled step "
        "would update two copies of it, and keep only one of the updates.",
        fix="pass each ref once (read its value twice inside the step instead).",
        contract="definition",
        step=name,
        leaves=pairs,
        note="Nothing was dispatched; the refs are intact.",
    )


def closed_over_refs(consts: Sequence[Any]) -> list[Any]:
    """The JAX refs among a traced step's constants: refs its function closes over."""
    return [c for c in consts if is_ref(c)]


def closed_over_refs_error(
    name: str, fn: Callable[..., Any], refs: Sequence[Any]
) -> DefinitionError:
    """A step that closes over ``refs``: JAX makes each a hidden argument of the
    executable, which its AOT API cannot describe (``Compiled.input_shardings``
    raises), so a hot step cannot carry it; passed as an argument, it can."""
    names = _closure_names(fn, refs)
    shown = [
        f"`{names[id(r)]}` ({_fmt_ref(r)})" if id(r) in names else f"a ref {_fmt_ref(r)}"
        for r in refs
    ]
    first = next((names[id(r)] for r in refs if id(r) in names), "ref")
    param = param_of(first)
    return DefinitionError(
        f"{name} closes over {'a JAX ref' if len(refs) == 1 else f'{len(refs)} JAX refs'}: "
        f"{', '.join(shown[:3])}{', ...' if len(shown) > 3 else ''}. A compiled step "
        "takes a ref it closes over as a hidden argument, which a hot step cannot check, "
        "donate or report.",
        fix=f"pass it as an argument (def step(..., {param}): ...; step(..., {param})), or make it "
        "part of the state: a hot step carries the refs it is given, updated in place.",
        contract="definition",
        step=name,
        leaves=[names.get(id(r), "ref") for r in refs],
        note="Nothing was dispatched; the refs are intact.",
    )


def _fmt_ref(ref: Any) -> str:
    inner = getattr(getattr(ref, "aval", None), "inner_aval", None)
    return fmt_aval(ref.shape, ref.dtype, bool(getattr(inner, "weak_type", False)))


def _closure_names(fn: Callable[..., Any], refs: Sequence[Any]) -> dict[int, str]:
    """Each ref's name in ``fn``'s closure or globals (``counter``,
    ``state['n']``), where the function names it directly or in a container;
    read with ``inspect.getclosurevars``, nothing else."""
    wanted = {id(r) for r in refs}
    found: dict[int, str] = {}
    fn = inspect.unwrap(getattr(fn, "func", fn))
    try:
        closure = inspect.getclosurevars(fn)
    except (TypeError, ValueError):  # a builtin, a callable object: no names
        return found
    # then the module's globals by identity (a jitted helper the step calls closes over it)
    module = [(k, v) for k, v in getattr(fn, "__globals__", {}).items() if id(v) in wanted]
    for var, value in (*closure.nonlocals.items(), *closure.globals.items(), *module):
        if id(value) in wanted:
            found.setdefault(id(value), var)
            continue
        if inspect.ismodule(value) or callable(value):
            continue
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            if id(leaf) in wanted:
                found.setdefault(id(leaf), var + jax.tree_util.keystr(path))
    return found


def _refs_error(name: str, paths: Sequence[str], why: str) -> DefinitionError:
    return DefinitionError(
        f"{name}: {', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''} "
        f"{'is a JAX ref' if len(paths) == 1 else f'are JAX refs ({len(paths)})'} "
        f"(jax.new_ref), which this step cannot carry: {why}.",
        fix="pass a pytree whose every leaf is a ref of one array (jax.tree.map(jax.new_ref, "
        "state)), or carry arrays (state = step(state), the step returning its new state).",
        contract="definition",
        leaves=list(paths),
    )
