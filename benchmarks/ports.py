"""ports: real programs' loops, ported with the least change, against the originals.

What is measured
----------------
Three programs, each its own case, each in two forms: the original as its
authors write it (``jax.jit``) and the same program ported to jaxcontracts
(``jc.hot_step`` in place of each ``jax.jit``, the loop in
``jc.hot_loop(compiles="warmup")``), in the shapes of ``tests/ports/``:

- **NNX**: flax NNX's functional training loop as its docs write it
  (``nnx.split``, a donated ``jax.jit`` on ``nnx.State``, numpy batches from
  a loader), ported as ``@jc.hot_step(state="state", host="batch")``. The
  batches are made before timing and are numpy: the original's ``jax.jit``
  and the port's executable both transfer them in JAX's C++ path.
- **gymnax PPO**: the PPO update on gymnax's CartPole-v1 (a flax linen
  actor-critic, an optax ``TrainState``; a ``lax.scan`` rollout, GAE, minibatch
  epochs), called ``update(runner_state, config=config)`` with a keyword,
  static ``config``: ``jax.jit(update, static_argnames="config",
  donate_argnums=0)`` against ``jc.hot_step(update, state="runner_state",
  static="config")``. Tiny sizes (2 envs x 8 steps, 1 epoch, 1 minibatch), so
  that an iteration is dominated by the per-call host cost of the keyword and
  static arguments and the ~40-leaf runner state.
- **evosax CMA-ES**: ask / evaluate / tell, three steps per generation (and
  the loop's ``jax.random.split`` of the key): ``jax.jit`` of ``es.ask``,
  ``jax.vmap(f)`` and ``es.tell`` against ``jc.hot_step(es.ask,
  state="state")``, ``jc.hot_step(jax.vmap(f), stateless=True)`` and
  ``jc.hot_step(es.tell, state="state")``. ``params`` and ``state`` go
  through ``jc.device_tree`` for both forms (so that the original does not
  recompile at its second tell). Population 8, dimension 4, so that dispatch
  dominates.

Each sample is one loop of N iterations (``--steps``), ending in one
``jax.block_until_ready``; per case, after two warm-up loops of each variant
(compiles, caches), the variants (original, port at ``full``, port at
``off``) are interleaved in a freshly shuffled order each repeat. Each
variant carries its own state from loop to loop. A case whose library is not
installed (gymnax, evosax) is skipped with a note and its budget is "not
run". A warning note says if any step compiled more than once or refused a
call.

- **cookbook refs**: a step that updates its train state's refs in place
  and returns the loss (numpy batches): ``jax.jit`` against
  ``jc.hot_step(train_step, state="state", host="batch")``, which passes the
  arrays the refs hold, donated.
- **diffrax**: ``solver.step`` of Dopri5 from a Python loop with Python-float
  times: ``eqx.filter_jit(solver.step)`` against ``jc.hot_step(solver.step,
  state=("y0", "solver_state"), host=("t0", "t1"), static="made_jump")``.
- **equinox stateful**: equinox's stateful example (``eqx.nn.State``
  through a BatchNorm, adam): ``eqx.filter_jit(make_step)`` against
  ``jc.hot_step(make_step, state=("model", "state", "opt_state"))``.
- **MJX**: ``jax.jit(mjx.step)`` on a double pendulum's ``mjx.Data`` against
  ``jc.hot_step(mjx.step, state="d")`` (donated).

Budgets: per case, the port at ``full`` <= 1.05x the original (ratio of
medians; the bootstrap interval of the paired ratio marks it uncertain).

Whole programs (``--programs``, no budget): each ``tests/ports/`` pair run as a
script (``runpy``, output discarded), the original against the port at
``full`` and at ``off``, interleaved as above, 5 runs each by default. A run
includes everything the script does but its imports: building the model,
tracing and compiling (JAX's caches are cleared before each run, as in a new
process), the loop, evaluation, checkpoints. ``--programs`` alone runs the six of issue 38
(``nnx_mnist nnx_trainer diffrax_manual mjx_rollout equinox_stateful
cookbook_refs``); name others after it.

Run: ``python -m benchmarks.ports`` (``--quick`` for a smoke run,
``--cases nnx ppo cmaes refs diffrax mjx eqx_stateful`` to choose).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import io
import random
import runpy
import statistics
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

import jaxcontracts as jc
from benchmarks._common import Result, machine, parser, row

LIMIT = 1.05
VARIANTS = ("original", "full", "off")


@dataclasses.dataclass
class Case:
    """One program to measure: how to run one loop of each variant."""

    name: str  # in the budget line: "NNX", "gymnax PPO", ...
    case: str  # the table's case column
    loop: Callable[[str], float] | None = None  # variant -> seconds for one loop
    ports: dict[str, Any] = dataclasses.field(default_factory=dict)  # label -> hot step
    originals: dict[str, Any] = dataclasses.field(default_factory=dict)  # label -> jax.jit
    notes: list[Callable[[dict[str, list[float]]], str]] = dataclasses.field(default_factory=list)
    skipped: str = ""  # why it was not measured
    budgeted: bool = True  # False: a whole program, timed without a budget


def _skipped(case: Case, e: ImportError, library: str) -> Case:
    """``case``, skipped for the library it could not import."""
    case.skipped = f"{(e.name or library).split('.')[0]} not installed"
    return case


def _timed(states: dict[str, Any], variant: str, body: Callable[[Any], tuple[Any, Any]]) -> float:
    """Run ``body(carry) -> (carry, to_block)`` once for ``variant``, timed, gc off.

    A port variant's checks level is set before the clock starts, as a
    program sets it once: a level change switches every live step's call
    path (built at its first call at that level, about 0.5 ms a step), which
    no loop of a program pays.
    """
    if variant != "original":
        jc.set_checks(variant)
    gc.disable()
    try:
        t0 = time.perf_counter()
        # body is the carry's one holder: an array it donates has no second name
        states[variant], out = body(states.pop(variant))
        jax.block_until_ready(out)
        return time.perf_counter() - t0
    finally:
        gc.enable()


# --------------------------------------------------------------------------
# NNX: flax NNX's functional training loop


def _program() -> tuple[Any, Any, Any]:
    """(train_step function, initial state maker, graphdef), as NNX's docs write it."""
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, din: int, dhidden: int, dout: int, *, rngs: Any) -> None:
            self.l1 = nnx.Linear(din, dhidden, rngs=rngs)
            self.l2 = nnx.Linear(dhidden, dout, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.l2(jax.nn.relu(self.l1(x)))

    def make() -> Any:
        model = MLP(8, 32, 1, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        return nnx.split((model, optimizer))

    graphdef, _ = make()

    def train_step(state: Any, batch: Any) -> Any:
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model: Any) -> Any:
            logits = model(batch["x"])
            return optax.sigmoid_binary_cross_entropy(logits, batch["y"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    return train_step, (lambda: make()[1]), graphdef


def _batches(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        x = rng.normal(size=(32, 8)).astype(np.float32)
        out.append({"x": x, "y": (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)})
    return out


def _nnx_case(steps: int) -> Case:
    case = Case("NNX", f"NNX: {steps} steps, numpy batches")
    train_step, initial, _ = _program()
    original = functools.partial(jax.jit, donate_argnums=0)(train_step)
    port = jc.hot_step(train_step, state="state", host="batch")
    batches = _batches(steps)
    states = {v: initial() for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(state: Any) -> tuple[Any, Any]:
            if variant == "original":
                for batch in batches:
                    loss, state = original(state, batch)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for batch in hl.iterate(batches):
                        loss, state = port(state, batch)
            return state, (loss, state)

        return _timed(states, variant, body)

    case.loop = loop
    case.ports = {"NNX train_step": port}
    case.originals = {"NNX train_step": original}
    case.notes.append(lambda s: f"NNX port: {port.stats.host_calls} calls transferred "
                                f"{port.stats.host_bytes:,} bytes of batches")
    return case


# --------------------------------------------------------------------------
# NNX in place: the tutorial's @nnx.jit step that mutates its objects


def _inplace_program() -> tuple[Any, Any]:
    """(train_step that returns nothing, objects maker), as NNX's MNIST tutorial writes it."""
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, *, rngs: Any) -> None:
            self.l1 = nnx.Linear(8, 32, rngs=rngs)
            self.bn = nnx.BatchNorm(32, rngs=rngs)
            self.l2 = nnx.Linear(32, 1, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.l2(jax.nn.relu(self.bn(self.l1(x))))

    tx = optax.adam(1e-2)  # one transformation: the variants' optimizers share its functions

    def make() -> Any:
        model = MLP(rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        return model, optimizer, nnx.MultiMetric(loss=nnx.metrics.Average("loss"))

    def train_step(model: Any, optimizer: Any, metrics: Any, batch: Any) -> None:
        def loss_fn(model: Any) -> Any:
            return optax.sigmoid_binary_cross_entropy(model(batch["x"]), batch["y"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        metrics.update(loss=loss)
        optimizer.update(model, grads)

    return train_step, make


def _inplace_case(steps: int) -> Case:
    from flax import nnx

    case = Case("NNX in place", f"NNX in place: {steps} steps, numpy batches")
    train_step, make = _inplace_program()
    original = nnx.jit(train_step)
    port = jc.hot_step(train_step, state=("model", "optimizer", "metrics"), host="batch")
    batches = _batches(steps)
    states = {v: make() for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(objects: Any) -> tuple[Any, Any]:
            if variant == "original":
                for batch in batches:
                    original(*objects, batch)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for batch in hl.iterate(batches):
                        port(*objects, batch)
            return objects, nnx.state(objects)

        return _timed(states, variant, body)

    case.loop = loop
    case.ports = {"NNX in-place train_step": port}
    return case


# --------------------------------------------------------------------------
# gymnax PPO: a jitted update with a keyword, static config


class PPOConfig(NamedTuple):
    num_envs: int = 2
    num_steps: int = 8
    num_minibatches: int = 1
    update_epochs: int = 1
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    lr: float = 5e-3


def _ppo_program(config: PPOConfig) -> tuple[Any, Any]:
    """(update function, initial runner state maker), as tests/ports/gymnax_ppo_*.py write them."""
    import flax.linen as nn
    import gymnax
    import jax.numpy as jnp
    import optax
    from flax.training.train_state import TrainState
    from gymnax.wrappers.purerl import LogWrapper

    class ActorCritic(nn.Module):
        action_dim: int

        @nn.compact
        def __call__(self, x: Any) -> Any:
            actor = nn.tanh(nn.Dense(32)(x))
            logits = nn.Dense(self.action_dim)(actor)
            critic = nn.tanh(nn.Dense(32)(x))
            value = nn.Dense(1)(critic)
            return logits, jnp.squeeze(value, axis=-1)

    class Transition(NamedTuple):
        done: jax.Array
        action: jax.Array
        value: jax.Array
        reward: jax.Array
        log_prob: jax.Array
        obs: jax.Array
        info: dict

    env, env_params = gymnax.make("CartPole-v1")
    env = LogWrapper(env)
    network = ActorCritic(env.action_space(env_params).n)

    def calculate_gae(traj_batch: Any, last_val: Any, *, config: PPOConfig) -> Any:
        def get_advantages(carry: Any, transition: Any) -> Any:
            gae, next_value = carry
            delta = transition.reward + config.gamma * next_value * (1 - transition.done) - transition.value
            gae = delta + config.gamma * config.gae_lambda * (1 - transition.done) * gae
            return (gae, transition.value), gae

        _, advantages = jax.lax.scan(
            get_advantages, (jnp.zeros_like(last_val), last_val), traj_batch, reverse=True
        )
        return advantages, advantages + traj_batch.value

    def loss_fn(params: Any, traj_batch: Any, gae: Any, targets: Any, *, config: PPOConfig) -> Any:
        logits, value = network.apply(params, traj_batch.obs)
        log_probs = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_probs, traj_batch.action[:, None], axis=-1)[:, 0]

        value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(-config.clip_eps, config.clip_eps)
        value_loss = 0.5 * jnp.maximum(jnp.square(value - targets), jnp.square(value_pred_clipped - targets)).mean()

        ratio = jnp.exp(log_prob - traj_batch.log_prob)
        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
        loss_actor = -jnp.minimum(
            ratio * gae, jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps) * gae
        ).mean()
        entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
        return loss_actor + config.vf_coef * value_loss - config.ent_coef * entropy

    def update(runner_state: Any, *, config: PPOConfig) -> Any:
        train_state, env_state, last_obs, rng = runner_state

        def env_step(carry: Any, _: Any) -> Any:
            train_state, env_state, last_obs, rng = carry
            rng, _rng = jax.random.split(rng)
            logits, value = network.apply(train_state.params, last_obs)
            action = jax.random.categorical(_rng, logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
            rng, _rng = jax.random.split(rng)
            rng_step = jax.random.split(_rng, config.num_envs)
            obsv, env_state, reward, terminated, truncated, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(rng_step, env_state, action, env_params)
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(done, action, value, reward, log_prob, last_obs, info)
            return (train_state, env_state, obsv, rng), transition

        (train_state, env_state, last_obs, rng), traj_batch = jax.lax.scan(
            env_step, (train_state, env_state, last_obs, rng), None, config.num_steps
        )
        _, last_val = network.apply(train_state.params, last_obs)
        advantages, targets = calculate_gae(traj_batch, last_val, config=config)

        def update_epoch(carry: Any, _: Any) -> Any:
            train_state, rng = carry
            rng, _rng = jax.random.split(rng)
            batch_size = config.num_envs * config.num_steps
            permutation = jax.random.permutation(_rng, batch_size)
            batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), (traj_batch, advantages, targets))
            shuffled = jax.tree.map(lambda x: jnp.take(x, permutation, axis=0), batch)
            minibatches = jax.tree.map(
                lambda x: x.reshape((config.num_minibatches, -1) + x.shape[1:]), shuffled
            )

            def update_minibatch(train_state: Any, minibatch: Any) -> Any:
                traj, gae, target = minibatch
                loss, grads = jax.value_and_grad(loss_fn)(train_state.params, traj, gae, target, config=config)
                return train_state.apply_gradients(grads=grads), loss

            train_state, losses = jax.lax.scan(update_minibatch, train_state, minibatches)
            return (train_state, rng), losses

        (train_state, rng), losses = jax.lax.scan(update_epoch, (train_state, rng), None, config.update_epochs)
        metrics = {"return": traj_batch.info["returned_episode_returns"][-1].mean(), "loss": losses.mean()}
        return (train_state, env_state, last_obs, rng), metrics

    rng = jax.random.PRNGKey(0)
    rng, init_rng, reset_rng = jax.random.split(rng, 3)
    params = network.init(init_rng, jnp.zeros(env.observation_space(env_params).shape))
    tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.lr, eps=1e-5))
    train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
    obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_rng, config.num_envs), env_params)
    # The port's device_tree (TrainState.step is a Python int), for both forms alike.
    runner_state = jc.device_tree((train_state, env_state, obsv, rng))

    def initial() -> Any:
        # A copy of the arrays for each variant (each donates its own); the
        # static fields (apply_fn, tx) are the same objects: a second
        # optax.chain(...) would be a new static value, a new compile.
        return jax.tree.map(jnp.copy, runner_state)

    return update, initial


def _ppo_case(steps: int) -> Case:
    config = PPOConfig()
    case = Case("gymnax PPO", f"gymnax PPO: {steps} updates, {config.num_envs} envs x "
                              f"{config.num_steps} steps")
    try:
        update, initial = _ppo_program(config)
    except ImportError as e:
        return _skipped(case, e, "gymnax")
    original = jax.jit(update, static_argnames="config", donate_argnums=0)
    port = jc.hot_step(update, state="runner_state", static="config")
    states = {v: initial() for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(runner_state: Any) -> tuple[Any, Any]:
            if variant == "original":
                for _ in range(steps):
                    runner_state, metrics = original(runner_state, config=config)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for _ in hl.iterate(range(steps)):
                        runner_state, metrics = port(runner_state, config=config)
            return runner_state, (runner_state, metrics)

        return _timed(states, variant, body)

    leaves = len(jax.tree.leaves(states["original"]))
    case.loop = loop
    case.ports = {"PPO update": port}
    case.originals = {"PPO update": original}
    case.notes.append(lambda s: f"gymnax PPO: runner state of {leaves} leaves, config static by keyword")
    return case


# --------------------------------------------------------------------------
# evosax CMA-ES: ask / evaluate / tell


def _cmaes_program(population_size: int, num_dims: int) -> tuple[Any, Any, Any, Any]:
    """(es, rosenbrock, params, initial (key, state) maker), as tests/ports/evosax_cmaes_*.py write them."""
    import jax.numpy as jnp
    from evosax.algorithms import CMA_ES

    def rosenbrock(x: Any) -> Any:
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    es = CMA_ES(population_size=population_size, solution=jnp.zeros(num_dims))
    params = jc.device_tree(es.default_params)  # std_min, std_max, c_mean are Python floats

    def initial() -> Any:
        key = jax.random.key(0)
        key, key_init = jax.random.split(key)
        state = es.init(key_init, jnp.zeros(num_dims), params)
        # Both forms: init's weakly typed best_solution/best_fitness would
        # recompile the original's tell at its second call.
        return key, jc.device_tree(state)

    return es, rosenbrock, params, initial


def _cmaes_case(steps: int, population_size: int = 8, num_dims: int = 4) -> Case:
    case = Case("evosax CMA-ES", f"evosax CMA-ES: {steps} generations, pop {population_size} x dim {num_dims}")
    try:
        es, rosenbrock, params, initial = _cmaes_program(population_size, num_dims)
    except ImportError as e:
        return _skipped(case, e, "evosax")
    ask0 = jax.jit(es.ask)
    evaluate0 = jax.jit(jax.vmap(rosenbrock))
    tell0 = jax.jit(es.tell)
    ask = jc.hot_step(es.ask, state="state")
    evaluate = jc.hot_step(jax.vmap(rosenbrock), stateless=True)
    tell = jc.hot_step(es.tell, state="state")
    states = {v: initial() for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(carry: Any) -> tuple[Any, Any]:
            key, state = carry
            if variant == "original":
                for _ in range(steps):
                    key, key_ask, key_tell = jax.random.split(key, 3)
                    population, state = ask0(key_ask, state, params)
                    fitness = evaluate0(population)
                    state, metrics = tell0(key_tell, population, fitness, state, params)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for _ in hl.iterate(range(steps)):
                        key, key_ask, key_tell = jax.random.split(key, 3)
                        population, state = ask(key_ask, state, params)
                        fitness = evaluate(population)
                        state, metrics = tell(key_tell, population, fitness, state, params)
            return (key, state), (key, state, metrics)

        return _timed(states, variant, body)

    case.loop = loop
    case.ports = {"CMA-ES ask": ask, "CMA-ES evaluate": evaluate, "CMA-ES tell": tell}
    case.originals = {"CMA-ES ask": ask0, "CMA-ES evaluate": evaluate0, "CMA-ES tell": tell0}
    return case


# --------------------------------------------------------------------------
# The cookbook's refs: a step that updates its train state's refs in place


def _refs_case(steps: int) -> Case:
    case = Case("cookbook refs", f"cookbook refs: {steps} steps, numpy batches")
    if not hasattr(jax, "new_ref"):
        case.skipped = "this jax has no jax.new_ref"
        return case
    import jax.numpy as jnp

    def train_step(state: Any, batch: Any) -> Any:  # the refs written in place, the loss returned
        params = {k: r[...] for k, r in state.items()}
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((jax.nn.gelu(batch["x"] @ p["w1"]) @ p["w2"] - batch["y"]) ** 2)
        )(params)
        for k, r in state.items():
            r[...] = r[...] - 1e-2 * grads[k]
        return loss

    def make() -> Any:
        k1, k2 = jax.random.split(jax.random.key(0))
        return {"w1": jax.new_ref(jax.random.normal(k1, (8, 32))), "w2": jax.new_ref(jax.random.normal(k2, (32, 1)))}

    original = jax.jit(train_step)
    port = jc.hot_step(train_step, state="state", host="batch")
    batches = [{"x": b["x"], "y": b["y"]} for b in _batches(steps)]
    states = {v: make() for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(state: Any) -> tuple[Any, Any]:
            if variant == "original":
                for batch in batches:
                    loss = original(state, batch)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for batch in hl.iterate(batches):
                        loss = port(state, batch)
            return state, loss

        return _timed(states, variant, body)

    case.loop = loop
    case.ports = {"refs train_step": port}  # (jax.jit with refs keeps no C++ cache to count)
    return case


# --------------------------------------------------------------------------
# diffrax: solver.step from a Python loop (eqx.filter_jit in the original)


def _diffrax_case(steps: int) -> Case:
    case = Case("diffrax", f"diffrax manual stepping: {steps} Dopri5 steps")
    try:
        import diffrax
        import equinox as eqx
    except ImportError as e:
        return _skipped(case, e, "diffrax")
    import jax.numpy as jnp

    term = diffrax.ODETerm(lambda t, y, args: -args * y)
    solver, args, dt = diffrax.Dopri5(), jnp.array(0.5), 0.01
    original = eqx.filter_jit(solver.step)
    port = jc.hot_step(solver.step, state=("y0", "solver_state"), host=("t0", "t1"), static="made_jump")

    def make() -> Any:
        y = jnp.array([1.0, 2.0, 3.0])
        return y, solver.init(term, 0.0, dt, y, args)

    states = {v: make() for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(carry: Any) -> tuple[Any, Any]:
            y, state = carry
            del carry  # y is donated, a bare array: one name holds it
            step = original if variant == "original" else port
            if variant == "original":
                for i in range(steps):
                    y, _, _, state, _ = step(term, i * dt, (i + 1) * dt, y, args, state, made_jump=False)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for i in hl.iterate(range(steps)):
                        y, _, _, state, _ = step(term, i * dt, (i + 1) * dt, y, args, state, made_jump=False)
            return (y, state), (y, state)

        return _timed(states, variant, body)

    case.loop = loop
    case.ports = {"diffrax solver.step": port}
    return case


# --------------------------------------------------------------------------
# equinox stateful: eqx.nn.State through a BatchNorm, an eqx.filter_jit step


def _eqx_stateful_case(steps: int) -> Case:
    case = Case("equinox stateful", f"equinox stateful: {steps} steps, BatchNorm + eqx.nn.State")
    try:
        import equinox as eqx
        import optax
    except ImportError as e:
        return _skipped(case, e, "equinox")
    import jax.numpy as jnp
    import jax.random as jr

    class Model(eqx.Module):
        linear1: Any
        norm: Any
        linear2: Any

        def __init__(self, key: Any) -> None:
            k1, k2 = jr.split(key)
            self.linear1 = eqx.nn.Linear(2, 32, key=k1)
            self.norm = eqx.nn.BatchNorm(32, axis_name="batch", mode="batch")
            self.linear2 = eqx.nn.Linear(32, 1, key=k2)

        def __call__(self, x: Any, state: Any) -> Any:
            x, state = self.norm(self.linear1(x), state)
            return self.linear2(jax.nn.relu(x)), state

    optim = optax.adam(3e-4)

    def make_step(model: Any, state: Any, opt_state: Any, xs: Any, ys: Any) -> Any:
        def loss(model: Any, state: Any) -> Any:
            batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
            pred, state = batched(xs, state)
            return jnp.mean((pred - ys) ** 2), state

        grads, state = eqx.filter_grad(loss, has_aux=True)(model, state)
        updates, opt_state = optim.update(grads, opt_state)
        return eqx.apply_updates(model, updates), state, opt_state

    original = eqx.filter_jit(make_step)
    port = jc.hot_step(make_step, state=("model", "state", "opt_state"))
    xs = jr.normal(jr.key(1), (10, 2))
    ys = jnp.sin(xs).mean(axis=1, keepdims=True)

    def make() -> Any:
        model, state = eqx.nn.make_with_state(Model)(jr.key(0))
        return model, state, optim.init(eqx.filter(model, eqx.is_inexact_array))

    states = {v: make() for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(carry: Any) -> tuple[Any, Any]:
            model, state, opt_state = carry
            if variant == "original":
                for _ in range(steps):
                    model, state, opt_state = original(model, state, opt_state, xs, ys)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for _ in hl.iterate(range(steps)):
                        model, state, opt_state = port(model, state, opt_state, xs, ys)
            carry = (model, state, opt_state)
            return carry, eqx.filter(carry, eqx.is_array)

        return _timed(states, variant, body)

    case.loop = loop
    case.ports = {"equinox make_step": port}
    return case


# --------------------------------------------------------------------------
# MJX: jax.jit(mjx.step) on an 84-leaf mjx.Data


def _mjx_case(steps: int) -> Case:
    case = Case("MJX", f"MJX rollout: {steps} steps of a double pendulum")
    try:
        import mujoco
        from mujoco import mjx
    except ImportError as e:
        return _skipped(case, e, "mujoco")
    xml = (
        '<mujoco><worldbody><body pos="0 0 1"><joint type="hinge" axis="0 1 0"/>'
        '<geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.05"/><body pos="0 0 -0.5">'
        '<joint type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.04"/>'
        "</body></body></worldbody></mujoco>"
    )
    model = mjx.put_model(mujoco.MjModel.from_xml_string(xml))
    original = jax.jit(mjx.step)
    port = jc.hot_step(mjx.step, state="d")
    states = {v: mjx.make_data(model) for v in VARIANTS}

    def loop(variant: str) -> float:
        def body(data: Any) -> tuple[Any, Any]:
            if variant == "original":
                for _ in range(steps):
                    data = original(model, data)
            else:
                with jc.hot_loop(compiles="warmup") as hl:
                    for _ in hl.iterate(range(steps)):
                        data = port(model, data)
            return data, data

        return _timed(states, variant, body)

    case.loop = loop
    case.ports = {"mjx.step": port}
    case.originals = {"mjx.step": original}
    return case


# --------------------------------------------------------------------------


PROGRAMS = Path(__file__).resolve().parent.parent / "tests" / "ports"
ISSUE_38 = ("nnx_mnist", "nnx_trainer", "diffrax_manual", "mjx_rollout", "equinox_stateful", "cookbook_refs")


def _program_case(name: str) -> Case:
    """A whole ported program run as a script: the original, or the port at a checks level."""
    paths = {"original": PROGRAMS / f"{name}_original.py", "port": PROGRAMS / f"{name}_port.py"}
    case = Case(name, f"program {name}: the whole script", budgeted=False)
    if not all(p.exists() for p in paths.values()):
        case.skipped = f"no tests/ports/{name}_original.py and _port.py"
        return case

    def loop(variant: str) -> float:
        path = paths["original" if variant == "original" else "port"]
        out = io.StringIO()
        jax.clear_caches()  # each run traces and compiles, as in a new process (imports aside)
        with jc.checks_level("full" if variant == "original" else variant), redirect_stdout(out):
            t0 = time.perf_counter()
            runpy.run_path(str(path), run_name="__main__")
            return time.perf_counter() - t0

    try:
        loop("original")
    except ImportError as e:  # the program's library is not installed
        return _skipped(case, e, name)
    case.loop = loop
    return case


CASES: dict[str, tuple[Callable[[int], Case], int, int]] = {
    # name -> (builder, steps, steps with --quick)
    "nnx": (_nnx_case, 200, 20),
    "nnx_inplace": (_inplace_case, 200, 20),
    "ppo": (_ppo_case, 200, 20),
    "cmaes": (_cmaes_case, 100, 10),
    "refs": (_refs_case, 200, 20),
    "diffrax": (_diffrax_case, 100, 10),
    "mjx": (_mjx_case, 100, 10),
    "eqx_stateful": (_eqx_stateful_case, 100, 10),
}


def _measure(case: Case, repeats: int, seed: int) -> dict[str, list[float]]:
    """Per variant, ``repeats`` loop times in ms, interleaved in shuffled order."""
    assert case.loop is not None
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(2 if case.budgeted else 1):  # warm-up: compiles, caches (a program: its imports)
        for variant in VARIANTS:
            case.loop(variant)
    rng = random.Random(seed)
    for _ in range(repeats):
        gc.collect()
        order = list(VARIANTS)
        rng.shuffle(order)
        for variant in order:
            samples[variant].append(case.loop(variant) * 1e3)
    return samples


def _report(res: Result, case: Case, samples: dict[str, list[float]] | None, steps: int,
            repeats: int, seed: int) -> None:
    line = f"{case.name} port at full <= {LIMIT:.2f}x the original jax.jit loop"
    unit = "ms/loop" if case.budgeted else "ms/run"
    if samples is None and not case.budgeted:
        res.rows.append(row(case.case, "original", None, unit, note=case.skipped))
        res.notes.append(f"{case.name}: skipped, {case.skipped}")
        return
    if samples is None:
        res.rows.append(row(case.case, "jax.jit (original)", None, "ms/loop", note=case.skipped))
        res.budget(line, None, LIMIT, why=f"skipped: {case.skipped}")
        res.notes.append(f"{case.name}: skipped, {case.skipped}")
        return
    base = samples["original"]
    res.rows.append(row(case.case, "jax.jit (original)", base, unit, base=base, note="base"))
    res.rows.append(row(case.case, "port full", samples["full"], unit, base=base))
    res.rows.append(row(case.case, "port off", samples["off"], unit, base=base))
    if not case.budgeted:
        full, off = (statistics.median(samples[v]) / statistics.median(base) for v in ("full", "off"))
        res.notes.append(f"{case.name} (whole program): port at full {full:.3f}x, at off {off:.3f}x; "
                         f"{repeats} runs each")
        return
    ratio = statistics.median(samples["full"]) / statistics.median(base)
    res.budget(line, ratio, LIMIT, paired=[a / b for a, b in zip(samples["full"], base)], seed=seed)
    off = statistics.median(samples["off"]) / statistics.median(base)
    per_step = statistics.median(base) / steps * 1e3
    res.notes.append(f"{case.name}: original {per_step:.1f} us per iteration; port at off: {off:.3f}x; "
                     f"{repeats} loops each")
    for note in case.notes:
        res.notes.append(note(samples))
    for label, step in case.ports.items():
        res.check_clean(f"{label} (port)", step)
    for label, fn in case.originals.items():
        n = fn._cache_size()
        if n != 1:
            res.notes.append(f"WARNING: {label} (original jax.jit): {n} compiled signatures")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--steps", type=int,
                   help="loop iterations per sample, every case (default NNX 200, PPO 200, CMA-ES 100)")
    p.add_argument("--repeats", type=int, help="loops per variant (default 31)")
    p.add_argument("--cases", nargs="*", choices=list(CASES), help="measure only these")
    p.add_argument("--programs", nargs="*", help="whole tests/ports programs to time (none named: issue 38's six)")
    args = p.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 31)
    start = time.perf_counter()
    res = Result("ports", "real programs' loops (NNX, gymnax PPO, evosax CMA-ES): port vs original")
    res.meta = machine()
    with jc.checks_level("full"):  # the variants set theirs (_timed); the caller's comes back
        cases = args.cases if args.cases is not None else ([] if args.programs is not None else list(CASES))
        for name in cases:
            build, full_steps, quick_steps = CASES[name]
            steps = args.steps or (quick_steps if args.quick else full_steps)
            case = build(steps)
            samples = None if case.skipped else _measure(case, repeats, args.seed)
            _report(res, case, samples, steps, repeats, args.seed)
        runs = args.repeats or (1 if args.quick else 5)
        for name in args.programs or (ISSUE_38 if args.programs is not None else ()):
            case = _program_case(name)
            samples = None if case.skipped else _measure(case, runs, args.seed)
            _report(res, case, samples, 1, runs, args.seed)
    res.seconds = time.perf_counter() - start
    res.emit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
