"""Contract snapshots: what hot steps and loops were proven to be, as text.

A :class:`Snapshot` is an ordered list of one-line fields keyed by backend and
device count (``cpu x8``; fields: ``docs/snapshots.md``). :meth:`Snapshot.diff`:
:data:`TOLERANCED` fields may grow by their tolerance, the others are exact;
across jax/jaxlib versions memory and cost (XLA's output) are not compared.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .._errors import MAX_DETAIL_LINES, DefinitionError

__all__ = [
    "Change",
    "Path",
    "Snapshot",
    "SnapshotDiff",
    "TOLERANCED",
    "field_name",
    "parse_tolerance",
    "version_of",
]

Path = tuple[str, ...]

#: Numeric fields compared with a tolerance (growth allowed, as a fraction),
#: and their defaults. Every other field is exact.
TOLERANCED: dict[str, float | None] = {
    "memory.arguments": 0.0,
    "memory.outputs": 0.0,
    "memory.aliased": 0.0,
    "memory.temporaries": 0.10,
    "cost.flops": 0.10,
    "cost.transcendentals": 0.10,
    "cost.bytes_accessed": 0.10,
}
_SHORT = {k.split(".", 1)[1]: k for k in TOLERANCED}  # "temporaries" -> "memory.temporaries"


def version_of(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:  # pragma: no cover - jax without metadata
        return "unknown"


@dataclasses.dataclass(frozen=True)
class Change:
    """One difference between two snapshots.

    Attributes:
        field: where (``step demo.advance / signature 1 / leaf p.pos``) and,
            for a leaf, which attribute (``spec``, ``donated``, ...).
        before: the recorded value (``-``: absent).
        after: the value now (``-``: absent).
        rule: how it was compared (``exact``, ``+10%``).
    """

    field: str
    before: str
    after: str
    rule: str = "exact"


@dataclasses.dataclass(frozen=True)
class SnapshotDiff:
    """The changes between a recorded snapshot and a new one.

    Falsy when nothing changed beyond its tolerance. ``str()`` is a table
    (field, before, after, rule); in a notebook it renders as HTML.

    Attributes:
        changes: every difference that fails its comparison.
        skipped: fields not compared because the jax/jaxlib versions differ
            (or because the new run could not count them, at checks ``off``).
        note: why fields were skipped, if any were.
    """

    changes: tuple[Change, ...]
    skipped: tuple[str, ...] = ()
    note: str = ""

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def ok(self) -> bool:
        """True when the new snapshot matches the recorded one."""
        return not self.changes

    def __str__(self) -> str:
        if not self.changes:
            return "snapshot unchanged" + (f" ({self.note})" if self.note else "")
        shown = self.changes[:MAX_DETAIL_LINES]
        rows = [("field", "before", "after", "rule")] + [
            (c.field, c.before, c.after, c.rule) for c in shown
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [
            f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip()
            for r in rows
        ]
        n = len(self.changes)
        out = [f"{n} contract field{'s' * (n != 1)} changed:", *lines]
        if n > len(shown):
            out.append(f"  ... and {n - len(shown):,} more (all of them: the diff's .changes)")
        if self.note:
            out.append(f"  ({self.note})")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        e = html.escape
        if not self.changes:
            return f"<p>{e(str(self))}</p>"
        head = "".join(f"<th>{h}</th>" for h in ("field", "before", "after", "rule"))
        body = "".join(
            f"<tr><td><code>{e(c.field)}</code></td><td>{e(c.before)}</td>"
            f"<td><b>{e(c.after)}</b></td><td>{e(c.rule)}</td></tr>"
            for c in self.changes[:MAX_DETAIL_LINES]
        )
        more = len(self.changes) - MAX_DETAIL_LINES
        if more > 0:
            body += f'<tr><td colspan="4">... and {more:,} more (the diff\'s .changes)</td></tr>'
        note = f"<p>{e(self.note)}</p>" if self.note else ""
        return f'<table class="jc-snapshot-diff"><tr>{head}</tr>{body}</table>{note}'


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The contract of some hot steps and loops on one backend: see :func:`snapshot`.

    Attributes:
        backend: ``cpu``, ``gpu``, ``tpu``.
        devices: the number of devices (``jax.device_count()``).
        versions: ``{"jax": ..., "jaxlib": ...}``.
        fields: ``(path, value)`` pairs in a stable order; a path is the
            headers it sits under and its key
            (``("step m.advance", "signature 1", "leaf p.pos")``).
    """

    backend: str
    devices: int
    versions: Mapping[str, str]
    fields: tuple[tuple[Path, str], ...]

    @property
    def key(self) -> str:
        """``cpu x8``: snapshots are compared only with the same key."""
        return f"{self.backend} x{self.devices}"

    def get(self, *path: str) -> str | None:
        """The value at ``path`` (headers then key), or None."""
        for p, v in self.fields:
            if p == path:
                return v
        return None

    def __str__(self) -> str:
        out = [f"[{self.key}]"] + [f"{k}: {v}" for k, v in sorted(self.versions.items())]
        open_: Path = ()
        for path, value in self.fields:
            *heads, key = path
            common = 0
            while common < min(len(open_), len(heads)) and open_[common] == heads[common]:
                common += 1
            for depth in range(common, len(heads)):
                out.append("  " * depth + heads[depth])
            open_ = tuple(heads)
            out.append("  " * len(heads) + (f"{key}: {value}" if value != "" else key))
        return "\n".join(out)

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td><code>{e(' / '.join(p[:-1]))}</code></td><td><code>{e(p[-1])}</code></td>"
            f"<td>{e(v)}</td></tr>"
            for p, v in self.fields
        )
        versions = ", ".join(f"{k} {v}" for k, v in sorted(self.versions.items()))
        return (
            f'<div class="jc-snapshot"><b>contract snapshot</b> <code>{e(self.key)}</code> '
            f"({e(versions)})<table><tr><th>under</th><th>field</th><th>value</th></tr>"
            f"{rows}</table></div>"
        )

    def diff(
        self, other: Snapshot, *, tolerances: Mapping[str, float | None] | None = None
    ) -> SnapshotDiff:
        """What changed from this (recorded) snapshot to ``other`` (the new one).

        Args:
            other: the new snapshot, of the same backend and device count.
            tolerances: per numeric field (``temporaries``, ``memory.outputs``,
                ``flops``...), the growth allowed as a fraction (``0.1``: at
                most 10% more); ``None``: not compared. Missing fields take
                :data:`TOLERANCED`'s defaults.

        Returns:
            A :class:`SnapshotDiff`, falsy when nothing changed.

        Raises:
            DefinitionError: the snapshots have different keys, or a
                tolerance names an unknown field.
        """
        if self.key != other.key:
            raise DefinitionError(
                f"jc.Snapshot.diff: a {self.key} snapshot cannot be compared with a "
                f"{other.key} one (sizes, shardings and costs depend on the backend).",
                fix="compare snapshots taken on the same backend and device count.",
            )
        rules = dict(TOLERANCED)
        for name, tol in (tolerances or {}).items():
            rules[field_name(name)] = tol
        same_versions = dict(self.versions) == dict(other.versions)
        before, after = dict(self.fields), dict(other.fields)
        order = [p for p, _ in self.fields] + [p for p, _ in other.fields if p not in before]
        changes: list[Change] = []
        skipped: list[str] = []
        heads_before = {p[:i] for p in before for i in range(1, len(p))}
        heads_after = {p[:i] for p in after for i in range(1, len(p))}
        blocks_done: set[Path] = set()
        for path in order:
            block = next(
                (
                    path[:i]
                    for i in range(1, len(path))
                    if (path[:i] in heads_before) != (path[:i] in heads_after)
                ),
                None,
            )
            if block is not None:  # a whole step, signature or loop run came or went
                if block not in blocks_done:
                    blocks_done.add(block)
                    gone = block in heads_before
                    text = _block_summary(self.fields if gone else other.fields, block)
                    changes.append(
                        Change(" / ".join(block), text if gone else "-", "-" if gone else text)
                    )
                continue
            found = _compare_field(path, before.get(path), after.get(path), rules, same_versions)
            if found is None:
                skipped.append(" / ".join(path))
            else:
                changes += found
        note = ""
        if not same_versions:
            was = ", ".join(f"{k} {v}" for k, v in sorted(self.versions.items()))
            now = ", ".join(f"{k} {v}" for k, v in sorted(other.versions.items()))
            note = (
                f"recorded with {was}, running {now}: memory and cost fields not "
                "compared, only the version-stable contract"
            )
        return SnapshotDiff(tuple(changes), tuple(skipped), note)


