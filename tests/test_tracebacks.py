"""A contract error's traceback ends at the user's line (issue 21).

As JAX's own errors do: every frame of ours (and JAX's, numpy's, the standard
library's, a dataclass's generated method) is removed at the outermost frame
of ours the error crossed, unless ``JAX_TRACEBACK_FILTERING`` (JAX's
``jax_traceback_filtering`` option) is ``off``; then every frame is kept.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sysconfig
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float32

import jaxcontracts as jc
from jaxcontracts._tracebacks import is_library

PACKAGE = os.path.dirname(jc.__file__) + os.sep


@jc.state
class S:
    x: Float32[Array, "n"]


@jc.hot_step(signature=S, donate="all")
def advance(s: S) -> S:
    return S(x=s.x + 1)


class Stepper:
    @jc.hot_step(signature=S, donate="all")
    def step(self, s: S) -> S:
        return S(x=s.x * 2)


@dataclasses.dataclass
class Holder:  # a plain dataclass holding an array: its generated __repr__ reads it
    w: jax.Array


def _frames(err: BaseException) -> list[traceback.FrameSummary]:
    """The frames below the test's own (the first entry is the raising test line)."""
    return traceback.extract_tb(err.__traceback__)[1:]


def _library(frames: list[traceback.FrameSummary]) -> list[str]:
    return [f"{f.filename}:{f.lineno} {f.name}" for f in frames if is_library(f.filename, False, f.name)]


def _ours(frames: list[traceback.FrameSummary]) -> list[str]:
    return [f"{f.filename}:{f.name}" for f in frames if f.filename.startswith(PACKAGE)]


def compile_refused_in_loop():
    s = advance(S(x=jnp.zeros(3)))
    other = S(x=jnp.zeros(5))
    with jc.hot_loop():
        s = advance(s)
        advance(other)


def float_read_in_loop():
    s = advance(S(x=jnp.zeros(3)))
    with jc.hot_loop():
        s = advance(s)
        float(s.x[0]) if False else float(s.x.sum())


def eager_compile_in_loop():
    s = advance(S(x=jnp.zeros(3)))
    with jc.hot_loop():
        s = advance(s)
        jnp.sin(s.x)


def recompile_outside_loop():
    advance(S(x=jnp.zeros(3)))
    advance(S(x=jnp.zeros(7)))


def first_call_refused():
    @jc.hot_step(signature=S, donate="all")
    def twice(s: S, t: S) -> S:
        return S(x=s.x + t.x)

    s = S(x=jnp.zeros(3))
    twice(s, s)  # one buffer donated twice


def method_step_refused():
    stepper = Stepper()
    stepper.step(S(x=jnp.zeros(3)))
    stepper.step(S(x=jnp.zeros(9)))


def decorated_loop_read():
    s = advance(S(x=jnp.zeros(3)))

    @jc.hot_loop()
    def run(s: S) -> float:
        s = advance(s)
        return float(s.x.sum())

    run(s)


def spec_error_at_construction():
    S(x=np.zeros(3, np.int32))


def definition_error_at_decoration():
    @jc.hot_step(signature=S)
    def f(s):
        return s


def definition_error_of_a_state_class():
    @jc.state
    class Bad:
        x: int = 3  # noqa: F841 - never built


def donated_read_outside_loop():
    s = S(x=jnp.zeros(3))
    advance(s)
    return s.x


def donated_read_inside_loop():
    s = advance(S(x=jnp.zeros(3)))
    with jc.hot_loop():
        old = s
        s = advance(s)
        old.x + 1


def donated_read_in_a_recording_loop():
    s = advance(S(x=jnp.zeros(3)))
    with jc.hot_loop(on_violation="record"):
        old = s
        s = advance(s)
        old.x + 1  # JAX's error, translated as it leaves the loop


def device_tree_refused():
    jc.device_tree({"a": object()})


def spec_from_a_class():
    S.spec(m=3)


