"""JAX's transfer-guard log lines, taken off stderr and handed to record mode.

In record mode a hot loop sets JAX's host-to-device guard to ``"log"``, and
jaxlib's C++ logging writes one line per transfer straight to fd 2. While a
recording loop is active, fd 2 is a pipe; a reader thread passes other lines
through at once and keeps the guard lines by the native thread id they carry,
so each loop takes its own thread's. The format is jaxlib's, not an API: a
line that no longer parses is passed through and counted.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import select
import sys
import threading

from .registry import capability, define

__all__ = ["Capture", "GuardEvent", "start", "stop"]

# absl's prefix: severity+date, time, thread id, file:line]
_LINE = re.compile(
    r"^[IWEF]\d{4} [\d:.]+\s+(?P<tid>\d+) guard_lib\.cc:\d+\] "
    r"(?P<direction>host-to-device|device-to-host|device-to-device) transfer:\s*(?P<detail>.*)$"
)
_AVAL = re.compile(r"aval=ShapedArray\((?P<aval>[^)]*)\)")
_MARK = "\x00jaxcontracts-sync-"
# Where a guard line or a sync mark starts in the stream, and what the start
# of one looks like before the rest has come.
_OURS = re.compile(rb"\x00jaxcontracts-sync-|[IWEF]\d{4} [\d:.]+\s+\d+ guard_lib\.cc:\d+\] ")
_MAYBE_OURS = re.compile(rb"\x00[a-z-]*\d*-?\d*|[IWEF]\d{4} [\d:.]*(\s+\d*( [\w.]*:?\d*\]?)?)?")


@dataclasses.dataclass(frozen=True)
class GuardEvent:
    """One transfer that JAX's guard logged."""

    direction: str  # "host-to-device", ...
    aval: str  # "float32[], weak_type=True" ("" when jaxlib gave none)


def parse(line: str) -> tuple[int, GuardEvent] | None:
    """``(native thread id, event)`` for a guard log line, else None."""
    m = _LINE.match(line.rstrip("\r\n"))
    if m is None:
        return None
    aval = _AVAL.search(m["detail"])
    return int(m["tid"]), GuardEvent(m["direction"], aval["aval"] if aval else "")


@define(
    "guard-log-capture",
    "jaxlib's transfer-guard log lines on file descriptor 2 "
    "(absl format with the native thread id)",
    "recording implicit host-to-device transfers in record mode "
    "(and keeping them off the terminal)",
)
def _probe() -> str | None:
    if not hasattr(threading, "get_native_id"):
        return "threading.get_native_id() is missing"
    if not hasattr(select, "poll"):
        return "select.poll() is missing (not POSIX)"
    try:
        os.fstat(2)
    except OSError:
        return "file descriptor 2 is closed"
    sample = (
        "W1130 19:54:47.320191    7187 guard_lib.cc:125] host-to-device transfer: "
        "aval=ShapedArray(float32[3]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0))"
    )
    return None if parse(sample) is not None else "the line pattern does not parse its sample"


