"""jc.hot_loop and jc.fetch: transfers, compiles and donated arrays in a loop."""

from __future__ import annotations

import io
import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Particles, advance_fn, make_particles
from jaxtyping import Array, Float32

import jaxcontracts as jc
from jaxcontracts import _guard

# -- the access-path matrix -------------------------------------------------

# Each path reads one array prepared before the loop: a 0-d float, a 0-d int
# or a vector. Nothing else in the lambda touches jax (no eager op).
READS = {
    "float": ("f", lambda x: float(x)),
    "int": ("f", lambda x: int(x)),
    "bool (if)": ("f", lambda x: 1 if x else 0),
    "complex": ("f", lambda x: complex(x)),
    "index (list)": ("i", lambda x: [10, 20, 30][x]),
    "index (range)": ("i", lambda x: range(x)),
    ".item()": ("f", lambda x: x.item()),
    ".tolist()": ("v", lambda x: x.tolist()),
    "repr": ("v", lambda x: repr(x)),
    "str": ("v", lambda x: str(x)),
    "f-string": ("f", lambda x: f"{x:.3f}"),
    "print": ("v", lambda x: print(x, file=io.StringIO())),
    "iteration": ("v", lambda x: [None for _ in x]),
    "np.asarray": ("v", lambda x: np.asarray(x)),
    "np.array(dtype)": ("v", lambda x: np.array(x, dtype=np.float64)),
    "np.add (ufunc)": ("v", lambda x: np.add(x, 1)),
    "pickle": ("v", lambda x: pickle.dumps(x)),
}


def _arrays(layout: str, mesh2) -> dict[str, jax.Array]:
    f, i, v = jnp.float32(2.5) + 0, jnp.int32(1) + 0, jnp.arange(4.0, dtype=jnp.float32)
    if layout == "one device":
        return {"f": f, "i": i, "v": v}
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rep = NamedSharding(mesh2, P())
    return {
        "f": jax.device_put(f, rep),
        "i": jax.device_put(i, rep),
        "v": jax.device_put(v, NamedSharding(mesh2, P("x"))),
    }


@pytest.mark.parametrize("layout", ["one device", "2-device mesh"])
@pytest.mark.parametrize("path", list(READS))
def test_every_read_raises_inside_and_works_outside(path, layout, mesh2):
    kind, read = READS[path]
    x = _arrays(layout, mesh2)[kind]
    read(x)  # outside: works (and warms any lazy path)
    if path == "iteration" and layout == "one device":
        with jc.hot_loop():  # slices on the device: no read (see the RNG test)
            read(x)
        return
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            read(x)
    msg = str(info.value)
    assert "device-to-host read" in msg
    assert "test_guard.py:" in msg and "Fix: " in msg and "jc.fetch" in msg
    read(x)  # and works again after the loop


