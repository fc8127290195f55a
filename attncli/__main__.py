"""Entry point (``attncli`` and ``python -m attncli``), and the only place that changes the process.

Light (no numpy, no typer before the handlers are in place). The library raises exceptions and
installs nothing; the console script decides what a signal does:

- SIGINT, SIGTERM, SIGHUP at any moment (even while numpy is half imported): the temporaries
  being written (attncli.io.session) are removed, one line is said, and the process exits
  130 / 143 / 129 at once: no unwinding through half-imported modules, nothing written after;
- a memory-mapped input truncated by another program (SIGBUS) is one line naming the files
  mapped (attncli.io.session.mapped) and exit 2; the handler is installed on the first map;
- the run leaves through :func:`leave`: signals blocked, streams flushed, no interpreter
  shutdown for a late signal to land in after the output is complete.
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # typing itself is not imported before the handlers are in place

if TYPE_CHECKING:
    from typing import Any

# Nothing of the package is imported before the handlers are in place (install() is the first thing
# main() does): a signal during start-up finds them already there, not Python's KeyboardInterrupt.
SAID = {"SIGINT": "interrupted", "SIGTERM": "terminated", "SIGHUP": "hung up"}
_CRITICAL = tuple(getattr(signal, name) for name in SAID if hasattr(signal, name))


def _on_signal(signum: int, frame: Any) -> None:
    """Remove the temporaries, say one line, exit 128 + signum now (buffered stdout is dropped)."""
    session = sys.modules.get("attncli.io.session")  # not imported yet (or half): nothing written yet either
    cleanup = getattr(session, "cleanup", None)
    if cleanup is not None:
        cleanup()
    said = SAID.get(signal.Signals(signum).name, "killed")
    try:
        os.write(2, f"attncli: error: {said}\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)


def install() -> None:
    """Handle SIGINT, SIGTERM and SIGHUP from now on (a signal the parent ignores stays ignored:
    ``nohup`` keeps working), and SIGBUS once a file is memory-mapped."""
    for sig in _CRITICAL:
        try:
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread
            pass
    from attncli.io import session

    session.hold_after_commit = True
    session.on_mapped(_install_bus_handler)


_bus_handler: Any = None


def _install_bus_handler() -> None:
    """A read of a page past the new end of a truncated mapped file raises SIGBUS, which Python
    cannot turn into an exception (the faulting instruction would run again). A C-level handler
    (through ctypes) says one line naming the mapped files and exits 2 instead of dying without a word."""
    global _bus_handler
    if _bus_handler is not None or not hasattr(signal, "SIGBUS"):
        return
    import ctypes
    import ctypes.util

    from attncli.io import session

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return

    @ctypes.CFUNCTYPE(None, ctypes.c_int)
    def on_bus(signum: int) -> None:  # pragma: no cover - runs in a signal handler, then exits
        from attncli.errors import printable

        names = ", ".join(session.mapped()) or "a memory-mapped input"
        line = (f"attncli: error: {printable(names, 120)}: changed while it was read (truncated by another "
                "program?); run again when nothing else writes it\n")
        os.write(2, line.encode("utf-8", "replace"))
        session.cleanup()
        os._exit(2)

    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signal.SIGBUS, ctypes.cast(on_bus, ctypes.c_void_p))
    _bus_handler = on_bus  # kept alive for as long as the process runs


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
        except Exception:  # OSError, ValueError, the CLI's StdoutError: nothing more can be said
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def main() -> None:
    install()
    code: object = 0
    try:
        from attncli.cli import main as cli_main

        cli_main()
    except SystemExit as e:
        code = e.code
    leave(code)


if __name__ == "__main__":
    main()
