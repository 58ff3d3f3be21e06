"""Each capability (a private JAX/jaxtyping/CPython mechanism) probed for real.

The library's own probes are cheap structural checks; these tests exercise
each mechanism on the installed versions, so that a jax or jaxtyping release
that breaks one fails here, by name, before it makes a check lie.
"""

from __future__ import annotations

import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from helpers import BUFFER_PROTOCOL, CPU_SIZES, SYNC_ERRORS
from jaxtyping import Array, Float32, PyTree

import jaxcontracts as jc
from jaxcontracts import _compat
from jaxcontracts._compat import (
    arrays,
    events,
    executable,
    frames,
    guarded,
    liveorder,
    registry,
    runtime_errors,
    threadguard,
    tracing,
)
from jaxcontracts._compat import jaxtyping as jt


@pytest.mark.parametrize("cap", [c.name for c in _compat.capabilities()])
def test_every_capability_is_in_force_on_the_installed_versions(cap):
    found = _compat.capability(cap)
    assert found.available, f"{cap}: {found.detail}"



def test_live_arrays_are_listed_newest_first_eager_and_jitted_alike():
    # the audit's one-step-late eager read (issue 51): an eager result made
    # before a jitted call is older than the call's outputs, one made after it
    # is not; an array not alive in the list has no order
    step = jax.jit(lambda w: w * 0.5)
    w = jnp.ones(8)
    norm = jnp.linalg.norm(w)  # eager, before the call
    out = step(w)
    after = jnp.sum(out)  # eager, after it
    assert liveorder.made_before([norm, after, w], [out]) == {id(norm), id(w)}
    assert liveorder.made_before([norm], []) == set()
    assert registry.capability("live-array-order").available

def test_array_read_hooks_reach_existing_arrays():
    x = jnp.arange(3.0)  # made before the patch: the class slot must cover it
    seen = []
    original = arrays.read_methods()["__float__"]

    def spy(self):
        seen.append(self.shape)
        return original(self)

    arrays.set_class_attr("__float__", spy)
    try:
        assert float(x[1]) == 1.0
    finally:
        arrays.set_class_attr("__float__", original)
    assert seen == [()]
    assert type(x).__dict__["__float__"] is original
    optional = {n for n in arrays.OPTIONAL_READ_METHODS if n in type(x).__dict__}
    assert set(arrays.READ_METHODS) | {"_value"} | optional == set(arrays.read_methods())
    assert "__dlpack__" in optional  # np.from_dlpack reads through it on this jax


@pytest.mark.cpu_only(BUFFER_PROTOCOL)
def test_a_refused_buffer_export_reaches_the_refused_callback():
    import sys

    x = jnp.arange(3.0)
    calls = []

    class Marker(Exception):
        pass

    def refused(obj):
        calls.append(obj is x)
        raise Marker

    on, off = arrays.buffer_hooks(lambda obj: obj is x, refused)
    on()
    try:
        with pytest.raises((Marker, SystemError)) as info:
            memoryview(x)
    finally:
        off()
    assert calls == [True]
    if sys.version_info < (3, 12):  # ctypes cannot raise through C: recognised
        assert arrays.is_unset_error(info.value)
    assert memoryview(x).nbytes == 12


def test_thread_guard_levels_are_set_from_another_thread():
    import threading

    x = jnp.float32(1.0)
    state = threadguard.current()
    saved = threadguard.levels(state)
    with jax.transfer_guard_host_to_device("disallow"):
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            jnp.add(x, np.float32(1))
        other = threading.Thread(target=threadguard.set_levels, args=(state, saved))
        other.start()
        other.join(30)
        assert float(jnp.add(x, np.float32(1))) == 2.0  # this thread's level changed
        threadguard.set_levels(state, saved, {"host_to_device": "disallow"})
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            jnp.add(x, np.float32(1))
    assert threadguard.levels(state) == saved


@pytest.mark.cpu_only(BUFFER_PROTOCOL)
def test_buffer_hook_refuses_and_restores():
    x = jnp.arange(4.0)
    refused = []

    def on_refused(a):
        raise BufferError("refused")

    on, off = arrays.buffer_hooks(lambda a: refused.append(a.shape) or True, on_refused)
    on()
    try:
        with pytest.raises((BufferError, SystemError)):
            memoryview(x)
    finally:
        off()
    assert refused == [(4,)]
    assert memoryview(x).nbytes == 16  # restored: the export works again


def test_compile_events_name_every_phase_and_the_function():
    seen = []

    def listener(event, value, **kwargs):
        if event in events.COMPILE_EVENTS:
            seen.append((event, kwargs.get("fun_name")))

    events.listen(listener)
    try:

        def a_fresh_function(v):
            return v * 3 + 1

        jax.jit(a_fresh_function)(jnp.ones(2))
    finally:
        events.unlisten(listener)
    names = {e for e, _ in seen}
    assert events.LOWERING_EVENT in names and events.COMPILE_EVENTS[2] in names
    assert any("a_fresh_function" in str(f) for _, f in seen)


@pytest.mark.cpu_only(CPU_SIZES)
def test_alias_table_reads_what_xla_aliased():
    f = lambda a, b: (a + 1, b * 2)  # noqa: E731
    spec = jax.ShapeDtypeStruct((8,), jnp.float32)
    donated = jax.jit(f, donate_argnums=(0,), keep_unused=True).lower(spec, spec).compile()
    plain = jax.jit(f, keep_unused=True).lower(spec, spec).compile()
    assert executable.aliased_parameters(donated, 2) == {0}
    assert executable.aliased_parameters(plain, 2) == set()
    assert executable.alias_bytes(donated) == 32
    assert executable.alias_bytes(plain) == 0