@pytest.mark.parametrize("key", ["uint32 key", "typed key"])
def test_rng_split_and_unpacking_a_device_array_are_clean(key, mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    k = jax.random.PRNGKey(0) if key == "uint32 key" else jax.random.key(0)
    rows = jnp.arange(8.0).reshape(4, 2)
    replicated = jax.device_put(rows, NamedSharding(mesh2, P()))

    def body(k):
        k, sub = jax.random.split(k)
        a, b, c, d = rows
        r = [row for row in replicated]
        return k, sub, a, r

    body(k)  # warm: a cold slice compiles once (and would raise in the loop)
    with jc.hot_loop():
        for _ in range(3):
            k, sub, a, r = body(k)
    assert a.shape == (2,) and len(r) == 4 and k.shape == sub.shape
    scalar = jnp.float32(1.0)
    with jc.hot_loop(), pytest.raises(TypeError, match="0-d"):
        iter(scalar)  # numpy's error, not a read
    # A sharded, not replicated array is still read on the host to iterate.
    sharded = jax.device_put(rows, NamedSharding(mesh2, P("x")))
    list(sharded)
    with pytest.raises(jc.TransferError, match="device-to-host read"):
        with jc.hot_loop():
            list(sharded)


def test_explicit_transfers_are_allowed():
    x = jnp.arange(3.0)
    with jc.hot_loop():
        host = jc.fetch({"x": x})
        also = jax.device_get(x)
        y = jax.device_put(np.ones(3, np.float32))
    assert host["x"].tolist() == [0.0, 1.0, 2.0]
    assert isinstance(also, np.ndarray) and y.shape == (3,)


def test_message_names_the_state_path_and_the_line():
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            p = advance(p)
            float(p.t)  # the planted read
    msg = str(info.value)
    assert "float() of f32[] (advance_fn -> .t)" in msg
    assert "float(p.t)  # the planted read" in msg


def test_a_read_names_the_step_that_returned_a_state_kept_in_a_list_or_dict():
    advance = jc.hot_step(advance_fn, signature=Particles)
    holders = [
        (lambda q: [q], lambda h: h[-1]),
        (lambda q: {"last": q}, lambda h: h["last"]),
        (lambda q: (0, q), lambda h: h[1]),
    ]
    for keep, last in holders:
        p = advance(make_particles())
        with pytest.raises(jc.TransferError) as info:
            with jc.hot_loop():
                history = keep(advance(p))  # only the container holds the state
                t = last(history).t
                float(t)  # the planted read
        assert "float() of f32[] (advance_fn -> .t)" in str(info.value)


def test_the_state_path_keeps_no_argument_or_output_alive_inside_a_loop():
    # The `s = step(s)` path records nothing per call (a record of the last
    # arguments and output slowed loops of small steps by ~3%): once the
    # caller drops them, the consumed state and a returned state are freed.
    import gc
    import weakref

    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with jc.hot_loop():
        consumed = weakref.ref(p)
        q = advance(p)
        del p
        returned = weakref.ref(q)
        r = advance(q)
        del q
        gc.collect()
        assert consumed() is None and returned() is None
        assert float(jc.fetch(r.t)) == pytest.approx(0.03)  # the loop still sees its state


# -- host-to-device and compiles --------------------------------------------


def test_implicit_host_to_device_transfers_raise():
    x = jnp.arange(3.0)
    for planted in (
        lambda: x + np.ones(3, np.float32),  # numpy into an eager op
        lambda: x * 2,  # a Python scalar into an eager op
    ):
        planted()  # warm: only the transfer is left to catch
        with pytest.raises(jc.TransferError, match="host-to-device") as info:
            with jc.hot_loop():
                planted()
        assert "test_guard.py:" in str(info.value)
    advance = jc.hot_step(advance_fn, signature=Particles)
    advance(make_particles())
    bad = Particles.__new__(Particles)
    bad.__dict__.update(pos=np.zeros((4, 3), np.float32), vel=jnp.zeros((4, 3)), t=jnp.float32(0), dt=0.01)
    with pytest.raises(jc.TransferError, match="on the host"):
        with jc.hot_loop():
            advance(bad)


def test_compiles_raise_naming_the_function():
    x = jnp.arange(3.0)

    def fresh(a):
        return a - 1

    with pytest.raises(jc.RecompileError, match="`fresh`") as info:
        with jc.hot_loop():
            jax.jit(fresh)(x)
    assert "test_guard.py:" in str(info.value)
    with pytest.raises(jc.RecompileError, match="`tanh`"):
        with jc.hot_loop():
            jnp.tanh(x)  # a cold eager op
    jnp.tanh(x)
    with jc.hot_loop():
        jnp.tanh(x)  # warm now: allowed


def test_hot_step_first_compile_or_new_signature_inside_the_loop():
    advance = jc.hot_step(advance_fn, signature=Particles, max_compiles=2)
    p = make_particles()
    with pytest.raises(jc.RecompileError, match="hot_step advance_fn would compile a new signature"):
        with jc.hot_loop():
            advance(p)
    assert advance.stats.compiles == 0
    p = advance(p)
    bigger = make_particles(8)
    with pytest.raises(jc.RecompileError, match="would compile a new signature"):
        with jc.hot_loop():
            advance(bigger)
    with jc.hot_loop():
        p = advance(p)


def test_reading_a_donated_array_names_the_step():
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with pytest.raises(jc.DonationError) as info:
        with jc.hot_loop():
            old = p
            p = advance(p)
            jc.fetch(p)
            print(float(old.t))
    assert "donated to" in str(info.value) and "advance_fn" in str(info.value)


# -- no false positives -------------------------------------------------------


@jc.state
class Body:
    x: Float32[Array, "n"]
    v: Float32[Array, "n"]
    dt: float = jc.static(0.1)


@jc.hot_step(signature=Body)
def drift(b: Body) -> Body:
    return Body(x=b.x + b.v * b.dt, v=b.v, dt=b.dt)


@jc.hot_step(signature=Body)
def kick(b: Body, force: Float32[Array, "n"]) -> tuple[Body, Float32[Array, ""]]:
    jax.debug.print("kick {}", b.x[0])  # must not trip the loop (jax issue 39289)
    v = b.v + force * b.dt
    return Body(x=b.x, v=v, dt=b.dt), jnp.sum(v * v)


def test_correct_loops_raise_nothing(mesh2, capsys):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    for sharding in (None, NamedSharding(mesh2, P("x"))):
        b = Body.zeros(n=8, sharding=sharding)
        force = jax.device_put(np.ones(8, np.float32), sharding or jax.devices()[0])
        b = drift(b) if sharding is None else b
        kick_step = kick if sharding is None else jc.hot_step(kick.__wrapped__, signature=Body)
        drift_step = drift if sharding is None else jc.hot_step(drift.__wrapped__, signature=Body)
        b, energy = kick_step(drift_step(b), force)  # compile before the loop
        seen = []
        with jc.hot_loop():
            for i in range(20):
                b = drift_step(b)
                b, energy = kick_step(b, force)
                if i % 10 == 0:
                    seen.append(jc.fetch(energy))
        assert b.dt == 0.1 and len(seen) == 2
        print(b, b.x, energy)  # everything prints after the loop
        assert np.isfinite(float(energy))
    assert "kick" in capsys.readouterr().out


def test_another_thread_reads_while_the_main_thread_is_in_a_loop():
    x = jnp.arange(4.0)
    started, release = threading.Event(), threading.Event()
    results = []

    def reader():
        started.wait()
        results.append((float(x[1]), np.asarray(x).sum(), repr(x)[:5], memoryview(np.asarray(x)).nbytes))
        release.set()

    t = threading.Thread(target=reader)
    t.start()
    with jc.hot_loop():
        started.set()
        assert release.wait(30)
    t.join()
    assert results == [(1.0, 6.0, "Array", 16)]


def test_two_threads_each_with_their_own_loop():
    x = jnp.arange(4.0)
    barrier = threading.Barrier(2)
    out: dict[str, object] = {}

    def raising():
        with jc.hot_loop():
            barrier.wait()
            try:
                np.asarray(x)
            except jc.TransferError:
                out["raising"] = "raised"
            barrier.wait()

    def recording():
        with jc.hot_loop(on_violation="record") as loop:
            barrier.wait()
            for _ in range(2):
                repr(x)
            barrier.wait()
        out["recording"] = [(v.kind, v.count) for v in loop.violations]

    threads = [threading.Thread(target=raising), threading.Thread(target=recording)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {"raising": "raised", "recording": [("transfer", 2)]}


# -- record mode ----------------------------------------------------------------


def test_record_mode_collects_deduplicated_violations():
    x = jnp.arange(3.0)
    s = jnp.float32(1.0)
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(5):
            float(s)
            np.asarray(x)
        jax.jit(lambda a: a + 1)(x)
    kinds = sorted((v.kind, v.count) for v in loop.violations)
    assert kinds == [("compile", 1), ("transfer", 5), ("transfer", 5)]
    assert all("test_guard.py:" in v.where for v in loop.violations)
    report = str(loop.report())
    assert "violations: 3 | events: 11" in report and "float() of f32[]" in report
    assert not loop.report().ok
    with jc.hot_loop(on_violation="record") as clean:
        pass
    assert clean.violations == [] and clean.report().ok


# -- restoration, nesting, options ---------------------------------------------


def _pristine() -> bool:
    """No interceptor left on the array class."""
    impl = type(jnp.zeros(()))
    patches = _guard._patches
    if patches is None:
        return True
    from jax._src import monitoring

    listening = _guard._on_monitoring_event in getattr(monitoring, "_scalar_listeners", [])
    return (
        not listening
        and patches.depth == 0
        and "_value" in patches.originals
        and all(impl.__dict__[n] is f for n, f in patches.originals.items())
    )


@pytest.mark.parametrize("exc", [ValueError("boom"), KeyboardInterrupt()])
def test_everything_is_restored_after_an_exception(exc):
    x = jnp.arange(3.0)
    with pytest.raises(type(exc)):
        with jc.hot_loop():
            raise exc
    assert _pristine() and _guard.tracking.count == 0
    assert float(x[1]) == 1.0 and np.asarray(x).tolist() == [0.0, 1.0, 2.0]
    assert memoryview(np.asarray(x)).nbytes == 12
    assert _guard.local.loop is None


def test_nesting_and_restoration():
    x = jnp.float32(3.0)
    with jc.hot_loop(on_violation="record") as outer:
        with jc.hot_loop():
            with pytest.raises(jc.TransferError):
                float(x)
        float(x)  # back in the outer, recording loop
        assert _guard._patches.depth == 1
    assert [v.count for v in outer.violations] == [1]
    assert _pristine() and float(x) == 3.0


def _nothing_left_guarded(x) -> None:
    """After every loop ended: reads, host-to-device transfers, no active loop."""
    assert float(x) == 3.0
    assert jnp.add(x, np.ones(2, np.float32)).tolist() == [4.0, 4.0]  # JAX's own guard off
    assert _guard.local.loop is None and _guard.tracking.count == 0 and _pristine()
    assert all(e.ended for e in _guard.local.stack.entries)  # none live


def _looping_generator(x):
    with jc.hot_loop():
        while True:
            yield x


def test_generators_closed_in_creation_order_leave_nothing_guarded():
    x = jnp.float32(3.0)
    first, second = _looping_generator(x), _looping_generator(x)
    next(first)
    next(second)
    first.close()  # out of order: the first loop entered ends first
    with pytest.raises(jc.TransferError):
        float(x)  # the second loop is still active on this thread
    second.close()
    _nothing_left_guarded(x)


def test_asyncio_tasks_ending_out_of_order_leave_nothing_guarded():
    import asyncio

    x = jnp.float32(3.0)

    async def task(entered: asyncio.Event, release: asyncio.Event) -> None:
        with jc.hot_loop():
            entered.set()
            await release.wait()

    async def main() -> None:
        e1, r1, e2, r2 = (asyncio.Event() for _ in range(4))
        t1 = asyncio.create_task(task(e1, r1))
        await e1.wait()
        t2 = asyncio.create_task(task(e2, r2))
        await e2.wait()
        r1.set()  # the first task's loop ends first
        await t1
        r2.set()
        await t2

    asyncio.run(main())
    _nothing_left_guarded(x)


def test_generator_closed_on_another_thread_leaves_nothing_guarded():
    x = jnp.float32(3.0)
    gen = _looping_generator(x)
    next(gen)  # the loop is entered on this thread
    closer = threading.Thread(target=gen.close)
    closer.start()
    closer.join(30)
    _nothing_left_guarded(x)
    with jc.hot_loop():  # the next loop on this thread unwinds JAX's contexts
        with pytest.raises(jc.TransferError):
            float(x)
    _nothing_left_guarded(x)
    assert not _guard.local.stack.entries
    with jax.transfer_guard_host_to_device("allow"):  # restores what it saw: none
        pass
    _nothing_left_guarded(x)


def test_checks_off_leaves_only_jax_native_guards():
    from jax._src import monitoring

    from jaxcontracts._compat import arrays

    x = jnp.float32(3.0)
    impl = type(x)
    originals = arrays.read_methods()
    jc.set_checks("off")
    with jc.hot_loop():
        assert float(x) == 3.0 and repr(x).startswith("Array") and np.asarray(x) == 3.0
        assert all(impl.__dict__[n] is f for n, f in originals.items())  # no patching
        assert _guard._on_monitoring_event not in getattr(monitoring, "_scalar_listeners", [])
        jax.jit(lambda a: a * 5)(x)  # a compile: not intercepted
        assert _guard.local.loop is None and _guard.tracking.count == 0
    with pytest.raises(jc.TransferError, match="host-to-device"):
        with jc.hot_loop():
            jnp.add(x, np.ones(2, np.float32))  # JAX's own guard is still on
    jc.set_checks("full")
    _nothing_left_guarded(x)


def test_options_are_validated_and_can_allow():
    with pytest.raises(jc.DefinitionError, match="valid values are 'raise', 'record'"):
        jc.hot_loop(on_violation="ignore")
    x = jnp.float32(2.0)
    with jc.hot_loop(transfers="allow"):
        assert float(x) == 2.0
    with jc.hot_loop(compiles="allow"):
        jax.jit(lambda a: a * 3)(x)


def test_decorator_form():
    x = jnp.float32(2.0)

    @jc.hot_loop()
    def bad():
        return float(x)

    with pytest.raises(jc.TransferError):
        bad()
    assert float(x) == 2.0


def test_decorated_generator_runs_every_resumption_inside_the_loop():
    x = jnp.float32(2.0)

    @jc.hot_loop()
    def reads(n):
        for _ in range(n):
            got = yield jc.fetch(x)
            if got == "read":
                float(x)
        return "done"

    gen = reads(3)
    assert _guard.local.loop is None  # nothing runs, nothing is guarded, until next()
    assert next(gen) == 2.0
    assert _guard.local.loop is None and float(x) == 2.0  # the caller is not guarded
    assert gen.send(None) == 2.0
    with pytest.raises(jc.TransferError, match="float\\(\\) of f32"):
        gen.send("read")  # the body's read raises inside the loop
    assert list(reads(2)) == [2.0, 2.0]
    closed = reads(5)
    next(closed)
    closed.close()
    _nothing_left_guarded(jnp.float32(3.0))


def test_decorated_coroutine_runs_every_step_inside_the_loop():
    import asyncio

    x = jnp.float32(2.0)
    seen = []

    @jc.hot_loop()
    async def reads():
        seen.append(_guard.local.loop is not None)
        await asyncio.sleep(0)
        seen.append(_guard.local.loop is not None)
        return float(x)

    async def other():
        seen.append(("other", _guard.local.loop is None))

    async def main():
        return await asyncio.gather(reads(), other(), return_exceptions=True)

    result, _ = asyncio.run(main())
    assert isinstance(result, jc.TransferError) and "float() of f32" in str(result)
    assert seen == [True, ("other", True), True]
    _nothing_left_guarded(jnp.float32(3.0))


def test_decorated_async_generator_is_refused():
    with pytest.raises(jc.DefinitionError, match="(?s)async generator function .*Fix: decorate the"):

        @jc.hot_loop()
        async def agen():
            yield 1


def test_fetch_copies_so_a_kept_result_never_pins_a_donated_buffer():
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    with jc.hot_loop():
        kept = jc.fetch(p.pos)  # kept across the next step
        p = advance(p)  # at checks level full, a pinned buffer would raise here
    assert kept.flags.owndata and kept.shape == (4, 3)
    with pytest.raises(jc.DonationError, match="was donated to advance_fn"):
        with jc.hot_loop():
            old = p
            p = advance(p)
            jc.fetch(old.t)


def test_stale_state_is_explained_without_an_xla_error_line(capfd):
    advance = jc.hot_step(advance_fn, signature=Particles)
    p = advance(make_particles())
    q = advance(p)  # p is now stale
    capfd.readouterr()
    with pytest.raises(jc.DonationError, match="already"):
        advance(p)
    assert "ExecutePrepare" not in capfd.readouterr().err
    assert q.pos.shape == (4, 3)


def test_recorded_violations_carry_the_source_line_and_the_fix():
    x = jnp.float32(1.0)
    with jc.hot_loop(on_violation="record") as loop:
        float(x)  # the recorded line
    (v,) = loop.violations
    assert v.source == "float(x)  # the recorded line"
    assert v.fix.startswith("read it deliberately and rarely with jc.fetch(x)")


@jc.state
class _One:
    x: Float32[Array, "n"]


@jc.hot_step(signature=_One, donate="all")
def _bump(s: _One) -> _One:
    return _One(x=s.x + 1)


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_token_state_deleted_by_plain_jax_is_explained_without_an_xla_error_line(capfd, level):
    """A state a hot step returned keeps its class and token when a plain
    ``jax.jit(donate_argnums=0)`` consumes it; the provenance path still looks
    at its first buffer before calling, so XLA prints nothing."""
    with jc.checks_level(level):
        s = _bump(_bump(_One(x=jnp.zeros(3))))  # a warm call's output: the provenance path
        t = jax.jit(lambda s: s, donate_argnums=0)(s)  # its buffer passes to t
        assert type(s) is _One  # not marked: no hot step consumed it
        capfd.readouterr()
        with pytest.raises(jc.DonationError, match="already deleted"):
            _bump(s)
        assert "ExecutePrepare" not in capfd.readouterr().err
        assert _bump(t).x.tolist() == [3.0] * 3


@pytest.mark.parametrize("level", ["off", "fast", "full"])
def test_a_token_state_by_keyword_or_with_wrong_arguments_takes_the_checked_path(level):
    with jc.checks_level(level):
        s = _bump(_bump(_One(x=jnp.zeros(3))))
        s = _bump(s=s)  # by keyword: bound to its position, same result
        # jc.fetch, not .tolist(): jaxlib 0.11.2 pins a CPU buffer after a plain read
        assert jc.fetch(s.x).tolist() == [3.0] * 3
        with pytest.raises(TypeError, match="missing a required argument: 's'"):
            _bump()
        with pytest.raises(TypeError, match="too many positional arguments"):
            _bump(s, s)
        assert _bump(s).x.tolist() == [4.0] * 3  # refused calls consumed nothing
