"""Compiling one signature of a step (``compile_signature``, from specs, no data
needed), and the contracts proven then, once per signature at every checks
level: carry invariance (each returned state has exactly its input's spec, else
a :class:`RecompileError`) and donation in effect (every donated leaf aliases an
output, else a :class:`DonationError`), each naming the leaves.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import _contracts
from .._compat import events
from .._compat.arrays import hook_deleted_reads
from .._compat.executable import alias_bytes, aliased_parameters, requested_aliases
from .._compat.tracing import context_changes, flatten, jit_context
from .._donation.reads import consumed_wait, deleted_read
from .._dtypes import canonical
from .._errors import (
    NOTHING_RAN,
    ContractError,
    DefinitionError,
    DonationError,
    RecompileError,
    TransferError,
)
from .._format import flatten_with_path, fmt_aval, fmt_object
from .._leafdiff import LeafDiff, diff_leaves, diff_lines
from .._records import CompiledSignature, LeafRecord
from .._runtime import compiling
from .._state.fields import is_sealed_state
from .._state.filter import Filtered, join, join_out, split_if_needed
from .._state.foreign import any_node
from .._state.inplace import (
    closed_over_refs,
    closed_over_refs_error,
    is_inplace_object,
    mutated,
    new_refs,
    ref_values,
)
from .._state.spec import leaf_spec, movable, moved_by_jax, spec_nbytes
from .definition import StepDefinition
from .diffs import diff_specs

__all__ = [
    "compile_signature",
    "jit_for",
    "quiet_donation_warning",
    "signature_diffs",
]

def _leaf_key(x: Any, sharding: Any) -> tuple[Any, ...]:
    """What makes two leaves' exact specs the same."""
    return (tuple(x.shape), canonical(x.dtype), bool(x.weak_type), sharding)


def _spec_key(treedef: Any, leaves: Sequence[Any], shardings: Sequence[Any]) -> tuple[Any, ...]:
    """What makes two specs the same: their structure and each leaf's exact spec."""
    return (treedef, tuple(map(_leaf_key, leaves, shardings)))


class quiet_donation_warning(warnings.catch_warnings):
    """Silence JAX's lowering-time donation warning: we verify and report it."""

    def __enter__(self) -> Any:
        out = super().__enter__()
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return out


class JitPlan(NamedTuple):
    """What a compile of a step for some arguments traces: :func:`jit_for`'s answer."""

    jitted: Any  # the jax.jit function, its donation set
    spec_args: tuple[Any, ...]  # the arguments it is traced with (specs)
    treedef: Any  # of the positional arguments
    donated: tuple[int, ...]  # flat leaf indices donated
    flat_style: bool  # called with flat leaves (per-leaf donation)
    # the definition with what this compile found out: what the step returns
    # (``carried``, read from the output where the decorator could not tell) and
    # the objects it updates in place; the step keeps it (HotStep._learn)
    definition: StepDefinition


