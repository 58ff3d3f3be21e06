"""Property tests: a mutated leaf is named, exactly, by the RecompileError."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxcontracts as jc
from jaxcontracts._format import fit_change, fmt_aval

DTYPES = [jnp.float32, jnp.int32, jnp.float16, jnp.bfloat16, jnp.uint8, jnp.bool_]
SHAPES = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def state_and_mutation(draw):
    n = draw(st.integers(1, 6))
    names = [f"f{i}" for i in range(n)]
    leaves = {k: (draw(SHAPES), draw(st.sampled_from(DTYPES))) for k in names}
    victim = draw(st.sampled_from(names))
    shape, dtype = leaves[victim]
    if draw(st.booleans()):
        new_dtype = draw(st.sampled_from([d for d in DTYPES if d != dtype]))
        mutated = (shape, new_dtype)
    else:
        new_shape = draw(SHAPES.filter(lambda s: s != shape))
        mutated = (new_shape, dtype)
    return leaves, victim, mutated


def _identity_step(s: dict) -> dict:
    return {k: v for k, v in s.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state_and_mutation())
def test_recompile_error_names_exactly_the_mutated_leaf(case):
    leaves, victim, (shape, dtype) = case
    step = jc.hot_step(_identity_step, signature=dict, donate="none")
    specs = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in leaves.items()}
    step.compile(specs)
    args = {k: jnp.zeros(s, d) for k, (s, d) in leaves.items()}
    args[victim] = jnp.zeros(shape, dtype)
    with pytest.raises(jc.RecompileError) as info:
        step(args)
    msg = str(info.value)
    named = [k for k in leaves if f"s['{k}']:" in msg]
    assert named == [victim], msg
    want = f"called with {fmt_aval(shape, np.dtype(dtype))}"
    assert want in msg


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=24), st.data())
def test_a_fitted_diff_line_shows_the_field_that_changed(values, data):
    # issue 51: a static configuration's diff line, cut at the width, lost the
    # value that changed; trimmed, it keeps it (old and new) and fits
    k = data.draw(st.integers(0, len(values) - 1))
    new = data.draw(st.integers(0, 10**6).filter(lambda v: v != values[k]))
    changed = [*values[:k], new, *values[k + 1:]]

    def cfg(vs):
        return "Config(" + ", ".join(f"f{i}={v}" for i, v in enumerate(vs)) + ")"

    line = fit_change(f"static cfg: {cfg(values)} -> {cfg(changed)}", 94)
    old_side, new_side = line.split(" -> ")
    assert len(line) <= 94 and line.startswith("static cfg: ")
    assert f"f{k}={values[k]}" in old_side and f"f{k}={new}" in new_side, line
