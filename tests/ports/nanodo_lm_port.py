"""The nanodo-shaped decoder-only LM, ported to jaxcontracts: the Trainer's
jax.jit replaced by jc.hot_step (donation, in and out shardings derived from
the state), the training loop put in jc.hot_loop. The reads were already
explicit (jax.device_get)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import dataclasses  # noqa: E402
import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax.training.train_state import TrainState  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcontracts as jc  # noqa: E402


@dataclasses.dataclass(frozen=True)
class DoConfig:
    D: int = 32  # model dim
    H: int = 4  # heads
    L: int = 16  # context length
    N: int = 2  # blocks
    V: int = 64  # vocab (0 is padding)
    F: int = 64  # MLP inner dim


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 16
    num_train_steps: int = 20
    warmup_steps: int = 5
    peak_learning_rate: float = 1e-2
    final_learning_rate: float = 1e-3
    weight_decay: float = 0.1
    write_train_metrics_every_steps: int = 5
    seed: int = 0


def fsdp(init, axes):
    """Kernel init annotated with the mesh axes it is sharded over."""
    return nn.with_partitioning(init, axes)


class CausalAttn(nn.Module):
    cfg: DoConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        cfg = self.cfg
        Dh = cfg.D // cfg.H
        proj = functools.partial(
            nn.DenseGeneral,
            features=(cfg.H, Dh),
            use_bias=False,
            kernel_init=fsdp(nn.initializers.xavier_uniform(), ("data", None, None)),
        )
        q_BxLxHxDh = proj(name="query")(x_BxLxD) / Dh**0.5
        k_BxLxHxDh = proj(name="key")(x_BxLxD)
        v_BxLxHxDh = proj(name="value")(x_BxLxD)
        att_BxHxLxL = jnp.einsum("blhd,bmhd->bhlm", q_BxLxHxDh, k_BxLxHxDh)
        L = x_BxLxD.shape[1]
        causal_1x1xLxL = jnp.tril(jnp.ones((1, 1, L, L), dtype=bool))
        att_BxHxLxL = jnp.where(causal_1x1xLxL, att_BxHxLxL, jnp.finfo(jnp.float32).min)
        att_BxHxLxL = jax.nn.softmax(att_BxHxLxL, axis=-1)
        out_BxLxHxDh = jnp.einsum("bhlm,bmhd->blhd", att_BxHxLxL, v_BxLxHxDh)
        return nn.DenseGeneral(
            features=cfg.D,
            axis=(-2, -1),
            use_bias=False,
            kernel_init=fsdp(nn.initializers.xavier_uniform(), (None, None, "data")),
            name="attn_out_proj",
        )(out_BxLxHxDh)


class Mlp(nn.Module):
    cfg: DoConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        dense = functools.partial(
            nn.Dense,
            use_bias=False,
            kernel_init=fsdp(nn.initializers.xavier_uniform(), ("data", None)),
        )
        return dense(self.cfg.D)(jax.nn.gelu(dense(self.cfg.F)(x_BxLxD)))


class TBlock(nn.Module):
    cfg: DoConfig

    @nn.compact
    def __call__(self, in_BxLxD):
        x_BxLxD = in_BxLxD + CausalAttn(self.cfg)(nn.LayerNorm(use_bias=False)(in_BxLxD))
        return x_BxLxD + Mlp(self.cfg)(nn.LayerNorm(use_bias=False)(x_BxLxD))


class TransformerDo(nn.Module):
    cfg: DoConfig

    def setup(self):
        embed_init = fsdp(nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0), ("data", None))
        self.embed = nn.Embed(self.cfg.V, self.cfg.D, embedding_init=embed_init)
        self.pos_embed = nn.Embed(self.cfg.L, self.cfg.D, embedding_init=embed_init)
        self.blocks = [TBlock(self.cfg) for _ in range(self.cfg.N)]
        self.out_ln = nn.LayerNorm(use_bias=False)

    def __call__(self, y_BxL):
        y_BxLxD = self.embed(y_BxL) + self.pos_embed(jnp.arange(y_BxL.shape[1])[None])
        for block in self.blocks:
            y_BxLxD = block(y_BxLxD)
        return self.embed.attend(self.out_ln(y_BxLxD))


def get_optimizer(c):
    schedule = optax.join_schedules(
        [
            optax.linear_schedule(0.0, c.peak_learning_rate, c.warmup_steps),
            optax.cosine_decay_schedule(
                c.peak_learning_rate,
                c.num_train_steps - c.warmup_steps,
                alpha=c.final_learning_rate / c.peak_learning_rate,
            ),
        ],
        boundaries=[c.warmup_steps],
    )
    adamw = optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=c.weight_decay)
    return optax.MultiSteps(adamw, every_k_schedule=1)


def get_loss_fn(in_BxL, apply_fn):
    """Next-token cross-entropy, padding (token 0) and the last position masked."""

    def loss_fn(params):
        logits_BxLxV = apply_fn({"params": params}, in_BxL)
        y_BxL = jnp.roll(in_BxL, -1, axis=1)
        mask_BxL = (y_BxL != 0).at[:, -1].set(False)
        losses_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, y_BxL)
        ntokens = mask_BxL.sum()
        return (losses_BxL * mask_BxL).sum() / ntokens, ntokens

    return loss_fn


def _train_step(state, in_BxL, mesh):
    in_BxL = jax.lax.with_sharding_constraint(in_BxL, NamedSharding(mesh, P("data")))
    grad_fn = jax.value_and_grad(get_loss_fn(in_BxL, state.apply_fn), has_aux=True)
    (loss, ntokens), grads = grad_fn(state.params)
    updates, new_opt_state = state.tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.opt_state.gradient_step + 1,
        params=optax.apply_updates(state.params, updates),
        opt_state=new_opt_state,
    )
    metrics = {
        "train_loss": loss,
        "train_ntokens": ntokens,
        "grads/all/rms": optax.tree.norm(grads),
    }
    return new_state, metrics


def _init_train_state(c, cfg, model, rng, mesh):
    inputs = jax.ShapeDtypeStruct((1, cfg.L), jnp.int32)

    def init(rng, inputs):
        params = model.init(rng, inputs)["params"]
        return TrainState.create(apply_fn=model.apply, params=params, tx=get_optimizer(c))

    shardings = nn.get_sharding(jax.eval_shape(init, rng, inputs), mesh)
    return shardings, jax.jit(init, out_shardings=shardings)(rng, inputs)


class Trainer:
    def __init__(self, state, mesh, shardings):
        self.state = state
        self.step_fn = jc.hot_step(functools.partial(_train_step, mesh=mesh), state="state", host="in_BxL")

    @property
    def step(self):
        return int(jc.fetch(self.state.step))  # read once, by the loop header inside the hot_loop

    def do_step(self, in_BxL):
        self.state, metrics = self.step_fn(self.state, in_BxL)
        return metrics


def train_iterator(c, cfg):
    """Token sequences counting up by a per-row stride, mod V-1 (never 0)."""
    rng = np.random.default_rng(c.seed)
    while True:
        start = rng.integers(0, cfg.V - 1, size=(c.batch_size, 1))
        stride = rng.integers(1, 4, size=(c.batch_size, 1))
        yield (1 + (start + stride * np.arange(cfg.L)) % (cfg.V - 1)).astype(np.int32)


def train_and_evaluate(c, cfg):
    mesh = Mesh(np.array(jax.devices()), ("data",))
    model = TransformerDo(cfg)
    shardings, state = _init_train_state(c, cfg, model, jax.random.PRNGKey(c.seed), mesh)
    state = jc.device_tree(state)  # needed: TrainState.create(step=0) under jax.jit gives a weakly typed step; _train_step returns it strongly typed
    trainer = Trainer(state, mesh, shardings)
    train_iter = train_iterator(c, cfg)

    def process_metrics(step, metrics):
        if metrics is not None and step % c.write_train_metrics_every_steps == 0:
            metrics = jax.device_get(metrics)
            print(
                f"step {step}: loss {metrics['train_loss']:.4f}, "
                f"tokens {metrics['train_ntokens']}, grad norm {metrics['grads/all/rms']:.4f}"
            )

    pending = None
    with jc.hot_loop(compiles="warmup") as loop:
        for step in loop.iterate(range(trainer.step, c.num_train_steps + 1)):
            in_BxL = next(train_iter)
            new = trainer.do_step(in_BxL)
            # Read the previous step's metrics while this one runs.
            process_metrics(step - 1, pending)
            pending = new
    process_metrics(c.num_train_steps, pending)
    print(f"final step {trainer.step}, {len(jax.devices())} device(s)")


train_and_evaluate(TrainConfig(), DoConfig())