def jit_for(definition: StepDefinition, positional: tuple[Any, ...]) -> JitPlan:
    """The jitted function for ``positional`` and what tracing it needs (:class:`JitPlan`)."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(positional)
    paths = [p for p, _ in with_path]
    specs = []
    for p, x in with_path:
        spec = leaf_spec(x)
        if spec is None:
            raise TransferError(
                f"{definition.name}: argument {definition.param_path(p)} is {fmt_object(x)}, "
                "not an array.",
                fix="pass arrays (or specs); make configuration a jc.static field "
                "or close over it.",
                contract="device-arguments",
                step=definition.name,
                leaves=[definition.param_path(p)],
            )
        specs.append(spec)
    candidates = tuple(
        i
        for i in definition.state_params
        if i not in definition.carried_params
        and (i in definition.ref_params or is_inplace_object(positional[i]))
    )
    out: Any = None
    per_param = tuple(jax.tree_util.tree_unflatten(treedef, specs))
    if definition.carried is None:  # state= named, or no return annotation: read the output
        with quiet_donation_warning(), _tracing(definition):
            out = jax.eval_shape(
                _fresh(_in_place(definition, definition.positional, candidates), definition),
                *per_param,
            )
        definition = definition.resolve_carried(out, per_param)
    inplace = tuple(i for i in candidates if i not in definition.carried_params)
    if inplace:
        definition = definition.with_inplace(inplace)
    _refuse_uncarried(definition, out, per_param)
    # jax.jit donates nothing under jax_debug_nans (it runs a failing program again, on its inputs)
    donated = () if jax.config.jax_debug_nans else definition.donated_leaves(paths)
    per_arg: dict[int, list[bool]] = {}
    donated_set = set(donated)
    specs = _movable_unplaced(definition, paths, specs, [x for _, x in with_path], donated_set)
    for i, p in enumerate(paths):
        per_arg.setdefault(p[0].idx, []).append(i in donated_set)
    flat_style = any(any(v) and not all(v) for v in per_arg.values()) or _flatten_in_python(
        positional, treedef
    )
    positional_fn = derive_out_shardings(
        definition, _in_place(definition, definition.positional, candidates), paths, specs
    )
    if flat_style:
        fn, argnums, spec_args = _fresh(positional_fn, definition, treedef), donated, tuple(specs)
    else:
        fn = _fresh(positional_fn, definition)
        argnums = tuple(a for a, v in per_arg.items() if v and all(v))
        spec_args = tuple(jax.tree_util.tree_unflatten(treedef, specs))
    jitted = jax.jit(fn, donate_argnums=argnums, keep_unused=True)
    return JitPlan(jitted, spec_args, treedef, donated, flat_style, definition)


def _movable_unplaced(
    definition: StepDefinition, paths: Sequence[Any], specs: list[Any], leaves: Sequence[Any],
    donated: set[int],
) -> list[Any]:
    """The specs to compile, with the placement of each undonated uncommitted
    array left to the program where committed arrays are elsewhere (a key
    made on the default device beside a state sharded over a mesh): as
    ``jax.jit`` compiles it, and it is moved at each call. A donated one is
    refused by name: its placement is what the step proves before donating."""
    committed: dict[frozenset[Any], Any] = {}  # device set -> its first committed leaf
    for x in leaves:
        if isinstance(x, jax.Array) and not movable(x):
            committed.setdefault(frozenset(x.sharding.device_set), x)
    if not committed:
        return specs
    elsewhere = [
        i
        for i, x in enumerate(leaves)
        if movable(x) and frozenset(x.sharding.device_set) not in committed
    ]
    moved = [i for i in elsewhere if i in donated]
    if moved:
        where, other = next(iter(committed.items()))
        at = next(definition.param_path(p) for p, x in zip(paths, leaves) if x is other)
        raise DonationError(
            f"{definition.name}: {len(moved)} donated "
            f"{'leaf is' if len(moved) == 1 else 'leaves are'} uncommitted, on other devices than "
            f"{at} (placed on {len(where)} device(s)). A hot step proves each donated leaf's "
            "placement before it donates it; jax.jit would move such a leaf to the other devices "
            "at the call.",
            [f"  {definition.param_path(paths[i])}: {fmt_aval(leaves[i].shape, leaves[i].dtype)} "
             f"on {', '.join(map(str, leaves[i].sharding.device_set))}" for i in moved],
            fix=f"place {'it' if len(moved) == 1 else 'them'} where {at} is before the first "
            "call: state = jax.tree.map(lambda x: x if x.committed else jax.device_put(x, "
            "NamedSharding(mesh, PartitionSpec())), state) (optax's step count, made by jnp.zeros "
            "in opt.init, is such a leaf).",
            note=NOTHING_RAN,
            contract="donation-hazard",
            step=definition.name,
            leaves=[definition.param_path(paths[i]) for i in moved],
        )
    return [
        jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=s.weak_type) if i in elsewhere else s
        for i, s in enumerate(specs)
    ]


def _in_place(
    definition: StepDefinition, fn: Callable[..., Any], candidates: tuple[int, ...]
) -> Callable[..., Any]:
    """``fn`` as traced: returns (output, the ``inplace_params`` objects after it ran)
    where the step updates some in place; refuses an argument updated in place
    that nothing carries back (a compiled function's changes to it are lost)."""
    inplace, skip = (
        definition.inplace_params,
        {*candidates, *definition.static_params, *definition.filtered_params},
    )
    checked = tuple(i for i in range(len(definition.param_names)) if i not in skip)
    refs = definition.ref_params

    def traced(*args: Any) -> Any:
        if refs:  # the refs' arrays: the step gets refs of them, and they come back out
            args = tuple(new_refs(a) if i in refs else a for i, a in enumerate(args))
        before = [jax.tree_util.tree_flatten(args[i]) for i in checked]
        out = fn(*args)
        if definition.filtered_params and definition.carried:
            out = _returned_numbers_as_arrays(definition, out, args)
        lost = [
            i
            for i, (was, _) in zip(checked, before)
            if mutated(was, jax.tree_util.tree_leaves(args[i]))
        ]
        if lost:  # a returned state may be updated in place too: its new value is carried
            returned = definition.resolve_carried(out, args).carried_params
            lost = [i for i in lost if i not in returned]
        if lost:  # and so is a new value the step returns (``return nnx.state(model)``)
            out_ids = {id(leaf) for leaf in jax.tree_util.tree_leaves(out)}
            lost = [i for i in lost if not _handed_back(before[checked.index(i)], args[i], out_ids)]
            if lost:  # raised once the trace is over (JAX would add its own note to it)
                _lost.error = _lost_update_error(definition, lost, args)
        if not inplace:
            return out
        return out, tuple(ref_values(args[i]) if i in refs else args[i] for i in inplace)

    return traced


def _handed_back(before: tuple[list[Any], Any], arg: Any, out_ids: set[int]) -> bool:
    """Whether the output hands back ``arg``'s whole new value (``nnx.update(model,
    step(model))``): its structure unchanged and every leaf it holds a leaf of the output."""
    leaves, treedef = jax.tree_util.tree_flatten(arg)
    return treedef == before[1] and bool(leaves) and all(id(leaf) in out_ids for leaf in leaves)


def _returned_numbers_as_arrays(definition: StepDefinition, out: Any, args: tuple[Any, ...]) -> Any:
    """A filtered (equinox) step's returned states, each Python number where the
    given state held an array made an array of its dtype, as jax.jit returns it
    (diffrax's ``solver.step`` returns ``False`` where ``init`` gave an array:
    eqx.filter_jit's bool would be a new static value, a second compile)."""
    shift = 1 if definition.inplace_params else 0  # with in-place states, the output is element 0
    for i, pos in definition.carried or ():
        pos = pos[shift:]
        if i in definition.inplace_params or len(pos) > 1:
            continue
        element = out[pos[0]] if pos else out
        if type(element) is not Filtered:
            continue
        got, treedef = jax.tree_util.tree_flatten(join(element))
        given, given_def = jax.tree_util.tree_flatten(join(args[i]))
        if treedef != given_def:
            continue
        fixed = [
            jnp.asarray(x, dtype=g.dtype)
            if isinstance(x, (bool, int, float, complex)) and hasattr(g, "dtype")
            else x
            for x, g in zip(got, given)
        ]
        new = split_if_needed(jax.tree_util.tree_unflatten(treedef, fixed))
        out = (*out[: pos[0]], new, *out[pos[0] + 1 :]) if pos else new
    return out


_lost = threading.local()  # the error of a trace that found a lost update (see _in_place)


@contextlib.contextmanager
def _tracing(definition: StepDefinition) -> Iterator[None]:
    """A trace for a compile: the user's error names the step; a lost update
    (:func:`_in_place`) is raised once the trace is over."""
    __tracebackhide__ = True
    _lost.error = None
    try:
        yield
    except Exception as err:
        if not isinstance(err, ContractError):
            err.add_note(
                f"jaxcontracts: raised while compiling the hot step {definition.name} (tracing and "
                "lowering it: at its first call with these shapes, or its .compile())."
            )
        raise
    finally:
        lost, _lost.error = _lost.error, None
    if lost is not None:
        raise lost


def _lost_update_error(
    definition: StepDefinition, lost: Sequence[int], args: Sequence[Any]
) -> DefinitionError:
    names = [definition.param_names[i] for i in lost]
    objects = [n for i, n in zip(lost, names) if is_inplace_object(args[i])]
    state = [
        definition.param_names[i]
        for i in (*definition.state_params, *lost)
        if i in definition.state_params or is_inplace_object(args[i])
    ]
    state = list(dict.fromkeys(state))
    listed = f'"{state[0]}"' if len(state) == 1 else "(" + ", ".join(f'"{n}"' for n in state) + ")"
    return DefinitionError(
        f"{definition.name} updates {', '.join(f'`{n}`' for n in names)} in place, "
        "and nothing carries the new value out of the compiled step: the update would be lost "
        "(the object would keep its old arrays).",
        fix=(
            f"name the objects it updates as state: @jc.hot_step(state={listed}); their "
            "new arrays are written back into them after each call, as nnx.jit does."
            if objects
            else "return the new value and rebind it (s = step(s)), with the parameter "
            "named in state=: a container passed to a compiled step is a copy inside it."
        ),
        note=NOTHING_RAN,
        contract="carry",
        step=definition.name,
        leaves=names,
    )


def _refuse_uncarried(definition: StepDefinition, out: Any, spec_args: Sequence[Any]) -> None:
    """A state parameter named in ``state=`` that the step neither returns nor
    updates in place would never change: refused, naming it, and what it
    returns of the same kind with another structure (a dict with a key added:
    its new value, perhaps, whose carry would change the step's signature)."""
    __tracebackhide__ = True
    idle_params = [i for i in definition.state_params if i not in definition.carried_params]
    idle = [definition.param_names[i] for i in idle_params]
    if definition.state_named and idle:
        details = [line for i in idle_params for line in _alike(definition, out, spec_args[i], i)]
        raise DefinitionError(
            f"{definition.name}: state parameter {', '.join(f'`{n}`' for n in idle)} is neither "
            "returned by the step nor updated in place, so no call would carry a new "
            "value of it (and nothing of it would be donated).",
            details,
            fix=("if what it returns there is the state's new value, keep the state's tree "
                 "structure fixed (carry invariance: give it every key, and every optional "
                 "leaf, before the first call). Otherwise: " if details else "")
            + "return its new value (alone, or in a returned tuple); or, where the step "
            "only reads it, leave it out of state= (a step that carries no state is "
            "@jc.hot_step(stateless=True)).",
            note=NOTHING_RAN,
            contract="definition",
            step=definition.name,
            leaves=idle,
        )


def _alike(definition: StepDefinition, out: Any, given: Any, i: int) -> list[str]:
    """The lines that show what the step returns of the same node type as the
    state ``given`` (the output, or an element of a returned tuple) and how
    its structure differs; none where nothing returned is alike."""
    if out is None:
        return []
    out = join_out(out)
    want = jax.tree_util.tree_structure(join(given)).node_data()
    if want is None:
        return []
    places = [((), out)]
    if isinstance(out, (tuple, list)):
        places += [((k,), x) for k, x in enumerate(out)]
    name = definition.param_names[i]
    for pos, element in places:
        got = jax.tree_util.tree_structure(element).node_data()
        whole_tuple = pos == () and type(out) is tuple and want[0] is not tuple
        if got is None or got[0] is not want[0] or whole_tuple:
            continue
        diffs = diff_specs(given, element)
        if not diffs:
            continue
        lines, _ = diff_lines(
            diffs, name, words=("takes", "returns"), cause=_carry_cause, full_paths=False
        )
        where = f"return value {list(pos)}" if pos else "the return value"
        return [f"  `{name}` and {where}, a {want[0].__name__} too, differ:", *lines]
    return []


def _fresh(
    fn: Callable[..., Any], definition: StepDefinition, flat: Any = None
) -> Callable[..., Any]:
    """A new function calling ``fn``, made for one compile: JAX caches a trace
    and lowering (~6x the executable's memory) weakly by the function, so they
    die with this one, not with the step. JAX's messages name the user's
    function through ``__wrapped__`` and the step's parameters by name; with
    ``flat`` (the arguments' treedef) it takes the flat leaves (``leaves[i]``)."""
    if flat is None:

        def step(*args: Any) -> Any:
            return fn(*args)

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter(n, kind) for n in definition.param_names]
    else:

        def step(*leaves: Any) -> Any:
            return fn(*jax.tree_util.tree_unflatten(flat, leaves))

        params = [inspect.Parameter("leaves", inspect.Parameter.VAR_POSITIONAL)]
    step.__name__ = getattr(definition.fn, "__name__", "step")
    step.__qualname__ = getattr(definition.fn, "__qualname__", step.__name__)
    step.__wrapped__ = _user_function(definition)  # type: ignore[attr-defined]
    step.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return step


