"""Plain records passed up the layers: what was compiled, proven and seen.

Reports, the loop guard and users read a step through these frozen records
(``step.describe()``), never through a step's private attributes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

__all__ = [
    "CompiledSignature",
    "LeafRecord",
    "StepDescription",
    "StepStats",
    "Violation",
    "WarmupCompile",
]


@dataclasses.dataclass
class StepStats:
    """What a hot step has done so far.

    At checks level ``off`` a call is the bare compiled call, so ``calls`` is
    not counted there. Compile-time checks run at every level.
    """

    calls: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0
    cache_hits: int = 0  # compiles served by JAX's persistent compilation cache
    refused: int = 0  # calls refused with a RecompileError/TransferError/DonationError
    traced_calls: int = 0  # calls under an outer transformation (plain tracing)
    not_consumed: int = 0  # calls after which a donated input was still alive
    consumed_checked: int = 0  # calls whose donated inputs were looked at after it (checks full)
    host_calls: int = 0  # calls that transferred declared host data (host=...)
    host_bytes: int = 0  # the bytes they transferred
    # argument structures new to the step that took a compiled executable
    # (functools.partial statics equal by value: a second model instance)
    shared: int = 0


@dataclasses.dataclass(frozen=True)
class LeafRecord:
    """One flat argument leaf of a compiled signature.

    Attributes:
        path: ``param.field`` as messages print it (``s.pos``, ``batch['x']``).
        spec: its ``jax.ShapeDtypeStruct`` with the compiled sharding.
        donated: whether the step donates it.
        aliased: whether XLA aliases it to an output (``None``: not donated,
            or the executable's alias table could not be read).
        nbytes: its size, all shards together.
    """

    path: str
    spec: Any
    donated: bool
    aliased: bool | None
    nbytes: int


@dataclasses.dataclass(frozen=True)
class MemoryRecord:
    """The compiled executable's memory analysis (bytes per device; None: unknown)."""

    arguments: int | None = None
    outputs: int | None = None
    aliased: int | None = None
    temporaries: int | None = None


@dataclasses.dataclass(frozen=True)
class CompiledSignature:
    """One compiled signature of a hot step and everything proven about it:
    carry invariance and aliasing were verified before it was made
    (``aliased`` is ``None`` where the alias table could not be read).
    """

    spec_args: tuple[Any, ...]  # per parameter, a spec tree (with shardings)
    in_treedef: Any
    leaves: tuple[LeafRecord, ...]
    compiled: Any  # no Lowered kept: 6x a raw compile's memory (HotStep.lowered lowers anew)
    flat_style: bool  # called with flat leaves (per-leaf donation)
    donated: tuple[int, ...]  # flat leaf indices donated
    aliased: frozenset[int] | None
    weak: tuple[bool, ...]
    multi_device: bool
    compile_seconds: float
    # JAX's persistent compilation cache for this compile: "hit" (loaded from
    # it), "miss" (compiled, then stored), "off" (not consulted), None (unknown).
    cache: str | None = None
    # Flat leaf indices of declared host data (``host=``), and their bytes per call.
    host: tuple[int, ...] = ()
    host_nbytes: int = 0
    # Another signature's executable, taken by arguments whose tree structure
    # differs only by functools.partial statics equal by value (a second model
    # instance's own partial): not a compile.
    alias: bool = False
    # What each declared contract's scan hook found in the program, by contract key.
    found: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    # The config values jax.jit compiles for (x64, default device...) at the
    # compile: under others the executable is another signature, as under jax.jit.
    context: Any = None

    def donated_arrays(self, params: tuple[str, ...]) -> tuple[int, ...]:
        """The positions in ``params`` (the step's parameter names) whose
        argument is one donated array: its leaf's path is the parameter's name."""
        whole = {leaf.path for leaf in self.leaves if leaf.donated}
        return tuple(i for i, name in enumerate(params) if name in whole)

    @functools.cached_property
    def memory(self) -> MemoryRecord:
        """The executable's memory analysis, read on first use (it costs ms)."""
        try:
            analysis = self.compiled.memory_analysis()
        except Exception:  # noqa: BLE001 - not every backend has one
            analysis = None
        return MemoryRecord(
            arguments=getattr(analysis, "argument_size_in_bytes", None),
            outputs=getattr(analysis, "output_size_in_bytes", None),
            aliased=getattr(analysis, "alias_size_in_bytes", None),
            temporaries=getattr(analysis, "temp_size_in_bytes", None),
        )

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(leaf.path for leaf in self.leaves)

    @property
    def specs(self) -> tuple[Any, ...]:
        return tuple(leaf.spec for leaf in self.leaves)


@dataclasses.dataclass(frozen=True)
class StepDescription:
    """What a hot step is: its options, its compiled signatures, its counters.

    Returned by ``HotStep.describe()``; a snapshot (``stats`` is a copy).
    """

    name: str  # module.qualname of the step function
    donate: str | tuple[str, ...]
    max_compiles: int
    params: tuple[str, ...]
    state_params: tuple[str, ...]
    signatures: tuple[CompiledSignature, ...]
    current: CompiledSignature | None
    stats: StepStats

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]


@dataclasses.dataclass
class Violation:
    """One kind of violation at one source line, with how often it happened."""

    kind: str  # a key of _errors.VIOLATIONS (transfer, compile, donation, callback, ...)
    what: str
    where: str
    count: int
    message: str
    source: str = ""  # the text of the line at `where`
    fix: str = ""
    iteration: int | None = None  # loop.iterate()'s iteration where it first happened


@dataclasses.dataclass(frozen=True)
class WarmupCompile:
    """One compile a ``jc.hot_loop(compiles="warmup")`` let through, the first of its kind."""

    what: str  # `advance` (a hot step's first signature) or `jit(f)`, `less`...
    where: str  # the user's line
    iteration: int | None = None  # loop.iterate()'s iteration (0: the first pass)
