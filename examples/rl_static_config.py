"""A policy-gradient loop with a carried PRNG key and static configuration.

A linear Gaussian policy learns to move a point to a target. The rollout and
the update carry an ``Agent`` state (its PRNG key included); the
configuration and the environment's step function are *static* arguments
(hashable, part of the compiled signature: a new value would be a new
compile, refused in the loop); the advantage estimator ``compute_gae`` is a
*stateless* hot step on plain arrays.

The key is a raw ``jax.random.PRNGKey`` (uint32[2]): typed keys
(``jax.random.key``) as state leaves arrive with another change.

Run: python examples/rl_static_config.py
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32, UInt32

import jaxcontracts as jc


@dataclasses.dataclass(frozen=True)
class Config:
    horizon: int = 32
    gamma: float = 0.95
    lam: float = 0.9
    lr: float = 0.02
    noise: float = 0.3


def reach(pos: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The environment: move by a clipped action; reward is minus the distance to 1."""
    new = pos + 0.1 * jnp.clip(action, -1.0, 1.0)
    return new, -jnp.abs(new - 1.0)


@jc.state
class Agent:
    policy: Float32[Array, "2"]  # action mean = policy[0] * pos + policy[1]
    critic: Float32[Array, "2"]  # value = critic[0] * pos + critic[1]
    key: UInt32[Array, "2"]


@jc.hot_step(signature=Agent, static=("config", "env"))
def rollout(agent: Agent, config: Config, env) -> tuple[Agent, dict]:
    key, sub = jax.random.split(agent.key)
    noise = config.noise * jax.random.normal(sub, (config.horizon,), jnp.float32)

    def act(pos, eps):
        action = agent.policy[0] * pos + agent.policy[1] + eps
        new, reward = env(pos, action)
        return new, (pos, action, reward)

    _, (obs, actions, rewards) = jax.lax.scan(act, jnp.float32(0), noise)
    values = agent.critic[0] * obs + agent.critic[1]
    traj = {"obs": obs, "actions": actions, "rewards": rewards, "values": values}
    return Agent(policy=agent.policy, critic=agent.critic, key=key), traj


@jc.hot_step(stateless=True, static=("config",))
def compute_gae(
    rewards: Float32[Array, " t"], values: Float32[Array, " t"], config: Config
) -> Float32[Array, " t"]:
    next_values = jnp.append(values[1:], jnp.float32(0))
    deltas = rewards + config.gamma * next_values - values

    def back(carry, delta):
        carry = delta + config.gamma * config.lam * carry
        return carry, carry

    _, adv = jax.lax.scan(back, jnp.float32(0), deltas, reverse=True)
    return adv


@jc.hot_step(signature=Agent, static=("config",))
def update(agent: Agent, traj: dict, adv: Float32[Array, " t"], config: Config) -> Agent:
    def policy_loss(policy):
        mean = policy[0] * traj["obs"] + policy[1]
        logp = -((traj["actions"] - mean) ** 2) / (2 * config.noise**2)
        return -(logp * adv).mean()

    def critic_loss(critic):
        target = traj["values"] + adv
        return ((critic[0] * traj["obs"] + critic[1] - target) ** 2).mean()

    policy = agent.policy - config.lr * jax.grad(policy_loss)(agent.policy)
    critic = agent.critic - 0.1 * jax.grad(critic_loss)(agent.critic)
    return Agent(policy=policy, critic=critic, key=agent.key)


def main(iterations: int = 150) -> float:
    config = Config()
    agent = Agent(
        policy=jnp.zeros(2, jnp.float32),
        critic=jnp.zeros(2, jnp.float32),
        key=jax.random.PRNGKey(0),
    )
    # One call of each outside the loop compiles them (explicit .compile works too).
    agent, traj = rollout(agent, config, reach)
    adv = compute_gae(traj["rewards"], traj["values"], config)
    agent = update(agent, traj, adv, config)
    first = jc.fetch(traj["rewards"]).mean()

    returns = []
    with jc.hot_loop():  # raising: a read, a transfer or a compile here is an error
        for _ in range(iterations):
            agent, traj = rollout(agent, config, reach)
            adv = compute_gae(traj["rewards"], traj["values"], config)
            agent = update(agent, traj, adv, config)
            returns.append(traj["rewards"])
    last = jc.fetch(returns[-1]).mean()
    print(f"mean reward: first rollout {first:.3f}, last rollout {last:.3f}")
    print(f"compiles: rollout {rollout.stats.compiles}, gae {compute_gae.stats.compiles}, "
          f"update {update.stats.compiles}")
    assert last > first, (first, last)
    return float(last)


if __name__ == "__main__":
    main()
