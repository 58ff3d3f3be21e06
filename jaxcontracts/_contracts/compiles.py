"""No compiles once a step is compiled: each call matches a compiled
signature (checked on the call path), each returned state keeps its input's
spec (carry invariance, checked at compile), and inside
``jc.hot_loop(compiles=...)`` nothing compiles (the loop's guard).
"""

from __future__ import annotations

from .._errors import Contract, RecompileError, declare

__all__: list[str] = []

declare(Contract("carry", "carry invariance: each returned state keeps its input's spec", RecompileError))
declare(
    Contract(
        "signature", "arguments match a compiled signature", RecompileError,
        row="no call refused (recompile, transfer or donation)",
    )
)  # fmt: skip
declare(
    Contract(
        "no-compile", "no compiles", RecompileError,
        violations=(("compile", "compile inside jc.hot_loop"),),
        option="compiles", choices=("disallow", "warmup", "allow"),
        findings=("recompile", "compile_in_loop"),
    )
)  # fmt: skip
