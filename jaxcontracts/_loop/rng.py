"""``jax.random`` samplers inside a hot loop: their Python-number parameters.

An eager sampler copies its parameters and their defaults (``minval``,
``p``...), Python numbers, to the device at every call: documented idioms, a
few bytes, no user data. While loops are active the public samplers are
replaced by wrappers that lift JAX's guard for the call unless an argument
is numpy data, and count it (``loop.sampler_calls``). ``fold_in(key, i)``
(its int is the loop's data) and a sampler imported by name stay refused.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._runtime import local

__all__ = ["SAMPLERS", "install", "uninstall"]

# The public samplers: every function of jax.random that draws from a distribution.
SAMPLERS = (
    "ball", "bernoulli", "beta", "binomial", "categorical", "cauchy",
    "chisquare", "choice", "dirichlet", "double_sided_maxwell", "exponential",
    "f", "gamma", "generalized_normal", "geometric", "gumbel", "laplace",
    "loggamma", "logistic", "lognormal", "maxwell", "multinomial",
    "multivariate_normal", "normal", "orthogonal", "pareto", "permutation",
    "poisson", "rademacher", "randint", "rayleigh", "t", "triangular",
    "truncated_normal", "uniform", "wald", "weibull_min",
)  # fmt: skip


def _host_data(values: Any) -> bool:
    """Whether any argument is host data (numpy), which stays refused."""
    for v in values:
        if isinstance(v, (np.ndarray, np.generic)):
            return True
        if isinstance(v, (list, tuple)) and any(isinstance(x, (np.ndarray, np.generic)) for x in v):
            return True
    return False


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def sampler(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        loop = local.loop
        if (
            loop is None
            or not loop.checks_host_to_device
            or _host_data(args)
            or _host_data(kwargs.values())
        ):
            return original(*args, **kwargs)
        with jax.transfer_guard_host_to_device("allow"):
            out = original(*args, **kwargs)
        loop.sampler_calls += 1
        return out

    sampler.__wrapped__ = original  # type: ignore[attr-defined]
    sampler.__name__ = sampler.__qualname__ = name
    sampler.__doc__ = original.__doc__
    return sampler


class _Samplers:
    def __init__(self) -> None:
        self.originals = {n: getattr(jax.random, n) for n in SAMPLERS if hasattr(jax.random, n)}
        self.wrapped = {n: _wrap(n, f) for n, f in self.originals.items()}
        self._get = operator.itemgetter(*self.originals)  # the names' values, in C
        self._originals = tuple(self.originals.values())
        self._wrapped = tuple(self.wrapped.values())

    def _now(self, names: dict[str, Any]) -> tuple[Any, ...] | None:
        try:
            return self._get(names)  # type: ignore[no-any-return]
        except KeyError:
            return None

    def install(self) -> None:
        names = vars(jax.random)
        if self._now(names) == self._originals:  # identity: functions have no __eq__
            names.update(self.wrapped)
        else:  # never over a user's own patch
            originals = self.originals
            names.update({n: w for n, w in self.wrapped.items() if names.get(n) is originals[n]})

    def uninstall(self) -> None:
        names = vars(jax.random)
        if self._now(names) == self._wrapped:
            names.update(self.originals)
        else:
            wrapped = self.wrapped
            names.update({n: f for n, f in self.originals.items() if names.get(n) is wrapped[n]})


_samplers: _Samplers | None = None


def install() -> None:
    global _samplers
    if _samplers is None:
        _samplers = _Samplers()
    _samplers.install()


def uninstall() -> None:
    if _samplers is not None:
        _samplers.uninstall()