def _compare_field(
    path: Path, old: str | None, new: str | None, rules: Mapping[str, float | None],
    same_versions: bool,
) -> list[Change] | None:
    """The changes of one field (empty: none); ``None``: not compared (skipped)."""
    where, key = " / ".join(path), path[-1]
    if not same_versions and key.startswith(("memory.", "cost.")):
        return None
    if key in rules and old is not None and new is not None:
        change = _compare_number(where, old, new, rules[key])
        return [] if change is None else [change]
    if old == new:
        return []
    if new == "?" or old == "?":  # not countable at checks "off"
        return None
    if key.startswith("leaf ") and old is not None and new is not None:
        return _leaf_changes(where, old, new)
    return [Change(where, "-" if old is None else old, "-" if new is None else new)]


def _block_summary(fields: Sequence[tuple[Path, str]], block: Path) -> str:
    """One line for a whole step, signature or loop run: its leaves or first fields."""
    inside = [(p[len(block) :], v) for p, v in fields if p[: len(block)] == block]
    leaves = [(p[-1][5:], v.partition(" ")[0]) for p, v in inside if p[-1].startswith("leaf ")]
    if leaves:
        text = ", ".join(f"{path} {spec}" for path, spec in leaves[:4])
        return text + (f", ... ({len(leaves)} leaves)" if len(leaves) > 4 else "")
    shown = [f"{p[-1]}: {v}" for p, v in inside if len(p) == 1][:3]
    return "; ".join(shown)


