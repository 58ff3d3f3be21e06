"""jc.state, jc.static, Cls.spec/zeros and jc.spec_of."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Counter, Particles, make_particles
from jaxtyping import (
    Array,
    BFloat16,
    Bool,
    Complex64,
    Float,
    Float16,
    Float32,
    Float64,
    Int32,
    Int64,
    PyTree,
    Shaped,
    UInt32,
)

import jaxcontracts as jc


def test_paths_read_as_field_names_and_static_is_structure():
    p = make_particles()
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(p)]
    assert paths == [".pos", ".vel", ".t"]
    # dt is static: part of the structure, not a leaf
    assert jax.tree_util.tree_structure(p) != jax.tree_util.tree_structure(p.replace(dt=0.5))
    assert len(jax.tree_util.tree_leaves(p)) == 3


def test_construction_puts_exact_device_values():
    p = Particles(
        pos=np.zeros((2, 3), np.float32),  # numpy of the right dtype: placed on device
        vel=jnp.zeros((2, 3), jnp.float32),
        t=0,  # Python int -> f32
    )
    assert isinstance(p.pos, jax.Array)
    assert p.t.dtype == jnp.float32 and not p.t.aval.weak_type
    w = Particles(pos=p.pos, vel=p.vel, t=jnp.asarray(1.0))  # weakly typed -> strong
    assert w.t.aval.weak_type is False
    assert float(w.t) == 1.0


def test_wrong_dtype_is_never_cast_and_all_failures_are_collected():
    with pytest.raises(jc.SpecError) as info:
        Particles(
            pos=jnp.zeros((4, 3), jnp.int32),  # jax array, wrong dtype
            vel=np.zeros((4, 3), np.float64),  # numpy array, wrong dtype
            t=jnp.int32(0),  # the seed's int32 counter
        )
    msg = str(info.value)
    assert "got 3 invalid fields" in msg
    for field in (".pos", ".vel", ".t"):
        assert f"  {field}: expected" in msg
    assert "never cast silently" in msg


def test_named_dims_must_agree_across_fields():
    with pytest.raises(jc.SpecError) as info:
        Particles(pos=jnp.zeros((4, 3)), vel=jnp.zeros((5, 3)), t=0.0)
    msg = str(info.value)
    assert ".vel: expected f32[n,3] with n=4 (from .pos), got f32[5,3]" in msg
    assert "dims bound: n=4" in msg


def test_python_scalar_rules():
    with pytest.raises(jc.SpecError, match=r"\.count: expected i32\[\], got Python float 1.5"):
        Counter(x=jnp.zeros(2), count=1.5)
    with pytest.raises(jc.SpecError, match="fits only a rank-0 field"):
        Counter(x=1.0, count=0)
    with pytest.raises(jc.SpecError, match="cannot be represented"):
        Counter(x=jnp.zeros(2), count=2**40)


def test_python_scalar_that_overflows_a_float_field_is_refused():
    @jc.state
    class Small:
        h: Float16[Array, ""]
        b: BFloat16[Array, ""]
        c: Complex64[Array, ""]
        f: Float32[Array, ""]

    ok = dict(h=1.0, b=1.0, c=1.0, f=1.0)
    for field, value, became in (
        ("h", 1e6, "inf"),
        ("h", 70000, "inf"),  # an int too
        ("b", 1e39, "inf"),
        ("c", complex(1e300, 1.0), "inf"),
        ("f", 10**400, "inf"),  # beyond float64: no OverflowError escapes
    ):
        with pytest.raises(jc.SpecError) as info:
            Small(**{**ok, field: value})
        msg = str(info.value)
        assert f".{field}: expected " in msg and "got Python " in msg
        assert f"would be stored as {became}" in msg
    assert (
        "it overflows float16 (largest finite value 65504) and would be stored as inf; "
        "pass a smaller value, or annotate the field with a wider dtype (Float32)."
    ) in str(pytest.raises(jc.SpecError, Small, **{**ok, "h": 1e6}).value)
    assert "or annotate the field Complex128 (with jax_enable_x64 on)." in str(
        pytest.raises(jc.SpecError, Small, **{**ok, "c": 1e39}).value
    )
    # finite in, finite out; a non-finite value passed on purpose is kept
    s = Small(h=65504.0, b=1.5, c=1j, f=float("-inf"))
    assert float(s.h) == 65504.0 and s.b.dtype == jnp.bfloat16 and float(s.b) == 1.5
    assert np.isneginf(float(s.f)) and complex(s.c) == 1j
    assert np.isnan(float(Small(**{**ok, "h": float("nan")}).h))


def test_python_scalar_kinds_and_integer_ranges():
    @jc.state
    class Kinds:
        f: Float32[Array, ""]
        u: UInt32[Array, ""]
        flag: Bool[Array, ""]

    assert int(Kinds(f=2, u=2**32 - 1, flag=True).u) == 2**32 - 1
    for bad in (dict(f=True), dict(u=2**32), dict(u=-1), dict(u=True), dict(flag=1), dict(f=1j)):
        with pytest.raises(jc.SpecError, match="cannot be represented"):
            Kinds(**{**dict(f=0.0, u=0, flag=False), **bad})


def test_static_fields_are_checked():
    with pytest.raises(jc.SpecError, match=r"\.dt: expected a hashable float"):
        Particles(pos=jnp.zeros((1, 3)), vel=jnp.zeros((1, 3)), t=0.0, dt=[0.1])
    with pytest.raises(jc.SpecError, match=r"\.dt: expected float"):
        Particles(pos=jnp.zeros((1, 3)), vel=jnp.zeros((1, 3)), t=0.0, dt="fast")
    # int for float follows the PEP 484 numeric tower
    assert Particles(pos=jnp.zeros((1, 3)), vel=jnp.zeros((1, 3)), t=0.0, dt=1).dt == 1


def test_spec_and_zeros():
    spec = Particles.spec(n=5)
    assert isinstance(spec.pos, jax.ShapeDtypeStruct)
    assert spec.pos.shape == (5, 3) and spec.t.shape == () and spec.dt == 0.01
    z = Particles.zeros(n=5)
    assert z.pos.dtype == jnp.float32 and z.pos.shape == (5, 3)
    assert jc.spec_of(z).pos.shape == spec.pos.shape
    with pytest.raises(jc.SpecError, match="dimension 'n' of f32\\[n,3\\] is not given"):
        Particles.spec()
    with pytest.raises(jc.SpecError, match="(?s)unknown dimension\\(s\\) m.*Valid dims: n"):
        Particles.spec(n=2, m=3)


def test_dims_must_be_non_negative_ints():
    @jc.state
    class Grid:
        x: Float32[Array, "n 2*n"]
        y: Float32[Array, "*batch n"]
        z: Float32[Array, "n n-1"]

    for make in (Grid.spec, Grid.zeros):
        what = make.__name__
        for bad in (-1, 3.5, "3", True, None):  # "3" made 2*n "33"
            with pytest.raises(jc.SpecError) as info:
                make(n=bad, batch=(2,))
            msg = str(info.value)
            assert f"Grid.{what}() got 1 invalid dimension size:\n" in msg
            assert f"\n  n={bad!r} ({type(bad).__name__}): expected a non-negative int\n" in msg
            assert info.value.contract == "dims"
            assert f"Fix: pass each dimension as a non-negative Python int, e.g. Grid.{what}(n=4), " in msg
            assert msg.endswith(
                "and a *batch dimension as a tuple of them, e.g. batch=(2, 3).\nSee: python -m jaxcontracts explain SpecError"
            )
        for bad in ((2, -1), (2.0,), "2", (True,)):
            with pytest.raises(jc.SpecError, match=r"\*batch takes a tuple of non-negative ints"):
                make(n=2, batch=bad)
        with pytest.raises(jc.SpecError, match=r"'n-1' of f32\[n,n-1\] is -1 for n=0"):
            make(n=0, batch=())
        good = make(n=np.int64(2), batch=[1, np.int32(3)])
        assert good.x.shape == (2, 4) and good.y.shape == (1, 3, 2) and good.z.shape == (2, 1)
        assert make(n=2, batch=5).y.shape == (5, 2)  # one size for *batch, as before


def test_sharding_mapping_names_only_data_fields(mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rep = NamedSharding(mesh2, P())
    for make in (Particles.spec, Particles.zeros):
        with pytest.raises(jc.SpecError) as info:
            make(n=4, sharding={"pos": rep, "vell": rep})
        msg = str(info.value)
        assert msg.startswith(
            f"Particles.{make.__name__}(sharding=...) names 'vell', which is not a "
            "data field of Particles.\n  valid field names: pos, vel, t\n"
        )
        with pytest.raises(jc.SpecError, match=r"'dt', which is not a data field .*\(dt: static"):
            make(n=4, sharding={"dt": rep})

    @jc.state
    class Outer:
        inner: Particles
        step: Int32[Array, ""]

    with pytest.raises(jc.SpecError, match=r"Particles.spec\(sharding=...\) names 'x'"):
        Outer.spec(n=4, sharding={"inner": {"x": rep}, "step": rep})
    o = Outer.spec(n=4, sharding={"inner": {"pos": rep}, "step": rep})
    assert o.inner.pos.sharding == rep and o.step.sharding == rep


@pytest.mark.parametrize("form", ["decorator", "base class"])
def test_subclass_runs_the_base_post_init_like_a_dataclass(form, monkeypatch):
    from jaxcontracts._state import classes as _state

    ran = []

    def positive(self):
        ran.append(("base", type(self).__name__))
        if float(self.x) < 0:
            raise ValueError(".x must be >= 0")

    if form == "decorator":

        @jc.state
        class Base:
            x: Float32[Array, ""]
            __post_init__ = positive

        @jc.state
        class Plain(Base):  # no __post_init__ of its own: the base's runs
            y: Float32[Array, ""]

        @jc.state
        class Own(Base):  # its own: it calls super(), as with dataclasses
            y: Float32[Array, ""]

            def __post_init__(self):
                ran.append(("own", type(self).__name__))
                super().__post_init__()

        @jc.state
        class Quiet(Base):  # its own, without super(): the base's does not run
            y: Float32[Array, ""]

            def __post_init__(self):
                ran.append(("quiet", type(self).__name__))

    else:

        class Base(jc.State):
            x: Float32[Array, ""]
            __post_init__ = positive

        class Plain(Base):
            y: Float32[Array, ""]

        class Own(Base):
            y: Float32[Array, ""]

            def __post_init__(self):
                ran.append(("own", type(self).__name__))
                super().__post_init__()

        class Quiet(Base):
            y: Float32[Array, ""]

            def __post_init__(self):
                ran.append(("quiet", type(self).__name__))

    validated = []
    original = _state.validate
    monkeypatch.setattr(_state, "validate", lambda self: (validated.append(1), original(self)))
    Plain(x=1.0, y=2.0)
    assert ran == [("base", "Plain")] and len(validated) == 1
    ran.clear(), validated.clear()
    Own(x=1.0, y=2.0)
    assert ran == [("own", "Own"), ("base", "Own")]
    assert len(validated) == 1  # validated once, not again through super()
    ran.clear(), validated.clear()
    Quiet(x=-1.0, y=2.0)
    assert ran == [("quiet", "Quiet")] and len(validated) == 1
    for cls in (Base, Plain, Own):
        with pytest.raises(ValueError, match="must be >= 0"):
            cls(**({"x": -1.0} if cls is Base else {"x": -1.0, "y": 0.0}))
    with pytest.raises(jc.SpecError, match=r"\.y: expected f32\[\]"):
        Plain(x=1.0, y="no")  # fields are validated before any __post_init__


def test_init_var_is_a_definition_error():
    with pytest.raises(jc.DefinitionError) as info:

        @jc.state
        class Seeded:
            x: Float32[Array, ""]
            seed: dataclasses.InitVar[int] = 0

    msg = str(info.value)
    assert msg.startswith("@jc.state: ") and "Seeded.seed is an InitVar, which a state cannot hold." in msg
    assert "tree_unflatten" in msg
    assert "Fix: keep it as a field: `seed: int = jc.static(default=...)`" in msg
    with pytest.raises(jc.DefinitionError, match=r"Seeded2.seed is an InitVar"):

        class Seeded2(jc.State):
            x: Float32[Array, ""]
            seed: dataclasses.InitVar[int]


@pytest.fixture
def x64():
    """Turns JAX's 64-bit mode on for a block: ``with x64(): ...``."""
    import contextlib

    before = jax.config.jax_enable_x64

    @contextlib.contextmanager
    def on():
        jax.config.update("jax_enable_x64", True)
        try:
            yield
        finally:
            jax.config.update("jax_enable_x64", before)

    yield on
    jax.config.update("jax_enable_x64", before)


