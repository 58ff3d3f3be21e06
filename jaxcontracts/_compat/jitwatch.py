"""Observing plain ``jax.jit`` functions: what ``jc.watch()`` and the audit need.

``jax.jit`` is replaced while a watch is open, so that a function jitted then
(also by ``eqx.filter_jit`` and ``nnx.jit``) comes back wrapped, and
``jax.device_put``, so that the watch sees the arrays it makes over an
argument's buffers. ``PjitFunction._jit_info`` (private) gives a jitted
function's static and donated parameters, resolved by JAX; its
``_cache_size()``, whether a call compiled (or at least traced).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

import jax

from .frames import library_locals
from .registry import capability, define

__all__ = [
    "JitOptions", "add_miss_observer", "available", "cache_size", "equinox_arguments", "install",
    "installed", "options_from_info",
    "jaxpr_of", "options_of", "outputs_of", "remove_miss_observer", "uninstall",
]

_ORIGINAL = jax.jit
_ORIGINAL_PUT = jax.device_put


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
    return options_from_info(jitted._jit_info)


def cache_size(jitted: Any) -> int:
    return int(jitted._cache_size())


def install(wrap: Callable[[Any, Any], Any], put: Callable[[Any, Any], None]) -> None:
    """Replace ``jax.jit``: each function it makes is passed through
    ``wrap(jitted, fun)``; ``jax.jit(**options)`` (a decorator) too. And
    ``jax.device_put``: ``put(given, made)`` after each call that returns."""

    def jit(fun: Any = _NOT_GIVEN, /, **options: Any) -> Any:
        if fun is _NOT_GIVEN:
            decorator = _ORIGINAL(**options)
            return lambda f: wrap(decorator(f), f)
        return wrap(_ORIGINAL(fun, **options), fun)

    def device_put(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        made = _ORIGINAL_PUT(*args, **kwargs)
        put(args[0] if args else kwargs.get("x"), made)
        return made

    for new, old in ((jit, _ORIGINAL), (device_put, _ORIGINAL_PUT)):
        new.__wrapped__ = old  # type: ignore[attr-defined]
        new.__doc__ = old.__doc__
    jax.jit = jit
    jax.device_put = device_put


def uninstall() -> None:
    jax.jit = _ORIGINAL
    jax.device_put = _ORIGINAL_PUT


def installed() -> bool:
    return jax.jit is not _ORIGINAL


_NOT_GIVEN = object()


# --------------------------------------------------------------------------
# A jitted function's cache miss: what jc.hot_loop() sees of plain jax.jit


@define(
    "jit-cache-miss",
    "jax._src.pjit._infer_params (private), called by a jax.jit function's cache miss "
    "with the function, its PjitInfo and the call's arguments; "
    "PjitParams.params['jaxpr'].out_avals",
    "inside jc.hot_loop: a plain jax.jit's recompile named leaf by leaf, a wrong donation "
    "refused before the call, a host argument named by its function and parameter",
)
def _probe_miss() -> str | None:
    try:
        from jax._src import pjit
    except ImportError as err:  # pragma: no cover
        return f"jax._src.pjit: {err}"
    infer = getattr(pjit, "_infer_params", None)
    if not callable(infer):
        return "jax._src.pjit._infer_params is missing"
    if list(inspect.signature(infer).parameters) != ["fun", "ji", "args", "kwargs"]:
        return f"_infer_params takes {list(inspect.signature(infer).parameters)}"
    try:
        source = inspect.getsource(pjit._cpp_pjit)
    except (OSError, TypeError, AttributeError):
        return "jax._src.pjit._cpp_pjit's source cannot be read"
    if "_infer_params(fun, jit_info, args, kwargs)" not in source:
        return "a jax.jit cache miss no longer calls _infer_params"
    if "params" not in getattr(pjit.PjitParams, "_fields", ()):
        return "PjitParams has no params"
    return None


#: Observers of cache misses, innermost last: ``obs(fun, ji, args, kwargs, run)``
#: must return ``run(fun, ji, args, kwargs)`` (or raise before or after it).
_observers: list[Callable[..., Any]] = []
_observers_lock = threading.Lock()
_original_infer: Any = None


def add_miss_observer(observer: Callable[..., Any]) -> bool:
    """Install an observer of jax.jit cache misses (False: not on this JAX),
    once per user (a loop entry); the last ``remove`` puts JAX's function back."""
    global _original_infer
    if not capability("jit-cache-miss").available:
        return False
    from jax._src import pjit

    with _observers_lock:
        if not _observers:
            _original_infer = pjit._infer_params
            pjit._infer_params = _observed
        _observers.append(observer)
    return True


def remove_miss_observer(observer: Callable[..., Any]) -> None:
    from jax._src import pjit

    with _observers_lock:
        if observer in _observers:
            _observers.remove(observer)
        if not _observers and _original_infer is not None:
            pjit._infer_params = _original_infer


def _observed(fun: Any, ji: Any, args: Any, kwargs: Any) -> Any:
    run = _original_infer
    observer = _observers[-1] if _observers else None
    if observer is None:
        return run(fun, ji, args, kwargs)
    return observer(fun, ji, args, kwargs, run)


def options_from_info(ji: Any) -> JitOptions:
    sig = getattr(ji, "fun_signature", None)
    return JitOptions(
        tuple(ji.static_argnums),
        tuple(ji.static_argnames),
        tuple(ji.donate_argnums),
        tuple(ji.donate_argnames),
        sig if isinstance(sig, inspect.Signature) else None,
    )


def outputs_of(params: Any) -> tuple[Any, list[Any]]:
    """(output treedef, output avals) of a cache miss's ``PjitParams``."""
    return params.out_tree, list(params.params["jaxpr"].out_avals)


def jaxpr_of(params: Any) -> Any:
    return params.params["jaxpr"]


@define(
    "equinox-arguments",
    "equinox._jit._call(jit_wrapper, is_lower, args, kwargs) and _JitWrapper._signature "
    "(private): the frame of an eqx.filter_jit call, its function's signature",
    "that the audit names an eqx.filter_jit function's parameters as the user wrote them "
    "(model, x) rather than equinox's groups (dynamic_nodonate['rest'][13])",
)
def _probe_equinox() -> str | None:
    module = sys.modules.get("equinox._jit")
    if module is None:  # not imported: nothing to name (and not imported here)
        return None
    call, wrapper = getattr(module, "_call", None), getattr(module, "_JitWrapper", None)
    if call is None or wrapper is None:
        return "equinox._jit._call or _JitWrapper is gone"
    if (
        list(inspect.signature(call).parameters)[:4]
        != ["jit_wrapper", "is_lower", "args", "kwargs"]
    ):
        return "equinox._jit._call takes other arguments"
    if "_signature" not in getattr(wrapper, "__annotations__", {}):
        return "equinox's _JitWrapper has no _signature"
    return None


def equinox_arguments(frame: Any) -> dict[str, Any] | None:
    """The arguments of the ``eqx.filter_jit`` call running at or above
    ``frame``, by the user's parameter names; None where none is found."""
    if not capability("equinox-arguments").available:
        return None
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_call" and code.co_filename.endswith(
            ("equinox/_jit.py", "equinox\\_jit.py")
        ):
            found = library_locals(frame)
            signature = getattr(found.get("jit_wrapper"), "_signature", None)
            try:
                return dict(signature.bind(  # type: ignore[union-attr]
                    *found["args"], **found["kwargs"]
                ).arguments)
            except Exception:  # noqa: BLE001 - another shape of call: unnamed
                return None
        frame = frame.f_back
    return None
