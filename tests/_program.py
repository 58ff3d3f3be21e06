"""A user's program run as a script or inside a function (the tests of
messages that name a user's variable: those of a function's frame are read
from Python 3.13 on only, ``_compat.frames.locals_of``)."""

from __future__ import annotations

import sys
from typing import Any

import pytest


def run_program(source: str, start: str, where: str, names: dict[str, Any], returns: str) -> dict[str, Any]:
    """Run ``source`` as a script (``where == "a script"``) or with
    everything from the line starting ``start`` moved into ``main()``, which
    returns ``returns`` (a comma-separated list of names) into the script's
    namespace; that namespace, begun from ``names``."""
    if where == "a function":
        if sys.version_info < (3, 13):
            pytest.skip("a function's locals are read from Python 3.13 on (_compat.frames.locals_of)")
        head, body = source.split(start, 1)
        source = f"{head}def main():\n    {start}{body.replace(chr(10), chr(10) + '    ')}\n"
        source += f"    return {returns}\n{returns} = main()\n"
    namespace = {"__name__": "training_script", **names}
    exec(compile(source, "<training script>", "exec"), namespace)  # noqa: S102
    return namespace
