"""``jc.fetch``, ``jc.fetch_async``, ``jc.to_host``: deliberate device-to-host copies."""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar, overload

import jax
import numpy as np
import numpy.typing as npt

from .._compat import hostcopy
from .._contracts.donation import donation_fix
from .._dtypes import is_key
from .._errors import DonationError, TransferError
from .._format import fmt_aval
from .._marks import consumer_of
from .._report import timing as _timing
from .._runtime import donated, local, observers
from .._state.inplace import is_ref
from .._steps import consumed_by
from .._tracebacks import boundary

__all__ = ["Pending", "fetch", "fetch_async", "to_host"]

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
    leaves, treedef = _readable(tree, "jc.fetch")
    return jax.tree_util.tree_unflatten(treedef, _host_copies(leaves, "jc.fetch"))


def _host_copies(leaves: list[Any], what: str, keys: bool = True) -> list[Any]:
    """The leaves copied to numpy, the time counted as blocked under ``what``."""
    t0 = time.perf_counter()
    try:
        return _each(leaves, hostcopy.host_copy, keys)
    finally:
        _timing.blocked(what, time.perf_counter() - t0)


def _each(leaves: list[Any], copy: Any, keys: bool = True) -> list[Any]:
    """``copy`` of each device leaf (a typed key's data, with ``keys``; a ref's
    value), a copy of each numpy one: an explicit transfer."""
    local.allow += 1
    try:
        leaves = [x[...] if is_ref(x) else x for x in leaves]
        return [
            copy(jax.random.key_data(x) if keys and is_key(x.dtype) else x)
            if isinstance(x, jax.Array)
            else (np.array(x, copy=True) if isinstance(x, np.ndarray) else x)
            for x in leaves
        ]
    finally:
        local.allow -= 1


def _readable(tree: Any, what: str) -> tuple[list[Any], Any]:
    """``tree``'s leaves and structure, refused where a leaf cannot be read here."""
    __tracebackhide__ = True
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    for n, x in enumerate(leaves):
        if isinstance(x, jax.core.Tracer):
            path = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(tree)[0][n][0])
            raise TransferError(
                f"{what}(): {path + ': ' if path else ''}a traced {fmt_aval(x.shape, x.dtype)}, "
                "inside a function JAX is tracing (a hot step, a jax.jit): it has no value on the "
                "host until the compiled program runs.",
                fix="read it after the call: return it from the step and fetch the output there "
                "(every N steps: loss = jc.fetch(out['loss'])); to look at it while debugging, "
                "jax.debug.print('{}', x) prints it from the device.",
            )
        if (
            isinstance(x, jax.Array)
            and not x.is_fully_addressable
            and not x.is_fully_replicated
        ):
            raise TransferError(
                f"{what}(): a {fmt_aval(x.shape, x.dtype)} leaf spans devices of "
                "other processes, so this process cannot read all of it.",
                fix="fetch a replicated value (reduce it in the step), this process's "
                "shards (jc.fetch([s.data for s in x.addressable_shards])), or gather "
                "it with jax.experimental.multihost_utils.process_allgather.",
            )
        if isinstance(x, jax.Array) and x.is_deleted():
            by = consumer_of(tree) or consumed_by(x)
            path = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(tree)[0][n][0])
            raise DonationError(
                f"{what}(): {path + ': ' if path else ''}{fmt_aval(x.shape, x.dtype)} "
                f"{donated(by)} and no longer exists.",
                fix=donation_fix("fetch", by, value=f"s{path}"),
                contract="no-donated-use",
                step=by,
            )
    return leaves, treedef


