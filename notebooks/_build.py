"""Build the notebooks in this folder from the cells below, execute them, save them.

    python notebooks/_build.py            # build, execute and save both notebooks
    python notebooks/_build.py 02         # only those whose name contains "02"

The committed artefacts are the executed ``.ipynb`` files (with outputs, so
they read well on GitHub); this script is how they are made. Cells that
``tests/test_notebooks.py`` inspects carry metadata tags:

* ``report``: the cell's last expression is a ``jc.Report`` (HTML output);
* ``expect-violations-N``: that loop report lists N violations (0: OK);
* ``expect-ok``: that report reads OK;
* ``caught-<kind>``: the cell prints a caught ``jc`` error of that kind.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
KERNEL = "python3"
TIMEOUT = 600


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip())


def code(text: str, *tags: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(textwrap.dedent(text).strip())
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.from_dict(c) for c in cells]  # fresh copies
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"  # stable ids: rebuilding gives small diffs
    nb.metadata["kernelspec"] = {
        "name": KERNEL,
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    return nb


# --------------------------------------------------------------------------
# 01: quickstart

QUICKSTART = [
    md(
        """
        # jaxcontracts in five minutes

        A host-driven JAX loop (`for i in range(n): state = step(state)`) is
        fast only while three things stay true: nothing in it copies device
        arrays to the host, every state buffer is donated (reused in place),
        and nothing recompiles. jaxcontracts turns those facts into contracts
        checked where it is cheapest: when a class is defined, when a step
        compiles, when it is called, and inside a guarded loop.

        This tour defines a state, compiles a step ahead of time, runs it in a
        guarded loop, reads the step's report and watches one mistake get
        caught.
        """
    ),
    code(
        """
        import jax
        import jax.numpy as jnp
        from jaxtyping import Array, Float32

        import jaxcontracts as jc
        """
    ),
    md(
        """
        ## 1. A state: `@jc.state`

        A state class is a frozen dataclass and a pytree. Array fields carry a
        [jaxtyping](https://github.com/patrick-kidger/jaxtyping) annotation
        with a concrete dtype and named dimensions; a `jc.static` field is
        configuration: hashable, part of the tree structure, never a leaf.
        """
    ),
    code(
        """
        @jc.state
        class Particles:
            pos: Float32[Array, "n 3"]
            vel: Float32[Array, "n 3"]
            t: Float32[Array, ""]
            dt: float = jc.static(0.01)
        """
    ),
    md(
        """
        `Particles.spec(n=...)` is the exact type of a state, with no device
        memory behind it (a tree of `jax.ShapeDtypeStruct`); `Particles.zeros`
        is a real one, placed on the device with the exact dtypes. A state's
        repr shows specs, never values, so printing one never reads the
        device.
        """
    ),
    code(
        """
        Particles.spec(n=1024)
        """
    ),
    code(
        """
        Particles.zeros(n=4)
        """
    ),
    md(
        """
        Construction checks every field against its annotation, with the
        named dimensions bound across fields, and reports all problems at
        once:
        """
    ),
    code(
        """
        try:
            Particles(pos=jnp.zeros((4, 3)), vel=jnp.zeros((5, 3)), t=0.0)
        except jc.SpecError as e:
            print(f"SpecError: {e}")
        """,
        "caught-spec",
    ),
    md(
        """
        ## 2. A step: `@jc.hot_step`

        A hot step takes the state and returns the new one. `donate="all"`
        donates every leaf of the state, so XLA updates it in place instead of
        allocating a second copy. The step compiles ahead of time from the
        spec (no data needed); compiling checks that the step returns its
        state with exactly the spec it takes (otherwise the next call would
        recompile) and that XLA really aliases every donated buffer.
        """
    ),
    code(
        """
        @jc.hot_step(signature=Particles, donate="all")
        def advance(p: Particles) -> Particles:
            \"\"\"One semi-implicit Euler step of a unit harmonic oscillator.\"\"\"
            vel = p.vel - p.pos * p.dt
            return p.replace(pos=p.pos + vel * p.dt, vel=vel, t=p.t + p.dt)


        advance.compile(Particles.spec(n=1024))
        advance
        """
    ),
    md(
        """
        ## 3. A guarded loop: `jc.hot_loop`

        Inside `with jc.hot_loop():` an implicit read of a device array
        (`float(x)`, `if x:`, `print(x)`, `np.asarray(x)`, ...), a compile,
        or a read of an array a step consumed is an error, on every backend,
        CPU included. `jc.fetch(tree)` is the deliberate way to read values:
        here every 250 steps, so the host can run ahead of the device in
        between.
        """
    ),
    code(
        """
        def initial_state(n: int = 1024) -> Particles:
            pos = jax.random.normal(jax.random.key(0), (n, 3))
            return Particles(pos=pos, vel=jnp.zeros((n, 3)), t=0.0)


        p = initial_state()
        with jc.hot_loop():
            for i in range(1, 1001):
                p = advance(p)
                if i % 250 == 0:
                    t, pos, vel = jc.fetch((p.t, p.pos, p.vel))
                    energy = 0.5 * (pos**2 + vel**2).sum(axis=1).mean()
                    print(f"step {i:4d}   t = {t:5.2f}   energy per particle = {energy:.4f}")
        """
    ),
    code(
        """
        advance.stats
        """
    ),
    md(
        """
        ## 4. The step's report

        `step.report()` returns a `jc.Report`: per leaf its spec, sharding,
        whether it is donated and whether XLA aliased it; the executable's
        memory analysis; compile time and calls; and every contract with
        pass/fail. `print(report)` gives a text table; in a notebook it
        renders as HTML.
        """
    ),
    code(
        """
        advance.report()
        """,
        "report",
        "expect-ok",
    ),
    md(
        """
        ## 5. A caught mistake

        A stopping condition written the obvious way, `if float(p.t) > 2.5`,
        reads the device on every step: the host waits for each step to
        finish before it can dispatch the next one. Inside a hot loop it is
        caught at once, with the array named (which step produced it, and
        which field) and the line:
        """
    ),
    code(
        """
        p = initial_state()
        try:
            with jc.hot_loop():
                for _ in range(1000):
                    p = advance(p)
                    if float(p.t) > 2.5:
                        break
        except jc.TransferError as e:
            print(f"TransferError: {e}")
        """,
        "caught-transfer",
    ),
    md(
        """
        The fix is to read deliberately and rarely: one `jc.fetch` every 100
        steps costs one sync per 100 steps instead of one per step (and may
        run up to 99 steps past the condition; a step that must stop exactly
        can freeze itself with `jnp.where`).
        """
    ),
    code(
        """
        p = initial_state()
        with jc.hot_loop():
            for i in range(1, 1001):
                p = advance(p)
                if i % 100 == 0 and jc.fetch(p.t) > 2.5:
                    break
        print(f"stopped after {i} steps, at t = {jc.fetch(p.t):.2f}")
        """
    ),
    md(
        """
        ## Next

        [`02_fixing_a_slow_loop.ipynb`](02_fixing_a_slow_loop.ipynb) takes a
        training loop with five such problems, finds them all in one run with
        `jc.hot_loop(on_violation="record")`, and fixes them one by one.
        """
    ),
]


# --------------------------------------------------------------------------
# 02: fixing a slow loop

FIXING = [
    md(
        """
        # Fixing a slow training loop

        A host-driven loop stays fast only while the host never waits for the
        device: no values read back, nothing compiled, every state buffer
        donated and never touched again. This notebook takes a small training
        loop (linear regression with hand-written SGD with momentum) that
        breaks those rules in five places. Four of them only make it slow,
        each forcing a device sync or a compile on every iteration; one is an
        outright bug.

        Instead of hunting for them one at a time, we run the loop once inside
        `jc.hot_loop(on_violation="record")`, which records every violation
        (kind, line, count) instead of raising, and read the report. Then we
        fix the problems one by one, recording again after each fix, until the
        report reads OK.
        """
    ),
    code(
        """
        import jax
        import jax.numpy as jnp
        import numpy as np
        from jaxtyping import Array, Bool, Float32, Int32, PyTree

        import jaxcontracts as jc
        """
    ),
    md(
        """
        ## The problem

        Noisy linear data, `y = x @ w_true + 0.5 + noise`, and a state holding
        the parameters and the optimiser's momentum as `PyTree` fields (their
        spec comes from an instance), a step counter, and a sticky flag that
        records whether every loss so far was finite. The learning rate and
        momentum are `jc.static`: configuration, not data.
        """
    ),
    code(
        """
        N, D = 512, 8
        kx, kw, kn = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(kx, (N, D))
        w_true = jax.random.normal(kw, (D,))
        y = x @ w_true + 0.5 + 0.1 * jax.random.normal(kn, (N,))


        @jc.state
        class Train:
            params: PyTree[Float32[Array, "..."]]    # {"w": f32[D], "b": f32[]}
            velocity: PyTree[Float32[Array, "..."]]  # momentum, same structure
            step: Int32[Array, ""]
            finite: Bool[Array, ""]  # has every loss so far been finite?
            lr: float = jc.static(0.05)
            beta: float = jc.static(0.9)


        def init_params() -> dict:
            return {"w": jnp.zeros(D), "b": jnp.zeros(())}


        def init_state() -> Train:
            params = init_params()
            velocity = jax.tree.map(jnp.zeros_like, params)
            return Train(params=params, velocity=velocity, step=0, finite=True)


        param_spec = jc.spec_of(init_params())
        SPEC = Train.spec(params=param_spec, velocity=param_spec)
        SPEC
        """
    ),
    md(
        """
        The step computes the loss and its gradient, applies SGD with
        momentum, and returns the new state together with a dict of metrics.
        The metrics are a second output, not part of the state, so they are
        not donated: they are safe to keep.
        """
    ),
    code(
        """
        def loss_fn(params, x, y):
            return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


        def global_norm(tree):
            return jnp.sqrt(sum(jnp.vdot(v, v) for v in jax.tree.leaves(tree)))


        def sgd_momentum(s: Train, loss, grads) -> Train:
            velocity = jax.tree.map(lambda v, g: s.beta * v + g, s.velocity, grads)
            params = jax.tree.map(lambda p, v: p - s.lr * v, s.params, velocity)
            finite = s.finite & jnp.isfinite(loss)  # sticky: one NaN sets it for good
            return s.replace(params=params, velocity=velocity, step=s.step + 1, finite=finite)


        @jc.hot_step(signature=Train, donate="all")
        def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
            loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
            return sgd_momentum(s, loss, grads), {"loss": loss}


        train_step.compile(SPEC, x, y)
        N_STEPS, LOG_EVERY = 100, 25
        train_step.report()
        """,
        "report",
        "expect-ok",
    ),
    md(
        """
        The step itself is in order: every state leaf is donated and aliased
        by XLA, the data `x`, `y` are plain inputs. Whatever is slow is in the
        loop.

        ## The loop as first written

        It logs the loss, stops if training diverges, tracks the parameter
        norm, keeps the weight trajectory for a plot, and at the end reports
        how far the last update moved the weights. It looks harmless. We run
        it once in record mode:
        """
    ),
    code(
        """
        s = init_state()
        losses, norms, weights = [], [], []
        try:
            with jc.hot_loop(on_violation="record") as loop:
                for i in range(N_STEPS):
                    prev = s
                    s, metrics = train_step(s, x, y)
                    losses.append(float(metrics["loss"]))
                    if not s.finite:
                        raise FloatingPointError(f"the loss is not finite at step {i}")
                    norms.append(jax.jit(lambda p: global_norm(p))(s.params))
                    weights.append(s.params["w"].tolist())
                # How far did the last update move the weights?
                last_move = np.linalg.norm(np.subtract(weights[-1], prev.params["w"].tolist()))
        except jc.DonationError as e:
            print(f"DonationError: {e}")

        loop.report()
        """,
        "report",
        "expect-violations-5",
    ),
    md(
        """
        One run, five rows: one per line at fault, with how often it happened
        (`where` is file:line; in a notebook the file is the kernel's name for
        the cell):

        | row | line | what it costs |
        |---|---|---|
        | transfer, `float()` | `losses.append(float(metrics["loss"]))` | a device sync every step |
        | transfer, `bool()` | `if not s.finite:` | a device sync every step |
        | compile | `jax.jit(lambda p: ...)(s.params)` | a trace and a compile every step |
        | transfer, `.tolist()` | `weights.append(s.params["w"].tolist())` | a sync and a copy every step |
        | donation | `prev.params["w"].tolist()` | a crash: that buffer no longer exists |

        The last one also stopped the run: a donated buffer is gone, so the
        read cannot go on even in record mode, and the error surfaces when the
        block exits (the violations recorded up to then are kept). We fix it
        first.

        ## Fix 1: don't keep the state you passed to the step

        `prev = s` keeps a reference to the state that the next call consumes:
        `donate="all"` lets XLA reuse its buffers for the new state, so `prev`
        points at deleted arrays (outside `jc.hot_loop` this is a bare
        `RuntimeError: Array has been deleted`). Keeping old states alive would
        also double the loop's memory. The step is the one place where the old
        and the new parameters both exist, so compute what you wanted there,
        the size of the update, and return it as a metric.
        """
    ),
    code(
        """
        @jc.hot_step(signature=Train, donate="all")
        def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
            loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
            new = sgd_momentum(s, loss, grads)
            update = jax.tree.map(jnp.subtract, new.params, s.params)
            return new, {"loss": loss, "update_norm": global_norm(update)}


        train_step.compile(SPEC, x, y);
        """
    ),
    code(
        """
        s = init_state()
        losses, norms, weights = [], [], []
        with jc.hot_loop(on_violation="record") as loop:
            for i in range(N_STEPS):
                s, metrics = train_step(s, x, y)  # fix 1: no `prev`
                losses.append(float(metrics["loss"]))
                if not s.finite:
                    raise FloatingPointError(f"the loss is not finite at step {i}")
                norms.append(jax.jit(lambda p: global_norm(p))(s.params))
                weights.append(s.params["w"].tolist())
        print(f"the last update moved the parameters by {jc.fetch(metrics['update_norm']):.2e}")

        loop.report()
        """,
        "report",
        "expect-violations-4",
    ),
    md(
        """
        ## Fix 2: no `jax.jit` inside the loop

        `jax.jit(lambda p: ...)` makes a new function on every iteration, and
        jax caches compiled code per function, so the loop traces and compiles
        the norm on every step: the compile row's count is the number of
        steps. Creating the jitted function once before the loop (and calling
        it once there, so that its first compile is not in the loop either)
        would fix that. Better still, compute the norm in the step, which has
        the parameters at hand: no extra dispatch at all.
        """
    ),
    code(
        """
        @jc.hot_step(signature=Train, donate="all")
        def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
            loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
            new = sgd_momentum(s, loss, grads)
            update = jax.tree.map(jnp.subtract, new.params, s.params)
            return new, {
                "loss": loss,
                "update_norm": global_norm(update),
                "param_norm": global_norm(new.params),
            }


        train_step.compile(SPEC, x, y);
        """
    ),
    code(
        """
        s = init_state()
        losses, norms, weights = [], [], []
        with jc.hot_loop(on_violation="record") as loop:
            for i in range(N_STEPS):
                s, metrics = train_step(s, x, y)
                losses.append(float(metrics["loss"]))
                if not s.finite:
                    raise FloatingPointError(f"the loss is not finite at step {i}")
                norms.append(metrics["param_norm"])  # fix 2: computed in the step
                weights.append(s.params["w"].tolist())
        print(f"the last update moved the parameters by {jc.fetch(metrics['update_norm']):.2e}")

        loop.report()
        """,
        "report",
        "expect-violations-3",
    ),
    md(
        """
        ## Fix 3: keep the history on the device, fetch it once

        `.tolist()` copies the weights to the host on every step, and the host
        waits for the step to finish before it can. Keeping
        `s.params["w"]` itself in the list would not work either: the next
        step donates it (that would be the donation row again). Instead the
        step returns a copy of the weights among its metrics, which are not
        donated; the loop keeps the metrics as device arrays and fetches the
        whole history in one transfer after the loop. (`np.asarray` instead
        of `.tolist()` would be worse on CPU: it is a view of the device
        buffer, not a copy, so XLA could not reuse that buffer in the next
        step, and the step would raise a `DonationError`.)
        """
    ),
    code(
        """
        @jc.hot_step(signature=Train, donate="all")
        def train_step(s: Train, x: Float32[Array, "n d"], y: Float32[Array, "n"]) -> tuple[Train, dict]:
            loss, grads = jax.value_and_grad(loss_fn)(s.params, x, y)
            new = sgd_momentum(s, loss, grads)
            update = jax.tree.map(jnp.subtract, new.params, s.params)
            return new, {
                "loss": loss,
                "update_norm": global_norm(update),
                "param_norm": global_norm(new.params),
                "w": new.params["w"],  # an output, not the state's buffer: a copy
            }


        train_step.compile(SPEC, x, y);
        """
    ),
    code(
        """
        s = init_state()
        losses, history = [], []
        with jc.hot_loop(on_violation="record") as loop:
            for i in range(N_STEPS):
                s, metrics = train_step(s, x, y)
                losses.append(float(metrics["loss"]))
                if not s.finite:
                    raise FloatingPointError(f"the loss is not finite at step {i}")
                history.append(metrics)  # fix 3: device arrays, no transfer
        history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))
        print({k: v.shape for k, v in history.items()})

        loop.report()
        """,
        "report",
        "expect-violations-2",
    ),
    md(
        """
        ## Fix 4: log with `jc.fetch` every `LOG_EVERY` steps

        `float()` on a device array waits for the step that produces it and
        copies the value: the host can no longer run ahead of the device, so
        every step pays the whole round trip. The full loss curve is in the
        history now; for a progress line, read the loss deliberately with
        `jc.fetch` every `LOG_EVERY` steps: one sync per 25 steps instead of
        one per step.
        """
    ),
    code(
        """
        s = init_state()
        history = []
        with jc.hot_loop(on_violation="record") as loop:
            for i in range(N_STEPS):
                s, metrics = train_step(s, x, y)
                if i % LOG_EVERY == 0:  # fix 4: a deliberate read, now and then
                    print(f"step {i:3d}   loss {jc.fetch(metrics['loss']):.4f}")
                if not s.finite:
                    raise FloatingPointError(f"the loss is not finite at step {i}")
                history.append(metrics)
        history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))

        loop.report()
        """,
        "report",
        "expect-violations-1",
    ),
    md(
        """
        ## Fix 5: no `if` on a device array

        `if not s.finite:` calls `bool()` on a device array: a read and a sync
        on every step, just like `float()`. The step already folds every loss
        into a sticky flag (`finite = s.finite & jnp.isfinite(loss)`), so
        checking it now and then loses nothing: a NaN at step 3 still shows up
        at the next check. Fetch it together with the loss at the logging
        points, and once more after the loop. (A condition that must act at
        once belongs in the step: `jnp.where` or `jax.lax.cond`, e.g. to skip
        the update when the loss is not finite.)
        """
    ),
    code(
        """
        def check_finite(s: Train, i: int) -> None:
            if not jc.fetch(s.finite):
                raise FloatingPointError(f"a loss was not finite by step {i}")


        s = init_state()
        history = []
        with jc.hot_loop(on_violation="record") as loop:
            for i in range(N_STEPS):
                s, metrics = train_step(s, x, y)
                if i % LOG_EVERY == 0:
                    print(f"step {i:3d}   loss {jc.fetch(metrics['loss']):.4f}")
                    check_finite(s, i)  # fix 5: checked with the log line
                history.append(metrics)
        check_finite(s, N_STEPS)
        history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))

        loop.report()
        """,
        "report",
        "expect-violations-0",
        "expect-ok",
    ),
    md(
        """
        The report reads OK: in a hundred steps the host read nothing it did
        not ask for, compiled nothing, and never touched a donated buffer. The
        results are all there, fetched in one go after the loop:
        """
    ),
    code(
        """
        w_final = history["w"][-1]
        print(f"loss          {history['loss'][0]:.4f} -> {history['loss'][-1]:.4f}")
        print(f"|w - w_true|  {np.linalg.norm(w_final - np.asarray(w_true)):.4f}")
        print(f"b             {jc.fetch(s.params['b']):.4f}   (true: 0.5)")
        print(f"param norm    {history['param_norm'][-1]:.4f}")
        print(f"last update   {history['update_norm'][-1]:.2e}")
        """
    ),
    md(
        """
        ## Keep the guard on

        Record mode is for finding problems; once the loop is clean, the
        default `jc.hot_loop()` raises at the first violation, so a problem
        that creeps back in later fails loudly instead of quietly slowing the
        loop down. Here is the clean loop for 1000 steps, guarded:
        """
    ),
    code(
        """
        import time

        s = init_state()
        history = []
        start = time.perf_counter()
        with jc.hot_loop():
            for i in range(1000):
                s, metrics = train_step(s, x, y)
                if i % 250 == 0:
                    check_finite(s, i)
                history.append(metrics)
        history = jax.tree.map(lambda *steps: np.stack(steps), *jc.fetch(history))
        elapsed = time.perf_counter() - start
        print(f"1000 steps in {elapsed * 1e3:.0f} ms: {elapsed * 1e3:.0f} µs per step, the final fetch included")
        """
    ),
    md(
        """
        ## Summary

        | problem | symptom in the report | fix |
        |---|---|---|
        | reading a state after the step donated it | `donation` | compute what you need in the step and return it |
        | `jax.jit(lambda ...)` inside the loop | `compile`, once per step | jit once before the loop, or compute it in the step |
        | `.tolist()` / `np.asarray` history | `transfer`, once per step | return it from the step, keep it on the device, fetch after the loop |
        | `float(loss)` for logging | `transfer`, once per step | `jc.fetch` every `LOG_EVERY` steps |
        | `if` on a device array | `transfer`, `bool()` | a sticky flag in the step, checked periodically; or `jnp.where` / `lax.cond` |
        """
    ),
]


NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_fixing_a_slow_loop.ipynb": FIXING,
}


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    client = NotebookClient(
        nb,
        timeout=TIMEOUT,
        kernel_name=KERNEL,
        record_timing=False,  # no timestamps in the committed files
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def main(argv: list[str]) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    for name, cells in NOTEBOOKS.items():
        if argv and not any(a in name for a in argv):
            continue
        nb = notebook(cells)
        t0 = time.perf_counter()
        execute(nb, HERE)
        print(f"{name}: executed in {time.perf_counter() - t0:.1f} s")
        nbformat.validate(nb)
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    main(sys.argv[1:])
