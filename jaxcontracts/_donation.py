"""Donation: which leaves to donate, what really aliases, call-time hazards.

Donation is derived per leaf from the state type, never from argument
positions, so inserting or renaming parameters cannot desync it. What JAX
reports about donation (``args_info[...].donated``) is the *request*; what XLA
did is in the compiled executable's ``input_output_alias`` table, which we read
from the compiled HLO module (its first line), cross-checked against
``memory_analysis().alias_size_in_bytes``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["aliased_parameters", "field_of", "find_hazards"]

_ALIAS_RE = re.compile(r"input_output_alias=\{(.*?)\}\s*(?:,\s*[a-z_]+=|\n|$)")
_PARAM_RE = re.compile(r"\(\s*(\d+)\s*,")


def field_of(key: Any) -> str | None:
    """The field name a path entry selects (``.pos`` or ``['pos']``)."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    return None


def _entry_param_count(header: str) -> int | None:
    """Number of entry parameters, from ``entry_computation_layout={(...)->``."""
    start = header.find("entry_computation_layout={(")
    if start < 0:
        return None
    i = start + len("entry_computation_layout={(")
    depth, count, seen_item = 0, 0, False
    while i < len(header):
        c = header[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return count + (1 if seen_item else 0)
            depth -= 1
        elif c == "," and depth == 0:
            count += 1
        elif not c.isspace():
            seen_item = True
        i += 1
    return None


def aliased_parameters(compiled: Any, n_args: int) -> set[int] | None:
    """Indices of the flat arguments XLA aliases to an output.

    Args:
        compiled: a ``jax.stages.Compiled``.
        n_args: how many flat arguments the caller passes (JAX may prepend
            hoisted constants as extra entry parameters; they are skipped).

    Returns:
        The set of flat argument indices that alias an output, or ``None`` when
        the executable's HLO could not be read.
    """
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001 - some backends cannot print
        return None
    header = text.split("\n", 1)[0]
    n_params = _entry_param_count(header)
    offset = (n_params - n_args) if n_params is not None else 0
    if offset < 0:
        return None
    match = _ALIAS_RE.search(header)
    if match is None:
        return set()
    return {int(p) - offset for p in _PARAM_RE.findall(match.group(1))}


def find_hazards(
    leaves: Sequence[Any], donated: Sequence[int]
) -> tuple[list[int], list[tuple[int, int]]]:
    """Donated leaves already deleted, and pairs of leaves sharing a buffer.

    Returns:
        ``(deleted, duplicates)``: indices of deleted leaves (donated or not),
        and ``(first, second)`` index pairs where a donated buffer appears
        twice among the arguments.
    """
    deleted = [
        i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and _is_deleted(x)
    ]
    donated_set = set(donated)
    seen: dict[Any, int] = {}
    duplicates: list[tuple[int, int]] = []
    for i, x in enumerate(leaves):
        if not isinstance(x, jax.Array) or i in deleted:
            continue
        key = _buffer_key(x)
        first = seen.get(key)
        if first is None:
            seen[key] = i
        elif first in donated_set or i in donated_set:
            duplicates.append((first, i))
    return deleted, duplicates


def _is_deleted(x: jax.Array) -> bool:
    try:
        return bool(x.is_deleted())
    except Exception:  # noqa: BLE001 - tracers and exotic arrays
        return False


def _buffer_key(x: jax.Array) -> Any:
    if x.size == 0:  # empty buffers may all share one address
        return ("id", id(x))
    try:
        return ("ptr", x.unsafe_buffer_pointer())
    except Exception:  # noqa: BLE001 - multi-device arrays have no single pointer
        return ("id", id(x))