class Pending(Generic[T]):
    """Values on their way to the host, from :func:`fetch_async`.

    :meth:`result` gives them as :func:`fetch` would, waiting only for what
    has not arrived yet; :meth:`done` asks without waiting. The copies are
    arrays of their own (in the device's host memory), so a step may donate
    the arrays they were taken from at once.
    """

    __slots__ = ("_copies", "_treedef", "_value")

    def __init__(self, copies: list[Any], treedef: Any) -> None:
        self._copies, self._treedef, self._value = copies, treedef, None

    def done(self) -> bool:
        """Whether every value has arrived (never blocks)."""
        return self._value is not None or all(
            not isinstance(x, jax.Array) or x.is_ready() for x in self._copies
        )

    @boundary
    def result(self) -> T:
        """The values, as numpy arrays (blocks until they have arrived; the
        time blocked counts in a loop's timing, under ``jc.fetch_async``)."""
        __tracebackhide__ = True
        if self._value is None:
            values = _host_copies(self._copies, "jc.fetch_async", keys=False)
            self._value = (jax.tree_util.tree_unflatten(self._treedef, values),)
            self._copies = []
        return self._value[0]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<jc.Pending {'done' if self.done() else 'in flight'}>"


@boundary
def fetch_async(tree: T) -> Pending[T]:
    """Start copying a pytree of device arrays to the host, deliberately, and
    return at once: a lagged read that never stalls the loop.

    The host copies are made by the device in the order of its work (after
    the step that computes the values, before a later step that donates
    them), into arrays of their own in the device's host memory; a donating
    step need not wait for them. Read them with ``.result()`` when you need
    them, typically one iteration later, when they have long arrived::

        pending = None
        with jc.hot_loop() as loop:
            for batch in loop.iterate(loader):
                state, metrics = train_step(state, batch)
                if pending is not None:
                    log(pending.result())        # the previous step's metrics
                pending = jc.fetch_async(metrics)

    Works the same outside a loop. Each call counts as a fetch.

    Raises:
        DonationError: a leaf was donated to (consumed by) a hot step already.
    """
    __tracebackhide__ = True
    return Pending(*_host_memory_copies(tree, "jc.fetch_async", keys=True))


@boundary
def to_host(tree: T) -> T:
    """A copy of a pytree of device arrays in host memory, made asynchronously:
    ``jax.Array`` s of their own, for what must keep the values while steps go
    on (an orbax checkpoint saved in the background). Returns at once.

    The device makes the copies after the step that computes the values and
    before a later step that donates them, so donation neither waits for nor
    destroys them. Reading them inside a :func:`hot_loop` is no transfer
    (they are in host memory already)::

        with jc.hot_loop(compiles="warmup") as loop:
            for step in loop.iterate(range(steps)):
                state = train_step(state, next(batches))
                if step % 1000 == 0:  # orbax writes it while the loop goes on
                    manager.save(step, args=ocp.args.StandardSave(jc.to_host(state)))

    On a backend without a host memory kind, each array is copied on the
    device instead, and its transfer to the host started at once.

    Raises:
        DonationError: a leaf was donated to (consumed by) a hot step already.
    """
    __tracebackhide__ = True
    copies, treedef = _host_memory_copies(tree, "jc.to_host", keys=False)
    return jax.tree_util.tree_unflatten(treedef, copies)  # type: ignore[no-any-return]


def _host_memory_copies(tree: Any, what: str, keys: bool) -> tuple[list[Any], Any]:
    """Each leaf's asynchronous copy in host memory (a typed key's data, with
    ``keys``), and the tree's structure; counted as a fetch."""
    __tracebackhide__ = True
    observers.fetches += 1
    leaves, treedef = _readable(tree, what)
    return _each(leaves, _to_host_memory, keys=keys), treedef


def _to_host_memory(x: Any) -> Any:
    """A copy of ``x`` in its device's host memory (``pinned_host``), made
    asynchronously; where that memory is missing, an eager copy on the
    device, whose transfer to the host starts at once (donating ``x`` does
    not touch it)."""
    try:
        return jax.device_put(x, x.sharding.with_memory_kind("pinned_host"))
    except Exception:  # noqa: BLE001 - no host memory kind here
        copy = x.copy()
        copy.copy_to_host_async()
        return copy

