"""A compiled executable's C++ call that asks before it takes a new signature.

JAX's compiled fast path (``Compiled._call``, a jaxlib ``PjitFunction``)
flattens the arguments, computes their signature (tree structure; per leaf:
dtype, shape, weak type, committed sharding or device, numpy or device array;
plus the trace state and every config value in the jit key) and runs the
executable when it has seen that signature before. On a new one it calls its
cache miss, which for an AOT executable checks shape and dtype only, runs, and
caches the signature: a weakly typed leaf, a numpy array or an array on
another device is then taken silently forever after.

:func:`guarded_call` builds the same C++ call around the same executable with
a cache miss of ours: ``approve(args)`` runs first on every signature the C++
path has not seen, and only an approved signature reaches JAX's own cache
miss (which runs the call and caches the signature). A refused one returns
:data:`REFUSED` instead of running. So the per-leaf checks of a checked call
(types, weak types, shardings) run once per signature, in the miss, and every
later call is checked by the flatten JAX does anyway.

``in_tree`` lets the same executable take its arguments in another tree
structure with the same leaves (a flat tuple of the leaves, for a caller that
flattened them already; the arguments' own structure, for an executable
compiled from flat leaves). The mechanism is private (``_jax.pjit``, the
executable's ``create_cpp_call`` and ``CompiledCallParams``), so it is behind
the ``guarded-call`` capability; without it callers check every call in
Python, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import capability, define, missing

__all__ = ["REFUSED", "flat_in_tree", "guarded_call", "tree_in_tree"]


class _Refused:
    """What a guarded call returns when ``approve`` refused the arguments."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<refused by the call's checks>"


REFUSED: Any = _Refused()


def _parts() -> tuple[Any, Any, Any, Any, Any]:
    """(the pjit constructor, the cache keys class, the dispatch registry,
    the shard-arg function, the tracing registry) of the installed jaxlib."""
    from jax._src import tree_util
    from jax._src.interpreters import pxla

    try:
        from jax._src.lib import _jax

        pjit = _jax.pjit
    except (ImportError, AttributeError):  # jax 0.10.0: the same function, older home
        from jax._src.lib import xla_client

        pjit = xla_client._xla.pjit
    registry = getattr(tree_util, "tracing_registry", None) or tree_util.default_registry
    return pjit, pxla.JitGlobalCppCacheKeys, tree_util.dispatch_registry, pxla.cc_shard_arg, registry


@define(
    "guarded-call",
    "jaxlib's pjit C++ call built around an AOT executable with a cache miss of "
    "jaxcontracts' own (_jax.pjit, create_cpp_call, CompiledCallParams.in_tree)",
    "nothing is lost; checked hot step calls check every leaf in Python on every call "
    "(slower, most at many leaves)",
)
def _probe() -> str | None:
    from jax._src import stages
    from jax._src.interpreters import pxla

    _parts()
    if "in_tree" not in getattr(stages.CompiledCallParams, "_fields", ()):
        return "CompiledCallParams has no in_tree"
    if not hasattr(pxla.MeshExecutable, "create_cpp_call"):
        return "MeshExecutable.create_cpp_call is gone"
    return None


def flat_in_tree(n_leaves: int) -> Any:
    """The call tree of ``n_leaves`` positional array arguments (no keywords)."""
    return _parts()[4].flatten((tuple(range(n_leaves)), {}))[1]


def tree_in_tree(args: tuple[Any, ...]) -> Any:
    """The call tree of these positional arguments (specs or arrays, no keywords)."""
    return _parts()[4].flatten((tuple(args), {}))[1]


def guarded_call(
    compiled: Any,
    approve: Callable[[tuple[Any, ...]], bool],
    in_tree: Any = None,
    static: tuple[tuple[int, ...], tuple[str, ...], Callable[..., tuple[Any, ...] | None]] | None = None,
) -> Callable[..., Any] | None:
    """The C++ call of ``compiled``'s executable that runs only signatures ``approve`` took.

    Args:
        compiled: a ``jax.stages.Compiled``.
        approve: called with the positional arguments of a call whose
            signature the C++ path has not seen (never with keywords: those
            are refused); True lets JAX run the call and cache the signature.
            It must not raise and must not touch the device.
        in_tree: the call tree the executable takes its flat arguments in
            (:func:`flat_in_tree`, :func:`tree_in_tree`); None: its own.
        static: ``(argnums, argnames, bind)``: the C++ call takes these
            arguments as static, as ``jax.jit``'s ``static_argnums`` and
            ``static_argnames`` do (left out of the flat arguments, hashed
            into the signature; an executable whose static values travel as
            leafless tree nodes). On a miss, ``bind(args, kwargs)`` gives
            the positional arguments JAX's own miss takes, or None (refused);
            it must not raise. A signature is one call shape, so ``bind``
            must refuse any keyword that is not static (the C++ call would
            order those leaves by name).

    Returns:
        The call (which returns :data:`REFUSED` for a refused signature), or
        None where the executable has no C++ fast path (host callbacks,
        unordered effects) or the mechanism is missing here.
    """
    if not capability("guarded-call").available:
        return None
    try:
        pjit, cache_keys, dispatch_registry, shard_arg, _ = _parts()
        params = compiled._params
        if in_tree is not None:
            if in_tree.num_leaves != params.in_tree.num_leaves:
                raise ValueError(f"{in_tree.num_leaves} leaves, the executable takes {params.in_tree.num_leaves}")
            params = params._replace(in_tree=in_tree)
        executable = compiled._executable
        inner = executable.create_cpp_call(params)
        if inner is None:  # no C++ fast path for this executable (host callbacks...)
            return None
        jax_miss = inner._cache_miss
        name = executable.unsafe_call.name
    except Exception as e:  # noqa: BLE001 - private API moved: callers check in Python
        missing("guarded-call", f"building the call failed: {type(e).__name__}: {e}")
        return None
    refused = (REFUSED, None, False)
    argnums, argnames, bind = static if static is not None else ((), (), None)

    def cache_miss(*args: Any, **kwargs: Any) -> Any:
        if bind is not None:
            bound = bind(args, kwargs)
            if bound is None:
                return refused
            args, kwargs = bound, {}
        if kwargs or not approve(args):
            return refused  # not run, nothing cached: the caller's slow path explains
        return jax_miss(*args)

    return pjit(  # type: ignore[no-any-return]
        name, None, cache_miss, list(argnums), list(argnames), cache_keys(), dispatch_registry, shard_arg
    )
