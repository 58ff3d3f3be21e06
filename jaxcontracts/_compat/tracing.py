"""Tracing state, fast flattening and the compiled executable's C++ call."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax

from .registry import capability, define, missing

__all__ = [
    "REGISTERED",
    "exclude_from_source_info",
    "Tracer",
    "context_changes",
    "cpp_call",
    "flatten",
    "jit_context",
    "jit_disabled",
    "top_level_refs",
    "trace_state_clean",
]

Tracer = jax.core.Tracer

try:  # one attribute read: is any trace active on this thread?
    from jax._src.core import trace_state_clean as _trace_state_clean
except ImportError:  # pragma: no cover - future jax
    _trace_state_clean = None
try:  # what trace_state_clean() returns, one Python frame sooner (bound once)
    from jax._src.core import trace_ctx as _trace_ctx

    _is_top_level: Callable[[], bool] | None = _trace_ctx.is_top_level
except (ImportError, AttributeError):  # pragma: no cover - future jax
    _is_top_level = None

try:  # what is_top_level() compares, for the call path to read inline
    from jax._src.core import axis_env_state as _axis_ref
    from jax._src.core import eval_trace as _eval_trace
    from jax._src.core import top_axis_env as _top_axis_env
    from jax._src.core import trace_state_strong_ref as _trace_ref

    _refs: tuple[Any, Any, Any, Any] | None = (_trace_ref, _eval_trace, _axis_ref, _top_axis_env)
except ImportError:  # pragma: no cover - future jax
    _refs = None

try:  # the paths JAX's messages skip when they name the user's line, and its tracebacks leave out
    from jax._src import source_info_util as _source_info
    from jax._src import traceback_util as _traceback_util
except ImportError:  # pragma: no cover - future jax
    _source_info = _traceback_util = None  # type: ignore[assignment]


@define(
    "source-exclusion",
    "jax._src.source_info_util.register_exclusion and jax._src.traceback_util.register_exclusion "
    "(the paths JAX skips to name the user's line, and leaves out of the tracebacks it filters)",
    "JAX's own messages for a call made through a hot step, a hot loop or jc.watch() "
    "(jax_explain_cache_misses, a callback's site) name a jaxcontracts frame, not the user's line, "
    "and an error raised while a hot step traces shows the library's frames",
)
def _probe_source_exclusion() -> str | None:
    if _source_info is None or _traceback_util is None:
        return "jax._src.source_info_util or jax._src.traceback_util is gone"
    for name in ("register_exclusion", "is_user_filename"):
        if not callable(getattr(_source_info, name, None)):
            return f"source_info_util.{name} is gone"
    if not callable(getattr(_traceback_util, "register_exclusion", None)):
        return "traceback_util.register_exclusion is gone"
    return None


def exclude_from_source_info(prefixes: list[str]) -> None:
    """Have JAX skip the files under ``prefixes`` when it names the user's line
    and filter them from its tracebacks, as it does its own frames."""
    if capability("source-exclusion").available:
        for prefix in prefixes:
            _source_info.register_exclusion(prefix)
            _traceback_util.register_exclusion(prefix)


@define(
    "trace-state",
    "jax._src.core.trace_state_clean()",
    "state construction is skipped, and a hot step traces its function, only "
    "when an argument is a tracer (a state closed over by jax.jit runs eagerly)",
)
def _probe_trace_state() -> str | None:
    if _trace_state_clean is None:
        return "jax._src.core.trace_state_clean is gone"
    if _is_top_level is not None and _is_top_level() is not _trace_state_clean():
        return "trace_ctx.is_top_level() disagrees with trace_state_clean()"
    if _refs is not None:
        trace_ref, ev, axis_ref, top = _refs
        if (trace_ref.value is ev and axis_ref.value is top) is not _trace_state_clean():
            return "trace_state_strong_ref/axis_env_state disagree with trace_state_clean()"
    return None if _trace_state_clean() in (True, False) else "it returned a non-bool"


def _trace_state_unknown() -> bool:
    capability("trace-state")  # warns once: what is no longer checked
    return True


try:  # the config values jax.jit's cache key holds (x64, default device, matmul precision, mesh...)
    from jax._src.config import trace_context as _trace_context
except ImportError:  # pragma: no cover - future jax
    _trace_context = None
try:  # their names (jax 0.10.2 on; messages only)
    from jax._src.config import trace_context_names as _trace_context_names
except ImportError:  # jax 0.10.0
    _trace_context_names = None


def _names() -> tuple[str, ...] | None:
    try:
        return tuple(_trace_context_names()) if _trace_context_names is not None else None
    except Exception:  # noqa: BLE001 - NotImplementedError with an older jaxlib
        return None


@define(
    "jit-context",
    "jax._src.config.trace_context() (and trace_context_names(), for the messages)",
    "a hot step called under other values of the JAX options in jax.jit's cache key than "
    "it compiled under (jax_enable_x64, jax.default_device, a mesh) compiles again, never running "
    "the old program",
)
def _probe_context() -> str | None:
    if _trace_context is None:
        return "jax._src.config.trace_context is gone"
    values = _trace_context()
    if not isinstance(values, tuple) or hash(values) != hash(_trace_context()):
        return "trace_context() is not a hashable tuple"
    names = _names()  # where given, they must name the values
    if names is not None and (len(names) != len(values) or "jax_enable_x64" not in names):
        return "trace_context_names() does not name trace_context()'s values"
    return None


def jit_context() -> Any:
    """The config values ``jax.jit`` compiles for, as one comparable value
    (None when the mechanism is missing: every context then looks the same)."""
    if _trace_context is None or not capability("jit-context").available:
        return None
    return _trace_context()


#: What :func:`context_changes` names when JAX registered options since the
#: compile (on jax 0.12, importing flax, orbax or ``jax.extend`` does).
REGISTERED = "JAX options registered since the compile (an import: flax, orbax, jax.extend)"


def context_changes(compiled_for: Any, now: Any) -> list[tuple[str, Any, Any]]:
    """``(option, then, now)`` for each value that differs between two :func:`jit_context`'s."""
    if compiled_for is None or now is None or compiled_for == now:
        return []
    if len(compiled_for) != len(now):  # an option registered since
        return [(REGISTERED, f"{len(compiled_for)} options", f"{len(now)} options")]
    names = _names()
    if names is None or len(names) != len(now):  # (jax 0.10.0 does not name them)
        return [
            (f"option {i} of JAX's trace context", a, b)
            for i, (a, b) in enumerate(zip(compiled_for, now))
            if a != b
        ]
    return [(n, a, b) for n, a, b in zip(names, compiled_for, now) if a != b]


