"""Real programs, as their authors wrote them, ported with the least change.

Each port is the original file with ``jax.jit`` replaced by ``jc.hot_step``
and its loop put in a raising ``jc.hot_loop``; the test runs both, checks the
numbers are the original's, and pins the lines that differ (code lines,
docstrings and comments aside), so a gap closed in the library shows as a
shorter diff.
"""

from __future__ import annotations

import ast
import difflib
import io
import runpy
import subprocess
import sys
import tokenize
from contextlib import redirect_stdout
from pathlib import Path

import pytest

PORTS = Path(__file__).resolve().parent / "ports"


def _code_lines(path: Path) -> list[str]:
    """The file's code lines: no docstrings, no comments, no blank lines."""
    source = path.read_text()
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    comments = {
        tok.start[0]: tok.start[1]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    out = []
    for n, line in enumerate(source.splitlines(), 1):
        if n in doc_lines:
            continue
        text = line[: comments[n]] if n in comments else line
        if text.strip():
            out.append(text.rstrip())
    return out


def _run(path: Path) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    return out.getvalue()


def _added_lines(name: str) -> list[str]:
    original, port = PORTS / f"{name}_original.py", PORTS / f"{name}_port.py"
    changed = [
        line
        for line in difflib.unified_diff(_code_lines(original), _code_lines(port), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return [line[1:].strip() for line in changed if line.startswith("+")]


def _run_apart(path: Path) -> str:
    """stdout of ``path`` run in a fresh interpreter (jax-md keeps a jax array
    in a static field: its second run in one process fails, ours or not)."""
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _same_numbers(name: str) -> None:
    original, port = PORTS / f"{name}_original.py", PORTS / f"{name}_port.py"
    run = _run_apart if name in APART else _run
    expected = run(original)
    assert expected.strip()
    assert run(port) == expected  # the same numbers, to the last digit


APART = {"jaxmd_nve"}


# Per program: the modules it needs, and every code line of the port that is
# not the original's (re-indented lines under the `with` included). A line
# still needed beyond the decorator, the `with` and an explicit read says why.
PROGRAMS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    "nnx_functional": (
        ("flax.nnx", "optax"),
        [
            "import jaxcontracts as jc",  # was: import functools
            '@jc.hot_step(state="state", host="batch")',  # was: functools.partial(jax.jit, donate_argnums=0)
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for step, batch in enumerate(loop.iterate(loader(200))):",
            "loss, state = train_step(state, batch)",  # re-indented under the with
            "if step % 50 == 0:",  # re-indented
            "losses.append(float(jc.fetch(loss)))",  # the one read, made explicit
        ],
    ),
    "nnx_mnist": (
        ("flax.nnx", "optax"),
        [
            "import jaxcontracts as jc",
            # was: @nnx.jit (the step updates the three objects in place, returns nothing)
            '@jc.hot_step(state=("model", "optimizer", "metrics"), host="batch")',
            '@jc.hot_step(state="metrics", host="batch")',  # was: @nnx.jit (eval_step)
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for step, batch in enumerate(loop.iterate(train_ds * 3)):",
            "model.train()",  # re-indented
            "train_step(model, optimizer, metrics, batch)",  # re-indented
            "if step > 0 and step % eval_every == 0:",  # re-indented
            # needed: the evaluation every eval_every steps is a cold branch (its first
            # compiles come after the loop's first pass; metrics.reset() makes arrays)
            'with jc.hot_loop(transfers="allow", compiles="allow"):',
            "for metric, value in metrics.compute().items():",  # re-indented
            'history[f"train_{metric}"].append(float(value))',  # re-indented
            "metrics.reset()",  # re-indented
            "model.eval()",  # re-indented
            "for test_batch in test_ds:",  # re-indented
            "eval_step(model, metrics, test_batch)",  # re-indented
            "for metric, value in metrics.compute().items():",  # re-indented
            'history[f"test_{metric}"].append(float(value))',  # re-indented
            "metrics.reset()",  # re-indented
        ],
    ),
    "nnx_trainer": (
        ("flax.nnx", "optax", "orbax.checkpoint", "absl"),
        [
            "import jaxcontracts as jc",
            # was: functools.partial(jax.jit, donate_argnames=("model", "optimizer"))
            '@jc.hot_step(state=("model", "optimizer"), host="batch")',
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for step in loop.iterate(range(60)):",
            "batch = next(data)",  # re-indented
            "model, optimizer, loss = train_step(model, optimizer, batch)",  # re-indented
            "if step % 10 == 0:",  # re-indented
            "losses.append(round(float(jc.fetch(loss)), 5))",  # the logged read, made explicit
            'logging.info("step %d: loss %.5f", step, losses[-1])',  # re-indented
            "if step % 20 == 0:",  # re-indented
            # needed: orbax keeps what it saves while the loop goes on: a copy of its own
            # in host memory, made asynchronously (the save stays asynchronous)
            "manager.save(step, args=ocp.args.StandardSave(jc.to_host(nnx.state(model))))",
        ],
    ),
    "cookbook_refs": (
        (),
        [
            "import jaxcontracts as jc",
            # was: functools.partial(jax.jit, static_argnums=0); the refs are the state,
            # updated in place (their arrays donated and put back into them)
            '@jc.hot_step(state="train_state", static="config", host="batch")',
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for step in loop.iterate(range(config.steps)):",
            "batch = next(data)",  # re-indented
            "metrics = train_step(config, train_state, batch)",  # re-indented
            "if step % 20 == 0:",  # re-indented
            'history.append(round(float(jc.fetch(metrics["loss"])), 5))',  # the logged read, made explicit
        ],
    ),
    "diffrax_manual": (
        ("diffrax",),
        [
            "import jaxcontracts as jc",
            # was: eqx.filter_jit(solver.step); the solution and the solver state carried,
            # the loop's Python-float times declared host data, made_jump a static flag
            'step = jc.hot_step(solver.step, state=("y0", "solver_state"), host=("t0", "t1"), static="made_jump")',
            # (y = y0 as the original writes it: the first call donates y0 too, as
            # under jax.jit with donation, and a later read of y0 would name the step)
            'with jc.hot_loop(compiles="warmup"):',
            "while tprev < t1:",  # re-indented
            "y, _, _, state, _ = step(term, tprev, tnext, y, args, state, made_jump=False)",  # re-indented
            "values.append(round(float(jc.fetch(y)[0]), 6))",  # the read, made explicit
            "tprev = tnext",  # re-indented
            "tnext = min(tprev + dt0, t1)",  # re-indented
        ],
    ),
    "mjx_rollout": (
        ("mujoco.mjx",),
        [
            "import jaxcontracts as jc",
            'jit_step = jc.hot_step(mjx.step, state="d")',  # was: jax.jit(mjx.step)
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for i in loop.iterate(range(100)):",
            "mjx_data = jit_step(mjx_model, mjx_data)",  # re-indented
            "if i % 25 == 0:",  # re-indented
            "trajectory.append([round(float(q), 5) for q in jc.fetch(mjx_data.qpos)])",  # the read
        ],
    ),
    "equinox_stateful": (
        ("equinox", "optax"),
        [
            "import jaxcontracts as jc",
            '@jc.hot_step(state=("model", "state", "opt_state"))',  # was: @eqx.filter_jit
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for _ in loop.iterate(range(steps)):",
            "model, state, opt_state = make_step(model, state, opt_state, xs, ys)",  # re-indented
        ],
    ),
    "equinox_mnist": (
        ("equinox", "optax"),
        [
            "import jaxcontracts as jc",
            '@jc.hot_step(state=("model", "opt_state"), host=("x", "y"))',  # was: @eqx.filter_jit
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for step, (x, y) in loop.iterate(zip(range(STEPS), infinite_trainloader())):",
            "model, opt_state, train_loss = make_step(model, opt_state, x, y)",  # re-indented
            "if (step % PRINT_EVERY) == 0 or (step == STEPS - 1):",  # re-indented
            'print(f"step={step}, train_loss={jc.fetch(train_loss).item():.6f}")',  # the read
        ],
    ),
    "blackjax_nuts": (
        ("blackjax",),
        [
            "import jaxcontracts as jc",
            'step = jc.hot_step(nuts.step, state="state")',  # was: jax.jit(nuts.step)
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for _ in loop.iterate(range(300)):",
            "key, sub = jax.random.split(key)",  # re-indented
            "state, info = step(sub, state)",  # re-indented
            # needed: the next call donates state.position; a kept sample must be a
            # copy (refused at `full` before dispatch, with this fix)
            "samples.append(jnp.copy(state.position))",
        ],
    ),
    "evosax_cmaes": (
        ("evosax",),
        [
            "import jaxcontracts as jc",
            "params = jc.device_tree(params)",  # needed: Python floats in params (a transfer per call)
            "state = jc.device_tree(state)",  # needed: init's weak scalars, tell's strong ones (jax.jit recompiles)
            'ask = jc.hot_step(es.ask, state="state")',
            "evaluate = jc.hot_step(jax.vmap(rosenbrock), stateless=True)",
            'tell = jc.hot_step(es.tell, state="state")',
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for generation in loop.iterate(range(50)):",
            "key, key_ask, key_tell = jax.random.split(key, 3)",  # re-indented
            "population, state = ask(key_ask, state, params)",  # re-indented
            "fitness = evaluate(population)",  # re-indented
            "state, metrics = tell(key_tell, population, fitness, state, params)",  # re-indented
            "if generation % 10 == 0:",  # re-indented
            "print(f\"generation {generation}: best fitness {jc.fetch(metrics['best_fitness']):.6f}\")",
        ],
    ),
    "flax_mnist": (
        ("flax.linen", "optax"),
        [
            "import jaxcontracts as jc",
            '@jc.hot_step(state="state", host="batch")',  # was: @jax.jit
            '@jc.hot_step(stateless=True, host="batch")',  # was: @jax.jit (eval_step: it reads the params)
            "state = jc.device_tree(state)",  # needed: TrainState.create(step=0), a Python int
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for epoch in loop.iterate(range(1, 4)):",
            "state = train_epoch(state, train_ds, 32, epoch, rng)",  # re-indented
            "test_loss, test_accuracy = eval_model(state.params, test_ds)",  # re-indented
            'print(f" test epoch: {epoch}, loss: {test_loss:.4f}, accuracy: {test_accuracy * 100:.2f}")',
        ],
    ),
    "nanodo_lm": (
        ("flax.linen", "optax"),
        [
            "import jaxcontracts as jc",
            # was: six lines of jax.jit(..., in_shardings, out_shardings, donate_argnums=0)
            'self.step_fn = jc.hot_step(functools.partial(_train_step, mesh=mesh), state="state", host="in_BxL")',
            "return int(jc.fetch(self.state.step))",  # the read in the loop's range(), made explicit
            "state = jc.device_tree(state)",  # needed: a weak step counter the step returns strong
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for step in loop.iterate(range(trainer.step, c.num_train_steps + 1)):",
            "in_BxL = next(train_iter)",  # re-indented
            "new = trainer.do_step(in_BxL)",  # re-indented
            "process_metrics(step - 1, pending)",  # re-indented
            "pending = new",  # re-indented
        ],
    ),
    "gymnax_ppo": (
        ("gymnax", "optax", "flax.linen"),
        [
            "import jaxcontracts as jc",
            # was: jax.jit(update, static_argnames="config", donate_argnums=0)
            'update = jc.hot_step(update, state="runner_state", static="config")',
            "runner_state = jc.device_tree(runner_state)",  # needed: TrainState.create(step=0), a Python int
            'with jc.hot_loop(compiles="warmup") as loop:',
            "for i in loop.iterate(range(20)):",
            "runner_state, metrics = update(runner_state, config=config)",  # re-indented
            "if (i + 1) % 5 == 0:",  # re-indented
            "print(f\"update {i + 1}: episode return {float(jc.fetch(metrics['return'])):.6f}, "
            "loss {float(jc.fetch(metrics['loss'])):.6f}\")",  # the reads
        ],
    ),
    "jaxmd_nve": (
        ("jax_md",),
        [
            "import jaxcontracts as jc",
            # needed: donate="none" (the loop rolls back to the old state on overflow);
            # max_compiles=2 (a reallocated list has a new static max_occupancy)
            '@jc.hot_step(state=("state", "nbrs"), donate="none", max_compiles=2)',
            '@jc.hot_step(stateless=True, max_compiles=2)',  # total_energy reads the state
            # needed: transfers= (nbrs.did_buffer_overflow is an eager `code & <Python int>`)
            'with jc.hot_loop(compiles="warmup", transfers="allow_host_to_device") as loop:',
            "for _ in loop.iterate(range(20)):",
            "new_state, nbrs = simulation_step(state, nbrs)",  # re-indented
            "if jc.fetch(nbrs.did_buffer_overflow):",  # the read
            'print("Neighbor list overflowed, reallocating.")',  # re-indented
            # needed: the cold branch, marked: allocate reads the device to size the
            # list, and the new signatures compile here, not in the hot loop
            'with jc.hot_loop(transfers="allow", compiles="allow"):',
            "nbrs = neighbor_fn.allocate(state.position)",
            "simulation_step.compile(state, nbrs)",
            "total_energy.compile(state, nbrs)",
            "else:",  # re-indented
            "state = new_state",  # re-indented
            "step += 1",  # re-indented
            'print(f"step {step}: E = {float(jc.fetch(total_energy(state, nbrs))):.6f}")',  # the read
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_program_ports_with_a_decorator_and_a_with(name):
    modules, expected = PROGRAMS[name]
    for module in modules:
        pytest.importorskip(module)
    _same_numbers(name)
    assert _added_lines(name) == expected