def test_64_bit_fields_need_jax_enable_x64_when_used_not_when_defined(x64):
    assert not jax.config.jax_enable_x64

    @jc.state  # defining it is fine: x64 may be turned on later
    class Wide:
        x: Float64[Array, "n"]
        i: Int64[Array, ""]

    @jc.state
    class Tree:
        params: PyTree[Array]

    for make in (Wide.spec, Wide.zeros):
        with pytest.raises(jc.SpecError) as info:
            make(n=2)  # was: a spec saying f64 while zeros() made f32
        msg = str(info.value)
        assert (
            f"<locals>.Wide.{make.__name__}(): field .x: f64[n] is not what JAX would make: "
            "float64 needs JAX's 64-bit mode, which is off (jax_enable_x64 is False), "
            "so JAX would make it float32, and the spec would not describe the arrays.\n"
            'Fix: turn it on before creating any array: jax.config.update("jax_enable_x64", '
        ) in msg
        assert msg.endswith("or annotate the field Float32 and pass float32.\nSee: python -m jaxcontracts explain SpecError")
    with pytest.raises(jc.SpecError, match=r"field \.params\['w'\]: f64\[2\] \(numpy array\)"):
        Tree.spec(params={"w": np.zeros(2)})
    with pytest.raises(jc.SpecError) as info:
        Wide(x=np.zeros(2), i=1)  # was: a float32 array in a Float64 field
    msg = str(info.value)
    assert "got 2 invalid fields" in msg
    assert ".x: expected f64[n], got f64[2] (numpy array)\n      fix: float64 needs JAX's" in msg
    assert "so JAX would make it int32: turn it on" in msg and "annotate the field Int32" in msg
    with pytest.raises(jc.SpecError, match=r"\.x: expected f64\[n\], got f32\[2\] \(jax array\)\n.*64-bit"):
        Wide(x=jnp.zeros(2, jnp.float32), i=jax.ShapeDtypeStruct((), np.int64))
    with pytest.raises(jc.SpecError, match=r"\.params\['w'\]: expected an array leaf JAX can hold"):
        Tree(params={"w": np.zeros(2)})  # was: silently stored as float32

    with x64():  # turned on after the class was defined: spec, zeros and values agree
        spec = Wide.spec(n=2)
        z = Wide.zeros(n=2)
        w = Wide(x=np.zeros(2), i=2**40)
        t = Tree(params={"w": np.zeros(2)})
        assert spec.x.dtype == z.x.dtype == w.x.dtype == np.float64
        assert spec.i.dtype == z.i.dtype == w.i.dtype == np.int64 and int(w.i) == 2**40
        shapes = [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves((spec, z, w))]
        assert shapes == [((2,), np.float64), ((), np.int64)] * 3
        assert t.params["w"].dtype == np.float64
        assert Tree.spec(params={"w": np.zeros(2)}).params["w"].dtype == np.float64


