"""What one command has read and written, its temporaries, its signals and its stdout.

Light (no numpy), so that ``attncli.__main__`` installs the signal handlers before anything
heavy is imported. The mechanisms live here, one each, so that no command can forget them:

- every file read (by the Reader, a loader, a checkpoint shard) is recorded, and an output
  that is one of them (same inode or same real path) is refused; so is an output named
  twice in one run (``--svg a.svg --plot a.svg``);
- every temporary being written is recorded, and a terminating signal (SIGINT, SIGTERM,
  SIGHUP) removes them, writes one line and exits 128 + the signal at once: no unwinding
  through half-imported modules, no output written after the signal;
- stdout is wrapped so that a failed write (a full disk, ``/dev/full``, a closed stdout,
  a reader gone away) surfaces as :class:`StdoutError`, which the CLI turns into one line
  and exit 2, or a quiet exit 0 for a closed pipe (``attncli ... | head -1``); a short
  write (a file size limit) is retried until it fails, never silently dropped;
- a memory-mapped input truncated by another program (SIGBUS) is one line and exit 2;
- the console script leaves through :func:`leave`: signals blocked, streams flushed, no
  interpreter shutdown for a late signal to land in.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import stat
import sys
from typing import Any

from attncli.errors import InputError

_read_ids: set[tuple[int, int]] = set()
_read_paths: set[str] = set()
_outputs: set[str] = set()
_temps: set[str] = set()
_pending: list[tuple[str, str]] = []  # (temporary, target): outputs written, renamed when the command succeeds
_installed = False  # the console script's signal handlers are in place (attncli.__main__)
_active = False  # inside a command: outputs named twice are refused


def begin() -> None:
    """A command starts: forget what an earlier one (in the same process: tests) read and wrote."""
    global _active
    _read_ids.clear()
    _read_paths.clear()
    _outputs.clear()
    _active = True


def end() -> None:
    """A command ends: outputs it did not commit (it failed, or was interrupted) are discarded."""
    global _active
    _active = False
    for tmp, _ in _pending:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        _temps.discard(tmp)
    _pending.clear()


def defer(tmp: str, target: str) -> bool:
    """Hold a finished output's temporary until the command succeeds (:func:`commit`); False
    outside a command (the library writes at once)."""
    if not _active:
        return False
    _pending.append((tmp, target))
    return True


def commit() -> None:
    """The command succeeded: every output it wrote is renamed into place, with the terminating
    signals held back, and (in the console script) held back until the process exits, so that a
    signal either finds nothing written or comes after the run is complete."""
    if not _pending:
        return
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, _CRITICAL)
    try:
        while _pending:
            tmp, target = _pending[0]
            try:
                os.replace(tmp, target)
            except OSError as e:
                raise InputError(f"cannot be written ({e.strerror or e})", target) from None
            _pending.pop(0)
            _temps.discard(tmp)
    finally:
        if not _installed and hasattr(signal, "pthread_sigmask"):  # in-process (tests, the library): as before
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _CRITICAL)


def record_read(path: str | os.PathLike[str]) -> None:
    """Remember a file that was read, so that no output of this run replaces it."""
    try:
        st = os.stat(path)
        _read_ids.add((st.st_dev, st.st_ino))
    except OSError:
        pass
    _read_paths.add(os.path.realpath(path))


def record_read_fd(stream: Any) -> None:
    """Remember the file behind a stream (stdin redirected from a file: ``< q.npy``)."""
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # a pipe with no fileno, a test's BytesIO
        return
    if stat.S_ISREG(st.st_mode):
        _read_ids.add((st.st_dev, st.st_ino))


def is_input(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is (a link to, another spelling of) a file read in this run."""
    if os.path.realpath(path) in _read_paths:
        return True
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in _read_ids


def claim_output(path: str | os.PathLike[str], source: str) -> None:
    """Refuse an output that is an input, or that another output of this run already names."""
    if is_input(path):
        raise InputError("is one of the inputs; refusing to overwrite it", source)
    real = os.path.realpath(path)
    if _active and real in _outputs:
        raise InputError("is named by two outputs of this run; give each output its own file", source)
    _outputs.add(real)


# ---- temporaries and terminating signals -----------------------------------------------------

SIGNALS = {"SIGINT": "interrupted", "SIGTERM": "terminated", "SIGHUP": "hung up"}
_CRITICAL = tuple(getattr(signal, name) for name in SIGNALS if hasattr(signal, name))


def add_temp(path: str) -> None:
    _temps.add(path)


def drop_temp(path: str) -> None:
    _temps.discard(path)


def _cleanup() -> None:
    for tmp in list(_temps):
        try:
            os.unlink(tmp)
        except OSError:
            pass
    _temps.clear()


def _on_signal(signum: int, frame: Any) -> None:
    """Remove the temporaries, say one line, exit 128 + signum now (buffered stdout is dropped)."""
    _cleanup()
    said = SIGNALS.get(signal.Signals(signum).name, "killed")
    try:
        os.write(2, f"attncli: error: {said}\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)


def install() -> None:
    """Handle SIGINT, SIGTERM and SIGHUP from now on (a signal the parent ignores stays ignored:
    ``nohup`` keeps working)."""
    global _installed
    _installed = True
    for sig in _CRITICAL:
        try:
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread
            pass


def leave(code: object) -> None:
    """Exit with ``code`` now: terminating signals blocked (the run is complete; a signal from here
    on changes nothing), streams flushed, no interpreter shutdown (whose restored default
    handlers would let a late signal kill the process without a word)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, _CRITICAL)
    if isinstance(code, str):  # sys.exit("message"), as Python itself would say it
        sys.stderr.write(code + "\n")
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError, StdoutError):
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


class blocked:
    """Terminating signals held back for a few statements (renaming a finished temporary into
    place and forgetting it), then delivered."""

    def __enter__(self) -> None:
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, _CRITICAL)

    def __exit__(self, *exc: object) -> None:
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _CRITICAL)


# ---- memory-mapped inputs -------------------------------------------------------------------

_mapped: list[str] = []
_bus_handler: Any = None


def watch_mapped(name: str) -> None:
    """A file is memory-mapped: if another program truncates it while it is read, the next read
    of a page past its new end raises SIGBUS, which Python cannot turn into an exception (the
    faulting instruction would run again). A C-level handler (through ctypes) says one line
    naming the file and exits 2 instead of dying without a word."""
    global _bus_handler
    if name not in _mapped:
        _mapped.append(name)
    if _bus_handler is not None or not hasattr(signal, "SIGBUS"):
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return

    @ctypes.CFUNCTYPE(None, ctypes.c_int)
    def on_bus(signum: int) -> None:  # pragma: no cover - runs in a signal handler, then exits
        from attncli.errors import printable

        names = ", ".join(_mapped) or "a memory-mapped input"
        line = (f"attncli: error: {printable(names, 120)}: changed while it was read (truncated by another "
                "program?); run again when nothing else writes it\n")
        os.write(2, line.encode("utf-8", "replace"))
        _cleanup()
        os._exit(2)

    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signal.SIGBUS, ctypes.cast(on_bus, ctypes.c_void_p))
    _bus_handler = on_bus  # kept alive for as long as the process runs


# ---- stdout ---------------------------------------------------------------------------------

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
