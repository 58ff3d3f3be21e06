"""Where a hot loop's time goes: ``loop.timing`` and the report's timing section."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float32, Int32

import jaxcontracts as jc
from jaxcontracts._report import timing as _timing


class Clock(jc.State):
    x: Float32[Array, "n"]
    t: Int32[Array, ""]


def make_step(name: str = "tick"):
    def tick(s: Clock) -> Clock:
        return s.replace(x=s.x * 0.5 + 1.0, t=s.t + 1)

    tick.__name__ = tick.__qualname__ = name
    return jc.hot_step(tick)


@pytest.fixture
def tick():
    step = make_step()
    step.compile(Clock.spec(n=8))
    return step


def fresh(n: int = 8) -> Clock:
    return Clock.zeros(n=n)


def test_a_loop_counts_step_calls_host_time_and_fetch_waits(tick):
    s = fresh()
    with jc.hot_loop() as loop:
        for _ in range(100):
            s = tick(s)
        t = jc.fetch(s.t)
    assert int(t) == 100
    timing = loop.timing
    assert timing.calls == 100 and timing.wall_seconds > 0
    (step,) = timing.steps
    assert step.name.endswith("tick") and step.calls == 100
    # the first FIRST (64), then one in SAMPLE (64) by stats.calls: 64 and the call after the 64th
    assert step.timed_calls == _timing.FIRST + len(range(_timing.FIRST, 100, _timing.SAMPLE))
    assert 0 < step.host_seconds <= timing.wall_seconds
    assert step.host_us_per_call == pytest.approx(step.host_seconds / 100 * 1e6)
    assert set(timing.blocked) == {"jc.fetch"} and timing.blocked["jc.fetch"] > 0
    assert timing.steps_per_second == pytest.approx(100 / timing.wall_seconds)
    assert timing.outputs_at_exit == 2
    # Which verdict depends on the machine (a loaded one stretches the gaps
    # between calls: the loop's own code), not on this loop: it follows its figures.
    blocked = sum(timing.blocked.values())
    user_share = (timing.wall_seconds - step.host_seconds - blocked) / timing.wall_seconds
    if timing.pending_at_exit or blocked / timing.wall_seconds >= _timing.DEVICE_BOUND_SHARE:
        assert timing.verdict == "device-bound"
    elif user_share >= _timing.USER_BOUND_SHARE:
        assert timing.verdict == "user-code-bound"
    else:
        assert timing.verdict in ("dispatch-bound", "mixed")


def test_both_spellings_of_block_until_ready_are_counted_once_and_restored(tick):
    function, method = jax.block_until_ready, type(jnp.zeros(1)).__dict__["block_until_ready"]
    s = fresh()
    with jc.hot_loop() as loop:
        s = tick(s)
        jax.block_until_ready(s)  # several arrays: jax waits on them in one call
        s = tick(s)
        s.x.block_until_ready()
    assert loop.timing.blocked["block_until_ready"] > 0
    assert jax.block_until_ready is function
    assert type(jnp.zeros(1)).__dict__["block_until_ready"] is method
    counted = []
    _timing.blocking.install(lambda where, seconds, value: counted.append(where))
    try:
        jax.block_until_ready({"a": jnp.zeros(2), "b": jnp.ones(2)})
        jax.block_until_ready(jnp.zeros(2))  # one array: jax calls the method
        jnp.zeros(2).block_until_ready()
    finally:
        _timing.blocking.uninstall()
    assert counted == ["block_until_ready"] * 3


def test_the_call_slot_is_one_call_path_and_the_clock_is_read_only_inside_loops(tick):
    """No class-level switch and no wrapper: a step's call slot is its one
    call path inside and outside loops; the checked closures read the clock
    only while a timing loop is active (``_steps.timing_on``)."""
    from jaxcontracts import _steps

    s = tick(fresh())
    other = make_step("other")
    other.compile(Clock.spec(n=8))
    m = fresh()
    assert tick.__call__ is tick._call and not _steps.timing_on[0]
    assert tick.timing_counters[1] == 0  # the call outside loops was not timed
    with jc.hot_loop() as loop:
        assert tick.__call__ is tick._call and _steps.timing_on[0]
        s = tick(s)
        m = other(m)
        m = other(m)
    assert not _steps.timing_on[0]
    assert {t.name.rsplit(".", 1)[-1]: t.timed_calls for t in loop.timing.steps} == {"tick": 1, "other": 2}
    assert all(t.host_seconds > 0 for t in loop.timing.steps)


def test_past_the_first_calls_one_in_sample_is_timed(tick):
    """A step's first FIRST calls inside loops are timed; then the tail marks
    the call after every SAMPLE-th call (by stats.calls) due, so a long loop
    reads the clock for one call in SAMPLE."""
    s = tick(fresh())  # one call before the loop: stats.calls == 1
    n = _timing.FIRST + 10 * _timing.SAMPLE
    with jc.hot_loop() as loop:
        for _ in range(n):
            s = tick(s)
    seconds, timed, first_seconds, first_timed = tick.timing_counters
    assert first_timed == _timing.FIRST and 0 < first_seconds < seconds
    assert tick.stats.calls == n + 1 and loop.timing.calls == n
    # The first FIRST; then the call after each multiple of SAMPLE in
    # stats.calls past them (128, 192, ..., 704).
    assert timed == _timing.FIRST + 10
    assert not tick.timing_due[0]  # after the loop: the next call is not due
    assert seconds > 0 and loop.timing.steps[0].calls == n


def test_a_refused_call_is_not_counted(tick):
    s = tick(fresh())
    with jc.hot_loop(on_violation="record") as loop:
        s = tick(s)
        with pytest.raises(jc.RecompileError):
            tick(fresh(n=9))  # a new signature: refused (max_compiles=1)
    assert loop.timing.calls == 1


def test_nested_loops_each_count_what_ran_inside_them(tick):
    s = fresh()
    with jc.hot_loop() as outer:
        s = tick(s)
        with jc.hot_loop() as inner:
            s = tick(s)
            s = tick(s)
        s = tick(s)
    assert inner.timing.calls == 2 and outer.timing.calls == 4


def test_checks_level_off_times_nothing(tick):
    s = tick(fresh())
    jc.set_checks("off")
    try:
        with jc.hot_loop() as loop:
            assert tick._call is tick._call
            s = tick(s)
    finally:
        jc.set_checks("full")
    assert loop.timing.calls == 0 and loop.timing.verdict == "no steps"
    assert "timing:" not in str(loop.report())


def test_the_report_has_a_timing_section_in_text_and_html(tick):
    s = fresh()
    with jc.hot_loop() as loop:
        for _ in range(5):
            s = tick(s)
        jax.block_until_ready(s)
    report = loop.report()
    assert report.timing is not None and report.timing.calls == 5
    text = str(report)
    assert "timing: 5 step calls" in text and "us host/call" in text and "verdict:" in text
    assert 'class="jc-timing"' in report._repr_html_()


def test_errors_of_a_timed_call_pass_unchanged(tick):
    s = tick(fresh())
    with jc.hot_loop():
        s2 = tick(s)
        with pytest.raises(jc.DonationError):
            tick(s)  # s was donated to the previous call
    assert int(jc.fetch(s2.t)) == 2


@pytest.mark.parametrize(
    ("wall", "calls", "blocked", "pending", "host", "verdict"),
    [
        (1.0, 10, 0.01, 0, 0.5, "dispatch-bound"),
        (1.0, 10, 0.01, 2, 0.5, "device-bound"),  # work still queued at exit
        (1.0, 10, 0.5, 0, 0.4, "device-bound"),
        (1.0, 10, 0.1, 0, 0.5, "mixed"),
        (1.0, 0, 0.0, 0, 0.0, "no steps"),
        # notebook 02's first run: 99% of the loop was the user's own code
        (1.0, 10, 0.001, 0, 0.009, "user-code-bound"),
        (1.0, 10, 0.3, 0, 0.0, "device-bound"),  # waiting on the device is never the user's code
    ],
)
def test_the_verdict_follows_the_shares(wall, calls, blocked, pending, host, verdict):
    assert _timing._verdict(wall, calls, blocked, pending, host) == verdict
    timing = jc.LoopTiming(
        wall_seconds=wall,
        steps=(jc.StepTiming("m.step", calls, host, calls),),
        blocked={"jc.fetch": blocked},
        pending_at_exit=pending,
        outputs_at_exit=2,
        verdict=verdict,
    )
    assert timing.advice().startswith(verdict.replace("no steps", "no hot step"))


def test_host_time_takes_the_first_calls_as_timed_and_the_rest_from_the_samples():
    # A step's first calls (cold caches, checks of a first call) are often
    # slower; they are counted as timed, and only the sampled calls stand
    # for the calls that were not timed.
    clock = _timing.LoopClock()
    clock.wall = 10.0
    # [calls, seconds timed, calls timed, of which first-phase: seconds, calls]
    clock.steps["slow_start"] = [1064, 0.64 + 0.01, 64 + 10, 0.64, 64, 0, 0.0]
    (step,) = clock.timing().steps
    assert step.host_seconds == pytest.approx(0.64 + 0.001 * 1000)  # not 0.65 / 74 * 1064
    assert step.timed_calls == 74


def test_host_time_estimates_never_add_up_to_more_than_the_loop_had():
    clock = _timing.LoopClock()
    clock.wall = 1.0
    clock.blocked["jc.fetch"] = 0.2
    clock.steps["a"] = [100, 0.08, 10, 0.0, 0, 0, 0.0]  # sampled noise: 0.8 s estimated
    clock.steps["b"] = [100, 0.08, 10, 0.0, 0, 0, 0.0]
    a, b = clock.timing().steps
    assert a.host_seconds == pytest.approx(0.4) and b.host_seconds == pytest.approx(0.4)
    clock.steps["b"] = [100, 0.01, 10, 0.0, 0, 0, 0.0]  # 0.8 + 0.1 > 0.8: scaled in proportion
    a, b = clock.timing().steps
    assert a.host_seconds == pytest.approx(0.8 * 8 / 9) and b.host_seconds == pytest.approx(0.8 / 9)
    clock.steps["a"] = clock.steps["b"] = [100, 0.001, 10, 0.0, 0, 0, 0.0]  # fits: as estimated
    assert [s.host_seconds for s in clock.timing().steps] == pytest.approx([0.01, 0.01])


def test_the_exit_looks_at_the_recorded_outputs_of_the_loops_steps_only():
    # The loop clock looks for queued work in the output each step it called
    # returned last inside the loop; it never reads the loop's frame.
    from jaxcontracts._runtime import held_outputs

    def tick_fn(c: Clock) -> Clock:
        return c

    step, other = jc.hot_step(tick_fn, signature=Clock), jc.hot_step(tick_fn, signature=Clock)
    c = step(fresh())  # compiled before the loop; outside a loop nothing is recorded
    assert held_outputs([step]) == []
    with jc.hot_loop():
        c = step(c)
        assert held_outputs([step]) == jax.tree_util.tree_leaves(c)
        assert held_outputs([other]) == []  # not called in a loop: nothing recorded
    assert held_outputs([step]) == []  # the exit forgets what the loop recorded


def test_steps_freed_while_the_registry_is_read_leave_it_and_nothing_hangs():
    # Steps in reference cycles are freed by the cycle collector, which runs
    # at any allocation: here, in the middle of set_checks() telling every
    # live step. (The id-keyed records this registry replaced deadlocked on
    # a finalizer once, and once named a dead step for a new one.)
    import gc
    import threading
    import weakref

    from jaxcontracts import _steps

    def ident(c: Clock) -> Clock:
        return c

    def doomed() -> weakref.ref:
        step = jc.hot_step(ident, signature=Clock)
        step.cycle = step  # freed only by the cycle collector
        step.last_output[0] = fresh()
        return weakref.ref(step)

    gone = [doomed() for _ in range(20)]
    collector = jc.hot_step(ident, signature=Clock)
    collector.checks_changed = lambda level: gc.collect()  # collects mid-iteration
    finished = threading.Event()

    def work() -> None:
        jc.set_checks("fast")
        jc.set_checks("full")
        list(_steps.last_outputs())
        _steps.clear_last_outputs()
        finished.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert finished.wait(60), "hung while steps were freed"
    gc.collect()
    assert all(r() is None for r in gone)
    live = _steps.live()
    assert collector in live and not any(r() in live for r in gone)
    assert "ident" not in [name for name, _ in _steps.last_outputs()]


def test_a_new_step_starts_with_no_recorded_output_whatever_id_it_gets():
    import gc

    from jaxcontracts import _steps

    def sgd(c: Clock) -> Clock:
        return c

    def dstep(c: Clock) -> Clock:
        return c

    old = jc.hot_step(sgd, signature=Clock)
    old.last_output[0] = fresh()
    old_id = id(old)
    del old
    gc.collect()
    made = [jc.hot_step(dstep, signature=Clock) for _ in range(50)]  # one may reuse the id
    assert all(step.last_output == [None] for step in made)
    assert "sgd" not in [name for name, _ in _steps.last_outputs()]
    assert old_id not in {id(step) for step in _steps.live() if step.short_name == "sgd"}


def test_a_loop_whose_own_code_dominates_is_told_so_not_to_fuse_steps(tick):
    """Issue 21: notebook 02's first run was 99% the user's code between calls,
    and the verdict said "dispatch-bound ... Fuse steps into one hot_step"."""
    import time

    s = tick(fresh())
    with jc.hot_loop() as loop:
        for _ in range(5):
            s = tick(s)
            time.sleep(0.05)  # the user's own host work between calls
    timing = loop.timing
    assert timing.verdict == "user-code-bound"
    # the verdict's own threshold, not a timing figure (a loaded machine
    # once made five step calls take 6.6 ms: 11% of the loop)
    assert timing.other_seconds / timing.wall_seconds >= _timing.USER_BOUND_SHARE
    advice = timing.advice()
    assert "your own code between step calls took" in advice and "Fuse" not in advice
    assert "user-code-bound" in str(loop.report())


def test_loop_entry_and_exit_never_visit_every_live_step(tick, monkeypatch):
    """Issue 22 goal 4: a loop's entry and exit cost the same with 2 or 1,000
    live steps. One flag turns timing on for every step (``_steps.timing_on``,
    read by the closures); the clock snapshots only the steps in use (called
    in loops lately); nothing on the way in or out iterates the live steps."""
    others = [make_step(f"idle_{i}") for i in range(200)]  # live, never called in a loop
    s = tick(fresh())
    from jaxcontracts import _steps

    def refused() -> list:
        raise AssertionError("a loop's entry or exit iterated every live step")

    monkeypatch.setattr(_steps, "live", refused)
    for _ in range(3):
        with jc.hot_loop() as loop:
            s = tick(s)
            s = tick(s)
        assert loop.timing.calls == 2
    in_use = _timing.in_use()
    assert tick in in_use and not any(o in in_use for o in others)


def test_a_step_idle_for_a_loop_leaves_use_and_is_counted_exactly_when_it_returns(tick):
    """A step not called in a loop that had it in use leaves (its next loop
    call due); that call joins with the counters it had, so its calls are
    counted exactly, even though most calls between samples are not timed."""
    s = tick(fresh())
    with jc.hot_loop():
        for _ in range(_timing.FIRST + 5):  # past the first phase: one call in SAMPLE timed
            s = tick(s)
    with jc.hot_loop():
        pass  # tick idle: it leaves use
    assert tick not in _timing.in_use()
    assert tick.timing_due[0]  # its next call in a loop is timed, and joins it
    for _ in range(7):  # calls outside loops are not the next loop's
        s = tick(s)
    with jc.hot_loop() as loop:
        for _ in range(5):
            s = tick(s)
    assert tick in _timing.in_use()
    assert loop.timing.calls == 5
    assert loop.timing.steps[0].timed_calls == 1  # the due call, then none till the next sample


def test_a_short_loop_with_no_sampled_call_uses_the_step_mean(tick):
    """Past its first calls, a step is sampled one call in SAMPLE: a loop of
    one call (a `with` per iteration) may time none; its host time is then
    the step's mean, not zero (which would make every such loop look
    user-code-bound)."""
    s = tick(fresh())
    with jc.hot_loop():
        for _ in range(_timing.FIRST + 3):
            s = tick(s)
    host = []
    for _ in range(2 * _timing.SAMPLE):
        with jc.hot_loop() as loop:
            s = tick(s)
        host.append(loop.timing.steps[0])
    assert all(t.host_seconds > 0 for t in host)
    assert any(t.timed_calls == 0 for t in host)  # such loops were there, and they say so


@pytest.mark.parametrize("in_use_at_entry", [False, True])
def test_a_step_dropped_inside_a_loop_is_freed_there_and_its_calls_still_count(in_use_at_entry):
    """Issue 39: a step dropped while a loop is open was kept alive by the
    loop's timing snapshot (a dict key) until the loop's exit."""
    import gc
    import weakref

    step = jc.hot_step(lambda s: {"x": s["x"] + 1}, state="s")
    s = step(jc.device_tree({"x": jnp.zeros(3)}))
    if in_use_at_entry:  # in the entry's snapshot; else it joins the loop at its first call
        with jc.hot_loop():
            s = step(s)
        assert step in _timing.in_use()
    with jc.hot_loop() as loop:
        for _ in range(3):
            s = step(s)
        dropped = weakref.ref(step)
        del step
        gc.collect()
        assert dropped() is None  # freed inside the loop
    assert [(t.name.rsplit(".", 1)[-1], t.calls) for t in loop.timing.steps] == [("<lambda>", 3)]
    assert loop.timing.steps[0].host_seconds > 0


@pytest.mark.parametrize("b_in_a_loop", [False, True])
def test_a_step_first_called_on_another_thread_is_counted_in_every_open_loop(b_in_a_loop):
    """A step joins the open loops when a timed call of it starts: every open
    loop, on any thread (its counters count its calls on every thread). It
    joined only the calling thread's loops: a loop another thread had open
    then never counted the step, its own calls included."""
    import threading

    shared = make_step("shared")
    shared.compile(Clock.spec(n=8))
    a_in, b_done, out = threading.Event(), threading.Event(), {}
    s_a, s_b = fresh(), fresh()  # made before any loop

    def a():
        s = s_a
        with jc.hot_loop() as loop:
            a_in.set()
            b_done.wait(30)
            for _ in range(5):
                s = shared(s)
        out["a"] = loop.timing

    def b():
        a_in.wait(30)
        if b_in_a_loop:
            with jc.hot_loop():
                shared(s_b)
        else:
            shared(s_b)  # no loop here, while a's is open
        b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    timing = out["a"]
    assert [t.name.rsplit(".", 1)[-1] for t in timing.steps] == ["shared"]
    assert timing.calls >= 5 and timing.steps[0].host_seconds > 0  # its own 5 (b's one may count too)


def test_a_loop_left_on_another_thread_stops_counting_the_entering_threads_waits(tick):
    # The exit drops the clock from the entering thread's list of active
    # clocks: it dropped it from the exiting thread's (where it is not), so
    # the time the entering thread later spent blocked, in another loop, was
    # added to the ended loop too.
    import threading

    s = tick(fresh())
    first = jc.hot_loop()
    first.__enter__()
    s = tick(s)
    exiting = threading.Thread(target=first.__exit__, args=(None, None, None))
    exiting.start()
    exiting.join()
    before = dict(first.timing.blocked)
    with jc.hot_loop() as second:
        s = tick(s)
        jax.block_until_ready(s)
    assert second.timing.blocked["block_until_ready"] > 0
    assert first.timing.blocked == before


def test_a_loop_entered_again_inside_itself_counts_each_wait_once(tick):
    # The clock was listed once per entry on the thread, so a wait inside the
    # inner entry was added to it twice.
    s = tick(fresh())
    loop = jc.hot_loop()
    with loop:
        s = tick(s)
        with loop:
            t0 = time.perf_counter()
            jax.block_until_ready(s)
            waited = time.perf_counter() - t0
    assert 0 < loop.timing.blocked["block_until_ready"] <= waited
