"""``jc.fetch``: the deliberate device-to-host transfer.

The one way to read device values inside a ``jc.hot_loop`` (it works the same
outside one). It copies, so no host view keeps a donated buffer pinned, and
its time counts as time blocked on the device in the loop's timing.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar, overload

import jax
import numpy as np
import numpy.typing as npt

from .._compat import hostcopy
from .._dtypes import is_key
from .._errors import DonationError, TransferError
from .._format import fmt_aval
from .._marks import consumer_of
from .._report import timing as _timing
from .._runtime import donated, donation_fix, local, observers
from .._tracebacks import boundary

__all__ = ["fetch"]

T = TypeVar("T")


@overload
def fetch(tree: jax.Array) -> npt.NDArray[Any]: ...


@overload
def fetch(tree: T) -> T: ...


@boundary
def fetch(tree: Any) -> Any:
    """Copy a pytree of device arrays to the host, deliberately.

    The one way to read device values inside a :func:`hot_loop`; it works the
    same outside one.

    Args:
        tree: any pytree of ``jax.Array`` s (a ``jc.state`` instance included).

    Returns:
        The same tree with numpy arrays as leaves. They are copies: on CPU a
        plain ``np.asarray(x)`` shares the device buffer, and a live view of a
        donated buffer makes XLA copy instead of donating at the next step.
        A typed PRNG key (``jax.random.key``) comes back as its key data, a
        numpy ``uint32`` array of shape ``key.shape + (2,)`` for the default
        threefry implementation (what ``jax.random.key_data`` holds):
        a typed key always lives on a device, and ``jax.device_get(key)``
        itself puts the data back on the device (a host-to-device transfer a
        hot loop refuses). ``jax.random.wrap_key_data(data)`` makes it a key
        again.

    Raises:
        DonationError: a leaf was donated to (consumed by) a hot step.

    Examples:
        >>> import jax.numpy as jnp, jaxcontracts as jc
        >>> with jc.hot_loop():
        ...     jc.fetch({"t": jnp.float32(2)})
        {'t': array(2., dtype=float32)}
    """
    __tracebackhide__ = True
    observers.fetches += 1  # counted by contract snapshots
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    for n, x in enumerate(leaves):
        if (
            isinstance(x, jax.Array)
            and not x.is_fully_addressable
            and not x.is_fully_replicated
        ):
            raise TransferError(
                f"jc.fetch(): a {fmt_aval(x.shape, x.dtype)} leaf spans devices of "
                "other processes, so this process cannot read all of it.",
                fix="fetch a replicated value (reduce it in the step), this process's "
                "shards (jc.fetch([s.data for s in x.addressable_shards])), or gather "
                "it with jax.experimental.multihost_utils.process_allgather.",
            )
        if isinstance(x, jax.Array) and x.is_deleted():
            by = consumer_of(tree)
            path = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(tree)[0][n][0])
            raise DonationError(
                f"jc.fetch(): {path + ': ' if path else ''}{fmt_aval(x.shape, x.dtype)} {donated(by)} "
                "and no longer exists.",
                fix=donation_fix("fetch", by, value="t"),
                contract="no-donated-use",
                step=by,
            )
    local.allow += 1
    t0 = time.perf_counter()
    try:
        copies = [
            hostcopy.host_copy(jax.random.key_data(x) if is_key(x.dtype) else x)
            if isinstance(x, jax.Array)
            else (np.array(x, copy=True) if isinstance(x, np.ndarray) else x)
            for x in leaves
        ]
    finally:
        local.allow -= 1
        _timing.blocked("jc.fetch", time.perf_counter() - t0)
    return jax.tree_util.tree_unflatten(treedef, copies)

