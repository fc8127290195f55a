"""The CLI's stdout (process-wide, so here and not in the library).

stdout is wrapped so that a failed write (a full disk, ``/dev/full``, a closed stdout, a
reader gone away) surfaces as :class:`StdoutError`, which the CLI turns into one line and
exit 2, or a quiet exit 0 for a closed pipe (``attncli ... | head -1``); a short write (a
file size limit) is retried until it fails, never silently dropped. The terminating signals
and SIGBUS are the console script's (attncli.__main__).
"""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any


class StdoutError(Exception):
    """Writing to stdout failed: a full disk, /dev/full, a closed descriptor, a closed pipe.
    Not an OSError: Typer turns an EPIPE OSError into exit 1 on its own."""

    def __init__(self, errno_: int | None, strerror: str) -> None:
        super().__init__(strerror)
        self.errno, self.strerror = errno_, strerror


class _Guarded:
    """A stream whose failed writes raise StdoutError (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def _call(self, name: str, *args: Any) -> Any:
        if self._inner is None:
            raise StdoutError(errno.EBADF, "stdout is closed")
        try:
            return getattr(self._inner, name)(*args)
        except ValueError as e:  # "I/O operation on closed file"
            raise StdoutError(errno.EBADF, "stdout is closed") from e
        except OSError as e:
            raise StdoutError(e.errno, e.strerror or str(e)) from None

    def write(self, data: Any) -> Any:
        return self._call("write", data)

    def writelines(self, lines: Any) -> Any:
        return self._call("writelines", lines)

    def flush(self) -> None:
        if self._inner is not None:
            self._call("flush")

    @property
    def buffer(self) -> _Guarded:
        if self._inner is not None and not hasattr(self._inner, "buffer"):  # a text-only stream (StringIO)
            raise AttributeError("buffer")
        return _Guarded(getattr(self._inner, "buffer", None))

    def isatty(self) -> bool:
        try:
            return bool(self._inner is not None and self._inner.isatty())
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self._inner is None:
            raise StdoutError(errno.EBADF, "stdout is closed")
        return int(self._inner.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _WholeWrites(io.RawIOBase):
    """Descriptor 1 written in whole: a short write (a file size limit, a disk filling up) is
    retried until it fails with its error. Python's BufferedWriter reports a short write only
    through a return value that TextIOWrapper ignores: the rest of the output would vanish."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        return done


def guard_stdout() -> None:
    """sys.stdout written in whole (_WholeWrites) and wrapped in a StdoutError-raising stream
    (sys.stdout is None when the shell closed it: ``>&-``)."""
    if isinstance(sys.stdout, _Guarded):
        return
    old = sys.stdout
    try:
        fd = old.fileno() if old is not None else None
    except (OSError, ValueError, AttributeError):  # not a real descriptor (a test's capture)
        fd = None
    if old is not None and fd is not None:
        old.flush()
        old = io.TextIOWrapper(io.BufferedWriter(_WholeWrites(fd)), encoding=old.encoding, errors=old.errors,
                               line_buffering=bool(old.line_buffering))
    sys.stdout = _Guarded(old)  # type: ignore[assignment]


def stdout_failed(e: StdoutError) -> int:
    """The exit code for a failed stdout, after saying so in one line (nothing for a closed pipe:
    the reader, e.g. ``head``, has what it wanted). stdout is pointed at /dev/null so that the
    interpreter's last flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    if e.errno == errno.EPIPE:
        return 0
    sys.stderr.write(f"attncli: error: stdout: cannot be written ({e.strerror or 'write failed'})\n")
    sys.stderr.flush()
    return 2


SWEEPING = frozenset({"run", "self", "view", "heads", "check", "examples"})  # commands that compute a block at a time


def allocator_for_sweeps() -> None:
    """glibc's allocator set for a process that computes attention a block of queries at a time (the viewer's, the big
    page's and the plot's sweeps, the blocked path, check's): by default each thread gets an arena of its own, a freed
    array of over the (dynamic) mmap threshold goes back to the system, and so does a free heap top of over 128 KiB, so
    every block's new arrays are faulted in page by page again. Here one arena, glibc's largest mmap threshold (32 MiB)
    and a trim threshold of 1 GiB: the viewer's sweep of 64 float64 heads × 2048² spent 2.6 s of system time faulting
    pages, now 0.2 s (3.2 s -> 2.2 s of wall time on 2 cores); its peak memory is the same. Process-wide, so the CLI's
    (never the library's); nothing where the C library has no mallopt (musl's does nothing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc refuses more)
    mallopt(-8, 1)  # M_ARENA_MAX