def field_name(name: str) -> str:
    full = _SHORT.get(name, name)
    if full not in TOLERANCED:
        raise DefinitionError(
            f"jc snapshot tolerance for {name!r}: only sizes and costs have a "
            "tolerance; valid names are "
            + ", ".join(repr(k) for k in [*_SHORT, *TOLERANCED])
            + ". Specs, donation, aliasing, compiles and loop counts are exact.",
            fix="name one of those fields, e.g. temporaries='25%'.",
        )
    return full


def parse_tolerance(value: Any) -> float | None:
    """``"10%"``, ``"+10%"``, ``0.1`` -> 0.1; ``"exact"``/``0`` -> 0.0; ``"any"`` -> None.

    Raises:
        DefinitionError: anything else.
    """
    text = value.strip().lower() if isinstance(value, str) else None
    if value is None or text == "any":
        return None
    if text == "exact":
        return 0.0
    number = value
    if text is not None:
        m = re.fullmatch(r"\+?(\d+(?:\.\d+)?)\s*%", text)
        if m:
            return float(m.group(1)) / 100
        try:
            number = float(text)
        except ValueError:
            number = None
    if isinstance(number, int | float) and not isinstance(number, bool) and 0 <= number < math.inf:
        return float(number)  # (a NaN compares False)
    raise DefinitionError(  # the value as written, not as converted
        f"jc snapshot tolerance {value!r}: write a growth like '10%' (or 0.1), "
        "'exact' (or 0), or 'any' (not compared).",
        fix="e.g. @pytest.mark.jc_snapshot(temporaries='10%').",
    )


def _compare_number(where: str, old: str, new: str, tol: float | None) -> Change | None:
    if tol is None:
        return None
    try:
        a, b = int(old), int(new)
    except ValueError:
        return None if old == new else Change(where, old, new)
    if tol == 0:
        return None if a == b else Change(where, old, _with_ratio(a, b), "exact")
    if b <= a * (1 + tol):
        return None
    return Change(where, old, _with_ratio(a, b), f"+{tol * 100:g}%")


def _with_ratio(a: int, b: int) -> str:
    if a == 0:
        return f"{b} (was 0)"
    return f"{b} ({(b - a) / a * 100:+.0f}%)"


def _leaf_attrs(value: str) -> dict[str, str]:
    spec, _, rest = value.partition(" ")
    attrs = {"spec": spec}
    head, sep, sharding = rest.partition("sharding=")
    for token in head.split():
        k, _, v = token.partition("=")
        attrs[k] = v
    if sep:
        attrs["sharding"] = sharding
    return attrs


def _leaf_changes(where: str, old: str, new: str) -> list[Change]:
    """One row per leaf: the attributes that changed, before and after."""
    a, b = _leaf_attrs(old), _leaf_attrs(new)
    keys = [k for k in [*a, *(k for k in b if k not in a)] if a.get(k) != b.get(k)]

    def show(attrs: dict[str, str]) -> str:
        return " ".join(
            attrs.get(k, "-") if k == "spec" else f"{k}={attrs.get(k, '-')}" for k in keys
        )

    return [Change(where, show(a), show(b))] if keys else []