def jit_disabled() -> bool:
    """Whether ``jax.disable_jit()`` is in force on this thread (then a step runs
    its Python function, as ``jax.jit`` does: the AOT path refuses to run)."""
    try:
        from jax._src.config import disable_jit

        return bool(disable_jit.value)
    except (ImportError, AttributeError):  # pragma: no cover - future jax: the public flag
        return bool(getattr(jax.config, "jax_disable_jit", False))


# Whether no JAX trace is active on this thread (``True`` if unknown). JAX's
# own function, not a wrapper: the hot step call path calls it on every call.
trace_state_clean: Callable[[], bool] = (
    _trace_state_unknown
    if _trace_state_clean is None
    else (_is_top_level if _is_top_level is not None else _trace_state_clean)
)


class _Clean:
    def __init__(self, yes: object) -> None:
        self._yes = yes

    @property
    def value(self) -> object:
        return self._yes if trace_state_clean() else None


def top_level_refs() -> tuple[Any, Any, Any, Any]:
    """``(trace_ref, eval_trace, axis_ref, top_axis_env)``: no trace is active
    exactly when ``trace_ref.value is eval_trace and axis_ref.value is
    top_axis_env`` (JAX's ``is_top_level()`` without its three Python frames).
    Without the refs, stand-ins that call :data:`trace_state_clean`."""
    if _refs is not None and capability("trace-state").available:
        return _refs
    yes, top = object(), object()
    return _Clean(yes), yes, types.SimpleNamespace(value=top), top


_registry = getattr(jax.tree_util, "default_registry", None)


@define(
    "fast-flatten",
    "jax.tree_util.default_registry.flatten",
    "nothing is lost; a hot step call flattens through tree_flatten's Python wrapper (slower)",
)
def _probe_flatten() -> str | None:
    if _registry is None or not callable(getattr(_registry, "flatten", None)):
        return "jax.tree_util.default_registry.flatten is gone"
    leaves, _ = _registry.flatten({"a": (1, 2)})
    return None if list(leaves) == [1, 2] else "it flattens differently"


flatten: Callable[[Any], tuple[list[Any], Any]] = jax.tree_util.tree_flatten
if _registry is not None and capability("fast-flatten").available:
    flatten = _registry.flatten


@define(
    "compiled-fast-call",
    "jax.stages.Compiled._call / _executable.create_cpp_call",
    "nothing is lost; hot step calls go through Compiled.__call__ (one more Python frame)",
)
def _probe_cpp_call() -> str | None:
    import inspect

    from jax._src import stages  # the private module: Executable is not re-exported

    source = inspect.getsource(stages.Compiled.__call__)
    if "_call" not in source or not hasattr(stages.Executable, "create_cpp_call"):
        return "Compiled.__call__ no longer caches a C++ call in Compiled._call"
    return None


def cpp_call(compiled: Any) -> Any:
    """The C++ call a warm ``Compiled.__call__`` forwards to, or ``compiled`` itself."""
    call = getattr(compiled, "_call", None)
    if call is None:
        try:
            call = compiled._executable.create_cpp_call(compiled._params)
        except Exception as e:  # noqa: BLE001 - private API moved: use the public call
            missing("compiled-fast-call", f"create_cpp_call failed: {type(e).__name__}")
            return compiled
        if call is None:
            return compiled
        compiled._call = call  # what __call__ would cache
    return call