def test_abstract_dtype_is_a_definition_error():
    for abstract in (Float, Shaped):
        with pytest.raises(jc.DefinitionError, match="abstract dtype") as info:

            @jc.state
            class Bad:
                x: abstract[Array, "n"]  # type: ignore[valid-type]

        assert "Float32[Array, 'n']" in str(info.value)


def test_non_array_field_is_a_definition_error_listing_the_choices():
    with pytest.raises(jc.DefinitionError) as info:

        @jc.state
        class Bad:
            lr: float

    msg = str(info.value)
    assert "Bad.lr" in msg and "jc.static" in msg and "1. an array" in msg


def test_nested_state_and_pytree_fields():
    @jc.state
    class Train:
        particles: Particles
        params: PyTree[Float32[Array, "..."]]
        opt: PyTree[Array]
        step: Int32[Array, ""]

    params = {"w": np.ones((3, 2), np.float32), "b": jnp.asarray(0.5)}
    opt = (
        {"mu": jnp.zeros((3, 2)), "nu": jnp.zeros((3, 2))},
        {"count": jnp.zeros((), jnp.int32)},
    )
    s = Train(particles=make_particles(4), params=params, opt=opt, step=0)
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(s)]
    assert ".particles.pos" in paths and ".params['w']" in paths
    assert ".opt[1]['count']" in paths
    assert isinstance(s.params["w"], jax.Array) and not s.params["b"].aval.weak_type
    spec = Train.spec(n=4, params=params, opt=opt)
    assert spec.particles.pos.shape == (4, 3)
    assert spec.params["w"].shape == (3, 2)
    with pytest.raises(jc.SpecError, match="field .params is a PyTree"):
        Train.spec(n=4)
    with pytest.raises(jc.SpecError, match=r"\.params\['w'\]: expected f32"):
        Train(particles=make_particles(4), params={"w": jnp.zeros(2, jnp.int32)}, opt=opt, step=0)
    with pytest.raises(jc.SpecError, match="a Particles instance"):
        Train(particles={"pos": 1}, params=params, opt=opt, step=0)