def _user_function(definition: StepDefinition) -> Any:
    """The user's function (a partial's), whose name and line JAX's words name."""
    fn = definition.fn
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


_BUILTIN_NODES = (dict, list, tuple, type(None))


def _flatten_in_python(positional: tuple[Any, ...], treedef: Any) -> bool:
    """Whether the arguments hold nodes flattened by Python callbacks (nnx,
    equinox...) and no jc.state: compiled over flat leaves, the executable does
    not pay those callbacks again after the call path flattened them."""
    if any(is_sealed_state(arg) for arg in positional):
        return False
    return any_node(
        treedef,
        lambda kind: (
            kind not in _BUILTIN_NODES
            and not (issubclass(kind, tuple) and hasattr(kind, "_fields"))
        ),
    )


def _spread(sharding: Any) -> bool:
    """Whether a leaf placed so is constrained to it on the way out: placed on
    more than one device, over a mesh none of whose axes is ``Explicit`` (the
    default of ``jax.make_mesh`` since jax 0.7). There the sharding is part of
    the array's type: ``with_sharding_constraint`` refuses it, and the carry
    check compares the output's with the input's, as for any spec."""
    try:
        if len(sharding.device_set) <= 1:
            return False
    except Exception:  # noqa: BLE001 - no sharding, or not a Sharding
        return False
    types = getattr(getattr(sharding, "mesh", None), "axis_types", None) or ()
    return jax.sharding.AxisType.Explicit not in types