def _alias_cases():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def f32(*shape, sharding=None):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)

    mesh = jax.make_mesh((len(jax.devices()),), ("d",))
    split, whole = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    n = 8 * len(jax.devices())
    return {
        "two leaves": (lambda a, b: (a + 1, b * 2), (f32(8), f32(8)), {}),
        "identity": (lambda a: a, (f32(8),), {}),
        "returned twice": (lambda a: (a, a), (f32(8),), {}),
        "a constant output": (lambda a: jnp.zeros(8), (f32(8),), {}),
        "read after the update": (lambda a: (a + 1, a.sum()), (f32(8),), {}),
        "swapped": (lambda a, b: (b, a), (f32(8), f32(8)), {}),
        "reshaped (same size)": (lambda a: a.reshape(2, 4) + 1, (f32(8),), {}),
        "dtype changed": (lambda a: a.astype(jnp.int32), (f32(8),), {}),
        "fewer outputs": (lambda a, b: a + b, (f32(8), f32(8)), {}),
        "a loop": (lambda a: jax.lax.fori_loop(0, 3, lambda i, x: x * 2, a), (f32(8),), {}),
        "unused": (lambda a, b: a * 2, (f32(8), f32(8)), {}),
        "hoisted constant": (lambda a: a + np.arange(8, dtype=np.float32), (f32(8),), {}),
        "typed keys": (
            lambda k: jax.random.split(k[0], 3),
            (jax.ShapeDtypeStruct((3,), jax.random.key(0).dtype),),
            {},
        ),
        "sharded, placed by XLA": (
            lambda a, b: (a * 2, b + 1),
            (f32(n, sharding=split), f32(n, sharding=whole)),
            {},
        ),
        "sharded, placed": (
            lambda a, b: (a * 2, b + 1),
            (f32(n, sharding=split), f32(n, sharding=whole)),
            {"out_shardings": (split, whole)},
        ),
        "sharded reduction": (
            lambda a: (a * 2, a.sum()),
            (f32(n, sharding=split),),
            {"out_shardings": (split, whole)},
        ),
    }


