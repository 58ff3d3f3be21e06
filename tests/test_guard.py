"""jc.hot_loop's lifecycle: entries and exits, nesting, threads, generators and
coroutines, JAX's native guards, and the loop's options.

However a loop ends (normally, by an exception, a generator closed out of
order or on another thread, a task finishing first), nothing stays guarded:
the read interceptors are off the array class, the compile listener is gone
and JAX's own transfer guards are as they were. What a loop catches is tested
by feature: reads in test_reads.py, compiles in test_compiles.py, JAX's runtime
errors in test_runtime_errors.py, record mode in test_record_mode.py and
jc.fetch in test_fetch.py.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import _warm_then_loop

import jaxcontracts as jc
from jaxcontracts import _runtime
from jaxcontracts._loop import intercept as _intercept

# -- restoration, nesting, options --------------------------------------------


def _pristine() -> bool:
    """No interceptor left on the array class."""
    impl = type(jnp.zeros(()))
    patches = _intercept._patches
    if patches is None:
        return True
    from jax._src import monitoring

    listening = _intercept.on_monitoring_event in getattr(monitoring, "_scalar_listeners", [])
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
    assert _pristine() and _runtime.tracking.count == 0
    assert float(x[1]) == 1.0 and np.asarray(x).tolist() == [0.0, 1.0, 2.0]
    assert memoryview(np.asarray(x)).nbytes == 12
    assert _runtime.local.loop is None


def test_nesting_and_restoration():
    x = jnp.float32(3.0)
    with jc.hot_loop(on_violation="record") as outer:
        with pytest.raises(jc.TransferError), jc.hot_loop(on_violation="raise"):  # set: not inherited
            float(x)
        float(x)  # back in the outer, recording loop
        assert _intercept._patches.depth == 1
    assert [v.count for v in outer.violations] == [1]
    assert _pristine() and float(x) == 3.0


def _nothing_left_guarded(x) -> None:
    """After every loop ended: reads, host-to-device transfers, no active loop."""
    assert float(x) == 3.0
    assert jnp.add(x, np.ones(2, np.float32)).tolist() == [4.0, 4.0]  # JAX's own guard off
    assert _runtime.local.loop is None and _runtime.tracking.count == 0 and _pristine()
    assert all(e.ended for e in _runtime.local.stack.entries)  # none live


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
    # It left this thread a stale entry, JAX's guard at disallow in its config
    # (any later jax.transfer_guard block brought the refusal back, outside
    # every loop) and the library's SIGINT handler installed.
    import signal

    x = jnp.float32(3.0)
    handler = signal.getsignal(signal.SIGINT)
    config = jax.config.jax_transfer_guard_host_to_device
    gen = _looping_generator(x)
    next(gen)  # the loop is entered on this thread
    with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed host-to-device"):
        jnp.add(x, np.ones(2, np.float32))  # inside it (though not raised out of it): JAX's own guard refuses
    closer = threading.Thread(target=gen.close)
    closer.start()
    closer.join(30)
    assert not _runtime.local.stack.entries  # no stale entry
    assert signal.getsignal(signal.SIGINT) is handler
    assert jax.config.jax_transfer_guard_host_to_device == config
    with jax.transfer_guard("allow"):  # restores what it saw: the thread's own level
        pass
    _nothing_left_guarded(x)
    with pytest.raises(jc.TransferError), jc.hot_loop():  # and loops work as before
        float(x)
    _nothing_left_guarded(x)


def test_a_generator_suspended_in_a_loop_at_interpreter_exit_prints_nothing():
    """Issue 20: closing it while modules were torn down printed "TypeError:
    'NoneType' object does not support the context manager protocol" from
    __exit__ (a module global already None)."""
    import subprocess
    import sys

    code = (
        "import jax.numpy as jnp, jaxcontracts as jc\n"
        "def gen():\n"
        "    with jc.hot_loop():\n"
        "        yield 1\n"
        "x = jnp.zeros(3)\n"
        "g = gen(); next(g)\n"  # suspended inside its loop until the interpreter exits
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr and "Error" not in proc.stderr, proc.stderr


def test_checks_off_leaves_only_jax_native_guards():
    from jax._src import monitoring

    from jaxcontracts._compat import arrays

    x = jnp.float32(3.0)
    impl = type(x)
    originals = arrays.read_methods()
    jc.set_checks("off")
    with jc.hot_loop():
        if jax.default_backend() == "cpu":  # JAX's device-to-host guard never fires on CPU
            assert float(x) == 3.0 and repr(x).startswith("Array") and np.asarray(x) == 3.0
        else:  # on an accelerator it does: that is all that checks the reads at off
            with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed device-to-host"):
                float(x)
        assert all(impl.__dict__[n] is f for n, f in originals.items())  # no patching
        assert _intercept.on_monitoring_event not in getattr(monitoring, "_scalar_listeners", [])
        jax.jit(lambda a: a * 5)(x)  # a compile: not intercepted
        assert _runtime.local.loop is None and _runtime.tracking.count == 0
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


# -- transfers="allow_host_to_device": JAX's host-to-device guard off, reads refused ---


def test_transfers_allow_host_to_device_lets_constants_through_but_not_reads():
    x, idx, flag = jnp.arange(10.0), jnp.array([1, 2, 3]), jnp.int32(5)

    def glue():
        return flag & 1, x * 0.5, x[idx]

    _warm_then_loop(glue, transfers="allow_host_to_device")
    with pytest.raises(jc.TransferError, match="device-to-host read: float"):
        with jc.hot_loop(transfers="allow_host_to_device"):
            float(flag)


def test_allow_host_to_device_does_not_let_host_arguments_into_a_hot_step():
    @jc.hot_step(signature=dict)
    def step(d: dict) -> dict:
        return {"x": d["x"] + 1}

    d = step({"x": jnp.zeros(3)})
    with pytest.raises(jc.TransferError, match="on the host"):
        with jc.hot_loop(transfers="allow_host_to_device"):
            step({"x": np.zeros(3, np.float32)})
    assert not d["x"].is_deleted()


def test_allow_host_to_device_nests_inside_a_refusing_loop():
    flag = jnp.int32(5)
    flag & 1
    with pytest.raises(jc.TransferError, match="a Python constant"), jc.hot_loop():
        with jc.hot_loop(transfers="allow_host_to_device"):
            flag & 1
        flag & 1  # the outer loop refuses it again


def test_transfers_option_lists_valid_values():
    with pytest.raises(jc.DefinitionError, match="'disallow', 'allow_host_to_device', 'allow'"):
        jc.hot_loop(transfers="host")  # type: ignore[arg-type]


# -- threads ------------------------------------------------------------------


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
        try:
            with jc.hot_loop():
                barrier.wait()
                try:
                    np.asarray(x)
                except jc.TransferError:
                    out["raising"] = "raised"
                barrier.wait()
        except jc.TransferError:  # caught inside, it fails the loop at its exit
            out["exit"] = "raised again"

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
    assert out == {"raising": "raised", "exit": "raised again", "recording": [("transfer", 2)]}


# -- the decorator form: functions, generators, coroutines --------------------


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
    assert _runtime.local.loop is None  # nothing runs, nothing is guarded, until next()
    assert next(gen) == 2.0
    assert _runtime.local.loop is None and float(x) == 2.0  # the caller is not guarded
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
        seen.append(_runtime.local.loop is not None)
        await asyncio.sleep(0)
        seen.append(_runtime.local.loop is not None)
        return float(x)

    async def other():
        seen.append(("other", _runtime.local.loop is None))

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


def test_a_concrete_flag_read_while_a_warm_up_compile_traces_is_part_of_the_compile():
    # jax-md's neighbor list: `if _always_rebuild:` on a device bool made once, read at trace time.
    flag = jnp.float32(0.5) == 0

    def step(x):
        return x if flag else x + 1

    for make in (functools.partial(jax.jit, donate_argnums=0), lambda f: jc.hot_step(f, state="x")):
        f, x = make(step), jnp.zeros(3)
        with jc.hot_loop(compiles="warmup") as loop:
            for _ in loop.iterate(range(3)):
                x = f(x)
        assert jc.fetch(x).tolist() == [3.0, 3.0, 3.0]
    g, z = jc.hot_step(step, state="x"), jnp.zeros(3)
    with pytest.raises(jc.RecompileError, match="would compile a new signature"):
        with jc.hot_loop():  # no warm-up: the compile is refused, before its trace reads
            g(z)
    with pytest.raises(jc.TransferError, match=r"device-to-host read: bool\(\)"):
        with jc.hot_loop():  # a read outside any trace is still a read
            bool(flag)


def _flag_reader(flag, seen=None):
    """A fresh jax.jit whose trace reads a device flag made once (jax-md, diffrax)."""

    @jax.jit
    def late(x):
        if seen is not None:  # JAX's own device-to-host guard, as the trace sees it
            seen.append(jax.config.jax_transfer_guard_device_to_host)
        return x if flag else x + 1

    return late


@pytest.mark.parametrize("level", ["fast", "full"])
def test_a_jit_first_traced_after_the_warm_up_is_refused_as_a_compile_not_as_its_flag_read(level):
    # issue 39 N6: its trace ran, and the `if flag:` in it was the TransferError (a symptom)
    flag, x = jnp.float32(0.5) == 0, jnp.zeros(3)
    with jc.checks_level(level):
        late = _flag_reader(flag)
        with pytest.raises(jc.RecompileError) as e:  # noqa: PT012
            with jc.hot_loop(compiles="warmup") as loop:
                for i in loop.iterate(range(3)):
                    if i == 1:
                        late(x)
        text = str(e.value)
        assert "compile inside jc.hot_loop: jax compiles `late` after the warm-up" in text, text
        assert "in iteration 1 of loop.iterate()" in text and "late(x)" in text
        assert "if flag" not in text  # the call's line, not the read's
        with pytest.raises(jc.RecompileError, match="jax compiles `late`"):  # noqa: PT012
            with jc.hot_loop():  # no warm-up: refused before its trace as well
                late = _flag_reader(flag)
                late(x)
        for compiles in ("warmup", "disallow"):  # record mode traces on: the compile is recorded
            late = _flag_reader(flag)
            with jc.hot_loop(compiles=compiles, on_violation="record") as loop:
                for i in loop.iterate(range(2)):
                    if i == 1:
                        late(x)
            found = [(v.kind, v.iteration) for v in loop.violations]
            assert found == [("compile", 1)], loop.violations
            assert "`late`" in loop.violations[0].what


@pytest.mark.parametrize(("level", "first"), [("fast", 0), ("full", 0), ("off", 1)])
def test_a_compile_the_loop_lets_through_traces_with_jaxs_own_read_guard_lifted(level, first):
    # Off CPU a loop sets JAX's device-to-host guard to disallow, and the flag read of a
    # plain jax.jit's trace was JAX's TransferError there (seen on a TPU v5e): in the
    # warm-up pass, and in any pass at level off, which checks no compile. A hot step's
    # compile lifts it (_runtime.compiling); a plain jit's trace now too. On CPU JAX's
    # guard never fires: what the trace sees of it is the test.
    flag, x, seen = jnp.float32(0.5) == 0, jnp.zeros(3), []
    late = _flag_reader(flag, seen)
    with jc.checks_level(level), jax.transfer_guard_device_to_host("disallow"):  # as off CPU
        with jc.hot_loop(compiles="warmup") as loop:
            for i in loop.iterate(range(3)):
                if i == first:
                    y = late(x)
    assert seen == ["allow"] and loop.violations == []
    assert jc.fetch(y).tolist() == [1.0, 1.0, 1.0]


def test_a_nested_allow_loop_lifts_the_outer_loops_native_guard_and_restores_it():
    x = jnp.arange(3.0)
    x * 2.0  # warm
    with pytest.raises(jc.TransferError, match="host-to-device, a Python constant") as e:
        with jc.hot_loop():
            with jc.hot_loop(transfers="allow", compiles="allow"):
                x * 2.0  # a Python constant: a host-to-device copy, allowed here
                jnp.asarray(np.ones(3, np.float32))
            x * 2.0  # the outer loop refuses it again
    assert "x * 2.0  # the outer loop refuses it again" in str(e.value)


def test_a_nested_loop_takes_the_options_it_does_not_set_from_the_loop_it_is_in():
    # issue 38 item 6: a metric helper compiled first in a nested
    # transfers="allow" block inside a warm-up loop was a RecompileError
    x = jnp.ones(3)
    inner = jc.hot_loop(transfers="allow")
    with jc.hot_loop(compiles="warmup", on_violation="record") as outer:
        for i in outer.iterate(range(3)):
            if i == 2:
                with inner:
                    assert float(jax.jit(lambda a: a.sum() * 3)(x)) == 9.0  # a first compile: warm-up
    assert inner.options == {"transfers": "allow", "compiles": "warmup", "callbacks": "allow", "on_violation": "record"}
    assert outer.violations == [] and [c.what for c in inner.warmup_compiles] == ["<lambda>"]
    with inner:  # in no loop: the defaults for what it does not set
        assert inner.options == {"transfers": "allow", "compiles": "disallow", "callbacks": "allow", "on_violation": "raise"}
    with jc.hot_loop(compiles="warmup"):
        with jc.hot_loop(compiles="disallow") as strict:  # what a loop sets, it keeps
            assert strict.options["compiles"] == "disallow"


def test_a_violation_swallowed_by_a_logging_call_fails_the_loop_at_its_exit(capsys):
    # logging catches what a handler raises (it prints "--- Logging error ---"
    # and goes on): the read must not be lost for it (issues 38 item 4, 39)
    import logging

    logger = logging.getLogger("jc-test-swallowed")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # pytest's own capture handler re-raises what a handler raises
    x = jnp.float32(3.0)
    ran = 0
    try:
        with pytest.raises(jc.TransferError) as info, jc.hot_loop():
            for _ in range(3):
                logger.info("loss %s", x)  # str() of the array, inside logging
                ran += 1
    finally:
        logger.removeHandler(handler)
    assert ran == 3  # logging went on, as it does
    err = info.value
    assert "str() / print() of f32[]" in str(err) and "logger.info(" in str(err)  # the user's line
    assert "caught it" in "".join(err.__notes__)
    assert "--- Logging error ---" in capsys.readouterr().err
    with jc.hot_loop(on_violation="record") as loop:  # recorded, reported: not lost either
        logging.getLogger("jc-test-swallowed").warning("loss %s", x)
    assert [v.kind for v in loop.violations] == ["transfer"]


def test_a_violation_the_user_catches_outside_the_inner_loop_that_raised_it_is_theirs():
    # Decided (issue 50): a violation caught inside the loop that raised it is
    # raised again as that loop ends (the logging case above); once it has
    # left that loop's `with`, an `except` the user wrote decides, as for any
    # exception, and an outer loop does not raise it again.
    x = jnp.float32(3.0)
    caught = []
    with jc.hot_loop() as outer:
        for _ in range(2):
            try:
                with jc.hot_loop():
                    float(x)
            except jc.TransferError as err:  # on purpose, around the inner loop
                caught.append(err)
    assert len(caught) == 2 and outer.violations == []
    with pytest.raises(jc.TransferError, match="caught it"), jc.hot_loop():  # inside the raising loop: raised again
        try:
            float(x)
        except jc.TransferError:
            pass


def test_warm_up_counts_nested_iterates_and_forgets_an_abandoned_one():
    # issue 39: a first compile in epoch 1, after the inner loop, ran; an
    # abandoned iterate made a re-entered loop refuse "in iteration 4"
    x = jnp.ones(3)
    inc, scale = jax.jit(lambda a: a + 1, donate_argnums=0), jax.jit(lambda a: a * 7)
    with pytest.raises(jc.RecompileError, match=r"in iteration 1 of loop\.iterate\(\)"):
        with jc.hot_loop(compiles="warmup") as loop:
            for epoch in loop.iterate(range(2)):
                for _ in loop.iterate(range(3)):
                    x = inc(x)
                if epoch == 1:
                    scale(x)  # a first compile, in the second epoch
    loop = jc.hot_loop(compiles="warmup")
    with loop:
        for i in loop.iterate(range(10)):
            if i == 4:
                break  # the generator is abandoned, not closed
    with loop:  # entered again, no iterate: a first pass
        jax.jit(lambda a: a - 3)(x)
    assert [c.what for c in loop.warmup_compiles] == ["<lambda>"]


def test_warm_up_tells_steps_of_one_name_apart():
    # two instances' method steps, two lambdas from one factory: one name each
    class Agent:
        def __init__(self, k):
            self.k = k

        @jc.hot_step(state="s")
        def act(self, s):
            return {"x": s["x"] * self.k}

    def factory(c):
        return jc.hot_step(lambda s: {"x": s["x"] + c}, state="s")

    a, b, f, g = Agent(2.0), Agent(3.0), factory(1.0), factory(2.0)
    s = {"x": jnp.ones(3)}
    with jc.hot_loop(compiles="warmup") as loop:
        for _ in loop.iterate(range(2)):
            s = g(f(b.act(a.act(s))))
    assert s["x"].tolist() == [57.0] * 3 and len(loop.warmup_compiles) == 4


@pytest.mark.parametrize("iterate", [False, True])
def test_a_trace_that_fails_in_the_warm_up_spends_no_compile(iterate):
    # the first call's trace raises (a shape error, caught and retried on the
    # right batch, as jax.jit lets it): nothing compiled, so the retry is still
    # the step's first compile of the warm-up
    step = jc.hot_step(lambda s, b: {"x": s["x"] + b[:3]}, state="s")
    s, short, right = {"x": jnp.zeros(3)}, jnp.ones(2), jnp.ones(4)
    with jc.hot_loop(compiles="warmup") as loop:
        for i in loop.iterate(range(2)) if iterate else range(1):
            if i == 0:
                with pytest.raises(TypeError, match="incompatible shapes"):
                    step(s, short)
            s = step(s, right)
    assert s["x"].tolist() == ([2.0] * 3 if iterate else [1.0] * 3)
    assert len(loop.warmup_compiles) == 1


def test_a_trace_alone_in_a_loop_is_refused_naming_what_traces_again():
    # jax.eval_shape traces at every call (no cache): in a raising loop that is
    # refused at its trace, as a compile's trace is, and the words say both
    x = jnp.ones(3) + 0
    jax.eval_shape(lambda a: a * 2, x)
    with pytest.raises(jc.RecompileError, match=r"jax compiles `<lambda>`.*or it only traces it.*jax\.eval_shape"):
        with jc.hot_loop():
            jax.eval_shape(lambda a: a * 2, x)


def test_a_recording_loop_records_what_a_raising_loop_refuses_each_compile_once():
    # A recording loop recorded compiles at their lowering: a trace alone
    # (eval_shape, make_jaxpr) never lowers, and went unrecorded while a
    # raising loop refused it; a compile that traces and lowers is one record.
    x = jnp.ones(3) + 0
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(3):
            jax.eval_shape(lambda a: a * 2, x)  # the trace-only line
            jax.make_jaxpr(lambda a: a * 3)(x)
        jax.jit(lambda a: a * 4)(x)  # the compiled line
        jnp.cos(x)  # a cold eager op
    recorded = [(v.kind, v.count, v.source.split("  # ")[-1]) for v in loop.violations]
    assert recorded == [
        ("compile", 3, "the trace-only line"),
        ("compile", 3, "jax.make_jaxpr(lambda a: a * 3)(x)"),
        ("compile", 1, "the compiled line"),
        ("compile", 1, "a cold eager op"),
    ], recorded
    assert "or it only traces it" in loop.violations[0].what