def derive_out_shardings(
    definition: StepDefinition, fn: Any, paths: Sequence[Any], specs: Sequence[Any]
) -> Any:
    """``fn`` with each returned state's multi-device leaves constrained to their
    input shardings, so XLA's propagation cannot reshard a carry (a replicated
    LayerNorm scale coming back ``P('data')``); other outputs are left to it."""
    per_param: dict[int, list[Any]] = {}
    for p, spec in zip(paths, specs):
        per_param.setdefault(p[0].idx, []).append(getattr(spec, "sharding", None))
    plan = []
    for arg, pos in definition.carried or ():
        shardings = per_param.get(arg, [])
        if len(pos) <= 1 and any(_spread(s) for s in shardings):
            plan.append((pos, [s if _spread(s) else None for s in shardings]))
    if not plan:
        return fn

    def constrained(*args: Any) -> Any:
        out = fn(*args)
        for pos, shardings in plan:
            try:
                sub = out[pos[0]] if pos else out
            except (TypeError, IndexError, KeyError):
                continue  # the carry check explains it
            leaves, treedef = jax.tree_util.tree_flatten(sub)
            if len(leaves) != len(shardings):
                continue  # the carry check explains it
            leaves = [
                x if s is None else jax.lax.with_sharding_constraint(x, s)
                for x, s in zip(leaves, shardings)
            ]
            sub = jax.tree_util.tree_unflatten(treedef, leaves)
            if not pos:
                out = sub
            else:
                items = list(out)
                items[pos[0]] = sub
                out = type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        return out

    return constrained