def test_no_validation_inside_a_trace_or_on_unflatten(monkeypatch):
    from jaxcontracts._state import classes as _state

    calls = []
    original = _state.validate

    def spy(self):
        calls.append(type(self).__name__)
        return original(self)

    monkeypatch.setattr(_state, "validate", spy)
    p = make_particles()
    calls.clear()
    jax.tree_util.tree_map(lambda x: x + 1, p)  # unflatten: no __init__
    assert calls == []

    @jax.jit
    def f(p):
        return Particles(pos=p.pos, vel=p.vel, t=p.t + 1, dt=p.dt)

    f(p)
    assert calls == ["Particles"]  # called, but returned at once (tracers)


def test_repr_never_reads_device_values():
    p = make_particles()
    assert repr(p) == "Particles(pos=f32[4,3], vel=f32[4,3], t=f32[], dt=0.01)"


def test_dataclass_behaviour():
    p = make_particles()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.t = jnp.float32(1)  # type: ignore[misc]
    q = dataclasses.replace(p, t=jnp.float32(2))
    assert float(q.t) == 2.0


def test_bool_and_other_dtypes():
    @jc.state
    class Flags:
        alive: Bool[Array, "n"]
        ids: Int32[Array, "n"]

    f = Flags.zeros(n=3)
    assert f.alive.dtype == jnp.bool_ and f.ids.dtype == jnp.int32
    assert Flags(alive=np.ones(3, bool), ids=np.arange(3, dtype=np.int32)).alive.shape == (3,)


