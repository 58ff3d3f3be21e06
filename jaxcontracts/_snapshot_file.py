"""Snapshot files: one per test, one section per backend and device count.

:func:`render_file` writes the text ``pytest --jc-snapshot-update`` saves;
:func:`parse` reads it back, as data only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ._snapshot import Path, Snapshot

__all__ = ["parse", "render_file"]


_HEADER = """\
# jaxcontracts contract snapshot of {test}
# Written by `pytest --jc-snapshot-update`; review changes like code.
# Exact: leaf specs, donation, aliasing, shardings, compiles, loop calls,
# fetches, violations. Within tolerance: memory.* and cost.* (compared only
# when jax and jaxlib match the versions below).
"""


def render_file(test: str, snapshots: Iterable[Snapshot]) -> str:
    """A snapshot file: a comment header, then one section per key, sorted."""
    body = "\n\n".join(str(s) for s in sorted(snapshots, key=lambda s: s.key))
    return _HEADER.format(test=test) + "\n" + body + "\n"


_SECTION = re.compile(r"^\[(\w+) x(\d+)\]$")


def parse(text: str) -> dict[str, Snapshot]:
    """Read a snapshot file (or one ``str(snapshot)``): key -> :class:`Snapshot`.

    Raises:
        ValueError: a line that does not fit the format, with its number.
    """
    out: dict[str, Snapshot] = {}
    current: tuple[str, int] | None = None
    versions: dict[str, str] = {}
    fields: list[tuple[Path, str]] = []
    heads: list[str] = []

    def close() -> None:
        if current is not None:
            snap = Snapshot(current[0], current[1], dict(versions), tuple(fields))
            out[snap.key] = snap

    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line or line.lstrip().startswith("#"):
            continue
        m = _SECTION.match(line)
        if m:
            close()
            current, versions, fields, heads = (m.group(1), int(m.group(2))), {}, [], []
            continue
        if current is None:
            raise ValueError(f"line {n}: {line!r} comes before any [backend xN] section")
        depth = (len(line) - len(line.lstrip(" "))) // 2
        body = line.strip()
        key, sep, value = body.partition(": ")
        if depth == 0 and sep and not fields and key in ("jax", "jaxlib"):
            versions[key] = value
            continue
        if depth > len(heads):
            raise ValueError(f"line {n}: {line!r} is indented under no header")
        del heads[depth:]
        if not sep and not body.endswith(":"):
            if body.startswith(("step ", "signature ", "loop ")):
                heads.append(body)
                continue
            fields.append(((*heads, body), ""))
            continue
        if not sep:
            key, value = body[:-1], ""
        fields.append(((*heads, key), value))
    close()
    return out