def _compile_args(definition: StepDefinition) -> str:
    """How the fix writes the step's ``.compile(...)`` arguments: every parameter,
    a state as ``S.spec(...)`` where its class makes specs, the others by name
    (``lr, S.spec(...)``: compile takes the arrays the calls will pass)."""
    t = definition.state_type
    spec = (
        f"{t.__name__}.spec(...)"
        if isinstance(t, type) and callable(getattr(t, "spec", None))
        else None
    )
    return ", ".join(
        spec if spec and i in definition.state_params else name
        for i, name in enumerate(definition.param_names)
    ) or "jc.spec_of(<its arguments>)"


def compile_signature(
    definition: StepDefinition, positional: tuple[Any, ...], why: str = ""
) -> tuple[CompiledSignature, StepDefinition]:
    """Compile for these arguments or specs and prove carry and aliasing; returns
    the signature and ``definition`` with ``carried`` resolved. ``why``: what
    makes it a new signature (a loop's refusal says it)."""
    __tracebackhide__ = True
    # in a hot_loop, a violation (before any trace)
    with compiling(definition.name, _compile_args(definition), definition.fn, why):
        jitted, spec_args, treedef, donated, flat_style, definition = jit_for(
            definition, positional
        )
        context = jit_context()  # the config values the program is traced and compiled under
        t0 = time.perf_counter()
        with quiet_donation_warning(), _tracing(definition):
            traced = jitted.trace(*spec_args)
            closed = closed_over_refs(traced.jaxpr.consts)
            if closed:  # before lowering: a hidden argument of the executable
                raise closed_over_refs_error(definition.name, definition.fn, closed)
            lowered = traced.lower()
            found = _contracts.scan(definition.name, traced.jaxpr)
        outcome = events.watch_cache()  # did JAX's persistent cache serve it?
        try:
            compiled = lowered.compile()
        finally:
            events.unwatch_cache(outcome)
        seconds = time.perf_counter() - t0

    in_shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0])
    flat_paths = [p for p, _ in flatten_with_path(positional)[0]]  # equinox State leaves named
    exact = _exact_specs(jax.tree_util.tree_leaves(spec_args), in_shardings)
    paths = [definition.param_path(p) for p in flat_paths]
    per_param = tuple(jax.tree_util.tree_unflatten(treedef, exact))
    out_avals, out_tree = _outputs(traced)
    _check_carry(definition, per_param, out_avals, out_tree, compiled.output_shardings)
    cached = outcome is not None and outcome.verdict == "hit"
    aliased = _check_aliasing(
        definition, lowered, compiled, flat_paths, paths, exact, donated, out_avals, cached
    )
    donated_set = set(donated)
    if donated:
        # later reads of what it consumes name the leaf and the step
        hook_deleted_reads(deleted_read, consumed_wait)
    host = tuple(i for i, p in enumerate(flat_paths) if p[0].idx in definition.host_params)
    # once per distinct spec (_exact_specs)
    nbytes = {k: spec_nbytes(x) for k, x in {id(x): x for x in exact}.items()}
    return CompiledSignature(
        spec_args=per_param,
        in_treedef=treedef,
        leaves=tuple(
            LeafRecord(
                path=path,
                spec=spec,
                donated=i in donated_set,
                aliased=None if aliased is None or i not in donated_set else i in aliased,
                nbytes=nbytes[id(spec)],
            )
            for i, (path, spec) in enumerate(zip(paths, exact))
        ),
        compiled=compiled,
        flat_style=flat_style,
        donated=donated,
        aliased=aliased,
        weak=tuple(bool(s.weak_type) for s in exact),
        multi_device=any(len(x.sharding.device_set) > 1 for x in exact),
        compile_seconds=seconds,
        cache=None if outcome is None else outcome.verdict,
        host=host,
        context=context,
        host_nbytes=sum(nbytes[id(exact[i])] for i in host),
        found=found,
    ), definition


