"""The kept-reference check: at ``full`` a call is refused before dispatch,
inputs intact, where reference counts (``_compat.refcount``: exact once garbage
is collected) prove something besides its state holds a donated leaf
(:class:`KeptPlan`) or a container of such leaves (:class:`InnerNodes`:
BlackJAX's ``samples.append(state.position)``). The arguments themselves cannot
be proven (the caller's name and a kept copy count alike): donated as
``jax.jit`` does, a later read names the step (``_steps.consumed_by``).
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

__all__ = ["kept_plan"]


@dataclasses.dataclass(frozen=True)
class KeptPlan:
    """At ``full``: the ``full`` closure counts references in one C loop,
    ``max(map(getrefcount, pick(leaves))) > limit`` (``pick`` None: all flat
    leaves watched); on a hit :meth:`refuse` collects garbage and counts again
    (``refcount.kept_after_collecting``). :attr:`nodes`: the containers
    inside a state, under the same rule."""

    watched: tuple[int, ...]  # flat leaf indices
    pick: Callable[[Sequence[Any]], Sequence[Any]] | None
    limit: int
    # (kept leaves, kept containers, the last error whose traceback holds one of them)
    error: Callable[
        [Sequence[int], Sequence[tuple[str, range]], BaseException | None], BaseException
    ]
    step: str  # the step's short name, for the record of what it consumed
    nodes: InnerNodes | None = None

    def refuse(
        self, seq: Sequence[Any], sequences: int, args: tuple[Any, ...]
    ) -> BaseException | None:
        """After a hit: the error, unless collecting garbage (and the steps' own
        last-output records) dropped every extra reference. A leaf held only by
        a stale ``locals()`` or a kept frame goes as under ``jax.jit``,
        remembered as this step's."""
        clear_last_outputs()
        kept, unproven = refcount.kept_after_collecting(seq, sequences, args)
        keep([seq[i] for i in unproven], self.step)
        if not kept:
            return None
        last = refcount.last_error_holding([seq[i] for i in kept])
        return self.error(list(dict.fromkeys(self.watched[i] for i in kept)), (), last)

    def refuse_nodes(self, nodes: list[Any], args: tuple[Any, ...]) -> BaseException | None:
        """After a hit on :attr:`nodes`: the error naming the kept containers."""
        clear_last_outputs()
        kept, unproven = refcount.kept_after_collecting(nodes, 1, args)
        for i in unproven:  # their arrays go as under jax.jit, remembered as this step's
            keep(jax.tree_util.tree_leaves(nodes[i]), self.step)
        assert self.nodes is not None
        if not kept:
            return None
        last = refcount.last_error_holding([nodes[i] for i in kept])
        return self.error((), [(self.nodes.paths[i], self.nodes.leaves[i]) for i in kept], last)


@dataclasses.dataclass(frozen=True)
class InnerNodes:
    """The containers below the arguments that hold donated leaves. Per
    parameter ``(i, top, watched, below)``: ``top`` flattens the argument to
    its children, ``watched`` picks the watched ones; ``below``: (child, treedef
    of one depth inside it, picker), C-only flattens. ``paths`` and ``leaves``
    (flat positions) follow :meth:`of` order."""

    # pickers: callctx.picker
    plans: tuple[tuple[int, Any, Any, tuple[tuple[int, Any, Any], ...]], ...]
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


# Only Python's own containers: a library's nodes (NNX) are held by it by design.
_PLAIN_CONTAINERS = (dict, list, tuple)


def _children(node: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """A node's children with their keys (a leaf: [])."""
    # flattened one level: its children are leaves
    kids = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
    return [] if len(kids) == 1 and kids[0][1] is node else kids


def _stored(node: Any) -> list[bool]:
    """Per child: whether ``node`` stores it (a second flatten gives the same
    object), not makes it afresh (an nnx.State's levels: held by no one)."""
    first, again = _children(node), _children(node)
    return [a[1] is b[1] for a, b in zip(first, again)]


def _inner_nodes(
    cs: CompiledSignature, definition: StepDefinition, skip: set[int]
) -> InnerNodes | None:
    """The :class:`InnerNodes` of the donated arguments but ``skip`` (None: no
    such container), found on ``cs.spec_args``, whose structure is the call's."""
    donated = set(cs.donated)
    plans: list[Any] = []
    paths: list[str] = []
    ranges: list[range] = []
    for i, (spec, leaves) in enumerate(zip(cs.spec_args, param_leaves(cs))):
        if i in skip or not donated.intersection(leaves):
            continue
        kids, stored = _children(spec), _stored(spec)
        top = jax.tree_util.tree_structure(spec, is_leaf=lambda x, spec=spec: x is not spec)
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
                    below_paths += [
                        definition.param_path((jax.tree_util.SequenceKey(i), *key, *k))
                        for k in keys
                    ]
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
    """Inside a watched container ``root`` (first leaf at ``first``), per depth:
    the treedef whose leaves are that depth's watched containers, their
    positions, key paths and leaves' flat positions (Python's own only)."""
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
        # A Filtered node holds one more reference to its leaves: the others
        # appear twice, so one limit holds for all.
        others = tuple(i for i in watched if i not in filtered)
        watched = (*(i for i in watched if i in filtered), *others, *others)
        pick, sequences = picker(watched), 3
    elif len(watched) == len(cs.leaves):  # all of them: the flat leaves themselves
        pick, sequences = None, 1
    else:
        pick, sequences = picker(watched), 2
    return KeptPlan(
        watched, pick, refcount.BASELINE + sequences - 1, ctx.kept, ctx.step.short_name, nodes
    )
