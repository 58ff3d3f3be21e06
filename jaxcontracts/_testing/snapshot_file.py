"""Snapshot files: one per test, one section per backend and device count, read back
as data only. :func:`read` and :func:`write` refuse links out of the snapshot folder,
bound what they read, and replace a file atomically under a lock, merging the
sections other sessions wrote meanwhile (pytest-xdist workers).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path as FilePath

from .snapshot import Path, Snapshot

__all__ = ["SUFFIX", "file_name", "parse", "read", "render_file", "write"]

#: The snapshot files' suffix: no test collector's default pattern.
SUFFIX = ".jcsnap"
#: The largest snapshot file read (a real one is a few KiB).
MAX_BYTES = 4 << 20
_NAME_LIMIT = 120  # characters of the readable part (file systems allow 255 bytes)
_CONFLICT = re.compile(r"^(<<<<<<<|=======$|>>>>>>>)")


def file_name(module: str, test_parts: Iterable[str]) -> str:
    """``<module>.<Class>.<test[params]>.jcsnap`` (``.jcsnap``: no collector's pattern).

    Where ``_`` replaced characters, or the id is long, a hash of the exact id
    follows: ``test_x[a b]`` and ``test_x[a_b]`` get two files, a long id fits.
    """
    exact = ".".join([module, *test_parts])
    name = re.sub(r"[^A-Za-z0-9_.\[\]=+,-]", "_", exact)
    if name != exact or len(name) > _NAME_LIMIT:
        digest = hashlib.sha256(exact.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        name = f"{name[:_NAME_LIMIT]}.{digest}"
    return name + SUFFIX


def _inside(folder: FilePath, file: FilePath) -> None:
    """Refuse a snapshot file that is a link, or that resolves outside ``folder``."""
    if file.is_symlink():
        raise ValueError(
            f"{file} is a symbolic link; snapshot files are never read or written through links"
        )
    if folder.exists() and folder.is_symlink():
        raise ValueError(f"{folder} is a symbolic link; snapshot folders are never followed")
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"{folder} is a file, where the snapshot folder of these tests goes; move "
            "it away (snapshots are files inside that folder)"
        )
    base = folder.resolve()
    if file.parent.resolve() != base:
        raise ValueError(f"{file} is outside its snapshot folder {base}")


def read(folder: FilePath, file: FilePath) -> dict[str, Snapshot]:
    """The sections of a snapshot file ({} when it does not exist), as data only.

    Raises:
        ValueError: a link, a file over 4 MiB, bytes that are not UTF-8, a merge
            conflict, or a line that does not fit the format (with its number).
    """
    _inside(folder, file)
    if not file.exists():
        return {}
    size = file.stat().st_size
    if size > MAX_BYTES:
        raise ValueError(f"{size:,} bytes: not a snapshot file (they are a few KiB)")
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a BOM from a Windows editor is not a difference
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ValueError(f"line {line}: not UTF-8 text ({e.reason})") from None
    if "\x00" in text:
        raise ValueError(f"line {text[: text.index(chr(0))].count(chr(10)) + 1}: binary data")
    return parse(text)


@contextlib.contextmanager
def _locked(folder: FilePath) -> Iterator[None]:
    """An exclusive lock on ``folder/.lock`` (no lock where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: one writer at a time is assumed
        yield
        return
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write(
    folder: FilePath,
    file: FilePath,
    update: Callable[[dict[str, Snapshot]], dict[str, Snapshot]],
    header: str,
) -> None:
    """Replace ``file`` with ``update(its sections as they are now)``, under a lock,
    through a temporary file renamed over it (a failed write never destroys it)."""
    _inside(folder, file)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        sections = update(read(folder, file))
        text = render_file(header, sections.values())
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=SUFFIX)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, file)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


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
        if _CONFLICT.match(line):
            raise ValueError(
                f"line {n}: {line[:40]!r} is a merge conflict marker; resolve it, "
                "or rerun --jc-snapshot-update"
            )
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

