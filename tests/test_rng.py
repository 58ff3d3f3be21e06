"""``jax.random`` idioms inside a raising loop (issue 20).

An eager sampler copies its Python-number parameters (``minval=0.0``, the
defaults of ``jax.random.uniform(key)``, ``p=0.5``) to the device on every
call, and JAX's own guard refuses them; inside a loop they are the documented
idioms of ``jax.random`` and are let through, counted. What stays refused: a
Python int that is the loop's data (``fold_in(key, i)``, ``key(i)``), numpy
parameters, and a sampler imported by name before the loop (which the loop
cannot replace): each with a message that names it.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcontracts as jc

KEY = jax.random.key(0)
LOGITS = jnp.zeros(4)

# The idioms of jax.random's documentation, as users write them.
IDIOMS = {
    "uniform bounds": lambda k: jax.random.uniform(k, (3,), minval=-1.0, maxval=1.0),
    "uniform defaults": lambda k: jax.random.uniform(k, (3,)),
    "uniform scalar": lambda k: jax.random.uniform(k),
    "normal": lambda k: jax.random.normal(k, (3,)),
    "randint": lambda k: jax.random.randint(k, (3,), 0, 10),
    "bernoulli": lambda k: jax.random.bernoulli(k, 0.3, (3,)),
    "bernoulli default p": lambda k: jax.random.bernoulli(k),
    "truncated_normal": lambda k: jax.random.truncated_normal(k, -2.0, 2.0, (3,)),
    "categorical": lambda k: jax.random.categorical(k, LOGITS),
    "choice": lambda k: jax.random.choice(k, 5, (2,), replace=False),
    "permutation": lambda k: jax.random.permutation(k, 5),
    "gamma": lambda k: jax.random.gamma(k, 2.0, (3,)),
    "poisson": lambda k: jax.random.poisson(k, 3.0, (3,)),
    "beta": lambda k: jax.random.beta(k, 2.0, 3.0, (3,)),
    "exponential": lambda k: jax.random.exponential(k, (3,)),
}


@pytest.fixture(scope="module")
def warm() -> dict[str, np.ndarray]:
    """Each idiom called once before the loop (its compile), and its value."""
    return {name: np.asarray(fn(KEY)) for name, fn in IDIOMS.items()}


@pytest.mark.parametrize("name", list(IDIOMS))
def test_a_sampler_idiom_is_clean_in_a_raising_loop(name: str, warm: dict[str, np.ndarray]) -> None:
    fn = IDIOMS[name]
    with jc.hot_loop() as loop:
        out = [fn(KEY) for _ in range(3)]
    assert loop.sampler_calls >= 3  # let through and counted (its parameters crossed)
    for x in out:  # the same numbers as outside any loop
        np.testing.assert_array_equal(np.asarray(x), warm[name])


def test_sampler_copies_are_in_the_report(warm: dict[str, np.ndarray]) -> None:
    with jc.hot_loop(on_violation="record") as loop:
        for _ in range(4):
            jax.random.uniform(KEY, (3,), minval=0.0, maxval=2.0)
    assert loop.sampler_calls == 4
    assert not loop.violations
    assert "jax.random parameter copies" in str(loop.report())
    assert "4 calls" in str(loop.report())


def test_samplers_are_jax_own_outside_loops() -> None:
    originals = {n: getattr(jax.random, n) for n in ("uniform", "bernoulli", "normal")}
    with jc.hot_loop():
        assert jax.random.uniform is not originals["uniform"]
        assert jax.random.uniform.__wrapped__ is originals["uniform"]  # type: ignore[attr-defined]
    for n, f in originals.items():
        assert getattr(jax.random, n) is f
    # and the guard is back: a Python constant in an eager op works outside
    assert float(jnp.zeros(3).sum() + 1.0) == 1.0


def test_fold_in_with_a_python_int_is_refused_naming_the_counter() -> None:
    jax.random.fold_in(KEY, 3)  # warm
    with pytest.raises(jc.TransferError) as info, jc.hot_loop(compiles="allow"):  # the transfer is under test
        for i in range(3):
            jax.random.fold_in(KEY, i)
    message = str(info.value)
    assert "the Python int given to jax.random.fold_in" in message
    assert "jax.random.split(key, n); for k in keys" in message
    assert info.traceback[-1].path.name == "test_rng.py"  # ends at the user's line


def test_split_keys_iterated_in_the_loop_are_clean() -> None:
    """The fix the fold_in message gives works in a raising loop."""
    keys = jax.random.split(KEY, 4)
    for k in keys:  # warm: iterating compiles its slice once
        jax.random.normal(k, (2,))
    with jc.hot_loop():
        drawn = [jax.random.normal(k, (2,)) for k in keys]
    assert len(drawn) == 4


def test_numpy_parameters_are_host_data_and_stay_refused() -> None:
    # compiles="allow": only the transfer is under test (whether JAX's eager
    # conversion compiles again depends on which guard contexts ran it before)
    p = np.float32(0.5)
    jax.random.bernoulli(KEY, p, (3,))
    with pytest.raises(jc.TransferError, match="host-to-device"), jc.hot_loop(compiles="allow") as loop:
        jax.random.bernoulli(KEY, p, (3,))
    assert loop.sampler_calls == 0
    probs = np.full(3, 0.5, np.float32)
    jax.random.bernoulli(KEY, probs)
    with pytest.raises(jc.TransferError, match="host-to-device"), jc.hot_loop(compiles="allow"):
        jax.random.bernoulli(KEY, probs)


def test_a_sampler_imported_by_name_is_refused_with_the_reason() -> None:
    from jax.random import uniform  # bound before the loop: JAX's own function

    uniform(KEY, (3,))
    with pytest.raises(jc.TransferError) as info, jc.hot_loop(compiles="allow"):  # the transfer is under test
        uniform(KEY, (3,))
    message = str(info.value)
    assert "the Python-number parameters of uniform" in message
    assert "from jax.random import uniform" in message
    assert "call jax.random.uniform" in message


def test_loops_that_allow_host_to_device_do_not_count() -> None:
    jax.random.uniform(KEY, (3,))
    with jc.hot_loop(transfers="allow_host_to_device") as loop:
        jax.random.uniform(KEY, (3,))
    assert loop.sampler_calls == 0


def test_a_sampler_on_another_thread_is_not_lifted_by_this_loop() -> None:
    """The wrapper reads the calling thread's loop: a thread under JAX's own
    guard (no jc loop) is refused by JAX as before, while the main thread's
    loop is open."""
    jax.random.uniform(KEY, (3,))
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with jax.transfer_guard_host_to_device("disallow"):
                jax.random.uniform(KEY, (3,))
        except BaseException as e:  # noqa: BLE001 - what the thread saw
            errors.append(e)

    with jc.hot_loop():
        t = threading.Thread(target=other)
        t.start()
        t.join()
        jax.random.uniform(KEY, (3,))  # this thread: lifted
    assert len(errors) == 1 and "Disallowed host-to-device" in str(errors[0])


def test_a_sampler_inside_a_step_traced_in_the_loop() -> None:
    """Tracing inside a warm-up loop: the wrapper is harmless under a trace."""

    @jax.jit
    def draw(k: jax.Array) -> jax.Array:
        return jax.random.uniform(k, (3,), minval=0.0, maxval=1.0)

    with jc.hot_loop(compiles="warmup"):
        drawn = [draw(k) for k in jax.random.split(KEY, 3)]
    assert [d.shape for d in drawn] == [(3,)] * 3


def test_a_users_own_patch_of_a_sampler_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def mine(*args: object, **kwargs: object) -> str:
        return "mine"

    monkeypatch.setattr(jax.random, "normal", mine)
    original_uniform = jax.random.uniform
    with jc.hot_loop():
        assert jax.random.normal is mine  # not replaced by a wrapper of JAX's own
        assert jax.random.uniform is not original_uniform  # the others are
    assert jax.random.normal is mine and jax.random.uniform is original_uniform