def _exact_specs(specs: Sequence[Any], shardings: Sequence[Any]) -> list[Any]:
    """Each leaf's exact spec (its compiled sharding), one immutable object per
    distinct spec (a state's leaves repeat a few; each costs microseconds)."""
    made: dict[tuple[Any, ...], Any] = {}
    exact = []
    for s, sh in zip(specs, shardings):
        key = _leaf_key(s, sh)
        spec = made.get(key)
        if spec is None:
            spec = made[key] = jax.ShapeDtypeStruct(
                s.shape, s.dtype, sharding=sh, weak_type=s.weak_type
            )
        exact.append(spec)
    return exact


def signature_diffs(cs: CompiledSignature, leaves: Sequence[Any], treedef: Any) -> list[LeafDiff]:
    """How flat arguments differ from a compiled signature (empty: they match)."""
    if treedef != cs.in_treedef:
        return [LeafDiff("(structure)", "", "")]
    changed = context_changes(cs.context, jit_context())
    if changed:  # jax.jit's cache key: the same arguments are another program now
        return [
            LeafDiff(
                f"(config {name})",
                repr(then),
                repr(now),
                "a JAX option the program was compiled under",
                "config",
            )
            for name, then, now in changed
        ]
    expected = [(leaf.path, leaf.spec) for leaf in cs.leaves]
    moved = moved_by_jax(leaves, cs.donated)  # uncommitted: jax.jit places them as compiled
    got = [
        (leaf.path, spec.update(sharding=leaf.spec.sharding) if i in moved else spec)
        for i, (leaf, spec) in enumerate(zip(cs.leaves, map(leaf_spec, leaves)))
    ]
    return diff_leaves(expected, got)


def _outputs(traced: Any) -> tuple[list[Any], Any]:
    """The step's flat output avals and their tree (``Traced.out_info`` builds
    a spec per leaf on every read: 2 ms at 1,000 leaves)."""
    try:
        return list(traced.jaxpr.out_avals), traced.out_tree
    except AttributeError:  # another jax.stages.Traced: the public tree of specs
        return flatten(traced.out_info)


def _returned(out_tree: Any, pos: tuple[int, ...]) -> tuple[int, Any] | None:
    """Where a state's leaves sit in the flat output: (first leaf, its tree),
    for element ``pos`` of a returned tuple or list (None: there is none)."""
    start, tree = 0, out_tree
    for k in pos:
        kind = tree.node_data()
        children = tree.children()
        if kind is None or not issubclass(kind[0], (tuple, list)) or not 0 <= k < len(children):
            return None
        start += sum(c.num_leaves for c in children[:k])
        tree = children[k]
    return start, tree


