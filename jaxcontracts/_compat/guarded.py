"""A compiled executable's C++ call that asks before it takes a new signature.

JAX's compiled fast path (``Compiled._call``, a jaxlib ``PjitFunction``) runs
the executable for a signature it has seen (tree structure, per-leaf dtype,
shape, weak type, placement, numpy or device; trace state and jit config).
On a new one its cache miss, for an AOT executable, checks shape and dtype
only and caches the signature: a weak leaf, numpy or another device is then
taken silently forever after. :func:`guarded_call` builds the same C++ call
with a cache miss of ours, so per-leaf checks run once per signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import capability, define, missing

__all__ = ["REFUSED", "flat_in_tree", "guarded_call", "tree_in_tree"]


class _Refused:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<refused by the call's checks>"


REFUSED: Any = _Refused()


def _parts() -> tuple[Any, Any, Any, Any, Any]:
    """The pieces of a jaxlib pjit call, and the tracing registry."""
    from jax._src import tree_util
    from jax._src.interpreters import pxla

    try:
        from jax._src.lib import _jax

        pjit = _jax.pjit
    except (ImportError, AttributeError):  # jax 0.10.0: the same function, older home
        from jax._src.lib import xla_client

        pjit = xla_client._xla.pjit
    registry = getattr(tree_util, "tracing_registry", None) or tree_util.default_registry
    return (
        pjit, pxla.JitGlobalCppCacheKeys, tree_util.dispatch_registry, pxla.cc_shard_arg, registry
    )


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
    static: (
        tuple[tuple[int, ...], tuple[str, ...], Callable[..., tuple[Any, ...] | None]] | None
    ) = None,
) -> Callable[..., Any] | None:
    """The C++ call of ``compiled``'s executable that runs only signatures
    ``approve`` took (else it returns :data:`REFUSED`); None where the
    executable has no C++ fast path (host callbacks) or the mechanism is missing.

    ``approve(args)``: on a signature the C++ path has not seen (keywords are
    refused); True lets JAX run the call and cache the signature. It must not
    raise nor touch the device. ``in_tree``: the call tree the executable
    takes its flat arguments in (None: its own). ``static``: ``(argnums,
    argnames, bind)``, static in the C++ call as ``jax.jit``'s; on a miss
    ``bind(args, kwargs)`` gives the positional arguments or None (refused),
    never raising, refusing any non-static keyword (C++ orders those by name).
    """
    if not capability("guarded-call").available:
        return None
    try:
        pjit, cache_keys, dispatch_registry, shard_arg, _ = _parts()
        params = compiled._params
        if in_tree is not None:
            if in_tree.num_leaves != params.in_tree.num_leaves:
                raise ValueError(
                    f"{in_tree.num_leaves} leaves, the executable takes {params.in_tree.num_leaves}"
                )
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
        name, None, cache_miss, list(argnums), list(argnames), cache_keys(), dispatch_registry,
        shard_arg,
    )
