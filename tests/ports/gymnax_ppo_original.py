"""PPO on gymnax's CartPole-v1, as gymnax users write it: a flax linen
actor-critic, an optax TrainState, a jitted update with a static config that
rolls out with lax.scan over env.step, computes GAE and runs minibatch
epochs, driven from a Python loop."""
from typing import NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState
from gymnax.wrappers.purerl import LogWrapper


class Config(NamedTuple):
    num_envs: int = 4
    num_steps: int = 32
    num_minibatches: int = 4
    update_epochs: int = 2
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    lr: float = 5e-3


class ActorCritic(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, x):
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


def calculate_gae(traj_batch, last_val, *, config):
    def get_advantages(carry, transition):
        gae, next_value = carry
        delta = transition.reward + config.gamma * next_value * (1 - transition.done) - transition.value
        gae = delta + config.gamma * config.gae_lambda * (1 - transition.done) * gae
        return (gae, transition.value), gae

    _, advantages = jax.lax.scan(
        get_advantages, (jnp.zeros_like(last_val), last_val), traj_batch, reverse=True
    )
    return advantages, advantages + traj_batch.value


def loss_fn(params, traj_batch, gae, targets, *, config):
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


def update(runner_state, *, config):
    train_state, env_state, last_obs, rng = runner_state

    def env_step(carry, _):
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

    def update_epoch(carry, _):
        train_state, rng = carry
        rng, _rng = jax.random.split(rng)
        batch_size = config.num_envs * config.num_steps
        permutation = jax.random.permutation(_rng, batch_size)
        batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), (traj_batch, advantages, targets))
        shuffled = jax.tree.map(lambda x: jnp.take(x, permutation, axis=0), batch)
        minibatches = jax.tree.map(
            lambda x: x.reshape((config.num_minibatches, -1) + x.shape[1:]), shuffled
        )

        def update_minibatch(train_state, minibatch):
            traj, gae, target = minibatch
            loss, grads = jax.value_and_grad(loss_fn)(train_state.params, traj, gae, target, config=config)
            return train_state.apply_gradients(grads=grads), loss

        train_state, losses = jax.lax.scan(update_minibatch, train_state, minibatches)
        return (train_state, rng), losses

    (train_state, rng), losses = jax.lax.scan(update_epoch, (train_state, rng), None, config.update_epochs)
    metrics = {"return": traj_batch.info["returned_episode_returns"][-1].mean(), "loss": losses.mean()}
    return (train_state, env_state, last_obs, rng), metrics


update = jax.jit(update, static_argnames="config", donate_argnums=0)

config = Config()
rng = jax.random.PRNGKey(0)
rng, init_rng, reset_rng = jax.random.split(rng, 3)
params = network.init(init_rng, jnp.zeros(env.observation_space(env_params).shape))
tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.lr, eps=1e-5))
train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_rng, config.num_envs), env_params)
runner_state = (train_state, env_state, obsv, rng)

for i in range(20):
    runner_state, metrics = update(runner_state, config=config)
    if (i + 1) % 5 == 0:
        print(f"update {i + 1}: episode return {float(metrics['return']):.6f}, loss {float(metrics['loss']):.6f}")