def _check_carry(
    definition: StepDefinition,
    spec_args: tuple[Any, ...],
    out_avals: Sequence[Any],
    out_tree: Any,
    out_shardings: Any,
) -> None:
    """Each state parameter's spec is the spec returned for it (compared as
    :func:`_spec_key`; specs built only to explain a difference)."""
    __tracebackhide__ = True
    blocks: list[str] = []
    leaves: list[str] = []
    kinds: list[str] = []
    weak_params: list[str] = []
    # where the signature says a state is returned, and none is
    misplaced: list[tuple[tuple[int, ...], str]] = []
    shard_flat = jax.tree_util.tree_leaves(out_shardings)
    if len(shard_flat) != len(out_avals):
        shard_flat = [None] * len(out_avals)
    for arg, pos in definition.carried or ():
        name = definition.param_names[arg]
        found = _returned(out_tree, pos)
        if found is None:
            kind = out_tree.node_data()
            blocks.append(
                f"  parameter `{name}`: the step returns "
                f"{kind[0].__name__ if kind else 'one array'}, with no state at return value "
                f"{list(pos)}"
            )
            misplaced.append((pos, type(spec_args[arg]).__name__))
            continue
        start, tree = found
        end = start + tree.num_leaves
        spec_leaves, spec_tree = jax.tree_util.tree_flatten(spec_args[arg])
        key = _spec_key(spec_tree, spec_leaves, [x.sharding for x in spec_leaves])
        if _spec_key(tree, out_avals[start:end], shard_flat[start:end]) == key:
            continue  # the same exact spec: nothing to explain
        returned = jax.tree_util.tree_unflatten(
            tree,
            [
                jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=sh, weak_type=o.weak_type)
                for o, sh in zip(out_avals[start:end], shard_flat[start:end])
            ],
        )
        diffs = diff_specs(spec_args[arg], returned)
        if diffs:
            where = f"return value {list(pos)}" if pos else "the return value"
            lines, named = diff_lines(
                diffs, name, words=("takes", "returns"), cause=_carry_cause, full_paths=False
            )
            blocks += [f"  parameter `{name}` -> {where}:", *lines]
            kinds += [d.kind for d in diffs]
            leaves += named
            weak_params += [name] if all(d.kind == "weak_type" for d in diffs) else []
    if not blocks:
        return
    # every difference of one placement kind
    placement = [c for kind, c in _PLACEMENT_CAUSES.items() if all(k == kind for k in kinds)]
    if kinds and placement:
        what, fix = placement[0]
        summary = (
            f"{definition.name} {what}, so its own output would not match the "
            "compiled signature on the next call (jax.jit would recompile there; "
            "a compiled step would reject it)."
        )
    elif not kinds:
        summary = (
            f"{definition.name} does not return what its signature says: its return "
            "annotation (or state=) puts the new state in a returned tuple, and "
            "the step returns no tuple there."
        )
        fix = (
            "return the tuple the annotation declares (the new state at return value "
            f"{list(misplaced[0][0])}), or make the return annotation what the step "
            f"returns (-> {misplaced[0][1]} for the state alone)."
        )
    else:
        summary = (
            f"{definition.name} does not return its state with the spec it takes, so "
            "its own output would not match the compiled signature on the next "
            "call (jax.jit would recompile there; a compiled step would reject it)."
        )
        fix = (
            "make every returned leaf keep its input's dtype, shape and "
            "weak type: either initialise the leaf with the dtype the step "
            "produces (e.g. jnp.float32(0) instead of 0 for a float counter), or "
            "cast in the step (t=(s.t + 1).astype(s.t.dtype))."
            + "".join(
                f" For a state another library builds (its init makes weak scalars): "
                f"{p} = jc.device_tree({p}) before the first call makes every leaf "
                "strongly typed."
                for p in weak_params[:1]
            )
        )
    raise RecompileError(
        summary,
        blocks,
        fix=fix,
        note=NOTHING_RAN,
        contract="carry",
        step=definition.name,
        leaves=leaves,
    )


