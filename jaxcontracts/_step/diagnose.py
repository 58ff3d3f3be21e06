"""What went wrong with a refused call, in the library's own words: the errors
the slow path raises, from specs and buffer states only (never device values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .._compat.hostcopy import pins_host_views
from .._compat.tracing import REGISTERED, context_changes, jit_context
from .._contracts.donation import donation_fix
from .._errors import INPUTS_INTACT, DefinitionError, DonationError, RecompileError, TransferError
from .._format import flatten_with_path, fmt_aval, fmt_bytes, fmt_error, fmt_listed, param_of
from .._hazards import is_deleted_array
from .._leafdiff import diff_lines
from .._records import CompiledSignature
from .._runtime import deleted_because, in_hot_loop
from .._runtime import donated as donated_words
from .._state.spec import fmt_value, moved_by_jax
from .definition import StepDefinition
from .diffs import diff_specs

__all__ = [
    "api_misuse_error",
    "hazard_error",
    "invalid_values_error",
    "host_leaves_error",
    "kept_leaves_error",
    "not_consumed_error",
    "new_signature_cause",
    "run_failed_note",
    "signature_error",
]


def api_misuse_error(
    definition: StepDefinition, positional: tuple[Any, ...], *, compiling: bool
) -> DefinitionError | None:
    """A class passed where an instance or spec belongs, or specs in a call.

    ``step.compile(S)`` (the class, not ``S.spec(...)``) and ``step(S.spec(...))``
    (specs, which hold no data) are API misuse, not host transfers.
    """
    classes, specs = [], []
    for i, arg in enumerate(positional):
        for path, x in flatten_with_path(arg)[0]:
            where = definition.param_path((jax.tree_util.SequenceKey(i), *path))
            if isinstance(x, type):
                classes.append((where, x))
            elif not compiling and isinstance(x, jax.ShapeDtypeStruct):
                specs.append((where, x))
    short = definition.short_name
    if classes:
        where, cls = classes[0]
        cls_name = getattr(cls, "__name__", repr(cls))
        has_spec = callable(getattr(cls, "spec", None))
        lines = [f"  {w}: the class {getattr(c, '__name__', c)}" for w, c in classes]
        if compiling:
            summary = (
                f"{short}.compile() was given the class {cls_name} itself for `{where}`: "
                "compile takes the arguments' specs (or the arguments), not their types."
            )
            fix = (
                f"{short}.compile({cls_name}.spec(...)), giving its dimension sizes "
                "by name; or pass real arguments."
                if has_spec
                else "pass a spec (jax.ShapeDtypeStruct(shape, dtype)) or an array."
            )
        else:
            summary = (
                f"{definition.name} was called with the class {cls_name} itself for `{where}`, "
                "not an instance."
            )
            fix = (
                f"call it with an instance: {cls_name}.zeros(...) or {cls_name}(...) of arrays."
                if has_spec
                else "call it with arrays."
            )
    elif specs:
        state = next((a for a in positional if hasattr(type(a), "zeros")), None)
        make = (
            f"{type(state).__name__}.zeros(...)" if state is not None else "jnp.zeros(shape, dtype)"
        )
        summary = (
            f"{definition.name} was called with specs (jax.ShapeDtypeStruct), which hold "
            "no data: a call needs arrays."
        )
        lines = [f"  {w}: {fmt_value(x)}" for w, x in specs]
        fix = (
            f"call it with arrays ({make}, or real data). To compile ahead of "
            f"time without data, use {short}.compile(...) with the specs."
        )
    else:
        return None
    return DefinitionError(
        summary,
        lines,
        fix=fix,
        note="" if compiling else INPUTS_INTACT,
        contract="definition",
        step=definition.name,
        leaves=[w for w, _ in classes or specs],
    )


def _device_put_lines(paths: Sequence[str]) -> str:
    """``params = jc.device_tree(params)`` for each parameter the paths are in
    (``x = jax.device_put(x)`` where the parameter is the leaf itself)."""
    lines: dict[str, str] = {}
    for path in paths:
        name = param_of(path)
        if name:
            tree = path != name
            lines.setdefault(
                name,
                f"{name} = jc.device_tree({name})" if tree else f"{name} = jax.device_put({name})",
            )
    return "; ".join(lines.values()) or "x = jax.device_put(x)"


def _host_candidates(definition: StepDefinition, host: Sequence[tuple[str, Any]]) -> list[str]:
    """The parameters that could be declared ``host=``: not state, static or
    donated, and every host leaf in them a numpy array (a loader's batch; not
    Python numbers)."""
    taken = {
        definition.param_names[i]
        for i in (*definition.state_params, *definition.static_params, *definition.donated_params)
    }
    names: dict[str, bool] = {}
    for path, x in host:
        name = param_of(path)
        names[name] = names.get(name, True) and isinstance(x, np.ndarray)
    return [
        n for n, ok in names.items() if ok and n and n not in taken and n in definition.param_names
    ]


def host_leaves_error(definition: StepDefinition, host: Sequence[tuple[str, Any]]) -> TransferError:
    batch = _host_candidates(definition, host)
    if batch:  # with the parameters already declared: the option replaces them
        names = [definition.param_names[i] for i in definition.host_params] + batch
        declared = (
            "for data that is new each call (a loader's batch), declare it: "
            f"@jc.hot_step(..., host={names[0] if len(names) == 1 else tuple(names)!r}) (the call "
            "transfers it, allowed inside jc.hot_loop); for data that stays, put it"
        )
    else:
        declared = "put " + ("it" if len(host) == 1 else "them")
    return TransferError(
        f"{definition.name}: {len(host)} argument {'leaf is' if len(host) == 1 else 'leaves are'} "
        f"on the host, so every call would copy {'it' if len(host) == 1 else 'them'} to the device "
        "(an implicit host-to-device transfer, and a sync):",
        [f"  {p}: {fmt_value(x)}" for p, x in host],
        fix=f"{declared} on the device once, before the loop, in the dtype the step "
        f"will see: {_device_put_lines([p for p, _ in host])} (jc.device_tree takes any "
        "pytree: a TrainState, an equinox Module, a dict; a jc.state class does it when "
        f"built). {_configuration(definition, host)}",
        note=INPUTS_INTACT,
        contract="device-arguments",
        step=definition.name,
        leaves=[p for p, _ in host],
    )


def _configuration(definition: StepDefinition, host: Sequence[tuple[str, Any]]) -> str:
    """The last sentence of the host-leaves fix: a parameter that is a Python
    bool (``training``) picks what the step does, so it goes in ``static=``."""
    flags = [p for p, x in host if type(x) is bool and p in definition.param_names]
    if not flags:
        return "Configuration belongs in a jc.static field or a closure."
    names = flags[0] if len(flags) == 1 else tuple(flags)
    return (
        "A Python bool that picks what the step does belongs in static=, one program per "
        f"value: @jc.hot_step(..., static={names!r}, max_compiles={2 ** len(flags)}), each "
        "value called once before the loop; other configuration in a jc.static field or a closure."
    )


def hazard_error(
    definition: StepDefinition,
    paths: Sequence[str],
    leaves: Sequence[Any],
    deleted: Sequence[int],
    duplicates: Sequence[tuple[int, int]],
    donated: Sequence[int],
    consumers: Sequence[str | None],
) -> DonationError:
    """``consumers``: per leaf, the step its state was donated to, where the
    consumed class of a ``jc.state`` proves it (``_runtime.donated``)."""
    lines, unknown = [], False
    for i in deleted:
        by = consumers[i]
        unknown = unknown or by is None
        lines.append(
            f"  {paths[i]}: {fmt_aval(leaves[i].shape, leaves[i].dtype)} "
            f"{donated_words(by, already=True, brief=True)}"
        )
    if unknown:
        lines.insert(0, f"  (deleted: {deleted_because()})")  # first: long lists are cut
    for a, b in duplicates:
        lines.append(
            f"  {paths[a]} and {paths[b]} are the same buffer, and "
            f"{paths[a] if a in donated else paths[b]} is donated"
        )
    by = {consumers[i] for i in deleted}
    if duplicates and not deleted:  # one buffer twice, the user's own making
        a, b = duplicates[0]
        fix = donation_fix("twice", value=f"jnp.copy({paths[a]}) at {paths[b]}")
    elif deleted and by == {None} and not any(i in donated for i in deleted):
        # none of them is a state this step donates: nothing says a step consumed them
        fix = donation_fix("pass_other", value=paths[deleted[0]])
    else:  # the consumer, where one is proven
        fix = donation_fix("pass", by.pop() if len(by) == 1 else None)
    donated_args = {definition.param_names[i] for i in definition.donated_params}
    if any(param_of(paths[i]) in donated_args for i in deleted):
        fix += (
            f" An argument in donate_argnames ({', '.join(sorted(donated_args))}) is "
            "consumed by every call: pass a fresh array each call (or the one the step "
            "returned in its place), or drop it from donate_argnames."
        )
    return DonationError(
        f"{definition.name}: "
        + (
            "the call would donate a buffer that cannot be donated:"
            if all(i in donated for i in deleted)
            else "the call passes a buffer that no longer exists (deleted or donated):"
        ),
        lines,
        fix=fix,
        note="The call did not run; your other inputs are intact.",
        contract="donation-hazard",
        step=definition.name,
        leaves=[paths[i] for i in deleted] + [paths[a] for a, _ in duplicates],
    )


def run_failed_note(
    definition: StepDefinition, paths: Sequence[str], leaves: Sequence[Any], donated: Sequence[int]
) -> str:
    """What a failed compiled call did to the donated inputs: a note on JAX's own
    error, which is re-raised (its text holds the real cause)."""
    consumed = [i for i in donated if is_deleted_array(leaves[i])]
    if not consumed:
        return (
            f"jaxcontracts: {definition.name}'s compiled call raised this error; its donated "
            "inputs were not consumed: they are intact."
        )
    intact = [i for i in donated if i not in consumed]
    note = (
        f"jaxcontracts: {definition.name} failed while its executable ran. The call did run: "
        f"it consumed (deleted) {len(consumed)} donated input(s) and produced no outputs, "
        "so that state is gone; rebuild it (from a checkpoint, or from scratch):\n"
        + "\n".join(
            f"  {paths[i]}: {fmt_aval(leaves[i].shape, leaves[i].dtype)} deleted" for i in consumed
        )
    )
    if intact:
        note += "\n" + "\n".join(f"  {paths[i]}: intact" for i in intact)
    return note


def kept_leaves_error(
    definition: StepDefinition,
    cs: CompiledSignature,
    kept: Sequence[int],
    nodes: Sequence[tuple[str, range]] = (),
    last_error: BaseException | None = None,
) -> DonationError:
    """Donated leaves, or containers of donated leaves inside a state
    (``nodes``: each one's path and the flat positions of its leaves), that
    something besides their state still references; ``last_error``: the
    interpreter's last error, whose traceback holds one of them."""
    leaves = [(cs.leaves[i].path, cs.leaves[i].spec) for i in kept]
    paths = [path for path, _ in leaves]
    lines = [f"  {path}: {fmt_aval(x.shape, x.dtype)}" for path, x in leaves]
    for path, held in nodes:  # a kept container: its donated leaves would be deleted in it
        inside = [cs.leaves[j] for j in held if cs.leaves[j].donated]
        lines.append(
            f"  {path}: a container of {len(inside)} donated array(s) "
            f"({fmt_bytes(sum(x.nbytes for x in inside))})"
        )
    node_paths = [path for path, _ in nodes]
    first = (paths or node_paths or ["the leaf"])[0]
    what = f"{len(leaves)} array(s)" if leaves else f"the arrays of {len(nodes)} container(s)"
    fix = donation_fix("kept" if leaves else "kept_node", value=first)
    if last_error is not None:  # a notebook cell that failed on the leaf: its error holds it
        lines.append(
            f"  held by the traceback of the last error ({fmt_error(last_error, 60)}), which "
            "the interpreter keeps as sys.last_value until the next error"
        )
        fix = (
            "run the cell again (this error replaces the last one), or let the last error go "
            "first: sys.last_value = sys.last_traceback = sys.last_exc = None. Otherwise: " + fix
        )
    return DonationError(
        f"{definition.name} would delete {what} you still hold elsewhere: donating "
        "a leaf deletes its buffer, and another reference to it (a sample kept in a list, "
        "a variable, a numpy view from np.asarray, a second container sharing the leaf, "
        "a caught exception you kept, whose traceback holds the frames that saw it, or "
        "pytest's record of an `assert` that built it) would then hold a deleted array.",
        lines,
        fix=fix,
        note=INPUTS_INTACT,
        contract="donation-hazard",
        step=definition.name,
        leaves=paths or node_paths,
    )


def not_consumed_error(
    definition: StepDefinition, cs: CompiledSignature, leaves: Sequence[Any], out: Any
) -> DonationError:
    missing = [i for i in cs.donated if not leaves[i].is_deleted()]
    return DonationError(
        f"{definition.name}: {len(missing)} donated input buffer(s) were not consumed: "
        "XLA copied instead of reusing them, so this step held its state twice.",
        [f"  {cs.leaves[i].path}: {fmt_aval(leaves[i].shape, leaves[i].dtype)}" for i in missing]
        + [_VIEW_CAUSE]
        + ([_PINNING_CAUSE] if pins_host_views() else []),
        fix="drop the view (del it), or take a copy with np.array(x) or "
        "jc.fetch(x) (which copies).",
        note="The call's outputs are in this error's .result: nothing was lost.",
        result=out,
        contract="consumed",
        step=definition.name,
        leaves=[cs.leaves[i].path for i in missing],
    )


#: The options set by a ``with`` block, not jax.config: the fix names the block.
_CONTEXT_FIXES = {
    name: "make every call, the first one (or .compile()) included, inside the same "
    f"`with {block}` block, or every one outside it"
    for names, block in (
        (("mesh_context_manager", "abstract_mesh_context_manager"), "jax.set_mesh(mesh):"),
        (("jax_default_device",), "jax.default_device(device):"),
    )
    for name in names
}

_VIEW_CAUSE = (
    "Likely cause: on CPU, a numpy view of the array is alive (np.asarray(x) "
    "shares its buffer, so XLA must copy); elsewhere another live reference pins the buffer."
)
_PINNING_CAUSE = (
    "Or: this jaxlib keeps a host view of a CPU array after any read of it (float(x), "
    "print(x), np.asarray(x), jax.device_get(x), pickle.dumps(x)) for the array's whole "
    "life, so XLA must copy it (jaxlib 0.11.2; 0.11.1 and 0.12 do not). "
    "jc.fetch does not pin; so reads done with jc.fetch, or an upgrade of jaxlib, avoid it."
)


def new_signature_cause(
    definition: StepDefinition, current: CompiledSignature, positional: tuple[Any, ...]
) -> str:
    """What makes these arguments a new signature of the step, in a few words
    (the first leaves that differ, or the JAX options that changed)."""
    changed = context_changes(current.context, jit_context())
    parts = [f"{name} {then!r} -> {now!r}" for name, then, now in changed]
    for i, name in enumerate(definition.param_names):
        for d in diff_specs(current.spec_args[i], positional[i]):
            where = name if d.path.startswith("(") else f"{name}{d.path}"
            parts.append(
                f"{where}: {d.expected} -> {d.got}"
                if d.expected or d.got
                else f"{where}: its structure"
            )
    return fmt_listed(parts)


def signature_error(
    definition: StepDefinition, current: CompiledSignature, n_compiled: int,
    positional: tuple[Any, ...],
) -> RecompileError | TransferError:
    """A call whose arguments match no compiled signature, with no compile left."""
    blocks: list[str] = []
    all_diffs = []
    leaves: list[str] = []
    flat = jax.tree_util.tree_leaves(positional)
    moved = (  # the paths of the arguments JAX moves to the compiled placement (never a cause)
        {current.leaves[i].path for i in moved_by_jax(flat, current.donated)}
        if len(flat) == len(current.leaves)
        else set()
    )
    for i, name in enumerate(definition.param_names):
        diffs = [
            d for d in diff_specs(current.spec_args[i], positional[i])
            if not (
                d.kind == "sharding"
                and (name if d.path.startswith("(") else f"{name}{d.path}") in moved
            )
        ]
        all_diffs += diffs
        if diffs:
            lines, named = diff_lines(
                diffs, name, words=("compiled with", "called with"), cause_prefix="likely cause: "
            )
            blocks += [f"  parameter `{name}`:", *lines]
            leaves += named
    if all_diffs and all(d.kind == "sharding" for d in all_diffs) and in_hot_loop():
        # Inside a loop, an array on other devices is a device-to-device
        # transfer waiting to happen (jax.jit would move it every call).
        return TransferError(
            f"implicit device-to-device transfer inside jc.hot_loop: {definition.name} "
            "was called with arrays placed differently from its compiled signature.",
            blocks,
            fix="place them once, before the loop, with jax.device_put(x, sharding) "
            f"using the compiled sharding (see {definition.short_name}.signature).",
            note=INPUTS_INTACT,
            contract="no-transfer",
            step=definition.name,
            leaves=leaves,
        )
    changed = context_changes(current.context, jit_context())
    if changed and not blocks:  # the same arguments, under other JAX options
        return RecompileError(
            f"{definition.name} was called under JAX options it was not compiled under "
            f"(max_compiles={definition.max_compiles}, {n_compiled} used): jax.jit compiles "
            "again for them.",
            [
                f"  {name}: compiled with {then!r}, called with {now!r}"
                for name, then, now in changed
            ],
            fix=(
                "import the libraries the program uses before a step's first call "
                "(jax.jit compiles again for the new options too)"
                if changed[0][0] == REGISTERED
                else _CONTEXT_FIXES.get(changed[0][0])
                or "set JAX options once, before the first call (jax.config.update at the start "
                "of the program)"
            )
            + ", or let the step compile for each: "
            f"@jc.hot_step(max_compiles={definition.max_compiles + 1}).",
            note=INPUTS_INTACT,
            contract="signature",
            step=definition.name,
        )
    return RecompileError(
        f"{definition.name} was called with a signature it was not compiled for "
        f"(max_compiles={definition.max_compiles}, {n_compiled} used).",
        blocks or ["  (the pytree structure differs)"],
        fix="pass arguments with the compiled spec (see the likely cause above), "
        f"or allow more signatures with @jc.hot_step(max_compiles={definition.max_compiles + 1}).",
        note=INPUTS_INTACT,
        contract="signature",
        step=definition.name,
        leaves=leaves,
    )


def invalid_values_error(
    definition: StepDefinition,
    current: CompiledSignature | None,
    positional: tuple[Any, ...],
    leaves: list[Any],
    paths: list[str],
    kind: str,
) -> FloatingPointError:
    """JAX's ``FloatingPointError`` for a call that produced a nan/inf: re-run op
    by op to name the operation, as ``jax.jit`` does, where no donated input
    was consumed; else the error says the inputs are gone."""
    donated = current.donated if current is not None else ()
    consumed = [i for i in donated if is_deleted_array(leaves[i])]
    if not consumed:
        try:
            with jax.disable_jit():
                definition.positional(*positional)
        except FloatingPointError as e:
            e.add_note(
                f"jaxcontracts: found by re-running {definition.name} without jit "
                f"(jax_debug_{kind}s is set)."
            )
            return e
    err = FloatingPointError(
        f"invalid value ({kind}) encountered in the output of {definition.name} "
        f"(jax_debug_{kind}s is set)."
    )
    err.add_note(run_failed_note(definition, paths, leaves, donated))
    if consumed:
        err.add_note(
            "jaxcontracts: the step cannot be re-run without jit to name the operation, as "
            "jax.jit does: its donated inputs are gone. To find it, run the step on a copy of "
            "the state with jax.disable_jit(), or with @jc.hot_step(donate=\"none\")."
        )
    return err
