"""What one command has read and written, its temporaries and the files it maps (io layer).

Light (no numpy). Registries only: nothing here installs a signal handler, replaces a stream
or exits; the console script (attncli.__main__) and the CLI (attncli.cli.process) do that,
reading these registries:

- every file read (by the Reader, a loader, a checkpoint shard) is recorded, and an output
  that is one of them (same inode or same real path) is refused; so is an output named
  twice in one run (``--svg a.svg --plot a.svg``);
- every temporary being written is recorded (:func:`temporaries`, :func:`cleanup`), so that
  whoever handles a terminating signal can remove them;
- every memory-mapped input is recorded (:func:`watch_mapped`), and the callbacks given to
  :func:`on_mapped` are told, so that the console script can say which file a SIGBUS came from.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable
from typing import Any

from attncli.errors import InputError

_read_ids: set[tuple[int, int]] = set()
_read_paths: set[str] = set()
_outputs: set[str] = set()
_temps: set[str] = set()
_pending: list[tuple[str, str]] = []  # (temporary, target): outputs written, renamed when the command succeeds
hold_after_commit = False  # set by the console script: outputs renamed, signals stay blocked until it exits
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
        if not hold_after_commit and hasattr(signal, "pthread_sigmask"):  # in-process (tests, the library): as before
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


# ---- temporaries ---------------------------------------------------------------------------

# The terminating signals held back while finished outputs are renamed into place (a mask on
# this thread for a few statements, restored after: nothing is installed).
SIGNALS = {"SIGINT": "interrupted", "SIGTERM": "terminated", "SIGHUP": "hung up"}
_CRITICAL = tuple(getattr(signal, name) for name in SIGNALS if hasattr(signal, name))


def add_temp(path: str) -> None:
    _temps.add(path)


def drop_temp(path: str) -> None:
    _temps.discard(path)


def cleanup() -> None:
    """Remove every temporary still being written (a terminating signal arrived)."""
    for tmp in list(_temps):
        try:
            os.unlink(tmp)
        except OSError:
            pass
    _temps.clear()


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
_map_callbacks: list[Callable[[], None]] = []


def watch_mapped(name: str) -> None:
    """A file is about to be memory-mapped. If another program truncates it while it is read, the
    next read of a page past its new end raises SIGBUS, which Python cannot turn into an exception;
    the console script (attncli.__main__) handles it, naming the files recorded here."""
    if name not in _mapped:
        _mapped.append(name)
    for fn in _map_callbacks:
        fn()


def mapped() -> list[str]:
    """The files memory-mapped so far, in the order they were mapped."""
    return list(_mapped)


def on_mapped(fn: Callable[[], None]) -> None:
    """Call ``fn`` whenever a file is memory-mapped (the console script installs its SIGBUS
    handler on the first one, so that a run that maps nothing pays nothing)."""
    if fn not in _map_callbacks:
        _map_callbacks.append(fn)