SCENARIOS = [
    compile_refused_in_loop,
    float_read_in_loop,
    eager_compile_in_loop,
    recompile_outside_loop,
    first_call_refused,
    method_step_refused,
    decorated_loop_read,
    spec_error_at_construction,
    definition_error_at_decoration,
    definition_error_of_a_state_class,
    donated_read_outside_loop,
    donated_read_inside_loop,
    donated_read_in_a_recording_loop,
    device_tree_refused,
    spec_from_a_class,
]


@pytest.fixture
def filtering_off():
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")
    yield
    jax.config.update("jax_traceback_filtering", before)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_a_contract_error_traceback_holds_no_library_frame(scenario):
    with pytest.raises(jc.ContractError) as info:
        scenario()
    frames = _frames(info.value)
    assert not _library(frames), "\n".join(_library(frames))
    # It ends at the user's line: the scenario's own frame (or a function of it) is last.
    assert frames and frames[-1].filename == __file__, frames


def test_a_runtime_error_translated_as_it_leaves_the_loop_ends_at_the_line_that_raised_it():
    # raised from the loop's exit, it keeps the traceback of JAX's error: the
    # user's line that read the array last, not the `with` statement
    with pytest.raises(jc.DonationError) as info:
        donated_read_in_a_recording_loop()
    assert _frames(info.value)[-1].line == "old.x + 1  # JAX's error, translated as it leaves the loop"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_with_filtering_off_every_frame_is_kept(scenario, filtering_off):
    with pytest.raises(jc.ContractError) as info:
        scenario()
    assert _ours(_frames(info.value)), "no frame of jaxcontracts with JAX_TRACEBACK_FILTERING=off"


def test_the_issue_s_compile_refusal_lost_its_ten_library_frames(filtering_off):
    """Before: ten frames of ours (_timing.call ... _guard.violation) above the
    message. With filtering off they are there (four since timing moved into
    the closure: guarded_full, slow_call, _decide, _signature_for); the
    trimmed tests above show they go."""
    with pytest.raises(jc.RecompileError) as info:
        compile_refused_in_loop()
    assert len(_ours(_frames(info.value))) >= 4


def test_a_read_caught_inside_the_loop_is_trimmed_there_too():
    """A read's interceptor is the outermost frame: trimmed before the loop ends.
    (A compile refused from inside JAX keeps JAX's frames above it until the
    error leaves the loop, whose exit trims them.)"""
    s = advance(S(x=jnp.zeros(3)))
    with pytest.raises(jc.TransferError):  # caught inside, it fails the loop at its exit
        with jc.hot_loop(on_violation="raise"):
            s = advance(s)
            try:
                s.x.tolist()
            except jc.TransferError as e:
                caught = e
                frames = traceback.extract_tb(caught.__traceback__)
    assert [f.filename for f in frames] == [__file__]


@pytest.mark.parametrize("filtering", ["auto", "off"])
def test_an_error_of_the_user_s_step_ends_at_the_user_s_lines_as_under_jax_jit(filtering):
    """A bug in the user's step raised while it traces: the caller's line and
    the user's raising line, as ``jax.jit`` shows them; the library's frames
    (about ten) were between them. ``JAX_TRACEBACK_FILTERING=off`` keeps all."""

    @jc.hot_step(signature=S, donate="all")
    def broken(s: S) -> S:
        raise ValueError("the user's own bug")

    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", filtering)
    try:
        with pytest.raises(ValueError) as info:
            broken(S(x=jnp.zeros(3)))
    finally:
        jax.config.update("jax_traceback_filtering", before)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].name == "broken"  # the user's raising line is there
    ours = [f for f in frames if f.filename.startswith(PACKAGE)]
    assert (ours == []) == (filtering == "auto"), frames
    if filtering == "auto":
        assert [f.name for f in frames] == [frames[0].name, "broken"], frames
        # said, as JAX says it of its own frames: a library bug must not read as the user's
        assert any("frames and JAX's are left out" in n for n in info.value.__notes__)