def test_spec_of_keeps_weak_type_and_sharding(mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    s = NamedSharding(mesh2, P("x"))
    x = jax.device_put(jnp.zeros(8), s)
    spec = jc.spec_of({"x": x, "w": jnp.asarray(1.0), "n": np.zeros(2, np.int8)})
    assert spec["x"].sharding == s
    assert spec["w"].weak_type is True
    assert spec["n"].dtype == np.int8
    with pytest.raises(jc.SpecError, match=r"\['bad'\]: str"):
        jc.spec_of({"bad": "text"})


def test_state_spec_and_zeros_with_sharding(mesh2):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    row = NamedSharding(mesh2, P("x"))
    rep = NamedSharding(mesh2, P())
    z = Particles.zeros(n=4, sharding={"pos": row, "vel": row, "t": rep})
    assert z.pos.sharding == row and z.t.sharding == rep
    spec = Particles.spec(n=4, sharding=rep)
    assert spec.vel.sharding == rep


def test_state_built_from_numpy_owns_its_device_buffer():
    # On CPU jax.device_put may borrow an aligned numpy buffer; XLA cannot
    # donate a borrowed buffer, so the first step would silently copy.
    raw = np.zeros(64 * 3 + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4  # a 64-byte aligned view: borrowable
    host = raw[start : start + 64 * 3].reshape(64, 3)
    p = Particles(pos=host, vel=np.zeros((64, 3), np.float32), t=0.0)
    assert p.pos.unsafe_buffer_pointer() != host.ctypes.data
    @jc.hot_step(signature=Particles)
    def advance(s: Particles) -> Particles:
        return Particles(pos=s.pos + 1, vel=s.vel, t=s.t, dt=s.dt)

    before = p.pos.unsafe_buffer_pointer()
    q = advance(p)
    assert q.pos.unsafe_buffer_pointer() == before  # donated on the very first step


def test_state_base_class_is_the_decorator():
    class Inner(jc.State):  # local: its name resolves in this frame
        x: Float32[Array, "n"]

    class Outer(jc.State, eq=True):
        inner: Inner
        step: Int32[Array, ""]
        dt: float = jc.static(default=0.1)

    o = Outer(inner=Inner(x=np.zeros(3, np.float32)), step=0)
    assert repr(o) == "Outer(inner=Inner(x=f32[3]), step=i32[], dt=0.1)"
    assert isinstance(o.inner.x, jax.Array) and o.step.dtype == jnp.int32
    assert [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(o)] == [
        ".inner.x",
        ".step",
    ]
    assert Outer.spec(n=2).inner.x == jax.ShapeDtypeStruct((2,), jnp.float32)
    assert o.replace(dt=0.2).dt == 0.2 and Outer.zeros(n=1).dt == 0.1
    assert o == o and Inner.__eq__ is object.__eq__  # eq off unless asked for
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.step = jnp.int32(1)  # type: ignore[misc]
    with pytest.raises(jc.SpecError, match=r"\.x: expected f32\[n\]"):
        Inner(x=np.zeros(3, np.int32))
    assert jc.state(Inner) is Inner  # already a state: the decorator adds nothing
    with pytest.raises(jc.DefinitionError, match=r"class Inner\(jc.State, eq=True\)"):
        jc.state(eq=True)(Inner)
    with pytest.raises(jc.DefinitionError, match="cannot resolve an annotation"):

        class Bad(jc.State):
            x: Missing


def test_wrong_dtype_fix_names_a_dtype_that_exists():
    from jaxtyping import UInt16

    @jc.state
    class U:
        x: UInt16[Array, "n"]

    with pytest.raises(jc.SpecError) as info:
        U(x=jnp.zeros(3, jnp.int32))
    message = str(info.value)
    assert "jnp.uint16" in message and "jnp.u16" not in message
    assert hasattr(jnp, "uint16")


def test_an_optional_array_field_is_refused_naming_the_annotation_as_written():
    # it said "the annotation Optional is not something a state field can
    # hold", the array type inside dropped
    from typing import Optional

    with pytest.raises(jc.DefinitionError, match=r"annotation Optional\[Float32\[Array, 'n'\]\] is not") as info:

        @jc.state
        class Maybe:
            x: Optional[Float32[Array, "n"]] = None  # noqa: UP045 - the spelling users write

    assert "None too: an optional array" in str(info.value)
    with pytest.raises(jc.DefinitionError, match=r"annotation Optional\[Float32\[Array, 'n'\]\] is not"):

        @jc.state
        class Maybe2:
            x: Float32[Array, "n"] | None = None  # the same, as Python 3.10 writes it


def test_a_pytree_field_whose_dims_disagree_with_an_array_field_is_the_one_named():
    # it blamed the array field (".v: expected Float32[Array, 'n'], got f32[4]")
    # while saying ".v" bound n=4, and never showed the tree's size 3
    class T(jc.State):
        params: PyTree[Float32[Array, "n"]]
        v: Float32[Array, "n"]

    with pytest.raises(jc.SpecError) as info:
        T(params={"a": jnp.zeros(3)}, v=jnp.zeros(4))
    text = str(info.value)
    assert "1 invalid field" in text and ".params: expected PyTree[Float32[Array, 'n']], got dict {['a']: f32[3]}" in text, text
    assert "n=4  (n from .v)" in text and list(info.value.leaves) == [".params"]

    class Shifted(jc.State):  # a dim only the tree binds, used by an array field: accepted as before
        params: PyTree[Float32[Array, "n"]]
        v: Float32[Array, "n+1"]

    assert Shifted(params={"a": jnp.zeros(3)}, v=jnp.zeros(4)).v.shape == (4,)
    with pytest.raises(jc.SpecError, match=r"\.v: expected Float32\[Array, 'n\+1'\], got f32\[5\]"):
        Shifted(params={"a": jnp.zeros(3)}, v=jnp.zeros(5))


def test_a_field_named_like_a_dimension_is_named_as_the_clash_it_is():
    # `n` both a field and the dimension of x: P.zeros(n=3) said "dimension
    # 'n' is not given. Fix: pass it, e.g. .zeros(n=...)", which it was
    @jc.state
    class P:
        x: Float32[Array, "n"]
        n: Int32[Array, ""]

    for make, given in ((P.zeros, {"n": 3}), (P.spec, {"n": 3}), (P.zeros, {})):  # ({}: not "pass n=...")
        with pytest.raises(jc.SpecError, match=r"`n` names both a field of .*P and a dimension") as e:
            make(**given)
        assert 'Float32[Array, "n_size"]' in str(e.value)
    assert P(x=jnp.ones(3), n=jnp.int32(3)).x.shape == (3,)  # built from values, nothing is ambiguous