class Capture:
    """The process-wide capture of fd 2 (reference-counted by active loops)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved_fd = -1
        self._reader: threading.Thread | None = None
        self._events: dict[int, list[GuardEvent]] = {}
        self._unparsed = 0  # guard lines that did not parse (passed through)
        self._marks: dict[str, threading.Event] = {}
        self._n = 0
        self._registered = False
        self._pipe: tuple[int, int] | None = None  # the pipe's (device, inode), while fd 2 is it
        # readers left forwarding for a subprocess that holds the pipe (each with
        # the pipe that wakes it), and the pipes they handed over
        self._draining: list[tuple[threading.Thread, tuple[int, int]]] = []
        self._handed: list[tuple[int, int]] = []
        self._wake = (-1, -1)  # the running reader's wake pipe (closed here once it ended)

    def forget(self) -> None:
        """In a forked child: start with no capture (the reader and its pipes
        are the parent's), so its exit never wakes or hands them over."""
        registered = self._registered  # (its exit handler came along, if any)
        self.__init__()  # type: ignore[misc]
        self._registered = registered

    def _holds_fd2(self) -> bool:
        """Whether fd 2 is still the pipe (the script may have pointed it
        elsewhere itself: ``os.dup2(log.fileno(), 2)``)."""
        try:
            return _identity(2) == self._pipe
        except OSError:
            return False

    def _give_back(self) -> threading.Thread | None:
        """fd 2 back to what it was, unless the script pointed it elsewhere since
        (then the reader, which met the pipe's end, closed the saved copy); the
        reader, left to drain the pipe."""
        if self._holds_fd2():
            os.dup2(self._saved_fd, 2)  # drops the pipe's last write end held here
        reader, self._reader, self._saved_fd, self._pipe = self._reader, None, -1, None
        return reader

    # -- the reader thread -------------------------------------------------

    def _read(self, fd: int, out: int, wake: int) -> None:
        # Runs until every writer of the pipe is gone (a subprocess started in
        # the loop keeps it as its stderr: this forwards for it), then closes
        # both descriptors. Woken (``wake``) as the interpreter exits with the
        # pipe still held elsewhere, it leaves the pipe to ``_hand_over``.
        pending, handed = b"", False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(wake, select.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if wake in ready and not ready.get(fd, 0) & (select.POLLIN | select.POLLHUP):
                    handed = True  # nothing to read, a writer left: a subprocess's
                    break
                try:
                    chunk = os.read(fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                pending = self._feed(pending + chunk, out)
            self._forward(pending, out)
        finally:
            if handed:
                with self._lock:
                    self._handed.append((fd, out))
            else:
                _close(fd, out)

    def _feed(self, data: bytes, out: int) -> bytes:
        """Take the guard lines and sync marks out of ``data`` wherever they
        start (after a progress bar's ``\r``), pass the rest on at once; returns
        the tail that may be the start of one, kept until more comes."""
        pos = 0
        while True:
            m = _OURS.search(data, pos)
            if m is None:
                break
            end = data.find(b"\n", m.start())
            if end < 0:  # not whole yet
                self._forward(data[pos : m.start()], out)
                return data[m.start() :]
            self._forward(data[pos : m.start()], out)
            self._line(data[m.start() : end].decode("utf-8", "replace"), out)
            pos = end + 1
        cut = max(data.rfind(b"\n", pos), data.rfind(b"\r", pos)) + 1
        tail = data[max(cut, pos) :]
        if tail and len(tail) < 128 and _MAYBE_OURS.fullmatch(tail):  # perhaps the start of one
            self._forward(data[pos : len(data) - len(tail)], out)
            return tail
        self._forward(data[pos:], out)
        return b""

    @staticmethod
    def _forward(data: bytes, out: int) -> None:
        while data:
            try:
                data = data[os.write(out, data) :]
            except InterruptedError:
                continue
            except OSError:
                return

    def _line(self, text: str, out: int) -> None:
        try:
            mark = self._marks.get(text)
            if mark is not None:
                mark.set()
                return
            if text.startswith(_MARK):  # a mark no one waits for any more
                return
            parsed = parse(text)
            if parsed is not None:
                tid, event = parsed
                with self._lock:
                    self._events.setdefault(tid, []).append(event)
                return
            with self._lock:
                self._unparsed += 1
        except Exception:  # noqa: BLE001 - never stop draining the pipe
            pass
        self._forward(text.encode("utf-8", "replace") + b"\n", out)

    # -- users -------------------------------------------------------------

    def start(self) -> bool:
        """Take fd 2 (first user); False when it cannot be taken."""
        with self._lock:
            if self._users:
                self._users += 1
                return True
            try:
                read_fd, write_fd = os.pipe()
                saved = os.dup(2)
            except OSError:
                return False
            try:
                os.dup2(write_fd, 2)
            except OSError:
                _close(read_fd, write_fd, saved)
                return False
            self._pipe = _identity(write_fd)
            os.close(write_fd)
            # fd 2 given back at interpreter exit, whatever is still recording
            if not self._registered:
                atexit.register(self.release_at_exit)
                self._registered = True
            self._saved_fd = saved
            self._wake = os.pipe()
            self._reader = threading.Thread(
                target=self._read, args=(read_fd, saved, self._wake[0]),
                name="jaxcontracts-guard-log", daemon=True,
            )
            try:
                self._reader.start()
            except RuntimeError:  # no new thread (the interpreter is exiting): fd 2 given back
                self._give_back()
                _close(read_fd, saved, *self._wake)
                return False
            self._users = 1
            return True

    def sync(self) -> None:
        """Wait until the reader has seen everything written to fd 2 so far."""
        with self._lock:
            if not self._users or not self._holds_fd2():
                return
            self._n += 1
            token = f"{_MARK}{os.getpid()}-{self._n}"
            done = self._marks[token] = threading.Event()
        try:
            os.write(2, token.encode() + b"\n")
            done.wait(5.0)
        finally:
            self._marks.pop(token, None)

    def take(self, tid: int) -> tuple[list[GuardEvent], int]:
        """The events logged on thread ``tid`` since the last take, and the unparsed count."""
        self.sync()
        with self._lock:
            events = self._events.pop(tid, [])
            unparsed, self._unparsed = self._unparsed, 0
        return events, unparsed

    def stop(self) -> None:
        """Give fd 2 back (last user). The reader drains the pipe and ends when
        no writer is left (at once, unless a subprocess inherited the pipe)."""
        with self._lock:
            if not self._users:  # not started: nothing to give back (never below zero)
                return
            self._users -= 1
            if self._users:
                return
            reader, wake = self._give_back(), self._wake
            self._events.clear()
        if reader is not None:
            reader.join(0.5)  # what was written before take()'s sync is read already
            with self._lock:  # (one still alive forwards for a subprocess that holds the pipe)
                self._draining.append((reader, wake))
                ended = [(r, w) for r, w in self._draining if not r.is_alive()]
                self._draining = [(r, w) for r, w in self._draining if r.is_alive()]
            for _, w in ended:
                _close(*w)

    def release_at_exit(self) -> None:
        """At interpreter exit: give fd 2 back and hand on what a subprocess
        still writes. An uncaught traceback is printed before ``atexit``, when
        a daemon reader may never run again (it was lost); a subprocess holding
        the pipe (a data loader) may outlive us: a small process of its own
        forwards the rest (else its next write to a readerless pipe kills it)."""
        with self._lock:
            if self._users:
                self._users = 0
                reader = self._give_back()  # the pipe's last write end here: the reader drains it
                if reader is not None:
                    self._draining.append((reader, self._wake))
            draining, self._draining = self._draining, []
        for reader, wake in draining:
            if reader.is_alive():
                os.write(wake[1], b"x")  # (its read end open here: never a write without a reader)
                reader.join(2.0)
            _close(*wake)
        with self._lock:
            handed, self._handed = self._handed, []
        for fd, out in handed:
            _hand_over(fd, out)


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


_FORWARD = (
    "import os\nwhile b := os.read(0, 65536):\n    while b:\n        b = b[os.write(1, b):]\n"
)


def _hand_over(fd: int, out: int) -> None:
    """Forward the pipe ``fd`` to ``out`` from a process of its own, which ends
    when the last writer does. ``os.posix_spawn``, in a session of its own: no
    ``Popen`` left to warn as it is collected, no Ctrl-C of the terminal's
    group stopping it before the writers."""
    try:
        if sys.executable and hasattr(os, "posix_spawn"):
            os.posix_spawn(
                sys.executable, [sys.executable, "-I", "-S", "-c", _FORWARD], os.environ,
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, 0), (os.POSIX_SPAWN_DUP2, out, 1)],
                setsid=True,
            )
    except OSError:
        pass
    finally:
        _close(fd, out)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


_capture = Capture()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_capture.forget)


def start() -> bool:
    """Start (or join) the capture; False when unavailable (nothing to stop)."""
    if not capability("guard-log-capture").available:
        return False
    return _capture.start()


def stop(tid: int) -> tuple[list[GuardEvent], int]:
    """This user's thread's events and the unparsed count; then leave the capture."""
    try:
        return _capture.take(tid)
    finally:
        _capture.stop()