# A carried state that comes back placed otherwise: what the message says and its fix.
_PLACEMENT_CAUSES = {
    "sharding": (
        "does not return its state placed as it takes it",
        "the step makes these leaves, so place them in the step: "
        "jax.lax.with_sharding_constraint(new_leaf, <input sharding>) before "
        "returning (jaxcontracts constrains a returned state to its input "
        "shardings when those are given, so give the spec its sharding: "
        "State.spec(..., sharding=...) or compile from the placed arrays).",
    ),
    "memory_kind": (
        "returns its state in another memory than it takes it in",
        "return each carried leaf in the memory it comes in: move it back in the "
        "step before returning (jax.device_put(new_leaf, <input sharding>)), or "
        "return the moved copy as an output of its own, outside the state.",
    ),
}


def _carry_cause(d: LeafDiff) -> str:
    if d.kind == "sharding":
        return "XLA's sharding propagation placed the step's output differently"
    return d.cause


def _aliasing_fix(definition: StepDefinition, params: Sequence[int]) -> str:
    args = sorted({definition.param_names[i] for i in params if i in definition.donated_params})
    if args and len(args) == len(set(params)):
        names = ", ".join(map(repr, args))
        return (
            f"XLA can reuse a donated buffer only for an output of the same shape and "
            f"dtype; remove {names} from donate_argnames (it stays alive until the "
            "caller drops it), or return an output it can become."
        )
    return (
        "1. return that leaf in the new state with the same spec (the "
        "carry contract); 2. if it is a read-only input, leave it out of the "
        "return annotation (a state parameter the step does not return is "
        'read-only, never donated); 3. donate only the other fields, e.g. donate=("pos", "vel"); '
        "4. drop a non-state argument from donate_argnames; or "
        '5. opt out with donate="none".'
    )


def _check_aliasing(
    definition: StepDefinition,
    lowered: Any,
    compiled: Any,
    flat_paths: Sequence[Any],
    paths: Sequence[str],
    specs: Sequence[Any],
    donated: tuple[int, ...],
    out_avals: Sequence[Any],
    cached: bool,
) -> frozenset[int] | None:
    """The donated leaves XLA aliases (``None``: not verifiable here). XLA keeps
    each alias JAX requested (``_compat.executable``): the program is read only
    where XLA chose, or where the persistent cache (``cached``) served it."""
    __tracebackhide__ = True
    if not donated:
        return frozenset()
    if not cached:
        requested = requested_aliases(lowered, len(specs))
        if requested is not None and requested.issuperset(donated):
            return requested
    aliased = aliased_parameters(compiled, len(specs))
    if aliased is None:  # HLO unreadable: fall back on the byte count
        got = alias_bytes(compiled)
        want = sum(spec_nbytes(specs[i]) for i in donated)
        if got is None:
            return None  # not verified: reports say so, never a pass
        return frozenset(donated) if got >= want else frozenset()
    missing = [i for i in donated if i not in aliased]
    if missing:
        flat_params = [p[0].idx for p in flat_paths]
        outs = [(o.shape, canonical(o.dtype)) for o in out_avals]
        lines = []
        for i in missing:
            spec = specs[i]
            key = (spec.shape, canonical(spec.dtype))
            why = (
                f"no output is {fmt_aval(spec.shape, spec.dtype)}"
                if key not in outs
                else "an output of this shape and dtype exists, but the executable from "
                "JAX's persistent compilation cache does not reuse the buffer for it"
                if cached
                else "every output of this shape and dtype already reuses another buffer"
            )
            lines.append(f"    {paths[i]}: {fmt_aval(spec.shape, spec.dtype)}: {why}")
        from_cache = cached and any(
            (specs[i].shape, canonical(specs[i].dtype)) in outs for i in missing
        )
        fix = _aliasing_fix(definition, [flat_params[i] for i in missing])
        if from_cache:
            fix = (
                "the executable was loaded from JAX's persistent compilation cache "
                f"({jax.config.jax_compilation_cache_dir or 'jax_compilation_cache_dir'}) "
                "and its aliasing does not match this program (an entry written by "
                "other code, or altered): delete that cache entry, or the folder, and "
                "compile again."
            )
        raise DonationError(
            f"{definition.name}: {len(missing)} donated "
            f"{'leaf' if len(missing) == 1 else 'leaves'} cannot be donated: "
            + (
                "the executable JAX's persistent compilation cache served does not "
                "reuse their buffers, so they would stay alive and the step would need "
                "more memory than its state."
                if from_cache
                else "XLA found no output to reuse the buffer for, so it would stay alive "
                "and the step would need more memory than its state."
            ),
            lines,
            fix=fix,
            note=NOTHING_RAN,
            contract="aliasing",
            step=definition.name,
            leaves=[paths[i] for i in missing],
        )
    return frozenset(aliased)