def test_print_of_a_dataclass_in_a_loop_is_blamed_on_the_user_s_line():
    """dataclasses generate ``__repr__`` from ``<string>``: the read is the user's ``print``."""
    s = advance(S(x=jnp.zeros(3)))
    with pytest.raises(jc.TransferError) as info:
        with jc.hot_loop():
            s = advance(s)
            print(Holder(w=s.x))  # the line the message names
    text = str(info.value)
    assert "<string>" not in text
    assert "print(Holder(w=s.x))" in text
    assert f"{os.path.basename(__file__)}:" in text


def test_the_library_test_names_generated_dunders_only():
    assert is_library("<string>", False, "__repr__")
    assert not is_library("<string>", False, "user_code")  # exec'd user code is the user's
    assert not is_library(__file__, False, "test")
    assert is_library(jc._tracebacks.__file__, False, "trim")
    assert not is_library(os.path.join(PACKAGE, "demo", "x.py"), False, "run")  # the public demo
    # an installed package is library code only where `installed` is asked:
    # pyenv's and Debian's site-packages sit in the standard library's folder
    stdlib = sysconfig.get_paths()["stdlib"]
    assert is_library(os.path.join(stdlib, "contextlib.py"), False, "__exit__")
    assert not is_library(os.path.join(stdlib, "site-packages", "optax", "x.py"), False, "update")
    assert is_library(os.path.join(stdlib, "site-packages", "optax", "x.py"), True, "update")


def _folder(root, name, record):
    """A package `name` in `root` with a dist-info (RECORD listing its files
    when `record`) or, without, an egg-info as `setup.py develop` writes."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    meta = root / (f"{name}-1.0.dist-info" if record else f"{name}.egg-info")
    meta.mkdir()
    (meta / ("METADATA" if record else "PKG-INFO")).write_text(f"Name: {name}\nVersion: 1.0\n")
    listing = f"{name}/__init__.py,,\n{meta.name}/METADATA,,\n"
    (meta / ("RECORD" if record else "SOURCES.txt")).write_text(listing)
    return str(root / name / "__init__.py")


def test_a_package_installed_outside_site_packages_is_library_code(tmp_path, monkeypatch):
    # `pip install --target DIR` with DIR on PYTHONPATH (the accelerator's
    # set-up): flax's frames there are a library's, the user's line is the
    # one that called flax.
    target, develop, scripts = tmp_path / "target", tmp_path / "src", tmp_path / "scripts"
    for d in (target, develop, scripts):
        d.mkdir()
    installed = _folder(target, "flaxlike", record=True)
    editable = _folder(develop, "mine", record=False)
    script = str(scripts / "train.py")
    monkeypatch.syspath_prepend(str(target))
    monkeypatch.syspath_prepend(str(develop))
    monkeypatch.syspath_prepend(str(scripts))
    assert is_library(installed)
    assert not is_library(installed, False)  # tracebacks keep installed frames
    assert not is_library(editable)  # the user's own package, in development
    assert not is_library(script)


def test_jax_s_words_for_an_error_while_a_step_traces_name_the_user_s_function_and_leaf():
    # JAX named the library's wrapper ("tracing the function traced at
    # jaxcontracts/_step/compile.py:211") and "the argument args[0]['loss']"
    def decay(s, lr):
        if s["loss"] > 1.0:  # a Python if on a traced value
            return {"loss": s["loss"] * lr}
        return s

    steps = [(jc.hot_step(decay, state="s"), (jnp.float32(0.5),)), (jc.hot_step(functools.partial(decay, lr=0.5), state="s"), ())]
    for step, more in steps:
        with pytest.raises(jax.errors.TracerBoolConversionError) as info:
            step({"loss": jnp.float32(2.0) + 0}, *more)
        text = str(info.value)
        line = decay.__code__.co_firstlineno
        assert f"tracing the function decay at {__file__}:{line}" in text, text
        assert "argument s['loss']" in text, text
