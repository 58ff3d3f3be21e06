"""The kept-reference check: a donated array that something besides its state still holds.

A donating call deletes its donated buffers; any other reference to one of
those arrays (a sample kept in a list, a variable, a second container) is
then a deleted array, and its data is lost. At ``full`` the call is refused
before dispatch, with the inputs intact, where reference counts prove that
something besides its state holds a donated array (``_compat.refcount``:
exact once garbage is collected). Two views of one rule:

* the leaves inside a state (:class:`KeptPlan`, counted by the closures of
  ``callpath`` over the flat leaves): each held once, by its container;
* the containers inside a state (:class:`InnerNodes`), each held once, by
  its parent (BlackJAX's ``samples.append(state.position)``).

What no count can prove, the arguments themselves (a state's own container,
an argument that is one array: the caller's name for it and a kept copy
count alike, and the count depends on how the call was made), is donated
as ``jax.jit`` donates it; a later read of such an array names the step
that consumed it (``_steps.consumed_by``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._compat import refcount
from .._records import CompiledSignature
from .._state.filter import Filtered
from .._steps import clear_last_outputs, keep
from .callctx import CallContext, param_leaves, picker
from .definition import StepDefinition

__all__ = ["KeptPlan", "kept_plan"]


@dataclasses.dataclass(frozen=True)
class KeptPlan:
    """At ``full``: how a closure tells, before dispatch, that a donated leaf is
    held by something besides its state (a kept sample, a variable, a numpy
    view), and the refusal then. The ``full`` closure counts references in
    one C loop, ``max(map(getrefcount, pick(leaves))) > limit``, over a fresh
    sequence of the watched leaves (``pick`` None: the flat leaves, all
    watched); on a hit :meth:`refuse` collects garbage, counts again
    (``refcount.kept_after_collecting``) and gives the error the slow path
    raises once it has ruled out a wrong signature. :attr:`nodes`: the
    containers inside a state, under the same rule (:class:`InnerNodes`).
    An argument itself (a bare array, the state's own container) is not
    watched: the caller's variable holds it, and a kept copy of it cannot be
    told from that variable (the step's report says so)."""

    watched: tuple[int, ...]  # flat leaf indices
    pick: Callable[[Sequence[Any]], Sequence[Any]] | None
    limit: int
    error: Callable[[Sequence[int], Sequence[tuple[str, range]]], BaseException]
    step: str  # the step's short name, for the record of what it consumed
    nodes: InnerNodes | None = None

    def refuse(self, seq: Sequence[Any], sequences: int, args: tuple[Any, ...]) -> BaseException | None:
        """After a hit: the error, unless collecting garbage dropped every
        extra reference. The steps' records of their last outputs inside
        loops are the library's own: dropped first (an output the caller took
        apart, ``p["w"] = out["w"]``, is held there too). A leaf held only by
        the interpreter's records of a call (a dict that may be a stale
        ``locals()``, a returned call's frame a debugger kept) goes as under
        ``jax.jit``, remembered as this step's (its later read names the step)."""
        clear_last_outputs()
        kept, unproven = refcount.kept_after_collecting(seq, sequences, args)
        keep([seq[i] for i in unproven], self.step)
        return self.error(list(dict.fromkeys(self.watched[i] for i in kept)), ()) if kept else None

    def refuse_nodes(self, nodes: list[Any], args: tuple[Any, ...]) -> BaseException | None:
        """After a hit on :attr:`nodes`: the error naming the kept containers."""
        clear_last_outputs()
        kept, unproven = refcount.kept_after_collecting(nodes, 1, args)
        for i in unproven:  # their arrays go as under jax.jit, remembered as this step's
            keep(jax.tree_util.tree_leaves(nodes[i]), self.step)
        assert self.nodes is not None
        return self.error((), [(self.nodes.paths[i], self.nodes.leaves[i]) for i in kept]) if kept else None


@dataclasses.dataclass(frozen=True)
class InnerNodes:
    """The containers inside the arguments that hold donated leaves, below the
    arguments themselves. Per parameter: ``(i, top, watched, below)``: the
    ``top`` treedef's flat list is the argument's children (one flatten of
    its own node type, which may run Python); ``watched`` picks those that
    are watched; ``below``: (child position, treedef of one depth inside
    that child, its picker): C-only flattens, since every node down
    to there is Python's own. ``paths`` name them, in :meth:`of` order, and
    ``leaves`` give the flat positions of the leaves each holds."""

    plans: tuple[tuple[int, Any, Any, tuple[tuple[int, Any, Any], ...]], ...]  # pickers: callctx.picker
    paths: tuple[str, ...]
    leaves: tuple[range, ...]

    def of(self, args: Sequence[Any]) -> list[Any]:
        """A fresh list of the containers (each then held by its parent and this list)."""
        out: list[Any] = []
        extend = out.extend
        for i, top, watched, below in self.plans:
            kids = top.flatten_up_to(args[i])
            extend(watched(kids))
            for j, treedef, pick in below:
                extend(pick(treedef.flatten_up_to(kids[j])))
            del kids
        return out


# The containers watched: Python's own, whose only holder inside a state is
# their parent. A library's nodes (an NNX Variable, an nnx.State level) are
# held by the library too, by design (the Module graph), so they are not.
_PLAIN_CONTAINERS = (dict, list, tuple)


def _not(node: Any) -> Callable[[Any], bool]:
    """``is_leaf`` that flattens ``node`` one level: its children are leaves."""

    def is_leaf(x: Any) -> bool:
        return x is not node

    return is_leaf


def _children(node: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """A node's children with their keys (a leaf: [])."""
    kids = jax.tree_util.tree_flatten_with_path(node, is_leaf=_not(node))[0]
    return [] if len(kids) == 1 and kids[0][1] is node else kids


def _stored(node: Any) -> list[bool]:
    """Per child of ``node``: whether the node holds that object (a second
    flatten gives the same one), not one its flatten makes afresh (an
    nnx.State's levels): a fresh child is held by no one, so not watched."""
    first, again = _children(node), _children(node)
    return [a[1] is b[1] for a, b in zip(first, again)]


def _inner_nodes(cs: CompiledSignature, definition: StepDefinition, skip: set[int]) -> InnerNodes | None:
    """The :class:`InnerNodes` of the donated arguments (``skip``: parameters
    not watched), or None where no container below an argument holds a
    donated leaf. Found on the compiled example (``cs.spec_args``), whose
    containers are the call's: each node's leaves are a contiguous run of
    the flat leaves."""
    donated = set(cs.donated)
    plans: list[Any] = []
    paths: list[str] = []
    ranges: list[range] = []
    for i, (spec, leaves) in enumerate(zip(cs.spec_args, param_leaves(cs))):
        if i in skip or not donated.intersection(leaves):
            continue
        kids, stored = _children(spec), _stored(spec)
        top = jax.tree_util.tree_structure(spec, is_leaf=_not(spec))
        watched: list[int] = []
        below: list[tuple[int, Any, Callable[[Sequence[Any]], Sequence[Any]]]] = []
        below_paths: list[str] = []  # of() lists the children first, then what is below them
        below_ranges: list[range] = []
        at = leaves.start
        for j, ((key, kid), held) in enumerate(zip(kids, stored)):
            m = len(jax.tree_util.tree_leaves(kid))
            holds = donated.intersection(range(at, at + m))
            if held and holds and isinstance(kid, _PLAIN_CONTAINERS):
                watched.append(j)
                paths.append(definition.param_path((jax.tree_util.SequenceKey(i), *key)))
                ranges.append(range(at, at + m))
                for treedef, positions, keys, held_leaves in _depths(kid, at, donated):
                    below.append((j, treedef, picker(positions)))
                    below_paths += [definition.param_path((jax.tree_util.SequenceKey(i), *key, *k)) for k in keys]
                    below_ranges += held_leaves
            at += m
        paths += below_paths
        ranges += below_ranges
        if watched:
            plans.append((i, top, picker(watched), tuple(below)))
    return InnerNodes(tuple(plans), tuple(paths), tuple(ranges)) if plans else None


def _depths(
    root: Any, first: int, donated: set[int]
) -> list[tuple[Any, tuple[int, ...], list[tuple[Any, ...]], list[range]]]:
    """Inside a watched container ``root`` (its first leaf at flat index
    ``first``): per depth, the treedef whose leaves are that depth's watched
    containers, their positions in its flat list, their key paths and the
    flat positions of their leaves. Only Python's own containers, reached
    through Python's own containers."""
    by_depth: dict[int, list[tuple[Any, tuple[Any, ...], range]]] = {}
    stack = [(root, (), 0, first)]
    while stack:
        node, path, depth, at = stack.pop()
        if depth:
            n = len(jax.tree_util.tree_leaves(node))
            if not donated.intersection(range(at, at + n)):
                continue
            by_depth.setdefault(depth, []).append((node, path, range(at, at + n)))
        for key, kid in _children(node):
            if isinstance(kid, _PLAIN_CONTAINERS):
                stack.append((kid, (*path, *key), depth + 1, at))
            at += len(jax.tree_util.tree_leaves(kid))
    out = []
    for depth in sorted(by_depth):
        nodes = by_depth[depth]
        ids = {id(node): (path, held) for node, path, held in nodes}
        # a library's node is a leaf of these treedefs: their flatten stays in C
        flat, treedef = jax.tree_util.tree_flatten(
            root, is_leaf=lambda x, ids=ids: id(x) in ids or not isinstance(x, _PLAIN_CONTAINERS)
        )
        positions = tuple(j for j, x in enumerate(flat) if id(x) in ids)
        found = [ids[id(flat[j])] for j in positions]
        out.append((treedef, positions, [path for path, _ in found], [held for _, held in found]))
    return out


def kept_plan(ctx: CallContext) -> KeptPlan | None:
    """The kept-leaf check of a closure over the flat leaves (None: not checked)."""
    if ctx.kept is None:
        return None
    cs = ctx.cs
    whole: set[int] = set()
    filtered: set[int] = set()  # the leaves of an equinox Module's Filtered node (_filter)
    unwatched: set[int] = set()  # parameters whose containers are not watched
    refs = ctx.step.definition.ref_params
    for i, (spec, leaves) in enumerate(zip(cs.spec_args, param_leaves(cs))):
        # the arrays JAX refs hold (no one else can: new_ref and reads copy),
        # or an argument that is one array
        if i in refs or jax.tree_util.tree_structure(spec).num_nodes == 1:
            whole.update(leaves)
            unwatched.add(i)
        elif type(spec) is Filtered:
            filtered.update(leaves)
            unwatched.add(i)
    watched = tuple(i for i in cs.donated if i not in whole)
    if not watched:
        return None
    nodes = _inner_nodes(cs, ctx.step.definition, unwatched)
    if filtered:
        # A Filtered node's leaves tuple is one more reference to each of its
        # leaves: the others appear twice in the sequence, so that one limit
        # holds for all (and the error names each leaf once).
        others = tuple(i for i in watched if i not in filtered)
        watched = (*(i for i in watched if i in filtered), *others, *others)
        pick, sequences = picker(watched), 3
    elif len(watched) == len(cs.leaves):  # all of them: the flat leaves themselves
        pick, sequences = None, 1
    else:
        pick, sequences = picker(watched), 2
    return KeptPlan(watched, pick, refcount.BASELINE + sequences - 1, ctx.kept, ctx.step.short_name, nodes)
