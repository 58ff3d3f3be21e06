"""No compiles once a step is compiled: each call matches a compiled
signature (checked on the call path), each returned state keeps its input's
spec (carry invariance, checked at compile), and inside
``jc.hot_loop(compiles=...)`` nothing compiles (the loop's guard).
"""

from __future__ import annotations

from typing import Any

from .._errors import Contract, RecompileError, declare

__all__: list[str] = []


def _carry(cs: Any, stats: Any) -> tuple[bool, str, str, str]:
    """A signature is compiled only once carry invariance held for it."""
    return True, "", "", ""


def _refused(cs: Any, stats: Any) -> tuple[bool, str, str, str]:
    return stats.refused == 0, f"{stats.refused} call(s) refused" if stats.refused else "", "", ""


declare(
    Contract(
        "carry", "carry invariance: each returned state keeps its input's spec", RecompileError,
        verdict=_carry,
    )
)  # fmt: skip
declare(
    Contract(
        "signature", "arguments match a compiled signature", RecompileError,
        row="no call refused (recompile, transfer or donation)", verdict=_refused,
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
