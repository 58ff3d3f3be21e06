"""Host callbacks an executable runs (``jax.debug.callback``/``print``,
``pure_callback``, ``io_callback``): a hook around each, and where they are.

On CPU a callback runs on the dispatching thread, inside its ``jc.hot_loop``,
whose refusal of the callback's eager ops would fail the step after XLA took
its donated buffers. JAX looks the runners up by name at run time, so
replacing them reaches every compiled callback, even those compiled before.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .registry import capability, define

__all__ = ["callback_sites", "hook_host_callbacks"]

try:
    from jax._src import callback as _callback
    from jax._src import debugging as _debugging
except ImportError:  # pragma: no cover - future jax
    _callback = _debugging = None  # type: ignore[assignment]

_hooked: list[Any] = []


def _targets() -> list[tuple[Any, str]]:
    """(owner, attribute) of each callback runner."""
    out: list[tuple[Any, str]] = []
    if _debugging is not None and callable(
        getattr(getattr(_debugging, "debug_callback_p", None), "impl", None)
    ):
        out.append((_debugging.debug_callback_p, "impl"))
    for name in ("pure_callback_impl", "io_callback_impl"):
        if _callback is not None and callable(getattr(_callback, name, None)):
            out.append((_callback, name))
    return out


@define(
    "host-callback-hook",
    "jax._src.debugging.debug_callback_p.impl, jax._src.callback.pure_callback_impl and "
    "io_callback_impl",
    "a host callback a hot step runs inside jc.hot_loop (a jax.debug.callback doing a jnp op) "
    "runs with the loop's guards lifted, instead of failing the step after its donated "
    "state is gone",
)
def _probe() -> str | None:
    found = {name for _, name in _targets()}
    want = {"impl", "pure_callback_impl", "io_callback_impl"}
    return None if found == want else "missing: " + ", ".join(sorted(want - found))


def hook_host_callbacks(
    around: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
) -> None:
    """Run each host callback as ``around(runner, args, kwargs)`` (once, for
    good), which must return ``runner(*args, **kwargs)``."""
    if _hooked or not capability("host-callback-hook").available:
        return
    for owner, name in _targets():
        original = getattr(owner, name)
        _hooked.append((owner, name, original))
        setattr(owner, name, _runner(original, around))


def _runner(original: Callable[..., Any], around: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def runner(*args: Any, **kwargs: Any) -> Any:
        return around(original, args, kwargs)

    return runner


_CALLBACKS = frozenset({"debug_callback", "debug_print", "pure_callback", "io_callback"})


@dataclasses.dataclass(frozen=True)
class CallbackSite:
    """One host callback in a compiled program: its primitive, and the line
    that wrote it (``file`` ``""`` where JAX kept none)."""

    primitive: str
    file: str
    line: int
    function: str


@define(
    "callback-sites",
    "a jaxpr's equations (eqn.primitive.name, sub-jaxprs in eqn.params) and "
    "eqn.source_info.traceback.frames (file_name, line_num, function_name)",
    "jc.hot_loop(callbacks=\"disallow\") and a hot step's report: the host callbacks a "
    "compiled program makes (jax.debug.print, pure_callback, io_callback), and where",
)
def _probe_sites() -> str | None:
    def f(x: Any) -> Any:
        jax.debug.print("{}", x)
        return jax.lax.cond(x > 0, lambda v: jax.pure_callback(lambda a: a, v, v), lambda v: v, x)

    sites = _sites(jax.make_jaxpr(f)(1.0), lambda file, function: file == __file__)
    want = {"debug_print", "pure_callback"}
    if {s.primitive for s in sites} != want:
        return f"found {sorted(s.primitive for s in sites)} where the probe wrote {sorted(want)}"
    if not all(s.file == __file__ and s.line > 0 for s in sites):
        return "the callbacks' lines are not in the equations' tracebacks"
    return None


def callback_sites(closed: Any, is_user: Callable[[str, str], bool]) -> tuple[CallbackSite, ...]:
    """The host callbacks of a (closed) jaxpr, its sub-jaxprs included (a
    scan's body, a cond's branches, an inner jax.jit), each with the innermost
    frame ``is_user(file, function)`` accepts; () where the jaxpr cannot be read."""
    if not capability("callback-sites").available:
        return ()
    return _sites(closed, is_user)


def _sites(closed: Any, is_user: Callable[[str, str], bool]) -> tuple[CallbackSite, ...]:
    out = []
    for eqn in _equations(getattr(closed, "jaxpr", closed)):
        if eqn.primitive.name in _CALLBACKS:
            out.append(CallbackSite(eqn.primitive.name, *_user_line(eqn, is_user)))
    return tuple(dict.fromkeys(out))  # one per primitive and line (a scan's body is traced once)


# Primitives whose sub-jaxprs are kernels run on the device: a print there
# (``pl.debug_print`` in a Pallas kernel) is lowered on the device, not a callback.
_DEVICE_KERNELS = frozenset({"pallas_call"})


def _jaxpr_types() -> tuple[type, type]:
    """The classes of a closed jaxpr and of its jaxpr, as ``jax.make_jaxpr``
    returns them: importing ``jax.extend`` for them would change JAX's trace
    context on jax 0.12 (it registers Pallas's options) and so recompile every
    ``jax.jit`` the user warmed before the first loop."""
    closed = jax.make_jaxpr(lambda: None)()
    return type(closed), type(getattr(closed, "jaxpr", closed))


_CLOSED_JAXPR, _JAXPR = _jaxpr_types()


def _equations(jaxpr: Any) -> Iterator[Any]:
    for eqn in jaxpr.eqns:
        yield eqn
        if eqn.primitive.name in _DEVICE_KERNELS:
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, _JAXPR):
                    yield from _equations(sub)
                elif isinstance(sub, _CLOSED_JAXPR):
                    yield from _equations(sub.jaxpr)


def _user_line(eqn: Any, is_user: Callable[[str, str], bool]) -> tuple[str, int, str]:
    traceback = getattr(eqn.source_info, "traceback", None)
    for frame in getattr(traceback, "frames", None) or ():
        if is_user(frame.file_name, frame.function_name):
            return frame.file_name, frame.line_num, frame.function_name
    return "", 0, ""
