"""``@jc.hot_step``: the decorator, bare or with options.

It reads the function and the options once (``_step.analyse``) and returns
a :class:`HotStep` (``_step.hot_step``), which compiles, checks and calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from .._compat.frames import caller_locals
from .._tracebacks import trim
from .analyse import analyse
from .hot_step import HotStep

__all__ = ["hot_step"]

P = ParamSpec("P")
R = TypeVar("R")


@overload
def hot_step(
    fn: Callable[P, R],
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
    static: str | tuple[str, ...] = (),
    donate_argnames: str | tuple[str, ...] = (),
    stateless: bool = False,
    state: str | tuple[str, ...] | None = None,
    host: str | tuple[str, ...] = (),
) -> HotStep[P, R]: ...


@overload
def hot_step(
    fn: None = None,
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
    static: str | tuple[str, ...] = (),
    donate_argnames: str | tuple[str, ...] = (),
    stateless: bool = False,
    state: str | tuple[str, ...] | None = None,
    host: str | tuple[str, ...] = (),
) -> Callable[[Callable[P, R]], HotStep[P, R]]: ...


def hot_step(
    fn: Any = None,
    /,
    *,
    signature: type | None = None,
    donate: str | tuple[str, ...] = "all",
    max_compiles: int = 1,
    static: str | tuple[str, ...] = (),
    donate_argnames: str | tuple[str, ...] = (),
    stateless: bool = False,
    state: str | tuple[str, ...] | None = None,
    host: str | tuple[str, ...] = (),
) -> Any:
    """Make ``fn`` an AOT-compiled step with derived, verified donation.

    Args:
        fn: the step, any function (a library's ``kernel.step``, an optax
            ``update``, a ``functools.partial``). Its state parameters are
            those ``state=`` names, else those annotated with ``signature``
            (else with the first non-static parameter's annotation).
        state: names of the state parameters (``"state"`` or
            ``("params", "opt_state")``), no annotation needed. What the step
            returns is then read from its output at the first compile: the
            output, or an element of a returned tuple, with a state
            parameter's exact tree structure is that state's new value
            (carried, donated per ``donate=``); a state parameter returned
            nowhere is read-only. A step that returns something shaped like
            its state that is not its new value (gradients of the
            parameters) takes ``donate="none"``.
        signature: the state type (with annotated parameters). The return
            annotation says which states come back (alone, or in a tuple such
            as ``tuple[State, Metrics]``); without one it is read from the
            output as for ``state=``. A state parameter the step does not
            return is read-only: never donated, never copied, still part of
            the compiled signature.
        donate: ``"all"`` donates every leaf of every returned state
            parameter; a tuple of field names donates those fields only;
            ``"none"`` opts out. Other parameters are donated only when named
            in ``donate_argnames``.
        max_compiles: how many distinct signatures may be compiled.
        static: names of parameters passed by value (hashable: a frozen
            dataclass, a NamedTuple, a function, a string...). A static value
            is part of the signature: a new value is a new compile, counted
            against ``max_compiles`` and named in the refusal's diff. An
            unhashable value is refused.
        donate_argnames: names of other (non-state, non-static) parameters
            whose every leaf is donated, e.g. the batch. Aliasing is proven
            at compile like the state's: a donated leaf no output can reuse
            is a :class:`DonationError`.
        host: names of parameters that take host data each call (a data
            loader's numpy batch). The executable's own call transfers them
            (JAX's C++ path, no ``jax.device_put`` in Python), inside a
            ``jc.hot_loop`` too, as declared transfers; ``stats.host_calls``
            and ``stats.host_bytes`` count them. Every other parameter still
            refuses host data.
        stateless: the step has no state (``compute_gae(rewards, values)``):
            its signature is its arguments' specs, taken from the first call
            or from specs passed to ``.compile(...)``. Nothing is donated
            unless named in ``donate_argnames``.

    On a method, ``obj.step(s)`` closes over ``obj`` as configuration (one
    compile per instance); on a ``functools.partial`` the bound values are
    configuration: see the hot-steps guide, "Methods and partials".

    Returns:
        A :class:`HotStep`, called like ``fn``.

    Raises:
        DefinitionError: no state parameter (and not ``stateless``), an
            unknown donated field or parameter name, or an invalid option; at
            a call, an unhashable static value.

    Examples:
        >>> import jax, jax.numpy as jnp, jaxcontracts as jc
        >>> from jaxtyping import Array, Float32
        >>> @jc.state
        ... class S:
        ...     x: Float32[Array, "n"]
        >>> @jc.hot_step(signature=S)
        ... def step(s: S) -> S:
        ...     return S(x=s.x + 1)
        >>> s = step(S.zeros(n=3))
        >>> step.stats.compiles, step.stats.calls
        (1, 1)

        A read-only step (the state is not returned: not donated), and a
        stateless one with a static argument:

        >>> @jc.hot_step(signature=S)
        ... def total(s: S) -> jax.Array:
        ...     return s.x.sum()
        >>> float(jc.fetch(total(s)))
        3.0
        >>> @jc.hot_step(stateless=True, static=("power",))
        ... def pow_(x: jax.Array, power: int) -> jax.Array:
        ...     return x**power
        >>> pow_(s.x, 2).tolist()
        [1.0, 1.0, 1.0]
    """
    # Annotations may name classes local to the caller's function: resolve there.
    localns = caller_locals(1)

    def make(f: Callable[P, R]) -> HotStep[P, R]:
        try:
            return HotStep(
                analyse(
                    f,
                    signature=signature,
                    donate=donate,
                    max_compiles=max_compiles,
                    localns=localns,
                    static=static,
                    donate_argnames=donate_argnames,
                    stateless=stateless,
                    state=state,
                    host=host,
                )
            )
        except Exception as err:  # the traceback ends at the user's line
            trim(err)
            raise

    try:
        return make if fn is None else make(fn)
    except Exception as err:
        trim(err)
        raise