@pytest.mark.cpu_only(CPU_SIZES)
@pytest.mark.parametrize("case", list(_alias_cases()))
def test_every_alias_jax_requests_is_in_the_executables_alias_table(case):
    # What lets a compile skip printing the program: an alias JAX wrote into
    # the lowered module (tf.aliasing_output) is one XLA keeps. Where JAX
    # left the choice to XLA (jax.buffer_donor), the table is read instead.
    fn, specs, kwargs = _alias_cases()[case]
    donate = tuple(range(len(specs)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Some donated buffers were not usable"
        lowered = jax.jit(fn, donate_argnums=donate, keep_unused=True, **kwargs).trace(*specs).lower()
    requested = executable.requested_aliases(lowered, len(specs))
    table = executable.aliased_parameters(lowered.compile(), len(specs))
    assert requested is not None and table is not None
    assert requested <= table
    if case in ("two leaves", "swapped", "sharded, placed"):
        assert requested == set(donate)  # paired by JAX: nothing printed for these
    if case in ("reshaped (same size)", "dtype changed"):
        assert not requested and table == {0}  # XLA's choice: read from the executable


def test_parameter_layouts_count_the_entry_parameters_the_header_lists():
    # The alias table's parameter numbers are offset by the entry parameters
    # JAX adds (hoisted constants); the count comes from the executable's
    # parameter layouts, which must agree with the HLO header's layout.
    big = np.arange(4096, dtype=np.float32)
    spec = jax.ShapeDtypeStruct((4096,), jnp.float32)
    cases = [
        jax.jit(lambda a: a + 1, donate_argnums=0).lower(spec),
        jax.jit(lambda a, b: (a + big, {"x": b}), donate_argnums=(0, 1), keep_unused=True).lower(spec, spec),
        jax.jit(lambda t: [t[0] * 2, t[1]], keep_unused=True).lower((spec, jax.ShapeDtypeStruct((), jnp.int32))),
    ]
    for lowered in cases:
        compiled = lowered.compile()
        header = compiled.as_text().split("\n", 1)[0]
        count = executable._parameter_count(compiled)
        assert count is not None and count == executable._entry_param_count(header)


def test_caller_frames_see_the_callers_namespace():
    local_marker = object()

    def inner():
        return frames.caller_locals(1)

    assert inner()["local_marker"] is local_marker
    assert frames.caller_frame(0).f_code.co_name == "test_caller_frames_see_the_callers_namespace"


def test_callback_frames_are_recognised_in_host_callbacks_and_device_get():
    seen = []

    def callback(v):
        seen.append(frames.allowed_reader(sys._getframe()))

    @jax.jit
    def f(v):
        jax.debug.callback(callback, v)
        return v + 1

    jax.block_until_ready(f(jnp.ones(2)))
    assert seen == [True]
    assert frames.allowed_reader(sys._getframe()) is False


def test_ipython_cells_are_named_by_execution_count():
    interactiveshell = pytest.importorskip("IPython.core.interactiveshell")
    shell = interactiveshell.InteractiveShell.instance()
    try:
        result = shell.run_cell(
            "import sys; _jc_file = sys._getframe().f_code.co_filename", store_history=True
        )
        assert result.success
        filename = shell.user_ns["_jc_file"]
        assert frames.notebook_cell(filename) == result.execution_count
    finally:
        interactiveshell.InteractiveShell.clear_instance()


@pytest.mark.parametrize(
    "dims",
    ["n 3", "*batch n", "#n _", "...", "b n+1", "rows=3 cols", "_n", "?n", "*_ k", "2*n"],
)
def test_jaxtyping_dims_parse_as_jaxtyping_reads_them(dims):
    ann = Float32[Array, dims]
    ours = jt.parse_dims(ann.dim_str)
    theirs = ann.dims  # jaxtyping's private dim objects: compared here only
    assert len(ours) == len(theirs)
    for mine, jax_dim in zip(ours, theirs):
        kind = type(jax_dim).__name__
        expected = {
            "_FixedDim": "fixed",
            "_NamedDim": "named",
            "_NamedVariadicDim": "variadic",
            "_SymbolicDim": "symbolic",
            "_AnonymousDim": "anonymous",
            "_AnonymousVariadicDim": "anonymous-variadic",
        }[kind]
        assert mine.kind == expected, (dims, mine, jax_dim)
        assert mine.name == getattr(jax_dim, "name", getattr(jax_dim, "elem", "")) or mine.kind in ("fixed", "anonymous", "anonymous-variadic")
        assert mine.broadcastable == getattr(jax_dim, "broadcastable", False)
    variadic = [i for i, d in enumerate(ours) if d.kind in ("variadic", "anonymous-variadic")]
    assert (variadic[0] if variadic else None) == ann.index_variadic


def test_jaxtyping_pytree_leaf_is_read():
    leaf = Float32[Array, "n"]
    assert jt.is_pytree_annotation(PyTree[leaf])
    assert jt.pytree_leaf(PyTree[leaf]) is leaf
    assert not jt.is_pytree_annotation(leaf) and jt.is_array_annotation(leaf)
    assert not jt.is_array_annotation(jaxtyping.PyTree)


def test_runtime_errors_are_recognised_only_when_jax_raised_them(monkeypatch):
    from jaxcontracts import _steps

    monkeypatch.setattr(_steps, "donating", lambda: [])  # no step donates: JAX's own error is kept
    x = jnp.zeros(3)
    with pytest.raises(Exception) as h2d:
        with jax.transfer_guard_host_to_device("disallow"):
            jnp.add(x, np.ones(3, np.float32))
    assert runtime_errors.classify(h2d.value)[0] == "host-to-device"
    box = [x + 1]
    box[0].delete()
    with pytest.raises(RuntimeError) as deleted:
        repr(box.pop())  # JAX's own error (ours while a step donates, see test_runtime_errors)
    assert runtime_errors.classify(deleted.value)[0] == "deleted"
    with pytest.raises(RuntimeError) as mine:
        raise RuntimeError("Array has been deleted, says my own code")
    assert runtime_errors.classify(mine.value) is None


@pytest.mark.cpu_only(SYNC_ERRORS)
def test_a_failure_while_an_executable_runs_is_jax_runtime_error():
    def cb(x):
        raise ValueError("inside")

    f = jax.jit(lambda x: jax.pure_callback(cb, jax.ShapeDtypeStruct((1,), jnp.float32), x))
    with pytest.raises(Exception) as info:
        f(jnp.ones(1))
    assert runtime_errors.is_runtime_error(info.value) and "inside" in str(info.value)
    assert runtime_errors.classify(info.value) is None
    assert not runtime_errors.is_runtime_error(RuntimeError("Array has been deleted"))


def test_trace_state_sees_an_active_trace():
    seen = []

    @jax.jit
    def f(v):
        seen.append(tracing.trace_state_clean())
        return v

    f(jnp.ones(1))
    assert seen == [False] and tracing.trace_state_clean() is True


def test_the_inline_top_level_refs_agree_under_every_transformation():
    """The call path reads is_top_level()'s two refs inline: same answer."""
    tref, ev, aref, top = tracing.top_level_refs()
    seen = []

    def f(v):
        seen.append((tref.value is ev and aref.value is top, tracing.trace_state_clean()))
        return v * 2

    x = jnp.ones(2)
    jax.jit(f)(x)
    jax.vmap(f)(x)
    jax.grad(lambda v: f(v).sum())(x)
    jax.lax.cond(True, f, f, x)
    jax.eval_shape(f, x)
    assert seen and all(inline is False and clean is False for inline, clean in seen)
    assert (tref.value is ev and aref.value is top) is True


def test_fast_flatten_and_the_compiled_fast_call_agree_with_the_public_api():
    tree = {"a": (1, 2), "b": [3]}
    assert tracing.flatten(tree)[0] == jax.tree_util.tree_flatten(tree)[0]
    compiled = jax.jit(lambda v: v * 2).lower(jnp.ones(3)).compile()
    call = tracing.cpp_call(compiled)
    assert call is not compiled
    assert np.array_equal(np.asarray(call(jnp.ones(3))), np.full(3, 2.0))


def _guarded_step(in_tree_of=None):
    """A donated dict step, its guarded call, and the arguments approve saw."""
    state = {"a": jnp.zeros(4), "b": jnp.ones(3)}
    compiled = jax.jit(lambda s: jax.tree_util.tree_map(lambda x: x + 1, s), donate_argnums=0).lower(state).compile()
    asked = []

    def approve(args):
        asked.append(args)
        leaves = jax.tree_util.tree_leaves(args)
        return tracing.trace_state_clean() and all(
            type(x) is arrays.ArrayImpl and not x.aval.weak_type and x.devices() == {jax.devices()[0]}
            for x in leaves
        )

    in_tree = None if in_tree_of is None else in_tree_of(state)
    return compiled, guarded.guarded_call(compiled, approve, in_tree), asked


def test_a_guarded_call_asks_once_per_signature_and_refuses_what_jax_would_take(mesh2):
    compiled, call, asked = _guarded_step()
    assert call is not None
    s = call({"a": jnp.zeros(4), "b": jnp.ones(3)})
    s = call(s)
    s = call(s)
    assert len(asked) == 1  # then the C++ path: its signature is cached
    assert s["a"].tolist() == [3.0] * 4
    # Each of these JAX's own call takes (and caches, never asking again):
    weak = {"a": jax.lax.broadcast(jnp.asarray(1.0), (4,)), "b": jnp.ones(3)}
    assert weak["a"].aval.weak_type
    with jax.default_device(jax.devices()[1]):
        elsewhere = {"a": jnp.zeros(4), "b": jnp.ones(3)}
    refused = [
        {"a": np.zeros(4, np.float32), "b": jnp.ones(3)},  # a numpy leaf: a silent transfer
        weak,
        elsewhere,  # uncommitted on another device: moved, undonated
        jax.device_put({"a": jnp.zeros(4), "b": jnp.ones(3)}, jax.devices()[1]),  # committed there
    ]
    for args in refused:
        before = len(asked)
        assert call(args) is guarded.REFUSED
        assert len(asked) == before + 1
        assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(args) if isinstance(x, jax.Array))
    assert len(compiled(jax.tree_util.tree_map(jnp.asarray, refused[0]))) == 2  # JAX itself takes it
    # A trace is in the C++ call's key: a miss even over concrete, closed-over arrays.
    fresh = {"a": jnp.zeros(4), "b": jnp.ones(3)}
    before = len(asked)

    def traced(z):
        assert call(fresh) is guarded.REFUSED
        return z

    jax.vmap(traced)(jnp.ones(2))
    assert len(asked) == before + 1 and not fresh["a"].is_deleted()
    assert call(s, extra=1) is guarded.REFUSED  # keywords are never taken
    s = call(s)
    assert s["a"].tolist() == [4.0] * 4  # the approved signature still runs


def test_a_guarded_call_takes_the_flat_leaves_or_the_arguments_tree():
    _, flat, asked = _guarded_step(lambda state: guarded.flat_in_tree(2))
    s = {"a": jnp.zeros(4), "b": jnp.ones(3)}
    leaves = jax.tree_util.tree_leaves(s)
    out = flat(*leaves)
    assert all(x.is_deleted() for x in leaves)  # donated through the flat call too
    assert out["a"].tolist() == [1.0] * 4 and len(asked) == 1
    assert flat(jnp.zeros(4), jnp.ones(3))["b"].tolist() == [2.0] * 3 and len(asked) == 1
    tree = guarded.tree_in_tree(({"a": 0, "b": 0},))
    assert tree == jax.tree_util.tree_structure((({"a": 0, "b": 0},), {}))
    with pytest.raises(TypeError):
        flat({"a": jnp.zeros(4), "b": jnp.ones(3)})  # another tree: JAX's own call refuses it (the caller flattens)


def test_a_guarded_call_takes_static_arguments_as_jax_jit_does():
    """static=(argnums, argnames, bind): the C++ call leaves the static values
    out of the flat arguments and hashes them, with their type, into its
    signature; bind gives JAX's own miss the positional arguments."""
    from jaxcontracts._state.spec import StaticArg

    s = {"a": jnp.zeros(3)}
    compiled = jax.jit(lambda s, n: {"a": s["a"] + n.value}).lower(s, StaticArg(1)).compile()
    asked = []

    def bind(args, kwargs):
        asked.append((args, kwargs))
        if set(kwargs) - {"n"}:
            return None  # a keyword that is not static: refused
        return (*args, StaticArg(kwargs["n"])) if kwargs else (args[0], StaticArg(args[1]))

    call = guarded.guarded_call(compiled, lambda args: args[1] == StaticArg(1), None, ((1,), ("n",), bind))
    assert call is not None
    assert call(s, n=1)["a"].tolist() == [1.0] * 3 and len(asked) == 1
    assert call(s, n=1)["a"].tolist() == [1.0] * 3 and len(asked) == 1  # cached: never asked again
    assert call(s, 1)["a"].tolist() == [1.0] * 3 and len(asked) == 2  # by position: another shape
    assert call(s, n=True) is guarded.REFUSED and len(asked) == 3  # equal by ==, another type: a miss
    assert call(s, n=2) is guarded.REFUSED
    assert call(s=s, n=1) is guarded.REFUSED  # the state by keyword: bind refuses


def test_a_missing_capability_warns_once_and_reports_list_it(monkeypatch):
    monkeypatch.setitem(
        registry._definitions,
        "test-only",
        registry._Definition("a mechanism", "something checked", lambda: "it moved"),
    )
    monkeypatch.setattr(registry, "_results", {})
    monkeypatch.setattr(registry, "_warned", set())
    with pytest.warns(jc.CapabilityWarning, match="'test-only'.*it moved.*something checked"):
        assert not _compat.capability("test-only").available
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compat.capability("test-only")  # no second warning
        report = jc.Report(title="t")
    assert ("test-only", False) in report.capabilities
    assert report.capabilities_line() == "capabilities MISSING (1 of " + str(len(report.capabilities)) + "): test-only (so not checked: something checked)"
    assert "test-only" in str(report)


def test_a_compile_prints_the_program_only_where_xla_chose_the_aliasing(monkeypatch):
    from helpers import Counter
    from jax import stages

    from jaxcontracts._step import compile as _compile

    printed = []
    as_text = stages.Compiled.as_text
    monkeypatch.setattr(stages.Compiled, "as_text", lambda self: printed.append(self) or as_text(self))

    def counter_step():
        @jc.hot_step
        def step(c: Counter) -> Counter:
            return Counter(x=c.x + 1, count=c.count + 1)

        return step

    def verified(step):
        report = jc.check(step, Counter.spec(n=3))
        donation = [c for c in report.contracts if c.name.startswith("donation verified")]
        return donation[0].ok and all(row.aliased for row in report.rows)

    assert verified(counter_step()) and printed == []  # JAX paired both leaves
    monkeypatch.setattr(_compile, "requested_aliases", lambda lowered, n: frozenset())
    assert verified(counter_step()) and len(printed) == 1  # left to XLA: its table is read


def test_unreadable_alias_table_is_not_verified_never_a_pass(monkeypatch):
    from helpers import Counter

    from jaxcontracts._step import compile as _compile

    monkeypatch.setattr(_compile, "requested_aliases", lambda lowered, n: None)
    monkeypatch.setattr(_compile, "aliased_parameters", lambda compiled, n: None)
    monkeypatch.setattr(_compile, "alias_bytes", lambda compiled: None)

    @jc.hot_step
    def step(c: Counter) -> Counter:
        return Counter(x=c.x + 1, count=c.count + 1)

    report = jc.check(step, Counter.spec(n=3))
    donation = [c for c in report.contracts if c.name.startswith("donation verified")]
    assert donation and not donation[0].ok and "not verified" in donation[0].detail
    assert all(row.aliased is None for row in report.rows)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16", "bfloat16", "complex64"])
def test_host_copy_copies_without_compiling_and_leaves_the_buffer_donatable(dtype):
    from jaxcontracts._compat import hostcopy

    f = jax.jit(lambda v: v + jnp.ones((), v.dtype) if v.dtype != jnp.bool_ else ~v, donate_argnums=0)
    y = f(jnp.zeros((64,), dtype))
    pointer = y.unsafe_buffer_pointer()
    seen = []

    def listener(event, value, **kwargs):
        if event in events.COMPILE_EVENTS:
            seen.append(event)

    events.listen(listener)
    try:
        host = hostcopy.host_copy(y)
    finally:
        events.unlisten(listener)
    assert seen == []
    assert host.dtype == np.dtype(dtype) and host.flags.owndata and host.flags.writeable
    expected = np.ones(64, dtype) if dtype != "bool" else np.ones(64, bool)
    assert np.array_equal(host, expected)
    del host
    z = f(y)
    assert y.is_deleted() and z.unsafe_buffer_pointer() == pointer  # donated, not copied


def test_host_copy_of_a_sharded_array_assembles_every_shard():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxcontracts._compat import hostcopy

    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices of the default backend (XLA_FLAGS on CPU)")
    devices = np.array(jax.devices()[:4]).reshape(2, 2)
    mesh = Mesh(devices, ("a", "b"))
    value = np.arange(32, dtype=np.float32).reshape(8, 4)
    for spec in (P("a", "b"), P("a"), P()):
        x = jax.device_put(value, NamedSharding(mesh, spec))
        assert np.array_equal(hostcopy.host_copy(x), value)


def test_key_array_class_is_the_class_of_typed_keys():
    from jaxcontracts._compat.arrays import KeyArray

    assert type(jax.random.key(0)) is KeyArray
    assert type(jax.random.split(jax.random.key(0))) is KeyArray


def test_a_warm_jit_refusing_a_donated_buffer_is_recognised_from_cpp(monkeypatch):
    from jaxcontracts import _steps

    monkeypatch.setattr(_steps, "donating", lambda: [])  # no step donates: JAX's own error is kept
    f = jax.jit(lambda a: a * 2)
    consume = jax.jit(lambda a: a + 1, donate_argnums=0)
    box = [jnp.zeros(3) + 1]
    f(box[0])
    consume(box[0])
    # jax 0.10/0.11 refuse it in C++ (ValueError, the innermost Python frame
    # is this test's); jax 0.12 in Python (RuntimeError from jax's frame).
    # Nothing names the array and no hot step donates, so it is JAX's own
    # error (otherwise a DonatedArrayError: tests/test_runtime_errors.py).
    with pytest.raises((ValueError, RuntimeError)) as cpp:
        f(box.pop())
    assert runtime_errors.classify(cpp.value)[0] == "deleted"
    with pytest.raises(ValueError) as mine:
        raise ValueError("Buffer has been deleted or donated, says my own code")
    assert runtime_errors.classify(mine.value) is None
    # the TPU runtime's words for it (jaxlib 0.10.2 on a v5e), raised by the warm C++ call
    tpu = ValueError(
        "INVALID_ARGUMENT: Invalid buffer passed to Execute() as argument 0 to replica 0: "
        "INVALID_ARGUMENT: Donation requested for invalid buffer"
    )
    assert runtime_errors.classify(tpu)[0] == "deleted"


def test_cache_events_are_counted_on_the_compiling_thread_only():
    outcome = events.watch_cache()
    assert outcome is not None
    try:
        t = threading.Thread(target=lambda: jax.monitoring.record_event(events.CACHE_HIT_EVENT))
        t.start()
        t.join()
        assert outcome.verdict == "off"
        jax.monitoring.record_event(events.CACHE_USE_EVENT)
        assert outcome.verdict == "off"  # recorded even with no cache directory
        jax.monitoring.record_event(events.CACHE_MISS_EVENT)
        assert outcome.verdict == "miss"
    finally:
        events.unwatch_cache(outcome)
    jax.monitoring.record_event(events.CACHE_HIT_EVENT)
    assert outcome.hits == 0


def test_guard_log_lines_parse_on_this_version(capfd):
    """jaxlib's transfer-guard log line (what record mode reads off fd 2)."""
    from jaxcontracts._compat import guardlog

    x = jnp.ones(3)
    x * 2.0
    assert guardlog.start()
    try:
        with jax.transfer_guard_host_to_device("log"):
            x * 3.0  # warm: jaxlib's fast path logs no aval
            jnp.ones(7, jnp.float32) * 4.0  # cold: the slow path names it
    finally:
        events, unparsed = guardlog.stop(threading.get_native_id())
    assert unparsed == 0
    assert {e.direction for e in events} == {"host-to-device"} and len(events) >= 2
    assert events[0].aval in ("", "float32[], weak_type=True")
    assert "float32[], weak_type=True" in [e.aval for e in events[1:]]
    assert "guard_lib" not in capfd.readouterr().err


def test_every_intercepted_read_has_one_wording_in_the_one_list():
    # _compat.arrays.READS is the only list of reads: what is patched and how
    # messages word it. A patched method with no entry would raise KeyError
    # inside the guard; an entry nothing patches would be a dead word.
    from jaxcontracts._compat import arrays

    patched = set(arrays.read_methods())
    assert patched <= set(arrays.READS)
    assert set(arrays.READS) == set(arrays.READ_METHODS) | set(arrays.OPTIONAL_READ_METHODS) | set(
        arrays.NON_METHOD_READS
    )
    assert "_value" in patched  # the property, wrapped like the methods


def test_allow_host_to_device_lets_one_call_transfer_and_restores_the_level():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxcontracts._compat import threadguard

    put = jax.jit(lambda x: x + 1).lower(np.zeros(3, np.float32)).compile()
    allowing = threadguard.allow_host_to_device(put)
    host = np.ones(3, np.float32)
    with jax.transfer_guard_host_to_device("disallow"):
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            put(host)
        np.testing.assert_array_equal(jax.device_get(allowing(host)), host + 1)
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            put(host)  # restored after the call

        def failing(x):
            raise ValueError("boom")

        with pytest.raises(ValueError):
            threadguard.allow_host_to_device(failing)(host)
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            put(host)  # restored after a failing call too
    assert jnp.asarray(host).shape == (3,)


def test_refcount_counts_every_holder_once_garbage_is_collected():
    import gc

    from jaxcontracts._compat import refcount

    assert refcount.available()
    state = {"x": object(), "y": object()}
    leaves = list(state.values())

    def held_elsewhere(leaves):  # the full closure's count, inline there
        return max(map(refcount.count, leaves)) > refcount.BASELINE

    assert not held_elsewhere(leaves)
    kept = [state["y"]]
    assert held_elsewhere(leaves) and refcount.kept_after_collecting(leaves, 1, (state,))[0] == [1]  # a live list
    del kept

    def dies_holding(v):
        raise ValueError("boom")  # only the frame holds v

    try:
        dies_holding(state["x"])
    except ValueError as e:
        saved = e  # its traceback's frame holds state["x"]: a holder like any other
    assert refcount.kept_after_collecting(leaves, 1, (state,))[0] == [0]
    del saved
    assert refcount.kept_after_collecting(leaves, 1, (state,))[0] == []

    class Cycle:
        pass

    gc.disable()
    try:
        garbage = Cycle()
        garbage.me, garbage.held = garbage, state["y"]
        del garbage  # unreachable: freed only by the cyclic collector
        assert held_elsewhere(leaves)  # counted until collected ...
        assert refcount.kept_after_collecting(leaves, 1, (state,))[0] == []  # ... which makes the count exact
    finally:
        gc.enable()


def test_a_dict_shaped_like_a_running_functions_locals_is_no_proof_of_a_holder():
    # 3.11/3.12: a frame keeps the dict locals() returned, synced only at the
    # next read: what it holds tells nothing without reading the frame
    import sys

    from jaxcontracts._compat import refcount

    state = {"x": object(), "y": object()}
    leaves = list(state.values())

    def body():
        x = state["x"]  # noqa: F841 - bound, then dropped: a stale snapshot entry
        snapshot = locals()
        del x
        stale = refcount.kept_after_collecting(leaves, 1, (state,))
        held = {"saved": state["y"]}  # a dict whose key is no variable: a holder
        kept = refcount.kept_after_collecting(leaves, 1, (state,))
        del snapshot, held
        return stale, kept

    stale, kept = body()
    # (held elsewhere, held only by a dict shaped like a locals() snapshot)
    # 3.13: locals() is a dict of its own that nothing syncs, which the user holds: a holder
    assert stale == (([0], []) if sys.version_info >= (3, 13) else ([], [0]))
    assert kept == (([0, 1], []) if sys.version_info >= (3, 13) else ([1], [0]))
    if sys.version_info < (3, 13):
        # the state's own dict is never taken for a snapshot, whatever its keys
        def own(x, y):  # noqa: ARG001 - variables named as the state's keys
            return refcount.kept_after_collecting(leaves, 1, ({"x": state["x"], "y": state["y"]},))

        assert own(None, None) == ([0, 1], [])  # the second dict holds both: a holder, not a snapshot


def test_decorators_applied_inside_a_function_read_its_locals_only_for_a_local_class():
    # Before Python 3.13, resolving annotations by reading the caller's
    # f_locals synced the dict locals() returned: a @jc.hot_step or @jc.state
    # applied in main() changed its `hparams = locals()`. The caller's locals
    # are read only for a name that is one of its variables (a local class).
    lr, hparams = 0.1, None
    hparams = locals()
    before = dict(hparams)

    @jc.state
    class Point:
        x: Float32[Array, " n"]

    @jc.hot_step(state="t")
    def bump(t: jax.Array) -> jax.Array:
        return t + 1

    class Velocity(jc.State):  # a State subclass resolves its annotations the same way
        v: Float32[Array, " n"]

    t = bump(jnp.zeros(2))
    assert hparams == before  # nothing read: jax.Array, Float32 and Array are globals
    assert Velocity(v=jnp.zeros(2)).v.shape == (2,)

    @jc.hot_step
    def move(p: Point) -> Point:  # a local class: its name is one of this frame's variables
        return Point(x=p.x + 1)

    p = move(Point(x=jnp.zeros(2)))
    assert float(p.x[0]) == 1.0 and float(t[0]) == 1.0
    # the local class is read from f_locals: 3.13's proxy writes nothing;
    # before it, the read syncs the dict locals() returned, as a debugger's does
    if sys.version_info >= (3, 13):
        assert hparams == before
    else:
        assert hparams["lr"] == before["lr"]  # the variables as they are (hparams is itself, now)


def test_the_caller_namespace_reads_nothing_for_a_name_the_frame_has_no_variable_for():
    from jaxcontracts._compat import frames

    def body():
        local_thing = 1
        return frames.caller_locals(0), local_thing

    namespace, _ = body()
    assert "jnp" not in namespace and "nothing_here" not in namespace  # no read needed
    assert namespace._read is None
    assert namespace["local_thing"] == 1 and namespace._read is not None


def test_a_refused_call_typed_at_a_pdb_prompt_leaves_the_debugged_functions_locals():
    # issue 39 (3.11/3.12): pdb writes its frame's locals dict back into the
    # frame on `continue`; a refusal built by reading that frame's f_locals
    # emptied the dict, so the debugged function lost its variables
    # (UnboundLocalError on 3.11, None on 3.12). Two refusals typed at the
    # prompt: a consumed state passed again, a bare array kept in a list.
    import io
    import pdb

    step = jc.hot_step(lambda s: {"x": s["x"] + 1}, state="s")
    halve = jc.hot_step(lambda theta: theta * 0.5, state="theta")

    def debugged():
        s = step({"x": jnp.zeros(3)})
        old, s = s, step(s)  # noqa: F841 - read by the commands typed at the prompt
        theta = halve(jnp.ones(3))
        lr = 0.1
        out = io.StringIO()
        commands = "!step(old)\n!kept = s['x']; step(s)\ncontinue\n"
        debugger = pdb.Pdb(stdin=io.StringIO(commands), stdout=out, nosigint=True, readrc=False)
        debugger.use_rawinput = False
        debugger.set_trace()
        return lr, s, theta, out.getvalue()

    lr, s, theta, text = debugged()
    assert text.count("jaxcontracts.DonationError") == 2, text
    assert lr == 0.1 and float(s["x"][0]) == 2.0 and not theta.is_deleted()


def test_locals_of_reads_a_frame_without_writing_to_it():
    import sys
    import weakref

    from jaxcontracts._compat import frames

    class Big:
        pass

    def body():
        x = Big()
        ref = weakref.ref(x)
        mine = locals()  # before 3.13: the frame's own dict, which a read of f_locals syncs
        y = 1
        seen = frames.locals_of(sys._getframe())
        if sys.version_info >= (3, 13):
            assert seen["x"] is x and seen["y"] == 1  # 3.13's proxy reads and keeps nothing
        else:
            assert seen == {}  # not read at all
        assert "y" not in mine and mine["x"] is x  # the user's dict is as locals() left it
        del seen, x, mine
        return ref

    assert body()() is None
    namespace = {"frames": frames, "sys": sys}
    exec("z = 1\nseen = frames.locals_of(sys._getframe())", namespace)
    assert namespace["seen"]["z"] == 1  # a module's namespace is read as it is


def test_a_compiled_call_under_debug_nans_raises_jaxs_internal_error_we_recognise():
    from jaxcontracts._compat import runtime_errors

    compiled = jax.jit(lambda x: jnp.log(x - 1.0)).lower(jnp.zeros(3)).compile()
    with jax.debug_nans(True):
        with pytest.raises(Exception) as e:
            compiled(jnp.zeros(3))
    assert runtime_errors.debug_nans_kind(e.value) == "nan", type(e.value)
    assert runtime_errors.debug_nans_kind(FloatingPointError("nan")) is None


def test_effect_tokens_see_an_executables_ordered_effects_and_make_the_missing_token():
    from jax._src import dispatch
    from jax.experimental import io_callback

    from jaxcontracts._compat import effects

    def ordered(x):
        io_callback(lambda v: None, None, x, ordered=True)
        return x + 1

    x = jnp.zeros(3)
    assert effects.effect_tokens(jax.jit(lambda x: x + 1).lower(x).compile()) is None  # no effect: no wrapper
    ensure = effects.effect_tokens(jax.jit(ordered).lower(x).compile())
    assert ensure is not None
    jax.effects_barrier()
    dispatch.runtime_tokens.clear()
    with jax.transfer_guard_host_to_device("disallow"):
        ensure()  # JAX's own bool[0] transfer, made with the guard lifted
    assert len(dispatch.runtime_tokens.current_tokens) == 1


def test_ref_buffers_are_the_refs_alone_and_replaced_in_place():
    # what a hot step over refs relies on: jax.new_ref(x) copies x, ref[...]
    # returns a copy, so the array a ref holds is no one else's to keep; and
    # replacing it is what the ref reads afterwards
    if not hasattr(jax, "new_ref"):
        pytest.skip("this jax has no jax.new_ref")
    from jaxcontracts._compat import refs

    x = jnp.arange(3.0)
    r = jax.new_ref(x)
    held = refs.buffer(r)
    assert isinstance(held, jax.Array) and held is not x
    assert r[...] is not held
    # committed and strongly typed, as a step's outputs for it are (jax 0.11.2 refuses at the ref's next use
    # an array whose committedness or weak type differ from what its own dispatch returns)
    refs.replace(r, jax.device_put(jnp.full(3, 7.0, jnp.float32), jax.devices()[0]))
    assert r[...].tolist() == [7.0] * 3 and held.tolist() == [0.0, 1.0, 2.0]

    @jax.jit
    def traced(r):
        assert refs.buffer(r) is None  # a traced ref holds no array: the step writes it itself
        r[...] += 1

    traced(r)
    assert r[...].tolist() == [8.0] * 3


def test_a_weakly_typed_view_shares_the_buffers_and_is_what_jax_takes():
    # what a hot step over a weakly typed ref relies on (capability
    # ref-weak-types): the view is weakly typed, on the same buffers (no copy),
    # donated with them, and a ref holding it is read and dispatched by JAX
    if not hasattr(jax, "new_ref"):
        pytest.skip("this jax has no jax.new_ref")
    from jaxcontracts._compat import refs

    strong = jax.device_put(jnp.int32(5), jax.devices()[0])  # committed and strong, as a step's output is
    view = refs.weakly_typed(strong)
    assert view.weak_type and not strong.weak_type and view.dtype == strong.dtype
    assert view.committed == strong.committed and view.sharding == strong.sharding
    assert view.unsafe_buffer_pointer() == strong.unsafe_buffer_pointer()
    r = jax.new_ref(jnp.array(0))
    weak = r.aval.inner_aval.weak_type  # jax 0.10: ~i32[], the array's type; 0.11.2: i32[]
    assert refs.buffer(r).weak_type is weak

    @jax.jit
    def bump(r):
        r[...] += 1

    refs.replace(r, jax.device_put(jnp.int32(5), jax.devices()[0]))  # strong: the ref's own type kept
    assert refs.buffer(r).weak_type is weak and int(r[...]) == 5
    bump(r)  # JAX's own dispatch takes the ref as replaced, and writes it
    assert int(r[...]) == 6
    jax.jit(lambda x: x + 1, donate_argnums=0)(view)
    assert view.is_deleted() and strong.is_deleted()  # one buffer


def test_equinox_arguments_names_a_filter_jit_calls_parameters():
    # what the audit relies on to name eqx.filter_jit's parameters as the
    # user wrote them (capability equinox-arguments, equinox's private _call)
    eqx = pytest.importorskip("equinox")
    from jaxcontracts._compat import jitwatch
    from jaxcontracts._compat.frames import caller_frame
    from jaxcontracts._compat.registry import capability

    seen = []

    def fn(model, x, *, scale=2.0):
        seen.append(jitwatch.equinox_arguments(caller_frame(0)))  # while equinox traces it
        return model * x * scale

    x = np.ones(2, np.float32)
    eqx.filter_jit(fn)(jnp.ones(2), x)
    assert capability("equinox-arguments").available
    assert seen and seen[0] is not None and seen[0]["x"] is x and set(seen[0]) <= {"model", "x", "scale"}


def test_the_jit_context_names_the_option_that_changed_or_the_options_an_import_registered():
    from jaxcontracts._compat import tracing

    now = tracing.jit_context()
    assert now is not None and tracing.context_changes(now, tracing.jit_context()) == []
    before = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", not before)
        flipped = tracing.jit_context()
    finally:
        jax.config.update("jax_enable_x64", before)
    changed = tracing.context_changes(now, flipped)
    assert [(then, later) for _, then, later in changed] == [(before, not before)]
    # named where this jax names its options (0.10.2 on), by position on jax 0.10.0
    if tracing._names():
        assert changed[0][0] == "jax_enable_x64"
    else:
        assert changed[0][0].endswith("of JAX's trace context")
    # jax 0.12 registers Pallas's options as jax.extend is imported: more values than before
    assert tracing.context_changes(now[:-1], now) == [(tracing.REGISTERED, f"{len(now) - 1} options", f"{len(now)} options")]
    assert tracing.context_changes(None, now) == []  # the capability missing: nothing is said
