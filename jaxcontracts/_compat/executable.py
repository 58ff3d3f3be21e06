"""What a compiled executable really aliases (its HLO ``input_output_alias``).

JAX's ``args_info[...].donated`` is the request; what XLA did is the alias
table on the first line of the HLO module, which no public API returns: we
parse it, with ``memory_analysis().alias_size_in_bytes`` as the fallback, else
the aliasing is *not verified*. Printing the module costs ~1 us per HLO op;
XLA keeps an alias JAX requested (``tf.aliasing_output``), so
:func:`requested_aliases` reads those, and the text is printed only where XLA
chose (``jax.buffer_donor``) or the executable came from JAX's cache.
"""

from __future__ import annotations

import re
from typing import Any

from .registry import capability, define, missing

__all__ = ["alias_bytes", "aliased_parameters", "requested_aliases"]

_ALIAS_RE = re.compile(r"input_output_alias=\{(.*?)\}\s*(?:,\s*[a-z_]+=|\n|$)")
_PARAM_RE = re.compile(r"\(\s*(\d+)\s*,")


@define(
    "alias-table",
    "the input_output_alias table in Compiled.as_text()'s HLO header",
    "which donated leaves XLA really aliased (falls back on alias byte counts)",
)
def _probe_alias_table() -> str | None:
    from jax import stages

    return None if hasattr(stages.Compiled, "as_text") else "Compiled.as_text is gone"


@define(
    "alias-request",
    "the tf.aliasing_output attributes of the lowered module's entry parameters "
    "(Lowered.compiler_ir('stablehlo'), jaxlib.mlir.ir)",
    "verifying donation without printing the compiled program (falls back on its alias table)",
)
def _probe_alias_request() -> str | None:
    from jax import stages
    from jax._src.lib.mlir import ir

    if not hasattr(stages.Lowered, "compiler_ir"):
        return "Lowered.compiler_ir is gone"
    if not all(hasattr(ir, name) for name in ("DictAttr", "StringAttr", "ArrayAttr")):
        return "jaxlib.mlir.ir has no DictAttr, StringAttr or ArrayAttr"
    return None


def requested_aliases(lowered: Any, n_args: int) -> frozenset[int] | None:
    """The flat arguments JAX paired with an output in the lowered module (not
    ``jax.buffer_donor``), one attribute dictionary per entry parameter
    (hoisted constants and tokens skipped). ``None``: unreadable."""
    if not capability("alias-request").available:
        return None
    try:
        from jax._src.lib.mlir import ir

        module = lowered.compiler_ir("stablehlo")
        main = None
        for op in module.body.operations:
            attrs = op.attributes
            if "sym_name" in attrs and ir.StringAttr(attrs["sym_name"]).value == "main":
                main = op
                break
        if main is None:
            return None
        if "arg_attrs" not in main.attributes:
            return frozenset()
        table = ir.ArrayAttr(main.attributes["arg_attrs"])
        offset = len(table) - n_args
        if offset < 0:  # tupled arguments, or another entry: not this reading
            return None
        return frozenset(
            i - offset
            for i in range(offset, len(table))
            if "tf.aliasing_output" in ir.DictAttr(table[i])
        )
    except Exception:  # noqa: BLE001 - another module layout: the executable's table is read
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


def _parameter_count(compiled: Any) -> int | None:
    """Entry parameters of the executable (hoisted constants included), without
    scanning the header (None where the runtime executable has no layouts)."""
    try:
        return len(compiled.runtime_executable().get_parameter_layouts())
    except Exception:  # noqa: BLE001 - older or other runtimes: the header is read
        return None


def aliased_parameters(compiled: Any, n_args: int) -> set[int] | None:
    """Indices of the ``n_args`` flat arguments XLA aliases to an output (JAX
    may prepend hoisted constants as entry parameters: skipped); ``None``
    where the executable's HLO could not be read."""
    try:
        text = compiled.as_text()
    except Exception as e:  # noqa: BLE001 - some backends cannot print
        missing("alias-table", f"Compiled.as_text() failed: {type(e).__name__}")
        return None
    header = (text or "").split("\n", 1)[0]
    n_params = _parameter_count(compiled)
    if n_params is None:
        n_params = _entry_param_count(header)
    if n_params is None:
        missing("alias-table", "the HLO header has no entry_computation_layout")
        return None
    offset = n_params - n_args
    if offset < 0:
        missing("alias-table", "the HLO entry has fewer parameters than the call")
        return None
    match = _ALIAS_RE.search(header)
    if match is None:
        return set()
    return {int(p) - offset for p in _PARAM_RE.findall(match.group(1))}


def alias_bytes(compiled: Any) -> int | None:
    """Bytes XLA aliases between inputs and outputs, or ``None`` if unknown."""
    try:
        value = compiled.memory_analysis().alias_size_in_bytes
    except Exception:  # noqa: BLE001 - not every backend has one
        return None
    return int(value) if isinstance(value, int) else None
