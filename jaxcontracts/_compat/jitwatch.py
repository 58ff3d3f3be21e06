"""Observing plain ``jax.jit`` functions: what ``jc.watch()`` and the audit need.

Three mechanisms, one capability (``jit-observation``):

* the public ``jax.jit`` attribute, replaced while a watch is open, so that a
  function jitted then (``@jax.jit``, ``jax.jit(f, ...)``, and the ``jax.jit``
  that ``eqx.filter_jit`` and ``nnx.jit`` call) comes back wrapped;
* ``PjitFunction._jit_info`` (private): a jitted function's static and
  donated parameters, resolved by JAX from numbers and names alike;
* ``PjitFunction._cache_size()`` (private): the number of signatures its C++
  cache holds, so that a call that grew it compiled (or at least traced).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax

from .registry import capability, define

__all__ = ["JitOptions", "available", "cache_size", "install", "options_of", "uninstall"]

_ORIGINAL = jax.jit


@dataclasses.dataclass(frozen=True)
class JitOptions:
    """What a jitted function was made with, resolved by JAX."""

    static_argnums: tuple[int, ...]
    static_argnames: tuple[str, ...]
    donate_argnums: tuple[int, ...]
    donate_argnames: tuple[str, ...]
    signature: inspect.Signature | None  # the function's, where JAX read one


@define(
    "jit-observation",
    "the public jax.jit replaced while jc.watch() is open; PjitFunction._jit_info "
    "and ._cache_size() (private)",
    "what jc.watch() and `python -m jaxcontracts audit` find in plain jax.jit code "
    "(recompiles, missed and wrong donations, host transfers)",
)
def _probe() -> str | None:
    def f(a: Any, n: int) -> Any:
        return a

    jitted = _ORIGINAL(f, static_argnames="n", donate_argnums=(0,))
    info = getattr(jitted, "_jit_info", None)
    if info is None:
        return "jax.jit's functions have no _jit_info"
    for name in ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames"):
        if not isinstance(getattr(info, name, None), tuple):
            return f"_jit_info.{name} is not a tuple"
    if tuple(info.static_argnums) != (1,) or tuple(info.donate_argnames) != ("a",):
        return "_jit_info does not resolve parameter names and numbers"
    size = getattr(jitted, "_cache_size", None)
    if not callable(size) or size() != 0:
        return "jax.jit's functions have no _cache_size()"
    return None


def available() -> bool:
    return capability("jit-observation").available


def options_of(jitted: Any) -> JitOptions:
    """The static and donated parameters of a ``jax.jit`` function."""
    info = jitted._jit_info
    sig = getattr(info, "fun_signature", None)
    return JitOptions(
        tuple(info.static_argnums),
        tuple(info.static_argnames),
        tuple(info.donate_argnums),
        tuple(info.donate_argnames),
        sig if isinstance(sig, inspect.Signature) else None,
    )


def cache_size(jitted: Any) -> int:
    """How many signatures the function's C++ cache holds."""
    return int(jitted._cache_size())


def install(wrap: Callable[[Any, Any], Any]) -> None:
    """Replace ``jax.jit``: each function it makes is passed through
    ``wrap(jitted, fun)``; ``jax.jit(**options)`` (a decorator) too."""

    def jit(fun: Any = _NOT_GIVEN, /, **options: Any) -> Any:
        if fun is _NOT_GIVEN:
            decorator = _ORIGINAL(**options)
            return lambda f: wrap(decorator(f), f)
        return wrap(_ORIGINAL(fun, **options), fun)

    jit.__wrapped__ = _ORIGINAL  # type: ignore[attr-defined]
    jit.__doc__ = _ORIGINAL.__doc__
    jax.jit = jit


def uninstall() -> None:
    jax.jit = _ORIGINAL


_NOT_GIVEN = object()
